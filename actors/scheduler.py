"""The scheduler actor: the loop that admits requests, plans steps and routes tokens.

receive -> (admit | abort | apply result | answer stats) -> if no step is in flight, send
the next plan; with the overlap scheduler (unless ``--overlap-schedule off``) also
while one is, when the core allows it, so that applying results and planning run while
the runner executes (``houchu.scheduler.overlap``). A step's tokens leave for the
tokenizer before the next plan is made: on a CPU whose cores all run the step, their
trip to the client then runs while the runner waits for that plan, not beside the next
step (``houchu.api.token_path`` measures both). The domain logic lives in
``houchu.scheduler``.

Every wait has a bound: lower-tier lookups (``Timings.tier_lookup_timeout_s``), draft
proposals (``Timings.draft_timeout_s``), and the step in flight (``--heartbeat-timeout``:
past it the runner is reported stuck to the launcher, which restarts it). When a peer is replaced
(``ActorDown``, see ``houchu.actors.supervisor``): runner — every request fails with 503,
the page pool and radix tree start over, and planning waits for the new runner's
``RunnerInfo``; tokenizer — every request is aborted; KV-tier manager — grants and
lookups are dropped; draft — no proposals until ``ActorUp``.
"""

from __future__ import annotations

import os
import time

import msgspec
import zmq.asyncio

from houchu.actors.draft_link import Draft, make_link, spec_config
from houchu.options.serve_config import ServeConfig
from houchu.scheduler.core import Rejected, SchedulerCore
from houchu.scheduler.overlap import resolve_overlap
from houchu.scheduler.tiers import TierClient
from houchu.startup_errors import ShutdownBeforeReady
from houchu.transport.actor_base import ActorBase
from houchu.transport.failures import unavailable
from houchu.transport.messages import (
    AbortRequest,
    ActorStuck,
    FinishRequest,
    RunnerInfo,
    SchedulerInbox,
    Shutdown,
    StatsQuery,
    StatsReply,
    StepResult,
    StepStamps,
    TokenBatch,
    TokenEvent,
    TokenizedRequest,
)
from houchu.transport.peers import receive
from houchu.transport.spec_messages import DraftReply
from houchu.transport.tier_messages import HostSlotGrant, TierLookupResult, TierStats


