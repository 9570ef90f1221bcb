"""The scheduler's side of speculative decoding: which requests ask the draft actor (or
the runner) for proposals and for how many, what a verification step did to a request, and the counters.

Per step (driven by ``SchedulerCore`` and the scheduler actor)::

    request = spec.draft_request(running)     # None: nothing to speculate this step
    ... the draft actor answers ...
    spec.on_reply(reply, lookup, seconds)     # proposals land in req.spec.draft_ids
    plan = core.next_plan()                   # the batcher appends them to decode work
    ... the runner verifies ...
    spec.on_verified(req, ...)                # counters, acceptance; pages rolled back

With ``--speculative mtp`` the runner proposes (``houchu.speculative.mtp``) and no draft actor
is asked: ``ask_runner`` sets each planned work item's ``num_propose``, and
``on_runner_proposals`` attaches what its step result brings for the next plan.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from houchu.cache_tiers.page_allocator import PageAllocator
from houchu.options.speculation_options import SpeculativeOptions
from houchu.speculative.adaptive import PRIOR_WEIGHT, SpecController
from houchu.speculative.ledger import SPEC_LEVER, SpecCounters
from houchu.transport.levers import Lever
from houchu.transport.messages import SeqWork, StepResult
from houchu.transport.spec_messages import DraftReply, DraftRequest, DraftSeq
from houchu.transport.stats import SpecStats
from houchu.transport.telemetry import LeverSample

if TYPE_CHECKING:
    from houchu.scheduler.request import Request

#: Every this many draft decisions, speculate even where the cost model says no.
PROBE_EVERY = 64


class SpecScheduler:
    """Speculative bookkeeping of one scheduler.

    Args:
        config: the speculation settings (``--speculative`` and the rest of its group).
        max_context: tokens per request (proposals never pass it).
        max_running: the largest batch (bounds the break-even search).
    """

    def __init__(self, config: SpeculativeOptions, max_context: int, max_running: int) -> None:
        config.validate()
        self.config = config
        self.max_context = max_context
        self.controller = SpecController(
            config.num_speculative_tokens, config.speculative_max_batch, max_running
        )
        self.totals = SpecCounters()
        #: the ledger's lever: MTP's own row where the checkpoint's MTP layer proposes
        self.lever = Lever.MTP if config.speculative == "mtp" else SPEC_LEVER
        #: the proposals come from the runner, with each step's result (MTP)
        self.in_runner = config.proposes_in_runner
        self.pending_release: list[str] = []
        self._query_ids = itertools.count(1)
        self._asked: dict[str, int] = {}  # rid -> k of the outstanding query
        self._decisions = 0
        self.num_draft_calls = 0
        self.last_batch = 0
        self.last_num_asked = 0
        self.draft_pool: dict[str, int] = {"num_seqs": 0, "pages_used": 0, "pages_total": 0}

    # ------------------------------------------------------------------ asking

    def draft_request(self, running: Iterable[Request]) -> DraftRequest | None:
        """The proposals to ask for before the next step, or None.

        ``running``: the running requests (``scheduler.request.Request``); those decoding
        get ``k`` from the controller, capped so that no proposal could pass
        ``max_tokens`` or the context window. Also carries pending releases.
        """
        if self.in_runner:  # the runner proposes with its results (``ask_runner``)
            return None
        decoding = [r for r in running if not r.is_prefilling and not r.is_aborted]
        for r in decoding:
            r.spec.draft_ids = []
        if not decoding:
            return None
        seqs = []
        for r, k in self._choose(decoding):
            seqs.append(DraftSeq(r.rid, r.spec.num_synced, r.all_ids()[r.spec.num_synced :], k))
            r.spec.num_synced = r.num_tokens
        self.last_num_asked = len(seqs)
        if not seqs:
            return None
        self._asked = {s.rid: s.k for s in seqs}
        self.num_draft_calls += 1
        release, self.pending_release = self.pending_release, []
        return DraftRequest(query_id=next(self._query_ids), seqs=seqs, release=release)

    def _choose(self, reqs: list[Request]) -> list[tuple[Request, int]]:
        """The controller's ``k`` for each of ``reqs`` (the decoding batch), capped so
        that no proposal could pass ``max_tokens`` or the context window; those with
        ``k > 0``."""
        self._decisions += 1
        probe = self._decisions % PROBE_EVERY == 0
        batch, prior = len(reqs), self.controller.global_acceptance()
        self.last_batch = batch
        chosen = []
        for r in reqs:
            alpha = r.spec.acceptance.rate(prior, PRIOR_WEIGHT)
            k = self.controller.choose_k(batch, alpha, _cap(r, self.max_context), probe)
            if k > 0:
                chosen.append((r, k))
        return chosen

    def ask_runner(self, work: list[SeqWork], scheduled: list[Request]) -> None:
        """Proposals made in the runner (``--speculative mtp``): ask for the controller's
        ``k`` after each sampling work item of a plan (``SeqWork.num_propose``; ``work``
        and ``scheduled`` are parallel). Nothing for a draft actor's proposers."""
        if not self.in_runner:
            return
        sampling = [(w, r) for w, r in zip(work, scheduled, strict=True) if w.sample]
        if not sampling:
            return
        ks = dict((r.rid, k) for r, k in self._choose([r for _, r in sampling]))
        for w, r in sampling:
            w.num_propose = ks.get(r.rid, 0)
        self.last_num_asked = len(ks)
        self.num_draft_calls += bool(ks)

    def on_runner_proposals(
        self, result: StepResult, lookup: Callable[[str], Request | None]
    ) -> None:
        """Attach the proposals a step's result carries (``ask_runner``) to their
        requests for the next plan, cut to what ``max_tokens`` and the context still
        allow; skipped for a request that finished, prefills again, or is in a step
        planned meanwhile (they would not follow its last token). Their seconds
        (``draft_s``) feed the cost model and the ledger's spent side."""
        props = result.proposals
        if not props:
            return
        total_k = sum(len(ids) for ids in props.values())
        if total_k:
            self.controller.observe_draft(len(props), max(map(len, props.values())), result.draft_s)
            self.totals.draft_s += result.draft_s
        for rid, ids in props.items():
            req = lookup(rid)
            if req is None or req.is_prefilling or req.is_in_flight:
                continue
            if total_k:
                req.spec.counters.draft_s += result.draft_s * len(ids) / total_k
            req.spec.draft_ids = list(ids[: max(_cap(req, self.max_context), 0)])

    def release_request(self) -> DraftRequest | None:
        """A request that only releases the requests that left, or None."""
        if not self.pending_release:
            return None
        release, self.pending_release = self.pending_release, []
        return DraftRequest(query_id=next(self._query_ids), release=release)

    def on_reply(
        self, reply: DraftReply, lookup: Callable[[str], Request | None], seconds: float
    ) -> None:
        """Attach the proposals of the awaited reply (``seconds``: the wait for it).

        ``lookup(rid)`` gives the running request or None. Proposals longer than asked are
        cut; proposals for requests that left meanwhile are dropped.
        """
        self.on_pool_stats(reply)
        asked, self._asked = self._asked, {}
        if reply.error is not None:  # the draft's mirror may be off: resend everything next
            for rid in asked:
                req = lookup(rid)
                if req is not None:
                    req.spec.num_synced = 0
            return
        total_k = sum(asked.values())
        if total_k:
            self.controller.observe_draft(len(asked), max(asked.values()), seconds)
            self.totals.draft_s += seconds
        for rid, k in asked.items():
            req = lookup(rid)
            if req is not None:
                req.spec.counters.draft_s += seconds * k / total_k
        for p in reply.proposals:
            req, k = lookup(p.rid), asked.get(p.rid, 0)
            if req is not None and k and not req.is_prefilling:
                req.spec.draft_ids = list(p.token_ids[:k])

    def on_pool_stats(self, reply: DraftReply) -> None:
        """Keep the draft actor's pool counters of any reply."""
        self.draft_pool = {
            "num_seqs": reply.num_seqs,
            "pages_used": reply.pages_used,
            "pages_total": reply.pages_total,
        }

    def abandon(self) -> None:
        """The awaited reply did not come in time: step without proposals."""
        self._asked = {}

    # ------------------------------------------------------------------ results

    def on_verified(self, req: Request, proposed: int, num_outputs: int, num_kept: int) -> None:
        """``req``'s verification pass: ``proposed`` proposals, ``num_outputs`` tokens
        returned by the runner (accepted + 1), ``num_kept`` of them emitted."""
        accepted = num_outputs - 1
        req.spec.acceptance.update(proposed, accepted)
        self.controller.observe_verify(proposed, accepted)
        req.spec.counters.on_verify(proposed, accepted, num_kept)
        self.totals.on_verify(proposed, accepted, num_kept)

    def observe_step(self, num_tokens: int, seconds: float) -> None:
        """A pass of decode and verify work only, ``num_tokens`` tokens in ``seconds``."""
        self.controller.observe_target(num_tokens, seconds)

    def on_leave(self, req: Request) -> list[LeverSample]:
        """``req`` finished or was aborted: queue its release in the draft actor and
        return its ledger samples."""
        if req.spec.num_synced:
            self.pending_release.append(req.rid)
            req.spec.num_synced = 0
        req.spec.draft_ids = []
        return req.spec.counters.samples(req.rid, lever=self.lever)

    def resync(self, running: Iterable[Request]) -> None:
        """The draft actor was replaced (it starts empty): forget the releases queued for
        the old one and resend every running request's tokens with its next query."""
        self.pending_release.clear()
        for req in running:
            req.spec.num_synced = 0
            req.spec.draft_ids = []

    def calibrate(self, times: dict[int, float]) -> None:
        """Seed the cost model with timed target passes (``times``: tokens -> seconds)
        and update the break-even batch size."""
        for num_tokens, seconds in times.items():
            self.controller.observe_target(num_tokens, seconds)
        self.controller.update_break_even()

    def blocks_overlap(self, num_decoding: int) -> bool:
        """Whether the next plan may carry proposals for a decoding batch of this size
        (then it must not be planned ahead: proposals need every token known)."""
        return 0 < num_decoding <= self.controller.cutoff

    def stats(self) -> SpecStats:
        """Speculation's counters for the stats endpoint."""
        c = self.controller
        return SpecStats(
            speculative=self.config.speculative,
            spec_max_tokens=self.config.num_speculative_tokens,
            spec_break_even_batch=c.break_even,
            spec_max_batch=c.cutoff,
            spec_acceptance_estimate=c.global_acceptance(),
            spec_draft_calls=self.num_draft_calls,
            spec_last_batch=self.last_batch,
            spec_last_requests_speculating=self.last_num_asked,
            draft_num_seqs=self.draft_pool["num_seqs"],
            draft_pages_used=self.draft_pool["pages_used"],
            draft_pages_total=self.draft_pool["pages_total"],
            totals=self.totals.stats(),
        )


