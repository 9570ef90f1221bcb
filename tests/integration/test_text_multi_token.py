"""Several tokens per event (speculative decoding accepts runs): a stop string inside an
event ends text, ids, logprobs and the usage count at the token that completed it —
exactly as when the same tokens arrive one per event."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from houchu.text.request_text import RequestText
from houchu.text.tokenizer.core import TextTokenizer, load_tokenizer
from houchu.transport.messages import SamplingParams, TokenEvent

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tok(real_model_path: Path) -> TextTokenizer:
    return load_tokenizer(real_model_path)


def feed(tok: TextTokenizer, chunks: list[list[int]], sp: SamplingParams, eos: bool) -> dict:
    """Feed the chunks as events (the last one finishing, with EOS if ``eos``); collect
    what the client would see."""
    state = RequestText("r", tok, tok.encode("prompt"), sp, tok.eos_token_ids)
    seen = {"text": "", "ids": [], "logprobs": 0, "usage": 0, "finish": None}
    for i, chunk in enumerate(chunks):
        last = i == len(chunks) - 1
        ids = [*chunk, tok.eos_token_ids[0]] if last and eos else list(chunk)
        ev = TokenEvent(
            rid="r",
            token_ids=ids,
            logprobs=[-0.5] * len(ids),
            top_logprobs=[[]] * len(ids),
            finish_reason=("stop" if eos else "length") if last else None,
        )
        d = state.on_event(ev)
        if d is not None:
            seen["text"] += d.text
            seen["ids"] += d.token_ids
            seen["logprobs"] += len(d.logprobs or [])
            seen["usage"], seen["finish"] = d.completion_tokens, d.finish_reason
        if state.finished:
            break
    return seen


def test_stop_string_in_the_middle_of_an_event(tok: TextTokenizer) -> None:
    ids = tok.encode("Hello world. Goodbye and more text after the stop")
    sp = SamplingParams(stop=["Goodbye"], logprobs=True)
    one = feed(tok, [[t] for t in ids], sp, eos=True)
    run = feed(tok, [ids[:3], ids[3:]], sp, eos=True)  # the stop is inside the second
    assert run == one
    assert run["text"] == "Hello world. " and run["finish"] == "stop"
    stop_at = next(i for i in range(len(ids)) if "Goodbye" in tok.decode(ids[: i + 1]))
    assert run["usage"] == stop_at + 1 < len(ids)  # nothing after the stop is counted
    assert run["ids"] == ids[: stop_at + 1] and run["logprobs"] == stop_at + 1


@pytest.mark.parametrize("eos", [True, False])
def test_random_runs_match_one_token_per_event(tok: TextTokenizer, eos: bool) -> None:
    rng = random.Random(7)
    for _ in range(60):
        text = "".join(rng.choice(["ab", " c", "你", "好", "🎉", "\n", "d"]) for _ in range(14))
        stops = [rng.choice(["b c", "你好", "🎉\n", "dd", "a"]) for _ in range(rng.randint(0, 2))]
        ids = tok.encode(text)
        sp = SamplingParams(stop=stops, logprobs=True)
        chunks, i = [], 0
        while i < len(ids):
            n = rng.randint(1, 6)
            chunks.append(ids[i : i + n])
            i += n
        assert feed(tok, chunks, sp, eos) == feed(tok, [[t] for t in ids], sp, eos)
