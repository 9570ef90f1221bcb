"""Speculative bookkeeping in the scheduler, without a model: proposals in the plan, runs of
accepted tokens, page rollback, stops inside a run, aborts, the draft sync protocol.

The fake runner is an exact greedy target whose output is fixed in advance: it accepts
the longest prefix of the proposals that matches the truth, then emits the next true
token — what ``houchu.model.sampling.verify`` does with a real model.
"""

from __future__ import annotations

import weakref

from msgspec import structs

from houchu.options.batching_options import BatchingOptions
from houchu.options.speculation_options import SpeculativeOptions
from houchu.runner.page_tables import PageTables
from houchu.scheduler.core import SchedulerCore
from houchu.text.stop import stop_ids
from houchu.transport.messages import (
    RunnerInfo,
    SamplingParams,
    SeqOutput,
    StepPlan,
    StepResult,
    TokenizedRequest,
)
from houchu.transport.spec_messages import DraftProposal, DraftReply
from tests.support.scheduler import EOS, check_page_tables

PS = 4


class Recorder:
    """A telemetry sink that keeps lever samples."""

    def __init__(self) -> None:
        self.levers = []

    def event(self, *a, **k) -> None:
        pass

    def step(self, record) -> None:
        pass

    def lever(self, sample) -> None:
        self.levers.append(sample)


def make_core(num_pages=32, radix=False, k=4, telemetry=None, **batch) -> SchedulerCore:
    info = RunnerInfo(
        num_pages=num_pages,
        page_size=PS,
        max_context=256,
        kv_bytes_per_token=8,
        num_params=1,
        model_name="tiny",
    )
    spec = SpeculativeOptions(speculative="ngram", num_speculative_tokens=k)
    return SchedulerCore(
        info, BatchingOptions(**batch, disable_radix_cache=not radix), telemetry, spec=spec
    )


def add(core, rid: str, n_prompt: int = 6, max_tokens: int = 20, **sp) -> None:
    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens, **sp)
    core.add(
        TokenizedRequest(
            rid=rid,
            prompt_ids=list(range(10, 10 + n_prompt)),
            sampling=sampling,
            stop_ids=stop_ids(sampling, [EOS]),
        )
    )


def truth(i: int) -> int:
    """The target's i-th output token of every request."""
    return 100 + i


#: each core's page tables as its runner holds them (plans carry only new pages)
_RUNNER_TABLES: weakref.WeakKeyDictionary[SchedulerCore, PageTables] = weakref.WeakKeyDictionary()


def runner_view(core: SchedulerCore, plan: StepPlan | None) -> StepPlan:
    """``plan`` as the runner runs it: every work item with its whole page table."""
    assert plan is not None
    tables = _RUNNER_TABLES.setdefault(core, PageTables())
    work, updates = tables.resolve(plan.work, plan.release)
    tables.commit(updates, plan.release)
    return structs.replace(plan, work=work)


def step(core, proposals=None, truth_of=None):
    """One step: ask for proposals (``proposals(req, k) -> ids``), plan, run the fake
    exact target. Returns (draft request, plan, events)."""
    truth_of = truth_of or {}
    dr = core.draft_request()
    if dr is not None:
        props = [
            DraftProposal(s.rid, proposals(core.batcher.get(s.rid), s.k) if proposals else [])
            for s in dr.seqs
        ]
        core.attach_drafts(DraftReply(query_id=dr.query_id, proposals=props), 0.01)
    plan = runner_view(core, core.next_plan())
    outs = []
    for w in plan.work:
        if not w.sample:
            continue
        req = core.batcher.get(w.rid)
        t = truth_of.get(w.rid, truth)
        done = len(req.output_ids)
        drafts = w.token_ids[len(w.token_ids) - w.num_draft :]
        run = 0
        while run < len(drafts) and drafts[run] == t(done + run):
            run += 1
        outs += [SeqOutput(rid=w.rid, token_id=t(done + i)) for i in range(run + 1)]
    events = core.apply(
        StepResult(step_id=plan.step_id, outputs=outs, duration_s=0.0, num_tokens=0)
    )
    return dr, plan, events


def right(req, k: int) -> list[int]:
    """The target's own continuation: every proposal is accepted."""
    n = len(req.output_ids)
    return [truth(n + i) for i in range(k)]


def wrong_after(m: int):
    """Proposals right for ``m`` tokens, then wrong."""

    def propose(req, k: int) -> list[int]:
        return right(req, k)[:m] + [1] * max(k - m, 0)

    return propose


