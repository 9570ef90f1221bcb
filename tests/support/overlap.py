"""The overlap schedule against the plain one: a scheduler core, a fake runner that answers
after a step of delay, and drivers that run both."""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Callable

from houchu.options.batching_options import BatchingOptions
from houchu.runner.page_tables import PageTables
from houchu.scheduler.batcher import PLACEHOLDER_TOKEN
from houchu.scheduler.core import SchedulerCore
from houchu.transport.messages import (
    RunnerInfo,
    SamplingParams,
    SeqOutput,
    StepPlan,
    StepResult,
    TokenizedRequest,
)
from tests.support.scheduler import EOS, check_page_tables

PS = 4


def make_core(num_pages=64, radix=False, spec=None, **batch) -> SchedulerCore:
    info = RunnerInfo(
        num_pages=num_pages,
        page_size=PS,
        max_context=256,
        kv_bytes_per_token=8,
        num_params=1,
        model_name="tiny",
    )
    options = BatchingOptions(**batch, disable_radix_cache=not radix)
    return SchedulerCore(info, options, spec=spec, overlap=True)


def add(core: SchedulerCore, rid: str, prompt: list[int], max_tokens: int) -> None:
    core.add(
        TokenizedRequest(
            rid=rid,
            prompt_ids=prompt,
            sampling=SamplingParams(temperature=0.0, max_tokens=max_tokens),
            stop_ids=[EOS],
        )
    )


class FakeRunner:
    """Executes plans in order over a KV pool of token ids (see module docstring).

    ``eos_at``: rid -> output index at which EOS is sampled. ``forced``: rid -> {output
    index: n}: after sampling that output, n tokens are forced (jump-forward), returned
    with ``forced`` set; a work item that then ends behind the request's tokens draws
    nothing (``houchu.model.grammar.jump_forward.drop_stale_samples``).
    """

    def __init__(
        self, eos_at: dict[str, int] | None = None, forced: dict[str, dict[int, int]] | None = None
    ) -> None:
        self.eos_at = eos_at or {}
        self.forced = forced or {}
        self.kv: dict[tuple[int, int], int] = {}  # (page, slot) -> token id
        self.seqs: dict[str, list[int]] = {}  # rid -> prompt + sampled tokens
        self.prompt_len: dict[str, int] = {}
        self.last: dict[str, int] = {}  # tokens sampled by the previous step
        self.tables = PageTables()  # page tables between steps, as the runner keeps them

    def token(self, rid: str, index: int) -> int:
        if self.eos_at.get(rid) == index:
            return EOS
        return 20 + (zlib.crc32(rid.encode()) + 7 * index) % 80

    def execute(self, plan: StepPlan) -> StepResult:
        previous, self.last = self.last, {}
        for rid in plan.release:
            del self.seqs[rid]
        for si in plan.init:
            assert si.rid not in self.seqs, "registered twice"
            self.seqs[si.rid] = list(si.prompt_ids)
            self.prompt_len[si.rid] = len(si.prompt_ids)
        work, tables = self.tables.resolve(plan.work, plan.release)
        self.tables.commit(tables, plan.release)
        outputs = []
        for w in work:
            seq = self.seqs[w.rid]
            ids = list(w.token_ids)
            if w.use_last_sampled:
                assert ids == [PLACEHOLDER_TOKEN]
                ids = [previous[w.rid]]  # KeyError: the previous step sampled nothing for it
            assert PLACEHOLDER_TOKEN not in ids
            end = w.start_pos + len(ids)
            assert ids == seq[w.start_pos : end], f"{w.rid}: wrong input tokens"
            for p, t in zip(range(w.start_pos, end), ids, strict=True):
                self.kv[(w.page_table[p // PS], p % PS)] = t
            for p in range(end):  # what attention reads is this request's own KV
                assert self.kv.get((w.page_table[p // PS], p % PS)) == seq[p], f"{w.rid} @ {p}"
            if w.sample and end < len(seq):  # forced tokens follow: nothing to draw
                assert w.rid in self.forced
            elif w.sample:
                assert end == len(seq)
                index = len(seq) - self.prompt_len[w.rid]
                tok = self.token(w.rid, index)
                seq.append(tok)
                self.last[w.rid] = tok
                outputs.append(SeqOutput(rid=w.rid, token_id=tok))
                for _ in range(self.forced.get(w.rid, {}).get(index, 0)):
                    seq.append(self.token(w.rid, len(seq) - self.prompt_len[w.rid]))
                    outputs.append(SeqOutput(rid=w.rid, token_id=seq[-1], forced=True))
        return StepResult(step_id=plan.step_id, outputs=outputs, duration_s=0.0, num_tokens=0)


Hook = Callable[[SchedulerCore, int], None]


def drive(core: SchedulerCore, runner: FakeRunner, overlap: bool, hook: Hook | None = None):
    """Run until idle; returns {rid: (tokens, finish reason)}. ``hook(core, n)`` runs
    before the n-th result is applied (a plan for the step after may already be sent)."""
    results: deque[StepResult] = deque()
    out: dict[str, tuple[list[int], str | None]] = {}
    n = 0
    while True:
        while not core.num_in_flight or (overlap and core.can_plan_ahead()):
            plan = core.next_plan()
            if plan is None:
                break
            results.append(runner.execute(plan))  # the runner runs plans in order
        if not results:
            assert not core.batcher.running and not core.batcher.waiting
            return out
        if hook is not None:
            hook(core, n)
        n += 1
        for ev in core.apply(results.popleft()):
            toks, _ = out.get(ev.rid, ([], None))
            out[ev.rid] = (toks + ev.token_ids, ev.finish_reason)
        check_page_tables(core)


def both(make: Callable[[], SchedulerCore], eos_at=None, hook=None, forced=None):
    """(step-by-step outputs, overlapped outputs, overlapped core)."""
    plain = drive(make(), FakeRunner(eos_at, forced), overlap=False, hook=hook)
    core = make()
    return plain, drive(core, FakeRunner(eos_at, forced), overlap=True, hook=hook), core
