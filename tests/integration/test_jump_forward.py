"""Structured-output jump-forward (``houchu.model.grammar.jump_forward``) on a tiny random Llama
with the default model's tokenizer, driven by the real scheduler core: the tokens the
grammar forces come back after the sampled one and are fed in one chunk, step by step
and with the overlap scheduler alike; the JSON stays valid for its schema; fewer steps
run; the forced tokens are the tokenizer's own; the ledger counts them."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from houchu.api.structured.request import json_schema_grammar
from houchu.runner.model_runner import ModelRunner
from houchu.scheduler.core import SchedulerCore
from houchu.text.tokenizer.core import TextTokenizer
from houchu.transport.messages import SamplingParams, StepPlan, TokenizedRequest
from houchu.transport.structured import StructuredOutput
from tests.support.overlap import PS, drive, make_core
from tests.support.runner_options import exact

pytestmark = pytest.mark.slow

KEYS = ["customer_full_legal_name", "customer_primary_shipping_address", "order_total_in_euros"]
SCHEMA = {
    "type": "object",
    "properties": {
        KEYS[0]: {"type": "string", "maxLength": 8},
        KEYS[1]: {"type": "string", "maxLength": 8},
        KEYS[2]: {"type": "integer", "minimum": 0, "maximum": 999},
    },
    "required": KEYS,
    "additionalProperties": False,
}
JSON = StructuredOutput(kind="json_schema", grammar=json_schema_grammar(SCHEMA))


def _runner(model_dir: Path, jump: str) -> ModelRunner:
    opts = exact(page_size=PS, num_pages=256, jump_forward=jump)
    return ModelRunner(str(model_dir), opts, quiet=True)


class Counting:
    """A runner that counts its steps and keeps each output's ``forced`` flag."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner, self.steps = runner, 0
        self.forced: dict[str, list[bool]] = {}

    def execute(self, plan: StepPlan):
        res = self.runner.execute(plan)
        self.steps += int(bool(plan.work))
        for o in res.outputs:
            self.forced.setdefault(o.rid, []).append(o.forced)
        return res


def _serve(model_dir: Path, tok: TextTokenizer, jump: str, overlap: bool, **sp):
    """Three seeded constrained requests through a scheduler core and the runner:
    ({rid: output ids}, the core, the counting runner)."""
    core: SchedulerCore = make_core(num_pages=256, max_batch_tokens=256)
    for seed in range(3):
        params = SamplingParams(temperature=1.0, seed=seed, max_tokens=120, structured=JSON, **sp)
        prompt = tok.encode("Order as JSON:")
        core.add(TokenizedRequest(rid=f"s{seed}", prompt_ids=prompt, sampling=params, stop_ids=[2]))
    runner = Counting(_runner(model_dir, jump))
    out = drive(core, runner, overlap=overlap)
    return {rid: ids for rid, (ids, _) in out.items()}, core, runner


def _valid(tok: TextTokenizer, ids: list[int]) -> dict:
    assert ids[-1] == 2, "the grammar ended the output with EOS"
    value = json.loads(tok.decode(ids[:-1]))
    jsonschema.validate(value, SCHEMA)
    return value


@pytest.mark.parametrize("overlap", [False, True])
def test_forced_keys_skip_decode_steps_and_the_json_stays_valid(model_dir, tok, overlap) -> None:
    on, core, runner = _serve(model_dir, tok, "on", overlap)
    off, core_off, runner_off = _serve(model_dir, tok, "off", overlap)
    for ids in [*on.values(), *off.values()]:
        _valid(tok, ids)
    forced = core.counters.jump_forward_tokens
    assert forced >= 3 * len("".join(KEYS)) // 8  # the keys, at least, are forced
    assert forced == sum(map(sum, runner.forced.values()))
    assert core_off.counters.jump_forward_tokens == 0 and runner_off.runner.jump.tokens == 0
    # a forced token costs no step of its own (the three requests decode side by side)
    assert runner.steps <= runner_off.steps - forced // 3 // 2
    assert runner.runner.jump.split_passes == 0  # constrained requests alone: one pass a step
    saved = [s for s in runner.runner.lever_samples() if s.lever == "jump_forward"]
    assert {s.rid for s in saved} == set(on) and sum(s.saved for s in saved) >= forced
    assert all(s.verb == "break_serial" and s.spent > 0 for s in saved)


def test_overlapped_equals_step_by_step(model_dir, tok) -> None:
    """A step planned ahead of forced tokens draws nothing, so the overlap scheduler
    gives the tokens of driving it step by step (same seeds)."""
    plain, _, _ = _serve(model_dir, tok, "on", overlap=False)
    over, core, _ = _serve(model_dir, tok, "on", overlap=True)
    assert over == plain and core.overlap.steps_ahead > 0


def test_forced_tokens_are_the_tokenizers_own(model_dir, tok) -> None:
    """Each run of forced tokens is how the tokenizer itself writes its text (llguidance
    forces a canonical prefix: no key cut into tokens the model never saw)."""
    out, _, runner = _serve(model_dir, tok, "on", overlap=False)
    for rid, ids in out.items():
        flags = runner.forced[rid][: len(ids)]
        runs, cur = [], []
        for t, forced in zip(ids, flags, strict=True):
            if forced:
                cur.append(t)
            elif cur:
                runs, cur = [*runs, cur], []
        runs += [cur] if cur else []
        assert runs
        for run in runs:
            assert tok.encode_plain(tok.decode(run)) == run, tok.decode(run)


def test_no_jump_forward_for_a_request_that_asks_for_logprobs(model_dir, tok) -> None:
    out, core, _ = _serve(model_dir, tok, "on", overlap=False, logprobs=True)
    assert core.counters.jump_forward_tokens == 0
    for ids in out.values():
        _valid(tok, ids)
