"""A constrained request's jump-forward leaves the free requests beside it as they are
(``houchu.model.grammar.catch_up``), on the default model's int4 weights and a decode route
pinned so that a step of more than 8 rows takes another path (torch's int4 kernel on
float activations: other floats).

The constrained request's grammar forces a long constant, so its catch-up chunk (the
sampled token and 30-odd forced ones) would push the step's rows past that bucket:
before, the free requests' rows then computed other logits (their greedy output could
change). Now the catch-up tokens run in a pass of their own, and the free requests'
tokens and log-probabilities are bit for bit those of the same requests alone,
step by step and with the overlap scheduler alike.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from houchu.api.structured.request import json_schema_grammar
from houchu.options.runner_options import RunnerOptions
from houchu.runner.autotune import DecodeRoute, attach
from houchu.runner.model_runner import ModelRunner
from houchu.scheduler.core import SchedulerCore
from houchu.text.tokenizer.core import TextTokenizer, load_tokenizer
from houchu.transport.messages import SamplingParams, StepPlan, StepResult, TokenizedRequest
from houchu.transport.structured import StructuredOutput
from tests.support.grammar_runner import run
from tests.support.overlap import PS, drive, make_core
from tests.support.runner_options import exact

pytestmark = pytest.mark.slow

#: up to 8 rows the fused int4 x int8 layers; more take torch's int4 kernel (float x)
ROUTE = DecodeRoute({1: "fused-a8", 2: "fused-a8", 4: "fused-a8", 8: "fused-a8"}, "torch")
NOTE = "the quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat"
SCHEMA = {
    "type": "object",
    "properties": {"note": {"const": NOTE}, "n": {"type": "integer", "maximum": 99}},
    "required": ["note", "n"],
    "additionalProperties": False,
}
FREE = {"a": "The ocean is", "b": "Cats are", "c": "Gravity"}
EOS = 2


@pytest.fixture(scope="module")
def tok(real_model_path: Path) -> TextTokenizer:
    return load_tokenizer(real_model_path)


class Recording:
    """The runner, keeping each request's sampled ``(token, logprob)`` in order."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.sampled: dict[str, list[tuple[int, float | None]]] = {}

    def execute(self, plan: StepPlan) -> StepResult:
        res = self.runner.execute(plan)
        for o in res.outputs:
            if not o.forced:
                self.sampled.setdefault(o.rid, []).append((o.token_id, o.logprob))
        return res


def _serve(path: Path, tok: TextTokenizer, constrained: bool, overlap: bool):
    """The free requests (greedy, with logprobs), and with ``constrained`` a constrained
    one that arrives once they decode: (the recording runner, {rid: output ids})."""
    options = RunnerOptions(
        device="cpu",
        compile="off",
        decode_paths="rules",
        int4_activations="int8",
        fixed_threads=True,
        page_size=PS,
        num_pages=512,
    )
    runner = ModelRunner(str(path), options, quiet=True)
    attach(runner.model, ROUTE)
    core: SchedulerCore = make_core(num_pages=512)
    for rid, text in FREE.items():
        sp = SamplingParams(temperature=0.0, max_tokens=40, logprobs=True, ignore_eos=True)
        core.add(TokenizedRequest(rid=rid, prompt_ids=tok.encode(text), sampling=sp, stop_ids=[]))

    def join(core: SchedulerCore, n: int) -> None:
        if constrained and n == 2:  # the free requests decode by now
            spec = StructuredOutput(kind="json_schema", grammar=json_schema_grammar(SCHEMA))
            sp = SamplingParams(temperature=1.0, seed=4, max_tokens=60, structured=spec)
            ids = tok.encode("JSON:")
            core.add(TokenizedRequest(rid="d", prompt_ids=ids, sampling=sp, stop_ids=[EOS]))

    rec = Recording(runner)
    out = drive(core, rec, overlap=overlap, hook=join)
    return rec, {rid: ids for rid, (ids, _) in out.items()}


@pytest.mark.parametrize("overlap", [False, True], ids=["step-by-step", "overlap"])
def test_free_requests_unchanged_beside_a_jump_forward(
    real_model_path: Path, tok: TextTokenizer, overlap: bool
) -> None:
    alone_rec, alone = _serve(real_model_path, tok, constrained=False, overlap=overlap)
    with_rec, both = _serve(real_model_path, tok, constrained=True, overlap=overlap)
    assert NOTE in tok.decode(both["d"])  # the constrained request ran, its constant forced
    jump = with_rec.runner.jump
    assert jump.tokens >= 15  # a long catch-up chunk, beside the free requests' decode rows
    for rid in FREE:
        assert both[rid] == alone[rid], rid
        n = len(alone[rid])  # an overlapped step may sample one more, discarded
        assert with_rec.sampled[rid][:n] == alone_rec.sampled[rid][:n], rid
    assert jump.split_passes >= 1  # the free rows shared steps with catch-up tokens


def test_tensor_parallel_ranks_run_both_passes(model_dir: Path) -> None:
    """A tensor-parallel runner's other ranks run each pass of a split step too (rank 0
    sends them one by one): its output is the single-rank runner's."""
    tok = load_tokenizer(model_dir)
    spec = StructuredOutput(kind="json_schema", grammar=json_schema_grammar(SCHEMA))
    free = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    reqs = {
        "free": (tok.encode("Once upon a time"), free),
        "json": (tok.encode("JSON:"), SamplingParams(temperature=0.0, structured=spec)),
    }
    one = ModelRunner(str(model_dir), exact(page_size=16, num_pages=64, threads=1), quiet=True)
    want = run(one, reqs, 30)
    opts = exact(page_size=16, num_pages=64, threads=1, tensor_parallel_size=2)
    two = ModelRunner(str(model_dir), opts, quiet=True)
    try:
        got = run(two, reqs, 30)
        split = two.jump.split_passes
    finally:
        two.close()
    assert NOTE in tok.decode(want["json"])
    assert got == want and split == one.jump.split_passes >= 1
