"""Detokenizer + stop strings composed per request (``RequestText``), on the real tokenizer."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from houchu.text.request_text import RequestText
from houchu.text.tokenizer.core import TextTokenizer, load_tokenizer
from houchu.transport.messages import SamplingParams, TextDelta, TokenEvent

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tok(real_model_path: Path) -> TextTokenizer:
    return load_tokenizer(real_model_path)


def chunked(rng: random.Random, ids: list[int]) -> list[list[int]]:
    chunks, i = [], 0
    while i < len(ids):
        size = rng.randint(1, 4)
        chunks.append(ids[i : i + size])
        i += size
    return chunks


def run(
    tok: TextTokenizer, chunks: list[list[int]], sampling: SamplingParams, eos: bool = True
) -> list[TextDelta]:
    """Feed ``chunks`` as token events (the last one ends with EOS if ``eos``)."""
    state = RequestText("r", tok, tok.encode("prompt"), sampling, tok.eos_token_ids)
    deltas = []
    for i, chunk in enumerate(chunks):
        last = i == len(chunks) - 1
        ids = [*chunk, tok.eos_token_ids[0]] if last and eos else chunk
        lps = [-0.5] * len(ids) if sampling.logprobs else None
        ev = TokenEvent(
            rid="r", token_ids=ids, logprobs=lps, finish_reason="stop" if last else None
        )
        delta = state.on_event(ev)
        if delta is not None:
            deltas.append(delta)
        if state.finished:
            break
    return deltas


def test_eos_is_not_text_and_everything_is_released(tok: TextTokenizer) -> None:
    text = "Hi 你好 🎉!"
    deltas = run(tok, [[t] for t in tok.encode(text)], SamplingParams(logprobs=True))
    assert "".join(d.text for d in deltas) == text
    assert deltas[-1].finish_reason == "stop"
    assert all("\ufffd" not in d.text for d in deltas)
    assert tok.eos_token_ids[0] not in [t for d in deltas for t in d.token_ids]
    data = b"".join(bytes(lp.bytes_) for d in deltas for lp in d.logprobs or [])
    assert data == text.encode()


def test_stop_string_finishes_request(tok: TextTokenizer) -> None:
    ids = tok.encode("Hello world. 你好。Goodbye and more text")
    deltas = run(tok, [[t] for t in ids], SamplingParams(stop=["。"]))
    assert "".join(d.text for d in deltas) == "Hello world. 你好"
    assert deltas[-1].finish_reason == "stop"


def test_random_texts_stops_and_chunks(tok: TextTokenizer) -> None:
    rng = random.Random(5)
    for _ in range(100):
        text = "".join(rng.choice(["ab", " c", "你", "好", "🎉", "\n", "d"]) for _ in range(12))
        stops = [rng.choice(["b c", "你好", "🎉\n", "dd", "a"]) for _ in range(rng.randint(1, 2))]
        deltas = run(tok, chunked(rng, tok.encode(text)), SamplingParams(stop=stops))
        hits = [i for i in (text.find(x) for x in stops) if i >= 0]
        assert "".join(d.text for d in deltas) == (text[: min(hits)] if hits else text)
        assert all("\ufffd" not in d.text for d in deltas)
        assert deltas[-1].finish_reason == "stop"


def test_min_tokens_holds_off_stop_strings(tok: TextTokenizer) -> None:
    ids = tok.encode("a, b, c, d")
    early = run(tok, [[t] for t in ids], SamplingParams(stop=[","]), eos=False)
    assert "".join(d.text for d in early) == "a" and early[-1].finish_reason == "stop"
    held = run(tok, [[t] for t in ids], SamplingParams(stop=[","], min_tokens=3), eos=False)
    assert "".join(d.text for d in held).startswith("a, b")  # the first "," came too early


def test_echo_and_prompt_logprobs_come_with_the_first_delta(tok: TextTokenizer) -> None:
    from houchu.transport.messages import PromptLogprobs

    prompt = tok.encode("Hello there")
    sp = SamplingParams(echo=True, prompt_logprobs=1)
    state = RequestText("r", tok, prompt, sp, tok.eos_token_ids, prompt_text="Hello there")
    n = len(prompt) - 1
    plp = PromptLogprobs(
        rid="r", start=1, logprobs=[-1.0] * n, ranks=[2] * n, top=[[(7, -0.5)]] * n
    )
    first = state.on_event(TokenEvent(rid="r", token_ids=[], prompt_logprobs=plp))
    assert first is not None and first.prompt_text == "Hello there"
    lps = first.prompt_logprobs
    assert [lp.token_id for lp in lps] == prompt
    assert lps[0].logprob is None and lps[0].rank is None and lps[0].top == []
    assert all(lp.logprob == -1.0 and lp.rank == 2 for lp in lps[1:])
    assert lps[1].top == [(tok.token_text(7), 7, -0.5)]
    later = state.on_event(TokenEvent(rid="r", token_ids=tok.encode(" you")))
    assert later is None or (later.prompt_text is None and later.prompt_logprobs is None)


def test_include_stop_str_in_output_ends_on_the_stop_string(tok: TextTokenizer) -> None:
    ids = tok.encode("Hello world. 你好。Goodbye and more text")
    sp = SamplingParams(stop=["。"], include_stop_str_in_output=True)
    deltas = run(tok, [[t] for t in ids], sp)
    assert "".join(d.text for d in deltas) == "Hello world. 你好。"
    assert deltas[-1].finish_reason == "stop"


@pytest.mark.parametrize("include", [False, True])
def test_stop_token_ids_text_kept_only_with_include_stop_str(
    tok: TextTokenizer, include: bool
) -> None:
    """vLLM's stop checker cuts a ``stop_token_ids`` token's text unless
    ``include_stop_str_in_output``; the EOS token's text is never shown."""
    ids = tok.encode(" 4,")
    comma = ids[-1]
    sp = SamplingParams(stop_token_ids=[comma], include_stop_str_in_output=include)
    stops = [comma, *tok.eos_token_ids]
    state = RequestText("r", tok, tok.encode("1, 2, 3,"), sp, stops)
    delta = state.on_event(TokenEvent(rid="r", token_ids=ids, finish_reason="stop"))
    assert delta is not None and delta.finish_reason == "stop"
    assert delta.text == (" 4," if include else " 4")
    eos = RequestText("e", tok, tok.encode("x"), sp, stops)
    last = eos.on_event(
        TokenEvent(
            rid="e", token_ids=[*tok.encode(" y"), tok.eos_token_ids[0]], finish_reason="stop"
        )
    )
    assert last is not None and last.text == " y"