class SchedulerActor(ActorBase[SchedulerInbox | DraftReply]):
    """Continuous batching between the tokenizer and the model runner."""

    name = "scheduler"
    drain_queued = True  # this message, then whatever else is queued, then plan

    def __init__(self, ctx: zmq.asyncio.Context, config: ServeConfig) -> None:
        super().__init__(ctx, config.endpoints, SchedulerInbox | DraftReply)
        self.config = config
        self.to_runner = self.peers.outbox("runner")
        self.to_tokenizer = self.peers.outbox("tokenizer")
        self.to_gateway = self.peers.outbox("gateway")
        self.to_tiers = self.peers.outbox("kv_tiers")
        self.to_launcher = self.peers.outbox("launcher")
        self.core: SchedulerCore | None = None
        self.telemetry = self.telemetry_to(config.recorder_address())
        self.runner_ready = False  # a runner's RunnerInfo came since its last restart
        self.overlap = False  # plan a step while one runs (resolved at start)
        self.stuck_reported = False  # the step in flight was reported stuck
        self.draft: Draft = make_link(ctx, config, self.peers)

    async def start(self) -> str:
        """Wait for the runner's pool geometry, then build the core (messages that arrive
        before it, such as the tier manager's first slot grant, are handled after)."""
        early: list[SchedulerInbox] = []
        while True:
            msg = await receive(self.inbox, self.name)
            if isinstance(msg, RunnerInfo):
                break
            if isinstance(msg, Shutdown):
                raise ShutdownBeforeReady("shut down before the runner was ready")
            early.append(msg)
        c = self.config
        batch = c.batching
        self.overlap = resolve_overlap(batch.overlap_schedule, msg, os.cpu_count() or 1)
        self.telemetry.start()
        tiers = None
        if c.kv_tiers.enabled:
            fingerprint = bytes.fromhex(c.launch.kv_fingerprint)
            timeout_s = c.timings.tier_lookup_timeout_s
            tiers = TierClient(fingerprint, msg.page_size, c.kv_tiers.write_through, timeout_s)
        self.core = SchedulerCore(msg, batch, self.telemetry, tiers, spec_config(c), self.overlap)
        self.runner_ready = True
        await self.draft.calibrate(
            self.core, self.to_runner, self.inbox, early, c.supervision.heartbeat_timeout
        )
        for m in early:
            if not await self.dispatch(m):
                raise RuntimeError("shut down while starting")
        return f"{msg.num_pages} pages, batch budget {batch.max_batch_tokens} tokens"

    def wake_in(self) -> float | None:
        """Seconds until something waited for times out (None: nothing is waited for)."""
        waits = []
        if self.core.is_looking_up():
            waits.append(0.05)  # lower-tier lookups time out: look now and then
        if self.draft.is_waiting:
            waits.append(max(self.draft.time_left(), 0.0))
        group_wait = self.core.group_wait_s()
        if group_wait is not None:
            waits.append(group_wait)
        if self.core.num_in_flight and not self.stuck_reported:
            left = self.config.supervision.heartbeat_timeout - self.core.at_runner_s()
            waits.append(max(left, 0.0))
        return min(waits) if waits else None

    async def on_quiet(self) -> None:
        """Nothing arrived in time: give up on late proposals, report a stuck runner."""
        if self.draft.is_waiting and self.draft.time_left() <= 0:
            self.draft.on_timeout(self.core)
        waited = self.core.at_runner_s()
        if self.core.num_in_flight and not self.stuck_reported:
            if waited > self.config.supervision.heartbeat_timeout:
                self.stuck_reported = True
                reason = f"the scheduler has waited {waited:.0f} s for a step result"
                await self.to_launcher.send(ActorStuck(name="runner", reason=reason))
        await self._maybe_step()

    async def handle(self, msg: SchedulerInbox | DraftReply) -> None:
        core = self.core
        match msg:
            case TokenizedRequest():
                try:
                    core.add(msg)
                except Rejected as e:  # 400 it never fits, 429 the queue is full
                    ev = TokenEvent(
                        rid=msg.rid, token_ids=[], finish_reason="error", failure=e.failure
                    )
                    await self.to_tokenizer.send(TokenBatch([ev]))
            case AbortRequest(rid=rid):
                core.abort(rid)
            case FinishRequest(rid=rid):
                core.finish(rid)
            case StepResult(step_id=step_id):
                if not core.is_in_flight(step_id):
                    return  # from a runner that was replaced: stale
                t0 = time.time()
                events = core.apply(msg)
                if events:
                    await self.to_tokenizer.send(TokenBatch(events, stamps_of(msg, t0)))
                core.record_work(t0, time.time(), overlapped=core.num_in_flight > 0)
            case StatsQuery(query_id=qid, rid=rid):
                stats = msgspec.structs.replace(
                    core.engine_stats(),
                    request_known=None if rid is None else int(core.knows(rid)),
                    step_in_flight=core.num_in_flight,
                    runner_ready=int(self.runner_ready),
                    telemetry_dropped=self.telemetry.num_dropped,
                )
                await self.to_gateway.send(StatsReply(query_id=qid, stats=stats))
            case HostSlotGrant() | TierLookupResult() | TierStats():
                core.on_tier_reply(msg)
            case DraftReply():
                self.draft.on_reply(core, msg)
            case RunnerInfo():
                if not self.runner_ready:  # the replacement of a runner that died
                    events = core.on_runner_info(msg)
                    if events:
                        await self.to_tokenizer.send(TokenBatch(events))
                    self.runner_ready = True

    async def on_peer_up(self, name: str) -> None:
        if name == "draft":
            self.draft.on_up()

    async def on_peer_down(self, name: str) -> None:
        core = self.core
        if name == "runner":  # its KV is gone: fail everything, start over on a new pool
            events = core.fail_all(unavailable("the model runner stopped and is restarting; retry"))
            if events:
                await self.to_tokenizer.send(TokenBatch(events))
            await self.draft.flush_releases(core)
            core.restart_pool()
            self.stuck_reported = self.runner_ready = False
        elif name == "tokenizer":  # nobody can receive these requests' text any more
            core.abort_all()
        elif name == "kv_tiers":
            core.reset_tiers()
        elif name == "draft":
            self.draft.on_down(core)

    async def after_messages(self) -> None:
        await self._maybe_step()

    async def _maybe_step(self) -> None:
        draft, core = self.draft, self.core
        if self.runner_ready and core.has_work and not core.num_in_flight:
            # with speculation, proposals may be asked for first: then wait for them
            if not await draft.before_plan(core):
                await self._send_plan()
        if core.num_in_flight == 1 and self.overlap and core.has_work:
            if core.can_plan_ahead():  # overlap: planned while the step in flight runs
                await self._send_plan()
        await draft.flush_releases(core)
        for m in core.tier_messages():
            await self.to_tiers.send(m)

    async def _send_plan(self) -> None:
        """Plan the next step and send it (timed for the overlap scheduler's ledger)."""
        t0 = time.time()
        ahead = self.core.num_in_flight > 0
        plan = self.core.next_plan()
        self.draft.after_plan()
        if plan is not None:
            self.stuck_reported = False
            plan.sent_at = time.time()  # the token path's stamp (StepStamps)
            await self.to_runner.send(plan)
        self.core.record_work(t0, time.time(), overlapped=ahead)


def stamps_of(result: StepResult, received: float) -> StepStamps:
    """The token path's stamps of ``result``'s step (``houchu.transport.token_path``)
    as its ``TokenBatch`` leaves: ``received`` (wall-clock seconds) is when this actor
    took the result; ``tokens_sent`` is now (the result applied)."""
    return StepStamps(
        step_id=result.step_id,
        plan_sent=result.plan_sent_at,
        plan_received=result.received_at,
        step_started=result.started_at,
        step_s=result.duration_s,
        forward_s=result.forward_s,
        sample_s=result.sample_s,
        result_sent=result.sent_at,
        result_received=received,
        tokens_sent=time.time(),
    )
