"""Each constrained request's share of a step's mask time (``houchu.model.grammar.fill``):
a row filled alone is timed; a batched row (one ``LLExecutor`` call for several rows)
gets the call's time in proportion to its request's masks timed alone, one row of the
batch leaving it every ``SOLO_EVERY`` steps to be timed; so two requests of different
grammars in one batch are not given the same mask time (the dashboard's
``structured.mask_s``)."""

from __future__ import annotations

from pathlib import Path

import llguidance
import pytest
import torch

from houchu.api.structured.request import json_schema_grammar, regex_grammar
from houchu.model.grammar.fill import SOLO_EVERY, MaskRow, fill_rows, share_batched
from houchu.model.grammar.matcher import GrammarEngine, RequestGrammar, _fill_all, bitmask_words
from houchu.transport.structured import StructuredOutput

pytestmark = pytest.mark.slow

VOCAB = 49152
WIDE = {
    "type": "object",
    "properties": {f"key_number_{i}": {"type": "string", "maxLength": 8} for i in range(30)},
    "required": [f"key_number_{i}" for i in range(30)],
    "additionalProperties": False,
}
SPECS = [
    StructuredOutput(kind="regex", grammar=regex_grammar("[a-z]{1,40}")),
    StructuredOutput(kind="json_schema", grammar=json_schema_grammar(WIDE)),
    StructuredOutput(kind="regex", grammar=regex_grammar("(yes|no)")),
]


@pytest.fixture(scope="module")
def engine(real_model_path: Path) -> GrammarEngine:
    return GrammarEngine(real_model_path, VOCAB)


def _rows(engine: GrammarEngine) -> list[MaskRow]:
    return [MaskRow(engine.compile(f"r{i}", s), i, []) for i, s in enumerate(SPECS)]


def test_a_batched_call_is_shared_by_each_requests_own_mask_time(engine) -> None:
    """Shares in proportion to the masks timed alone; one never timed weighs the mean
    of the others; equal shares when none was timed. The shares add up to the call."""
    rows = _rows(engine)
    share_batched(rows, 0.6)
    assert [r.fill_s for r in rows] == pytest.approx([0.2, 0.2, 0.2])
    rows[0].grammar.solo.add(1e-4, 0)
    rows[1].grammar.solo.add(2e-4, 0)
    rows[1].grammar.solo.add(4e-4, 8)  # mean 3e-4
    share_batched(rows, 0.6)  # weights 1, 3 and (never timed) 2
    assert [r.fill_s for r in rows] == pytest.approx([0.1, 0.3, 0.2])
    assert sum(r.fill_s for r in rows) == pytest.approx(0.6)


@pytest.mark.parametrize("step", [0, 1, SOLO_EVERY])
def test_every_few_steps_one_row_is_timed_alone(engine, step: int) -> None:
    """On every ``SOLO_EVERY``-th step the row timed alone least recently (never timed
    first) leaves the batch and is timed; the masks are those of the rows one by one."""
    rows = _rows(engine)
    rows[0].grammar.solo.add(1e-4, 0)
    rows[2].grammar.solo.add(1e-4, 3)
    batched = torch.full((3, bitmask_words(VOCAB)), -1, dtype=torch.int32)
    fill_rows(rows, batched, llguidance.LLExecutor(), step)
    counts = [r.grammar.solo.count for r in rows]
    assert counts == ([1, 1, 1] if step % SOLO_EVERY == 0 else [1, 0, 1])
    assert all(r.fill_s > 0 for r in rows)
    one_by_one = torch.full_like(batched, -1)
    for r in _rows(engine):
        r.grammar.fill(one_by_one, r.row, [])
    assert torch.equal(batched, one_by_one)


def _first_allowed(allowed: torch.Tensor) -> int:
    """The first allowed token that is not EOS (EOS where it is the only one)."""
    ids = allowed.nonzero().flatten().tolist()
    return next((t for t in ids if t > 2), ids[0])


def test_requests_of_one_batch_get_their_own_mask_time(engine) -> None:
    """Two requests batched for many steps, a short regex and a 30-key JSON schema:
    the ledger's samples give each its own mask time (not one equal share of every
    step, which made them identical), and each one's time is above zero."""
    engine.samples()
    grammars: list[RequestGrammar] = [engine.compile(f"s{i}", s) for i, s in enumerate(SPECS[:2])]
    for _ in range(3 * SOLO_EVERY):
        job = engine.start(grammars, [1, 1], [[], []])
        assert job is not None
        masks = job.wait(VOCAB, torch.device("cpu"))
        for g, m in zip(grammars, masks, strict=True):
            assert m is not None
            g.commit([_first_allowed(m)])
    assert all(g.solo.count >= 1 for g in grammars)
    times = {s.rid: s.saved + s.spent for s in engine.samples()}
    assert set(times) == {"s0", "s1"} and min(times.values()) > 0
    assert times["s0"] != times["s1"]


def test_the_worker_job_unpacks_what_it_filled(engine) -> None:
    """``_fill_all`` (the worker's job) returns the constrained rows unpacked."""
    rows = _rows(engine)
    bm = torch.full((3, bitmask_words(VOCAB)), -1, dtype=torch.int32)
    allowed, _ = _fill_all(rows, bm, VOCAB, llguidance.LLExecutor(), step=0)
    assert allowed.shape == (3, VOCAB) and all(0 < int(a.sum()) < VOCAB for a in allowed)