def test_stop_reason_names_what_ended_the_output(tok: TextTokenizer) -> None:
    """vLLM's ``stop_reason``: the matched stop string, the ``stop_token_ids`` id that
    ended the output, None for EOS, for the grammar's end and for any other reason."""
    ids = tok.encode("Hello world. 你好。Goodbye")
    by_string = run(tok, [[t] for t in ids], SamplingParams(stop=["zzz", "。"]))
    assert (by_string[-1].finish_reason, by_string[-1].stop_reason) == ("stop", "。")
    assert all(d.stop_reason is None for d in by_string[:-1])
    by_eos = run(tok, [[t] for t in ids], SamplingParams(stop=["zzz"]))
    assert (by_eos[-1].finish_reason, by_eos[-1].stop_reason) == ("stop", None)
    # ended "stop" by no stop token (a grammar's end): no stop reason
    by_grammar = run(tok, [ids], SamplingParams(stop=["zzz"]), eos=False)
    assert (by_grammar[-1].finish_reason, by_grammar[-1].stop_reason) == ("stop", None)

    comma = tok.encode(" 4,")[-1]
    for include in (False, True):
        sp = SamplingParams(stop_token_ids=[comma], include_stop_str_in_output=include)
        state = RequestText("r", tok, tok.encode("1, 2, 3,"), sp, [comma, *tok.eos_token_ids])
        delta = state.on_event(
            TokenEvent(rid="r", token_ids=tok.encode(" 4,"), finish_reason="stop")
        )
        assert delta is not None and (delta.finish_reason, delta.stop_reason) == ("stop", comma)
    cut = RequestText("c", tok, tok.encode("x"), SamplingParams(stop_token_ids=[comma]), [comma])
    delta = cut.on_event(TokenEvent(rid="c", token_ids=tok.encode(" y"), finish_reason="length"))
    assert delta is not None and (delta.finish_reason, delta.stop_reason) == ("length", None)


def test_a_stop_string_completed_by_the_last_text_is_the_stop_reason(tok: TextTokenizer) -> None:
    """Stops "abcd" and "bc" on the text "abc": "bc" is complete but "abcd" could still
    match earlier, so the text is held; when ``max_tokens`` ends the request there, the
    flush decides for "bc": the output ends on that stop string, ``finish_reason``
    "stop" with it as ``stop_reason`` (as vLLM reports a stop string the last token
    completed), not "length"."""
    sp = SamplingParams(stop=["abcd", "bc"])
    state = RequestText("r", tok, tok.encode("x"), sp, tok.eos_token_ids)
    delta = state.on_event(TokenEvent(rid="r", token_ids=tok.encode("abc"), finish_reason="length"))
    assert delta is not None and delta.text == "a"
    assert (delta.finish_reason, delta.stop_reason) == ("stop", "bc")
