"""The scheduler actor: the loop that admits requests, plans steps and routes tokens.

receive -> (admit | abort | apply result | answer stats) -> if no step is in flight, send
the next plan. The domain logic lives in ``houchu.scheduler``.
"""

from __future__ import annotations

import time

import zmq.asyncio

from houchu.actors.config import ServeConfig
from houchu.actors.draft_link import DraftLink, spec_config
from houchu.scheduler.batcher import BatchConfig
from houchu.scheduler.core import Rejected, SchedulerCore
from houchu.scheduler.tiers import TierClient
from houchu.transport.channel import BadMessage, Inbox, Outbox
from houchu.transport.messages import (
    AbortRequest,
    RunnerInfo,
    SchedulerInbox,
    Shutdown,
    StatsQuery,
    StatsReply,
    StepResult,
    TokenBatch,
    TokenEvent,
    TokenizedRequest,
)
from houchu.transport.spec_messages import DraftReply
from houchu.transport.telemetry import Telemetry
from houchu.transport.tier_messages import HostSlotGrant, TierLookupResult, TierStats


class SchedulerActor:
    """Continuous batching between the tokenizer and the model runner."""

    name = "scheduler"

    def __init__(self, ctx: zmq.asyncio.Context, config: ServeConfig) -> None:
        self.config = config
        ep = config.endpoints
        self.inbox: Inbox[SchedulerInbox] = Inbox(ctx, ep["scheduler"], SchedulerInbox | DraftReply)
        self.to_runner = Outbox(ctx, ep["runner"])
        self.to_tokenizer = Outbox(ctx, ep["tokenizer"])
        self.to_gateway = Outbox(ctx, ep["gateway"])
        self.to_tiers = Outbox(ctx, ep["kv_tiers"])
        self.core: SchedulerCore | None = None
        self.telemetry = Telemetry(ctx, ep["recorder"] if config.telemetry else None, self.name)
        self.step_in_flight = False
        self.step_sent_at = 0.0
        self.draft = DraftLink(ctx, config) if config.speculative else None

    async def start(self) -> str:
        """Wait for the runner's pool geometry, then build the core (messages that arrive
        before it, such as the tier manager's first slot grant, are handled after)."""
        early: list[SchedulerInbox] = []
        while True:
            msg = await self.inbox.recv()
            if isinstance(msg, RunnerInfo):
                break
            if isinstance(msg, Shutdown):
                raise RuntimeError("shut down before the runner was ready")
            early.append(msg)
        c = self.config
        batch = BatchConfig(
            max_batch_tokens=c.max_batch_tokens, chunk_size=c.chunk_size, max_running=c.max_running
        )
        self.telemetry.start()
        tiers = None
        if c.kv_tiers:
            fingerprint = bytes.fromhex(c.kv_fingerprint)
            write_through = c.kv_write_policy == "write_through"
            tiers = TierClient(fingerprint, msg.page_size, write_through, c.tier_lookup_timeout_s)
        self.core = SchedulerCore(msg, batch, c.radix_cache, self.telemetry, tiers, spec_config(c))
        if self.draft is not None:
            await self.draft.calibrate(self.core, self.to_runner, self.inbox, early)
        for m in early:
            await self._handle(m)
        return f"{msg.num_pages} pages, batch budget {c.max_batch_tokens} tokens"

    async def run(self) -> None:
        while True:
            # Lower-tier lookups time out: wake up now and then while any is pending.
            if self.core.tiers is not None and self.core.tiers.lookups:
                if not await self.inbox.poll(0.05):
                    await self._maybe_step()
                    continue
            if self.draft is not None and self.draft.is_waiting:  # proposals time out too
                if not await self.inbox.poll(max(self.draft.time_left(), 0.0)):
                    self.draft.on_timeout(self.core)
                    await self._maybe_step()
                    continue
            try:
                msg = await self.inbox.recv()
            except BadMessage as e:
                print(f"houchu scheduler: dropped a bad message: {e}", flush=True)
                continue
            if isinstance(msg, Shutdown):
                return
            await self._handle(msg)
            while (more := self.inbox.recv_nowait()) is not None:  # drain before planning
                if isinstance(more, Shutdown):
                    return
                await self._handle(more)
            await self._maybe_step()

    async def _handle(self, msg: SchedulerInbox) -> None:
        core = self.core
        match msg:
            case TokenizedRequest():
                try:
                    core.add(msg)
                except Rejected as e:
                    ev = TokenEvent(
                        rid=msg.rid,
                        token_ids=[],
                        finish_reason="error",
                        error=str(e),
                        error_status=400,
                    )
                    await self.to_tokenizer.send(TokenBatch([ev]))
            case AbortRequest(rid=rid, reason=reason):
                core.abort(rid, reason)
            case StepResult():
                self.step_in_flight = False
                events = core.apply(msg)
                if events:
                    await self.to_tokenizer.send(TokenBatch(events))
            case StatsQuery(query_id=qid):
                stats = core.stats()
                stats["step_in_flight"] = int(self.step_in_flight)
                stats["telemetry_dropped"] = self.telemetry.num_dropped
                await self.to_gateway.send(StatsReply(query_id=qid, stats=stats))
            case HostSlotGrant():
                core.tiers.on_grant(msg)
            case TierLookupResult():
                core.tiers.on_result(msg)
            case TierStats(stats=stats):
                core.tiers.tier_stats = stats
            case DraftReply():
                self.draft.on_reply(core, msg)
            case RunnerInfo():
                pass

    async def _maybe_step(self) -> None:
        draft = self.draft
        if not self.step_in_flight and self.core.has_work:
            if draft is None or not await draft.before_plan(self.core):  # else: await proposals
                plan = self.core.next_plan()
                if draft is not None:
                    draft.after_plan()
                if plan is not None:
                    self.step_in_flight = True
                    self.step_sent_at = time.perf_counter()
                    await self.to_runner.send(plan)
        if draft is not None:
            await draft.flush_releases(self.core)
        if self.core.tiers is not None:
            for m in self.core.tiers.drain():
                await self.to_tiers.send(m)

    async def close(self) -> None:
        await self.telemetry.close()
        for s in (self.inbox, self.to_runner, self.to_tokenizer, self.to_gateway, self.to_tiers):
            s.close()
        if self.draft is not None:
            self.draft.out.close()