def test_plan_carries_proposals_with_pages_for_every_position():
    core = make_core()
    add(core, "a", n_prompt=6)
    dr, _, _ = step(core, right)  # prefill: nothing to propose yet
    assert dr is None
    dr, plan, events = step(core, right)
    (s,) = dr.seqs
    assert (s.rid, s.start, s.k) == ("a", 0, 4) and s.token_ids == [*range(10, 16), 100]
    (w,) = plan.work
    assert w.token_ids == [100, 101, 102, 103, 104] and w.num_draft == 4 and w.start_pos == 6
    assert len(w.page_table) == 3  # positions 0 .. 10
    assert events[0].token_ids == [101, 102, 103, 104, 105]  # 4 accepted + the target's own
    req = core.batcher.get("a")
    assert req.num_computed == 11 and len(req.page_table) == 3  # 12 tokens, 11 computed
    check_page_tables(core)
    dr, _, _ = step(core, right)  # the next sync sends only what is new
    assert dr.seqs[0].start == 7 and dr.seqs[0].token_ids == [101, 102, 103, 104, 105]


def test_rejected_proposals_roll_back_computed_tokens_and_pages():
    core = make_core()
    add(core, "a", n_prompt=6)
    step(core)
    _, plan, events = step(core, wrong_after(1))
    assert len(plan.work[0].page_table) == 3
    assert events[0].token_ids == [101, 102]  # one accepted, then the correction
    req = core.batcher.get("a")
    assert req.num_computed == 8 and req.output_ids == [100, 101, 102]
    assert len(req.page_table) == 3  # 9 tokens need 3 pages; nothing beyond is kept
    _, _, events = step(core, wrong_after(0))
    assert events[0].token_ids == [103]
    assert req.num_computed == 9 and len(req.page_table) == 3
    check_page_tables(core)
    st = core.stats()
    assert st["spec_proposed_tokens"] == 8 and st["spec_accepted_tokens"] == 1
    assert st["spec_verify_steps"] == 2 and st["spec_forward_passes_saved"] == 1
    assert st["spec_mean_acceptance_length"] == 1.5


def test_pages_past_the_accepted_length_return_to_the_pool():
    core = make_core(num_pages=8)
    add(core, "a", n_prompt=8, max_tokens=8)  # 2 full pages
    step(core)
    assert core.allocator.num_free == 6
    _, plan, _ = step(core, wrong_after(0))
    assert len(plan.work[0].page_table) == 4  # positions 0 .. 12 for the step
    assert len(core.batcher.get("a").page_table) == 3  # 10 tokens now: the 4th is freed
    assert core.allocator.num_free == 5
    check_page_tables(core)


def test_eos_inside_an_accepted_run_ends_the_request_there():
    core = make_core()
    add(core, "a", n_prompt=6)
    step(core)
    seq = {1: 101, 2: EOS, 3: 103, 4: 104, 5: 105}

    def t(i):
        return seq.get(i, truth(i))

    _, _, events = step(core, lambda req, k: [t(1 + i) for i in range(k)], {"a": t})
    (ev,) = events
    assert ev.token_ids == [101, EOS] and ev.finish_reason == "stop"
    assert core.batcher.get("a") is None and core.allocator.num_free == 32
    assert core.stats()["num_generated_tokens"] == 3
    assert core.spec.pending_release == ["a"]  # the draft frees its state too


def test_stop_token_id_inside_a_run():
    core = make_core()
    add(core, "a", n_prompt=6, stop_token_ids=[102])
    step(core)
    _, _, events = step(core, right)
    assert events[0].token_ids == [101, 102] and events[0].finish_reason == "stop"


def test_max_tokens_caps_the_proposals_and_the_run():
    core = make_core()
    add(core, "a", n_prompt=6, max_tokens=3)
    step(core)
    dr, plan, events = step(core, right)
    assert dr.seqs[0].k == 1  # 1 token out, 3 allowed: at most 1 proposal + the target's
    assert plan.work[0].num_draft == 1
    assert events[0].token_ids == [101, 102] and events[0].finish_reason == "length"
    assert core.allocator.num_free == 32


def test_radix_tree_indexes_only_accepted_tokens():
    core = make_core(radix=True)
    add(core, "a", n_prompt=6)
    step(core)
    step(core, wrong_after(2))  # accepted 101, 102; correction 103
    req = core.batcher.get("a")
    assert req.output_ids == [100, 101, 102, 103] and req.num_computed == 9
    assert core.tree.num_pages == 2  # positions 0 .. 7: prompt, 100, 101
    pages, _ = core.tree.match(req.all_ids(), 100)
    assert pages == req.page_table[:2]
    check_page_tables(core)