def _cap(req: Request, max_context: int) -> int:
    """The most proposals ``req`` may verify now: a verify step of ``k`` proposals emits
    up to ``k + 1`` tokens (those accepted and one sampled after them), and none may pass
    ``max_tokens`` or the context window (``Request.tokens_left``)."""
    return req.tokens_left(max_context) - 1


def free_pages_past(req: Request, allocator: PageAllocator, num_tokens: int) -> int:
    """Free ``req``'s pages beyond those holding positions ``0 .. num_tokens - 1`` (the
    KV of rejected proposals); pages indexed by the radix tree are never among them.
    Returns the pages freed."""
    keep = max(allocator.pages_for(num_tokens), req.num_tree_pages)
    extra = req.page_table[keep:]
    if extra:
        allocator.free(extra)
        del req.page_table[keep:]
    return len(extra)


def add_drafts(
    work: list[SeqWork], scheduled: list[Request], allocator: PageAllocator, budget: int
) -> int:
    """Append each scheduled decode's proposals (``req.spec.draft_ids``, consumed) to its
    work, as far as the step's token ``budget`` and the free pages allow — never by
    preempting or evicting anything. Returns the budget left.

    ``work`` and ``scheduled`` are parallel (one decode token each so far).
    """
    for w, req in zip(work, scheduled, strict=True):
        draft, req.spec.draft_ids = req.spec.draft_ids[: max(budget, 0)], []
        if not draft:
            continue
        need = allocator.pages_for(req.num_computed + 1 + len(draft)) - len(req.page_table)
        if need > 0:
            if not allocator.can_allocate(need):
                continue
            req.page_table.extend(allocator.allocate(need))
            w.page_table = list(req.page_table)
        w.token_ids = w.token_ids + draft
        w.num_draft = req.spec.num_draft = len(draft)
        budget -= len(draft)
    return budget
