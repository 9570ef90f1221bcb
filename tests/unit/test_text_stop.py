"""Stop-string matching on streamed text (pure logic, no model)."""

from __future__ import annotations

import random

import pytest

from houchu.text.stop import StopStringMatcher


def run(stops: list[str], pieces: list[str]) -> tuple[str, bool, list[str]]:
    """Feed ``pieces``; return (all emitted text, stopped, per-feed outputs)."""
    matcher = StopStringMatcher(stops)
    outputs = []
    stopped = False
    for piece in pieces:
        text, stopped = matcher.feed(piece)
        outputs.append(text)
    if not stopped:
        outputs.append(matcher.flush())
        stopped = matcher.stopped
    return "".join(outputs), stopped, outputs


def expected(stops: list[str], text: str) -> tuple[str, bool]:
    """The reference: text cut before the earliest occurrence of any stop."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return (text[: min(hits)], True) if hits else (text, False)


def test_stop_spanning_feeds() -> None:
    assert run(["ab"], ["xa", "by"]) == ("x", True, ["x", ""])
    assert run(["ab"], ["a", "b"]) == ("", True, ["", ""])


def test_stop_at_very_beginning() -> None:
    assert run(["Hello"], ["Hello world"])[:2] == ("", True)


def test_stop_not_emitted_and_later_feeds_ignored() -> None:
    matcher = StopStringMatcher(["END"])
    assert matcher.feed("done END more") == ("done ", True)
    assert matcher.matched == "END"
    assert matcher.feed("anything") == ("", True)
    assert matcher.flush() == ""


def test_earliest_of_several_stops_wins() -> None:
    assert run(["world", "lo"], ["hello world"])[:2] == ("hel", True)
    matcher = StopStringMatcher(["c", "b"])
    assert matcher.feed("abc") == ("a", True)
    assert matcher.matched == "b"


def test_partial_prefix_held_then_released() -> None:
    matcher = StopStringMatcher(["ab"])
    assert matcher.feed("a") == ("", False)
    assert matcher.held == "a"
    assert matcher.feed("c") == ("ac", False)
    assert matcher.held == ""


def test_overlapping_prefixes() -> None:
    matcher = StopStringMatcher(["ab"])
    assert matcher.feed("a") == ("", False)
    assert matcher.feed("a") == ("a", False)  # the first "a" can no longer start "ab"
    assert matcher.feed("b") == ("", True)
    assert run(["ab"], ["aab"])[:2] == ("a", True)
    assert run(["aab"], ["a", "a", "a", "b"])[:2] == ("a", True)


def test_multibyte_stop() -> None:
    assert run(["。"], ["你好", "。再见"])[:2] == ("你好", True)
    assert run(["再见"], ["你好再", "见"])[:2] == ("你好", True)
    assert run(["🎉!"], ["party 🎉", "?", " 🎉", "!"])[:2] == ("party 🎉? ", True)


def test_no_stop_releases_everything_at_flush() -> None:
    matcher = StopStringMatcher(["STOP"])
    assert matcher.feed("go ST") == ("go ", False)
    assert matcher.flush() == "ST"
    assert not matcher.stopped


def test_no_stops_passes_text_through() -> None:
    assert StopStringMatcher([]).feed("abc") == ("abc", False)


def test_longer_stop_starting_earlier_waits_for_decision() -> None:
    # "bc" is complete at 1 but "abcd" could still match at 0: hold until decided.
    matcher = StopStringMatcher(["abcd", "bc"])
    assert matcher.feed("abc") == ("", False)
    assert matcher.feed("d") == ("", True)
    assert matcher.matched == "abcd"
    matcher = StopStringMatcher(["abcd", "bc"])
    assert matcher.feed("abc") == ("", False)
    assert matcher.feed("x") == ("a", True)
    assert matcher.matched == "bc"
    matcher = StopStringMatcher(["abcd", "bc"])
    assert matcher.feed("abc") == ("", False)
    assert matcher.flush() == "a"
    assert matcher.stopped and matcher.matched == "bc"


def test_empty_stop_rejected() -> None:
    with pytest.raises(ValueError):
        StopStringMatcher(["ok", ""])


def random_split(rng: random.Random, text: str) -> list[str]:
    """``text`` cut at random places (empty pieces allowed)."""
    cuts = sorted(rng.randint(0, len(text)) for _ in range(rng.randint(0, len(text) + 1)))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


@pytest.mark.parametrize("seed", range(5))
def test_property_random_texts_and_splits(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = "ab c。好"
    for _ in range(1000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        stops = [
            "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4)))
            for _ in range(rng.randint(1, 3))
        ]
        emitted, stopped, outputs = run(stops, random_split(rng, text))
        assert (emitted, stopped) == expected(stops, text), (text, stops, outputs)


def test_text_is_released_as_soon_as_it_cannot_start_a_stop() -> None:
    rng = random.Random(7)
    for _ in range(500):
        stops = ["".join(rng.choice("abc") for _ in range(rng.randint(1, 4))) for _ in range(2)]
        matcher = StopStringMatcher(stops)
        seen = ""
        for _ in range(20):
            piece = rng.choice("abcd")
            text, stopped = matcher.feed(piece)
            if stopped:
                break
            seen += piece
            # what is held is exactly the longest suffix that is a proper prefix of a stop
            suffixes = [
                seen[i:]
                for i in range(len(seen))
                if any(len(seen) - i < len(s) and s.startswith(seen[i:]) for s in stops)
            ]
            assert matcher.held == (suffixes[0] if suffixes else "")


def test_include_keeps_the_stop_string_at_the_end() -> None:
    """vLLM's include_stop_str_in_output: the output runs through the matched stop
    string, whichever pieces it spans, and nothing after it is emitted."""
    m = StopStringMatcher(["END", "ND!"], include=True)
    out = [m.feed(p) for p in ("abc E", "N", "D! tail")]
    assert "".join(t for t, _ in out) == "abc END"
    assert out[-1][1] and m.matched == "END"
    assert m.feed("more") == ("", True)
    plain = StopStringMatcher(["END"])
    assert "".join(plain.feed(p)[0] for p in ("abc E", "ND x")) == "abc "