def test_abort_while_verifying_frees_pages_and_drops_the_late_result():
    core = make_core()
    add(core, "a", n_prompt=6)
    add(core, "b", n_prompt=5)
    step(core)
    dr = core.draft_request()
    reply = [DraftProposal(s.rid, right(core.batcher.get(s.rid), s.k)) for s in dr.seqs]
    core.attach_drafts(DraftReply(query_id=dr.query_id, proposals=reply), 0.01)
    plan = core.next_plan()
    assert all(w.num_draft == 4 for w in plan.work)
    assert core.abort("a")
    check_page_tables(core)
    assert core.spec.release_request().release == ["a"]
    outs = [SeqOutput(rid=w.rid, token_id=101) for w in plan.work]
    events = core.apply(
        StepResult(step_id=plan.step_id, outputs=outs, duration_s=0.0, num_tokens=0)
    )
    assert [e.rid for e in events] == ["b"]
    check_page_tables(core)


def test_no_pages_for_proposals_means_no_proposals_not_preemption():
    core = make_core(num_pages=4)
    add(core, "a", n_prompt=7, max_tokens=5)
    add(core, "b", n_prompt=7, max_tokens=5)
    step(core)  # 2 pages each, pool full
    _, plan, _ = step(core, right)
    assert [w.num_draft for w in plan.work] == [0, 0] and core.batcher.num_preemptions == 0
    check_page_tables(core)


def test_token_budget_trims_proposals():
    core = make_core(max_batch_tokens=6, chunked_prefill_size=6)
    add(core, "a", n_prompt=3)
    add(core, "b", n_prompt=3)
    step(core)
    _, plan, _ = step(core, right)
    assert sum(len(w.token_ids) for w in plan.work) == 6
    assert [w.num_draft for w in plan.work] == [4, 0]


def test_draft_error_resends_whole_sequences():
    core = make_core()
    add(core, "a", n_prompt=6)
    step(core)
    dr = core.draft_request()
    core.attach_drafts(DraftReply(query_id=dr.query_id, error="boom"), 0.01)
    core.next_plan()  # steps without proposals
    dr = core.draft_request()
    assert dr.seqs[0].start == 0 and dr.seqs[0].token_ids == [*range(10, 16), 100]


def test_lever_samples_when_a_request_leaves():
    rec = Recorder()
    core = make_core(telemetry=rec)
    add(core, "a", n_prompt=6, max_tokens=8)
    while core.batcher.get("a") is not None:
        step(core, wrong_after(2))
    spec = [s for s in rec.levers if s.lever == "speculative_decoding"]
    saved = next(s for s in spec if s.spent_unit == "seconds")
    rejected = next(s for s in spec if s.spent_unit == "tokens")
    assert (
        saved.verb == "break_serial" and saved.rid == "a" and saved.saved_unit == "forward_passes"
    )
    req_counters = core.spec.totals
    assert saved.saved == req_counters.forward_passes_saved > 0
    assert rejected.spent == req_counters.num_rejected > 0 and saved.spent > 0


def test_random_runs_keep_page_accounting_exact():
    """Many requests, random proposals (some right, some wrong), EOS, aborts and a small
    pool with the radix cache: after every step each page is referenced exactly by its
    users, and at the end only the tree holds pages."""
    import random

    rng = random.Random(1)
    core = make_core(num_pages=40, radix=True, max_batch_tokens=24, chunked_prefill_size=8)
    eos_at = {}

    def t_of(rid):
        return lambda i: EOS if i == eos_at[rid] else 100 + (i % 7)  # repetitive outputs

    truths = {}
    for n in range(30):
        rid = f"r{n}"
        eos_at[rid] = rng.randint(3, 40)
        truths[rid] = t_of(rid)
        add(core, rid, n_prompt=rng.randint(1, 14), max_tokens=rng.randint(1, 30))

    def propose(req, k):
        good = [truths[req.rid](len(req.output_ids) + i) for i in range(k)]
        cut = rng.randint(0, k)
        return good[:cut] + [rng.randint(3, 9) for _ in range(k - cut)]

    for _ in range(400):
        if not core.has_work:
            break
        if rng.random() < 0.03 and core.batcher.running:
            core.abort(rng.choice(list(core.batcher.running)))
        dr, plan, _ = step(core, propose, truths)
        check_page_tables(core)
        assert all(len(w.token_ids) - w.num_draft >= 1 for w in plan.work)
    assert not core.batcher.running and not core.batcher.waiting
    check_page_tables(core)
    assert core.allocator.num_used == core.tree.num_pages
    st = core.stats()
    assert 0 < st["spec_accepted_tokens"] < st["spec_proposed_tokens"]
