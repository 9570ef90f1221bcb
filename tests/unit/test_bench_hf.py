"""The Hugging Face static-batching baseline on a tiny random Llama."""

from __future__ import annotations

from typing import Any

import pytest

from houchu.bench.backends.base import GenParams
from houchu.bench.backends.hf import HFBackend
from houchu.bench.driver import RunConfig, run_sessions
from houchu.bench.workloads import RequestSpec, Session
from houchu.devtools.tiny_models import make_tiny_llama


class _Tok:
    """Just enough tokenizer: one id per word, ids decode to letters."""

    pad_token_id = 0

    def __call__(self, text: str) -> dict[str, list[int]]:
        return {"input_ids": [3 + len(w) % 50 for w in text.split()]}

    def apply_chat_template(self, messages: list[dict[str, str]], **kw: Any) -> list[int]:
        return [1, *self(" ".join(m["content"] for m in messages))["input_ids"], 2]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(97 + i % 26) for i in ids)


class _TinyHF(HFBackend):
    def __init__(self, path: Any, params: GenParams, max_batch: int) -> None:
        super().__init__(path, params, max_batch, threads=1)
        self._path = path

    def _load(self) -> None:
        from transformers import AutoModelForCausalLM

        self._tok = _Tok()
        self._model = AutoModelForCausalLM.from_pretrained(str(self._path)).eval()


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("hf") / "m", seed=3)


@pytest.mark.parametrize("api", ["completions", "chat"])
async def test_static_batches_give_exact_counts_and_timings(tiny_path, api: str) -> None:
    b = _TinyHF(tiny_path, GenParams(api=api, timeout_s=60), max_batch=2)
    lengths = [2, 5, 3]
    sessions = [
        Session([RequestSpec(f"w{i} some words here", None, n)]) for i, n in enumerate(lengths)
    ]
    await b.start()
    try:
        run = await run_sessions(b, sessions, RunConfig(concurrency=3, progress=False))
    finally:
        await b.close()
    assert sorted(r.output_tokens for r in run.results) == sorted(lengths)
    for r in run.results:
        assert r.ok and r.usage_reported and r.counted_tokens == r.output_tokens
        assert len(r.token_times) == r.output_tokens and len(r.text) == r.output_tokens
        assert 0 < r.ttft <= r.e2el
        assert r.input_tokens == (6 if api == "chat" else 4)
    # two batches: the third request waited for the first batch to end
    by_len = {r.output_tokens: r for r in run.results}
    first_batch_end = max(by_len[2].end, by_len[5].end)
    assert by_len[3].token_times[0] >= first_batch_end


async def test_timeout_fails_only_the_late_request(tiny_path) -> None:
    b = _TinyHF(tiny_path, GenParams(timeout_s=0.0001), max_batch=1)
    await b.start()
    try:
        run = await run_sessions(
            b, [Session([RequestSpec("a b", None, 50)])], RunConfig(progress=False)
        )
    finally:
        await b.close()
    assert [r.error for r in run.results] == ["timeout"]
