"""The scheduler actor's link to the draft actor (speculative decoding).

Before each plan the scheduler asks the draft for proposals and waits for them — at most
one request in flight, at most ``draft_timeout_s`` seconds, after which it steps without
proposals (a late reply is then only read for its pool counters). Requests that left are
released in the draft as soon as possible. At start-up the link times target passes to
seed the cost model that decides when speculation pays (``houchu.speculative.calibrate``).

While the draft actor is down (``ActorDown`` until ``ActorUp``) the scheduler steps
without proposals; the replacement starts empty, so every request's mirror is resent.

With ``--speculative mtp`` there is no draft actor: the runner proposes with each step's
result (``houchu.speculative.mtp``) and the link (``RunnerProposals``) only calibrates.
"""

from __future__ import annotations

import time

import zmq.asyncio

from houchu.options.serve_config import ServeConfig
from houchu.options.speculation_options import SpeculativeOptions
from houchu.scheduler.core import SchedulerCore
from houchu.speculative.calibrate import best_times, calibration_plans, calibration_sizes
from houchu.startup_errors import ShutdownBeforeReady
from houchu.transport.channel import Inbox, Outbox
from houchu.transport.messages import Shutdown, StepResult
from houchu.transport.peers import Peers, receive
from houchu.transport.spec_messages import DraftReply


def spec_config(config: ServeConfig) -> SpeculativeOptions | None:
    """The scheduler's speculation settings (None: off)."""
    return config.speculation if config.speculation.enabled else None


class CalibratesTarget:
    """Seeds speculation's cost model with timed target passes at start-up (the
    scheduler's links that speculate: ``DraftLink``, ``RunnerProposals``)."""

    async def calibrate(
        self,
        core: SchedulerCore,
        to_runner: Outbox,
        inbox: Inbox,
        stash: list,
        timeout_s: float = 600.0,
    ) -> int:
        """Time target passes of 1, 2, 4, ... tokens on the runner and feed the cost
        model. Other messages arriving meanwhile are appended to ``stash``. Returns the
        sizes timed (0 if the pool is too small to hold the dummy sequence).

        Raises:
            RuntimeError: the runner failed a calibration step or did not answer within
                ``timeout_s`` seconds, or a shutdown came.
        """
        sizes = calibration_sizes(core.calibration_tokens())
        pages = core.lend_pages(sizes[-1])
        if not pages:
            return 0
        plans = calibration_plans(sizes, pages)
        seconds: list[float] = []
        try:
            for plan in plans:
                await to_runner.send(plan)
                while True:
                    msg = await receive(inbox, "scheduler", timeout_s)
                    if msg is None:
                        raise RuntimeError(f"no calibration step result in {timeout_s:.0f} s")
                    if isinstance(msg, StepResult):
                        break
                    if isinstance(msg, Shutdown):
                        raise ShutdownBeforeReady("shut down during calibration")
                    stash.append(msg)
                if msg.error is not None:
                    raise RuntimeError(f"calibration step failed: {msg.error}")
                if plan.work:
                    seconds.append(msg.duration_s)
        finally:
            core.return_pages(pages)
        core.seed_spec_costs(best_times(sizes, seconds))
        return len(sizes)


class DraftLink(CalibratesTarget):
    """Asks the draft actor for proposals and attaches them to the scheduler core.

    Args:
        ctx: the process's ZeroMQ context.
        config: the serving configuration (draft endpoint, timeout).
        peers: the scheduler's links, to follow the draft actor's restarts (None: a
            plain outbox).
    """

    def __init__(
        self, ctx: zmq.asyncio.Context, config: ServeConfig, peers: Peers | None = None
    ) -> None:
        if peers is not None:
            self.out = peers.outbox("draft")
        else:
            self.out = Outbox(ctx, config.endpoints["draft"])
        self.is_up = True  # False from the draft actor's death until its replacement is up
        self.timeout_s = config.timings.draft_timeout_s
        self.waiting: int | None = None  # query id the next plan waits for
        self.sent_at = 0.0  # time.perf_counter() of that query
        self.ready = False  # proposals for the next plan are attached (or none wanted)
        self.num_timeouts = 0

    @property
    def is_waiting(self) -> bool:
        return self.waiting is not None

    def time_left(self) -> float:
        """Seconds until the awaited reply times out (<= 0: it has)."""
        return self.sent_at + self.timeout_s - time.perf_counter()

    async def before_plan(self, core: SchedulerCore) -> bool:
        """Call when a plan could be built now. True: wait (proposals were asked for)."""
        if self.waiting is not None:
            return True
        if self.ready or not self.is_up:
            return False
        req = core.draft_request()
        if req is None:
            self.ready = True
            return False
        self.waiting, self.sent_at = req.query_id, time.perf_counter()
        await self.out.send(req)
        return True

    def after_plan(self) -> None:
        """A plan was built: the next one needs fresh proposals."""
        self.ready = False

    def on_reply(self, core: SchedulerCore, reply: DraftReply) -> None:
        if reply.error is not None:
            print(f"houchu scheduler: draft failed: {reply.error}", flush=True)
        if reply.query_id != self.waiting:
            # A release, or a reply that came too late: only its pool counters are news
            # (after a failure there, the next awaited reply fails too and resyncs).
            core.on_draft_stats(reply)
            return
        core.attach_drafts(reply, time.perf_counter() - self.sent_at)
        self.waiting, self.ready = None, True

    def on_timeout(self, core: SchedulerCore) -> None:
        """The awaited reply did not come in time: plan without proposals."""
        self.num_timeouts += 1
        core.abandon_drafts()
        self.waiting, self.ready = None, True

    async def flush_releases(self, core: SchedulerCore) -> None:
        """Tell the draft about requests that left (frees their draft KV now)."""
        req = core.draft_release()
        if req is not None and self.is_up:
            await self.out.send(req)

    def on_down(self, core: SchedulerCore) -> None:
        """The draft actor died: stop waiting, speculate no more until it is back, and
        resend every request's tokens to its replacement (which starts empty)."""
        if self.waiting is not None:
            core.abandon_drafts()
            self.waiting = None
        self.is_up, self.ready = False, False
        core.on_draft_down()

    def on_up(self) -> None:
        """The draft actor's replacement is ready: speculate again."""
        self.is_up = True


class NoDraftLink:
    """``DraftLink``'s stand-in when speculation is off: never waits, asks nothing."""

    is_waiting = False

    def time_left(self) -> float:
        """Nothing is awaited."""
        return 0.0

    async def before_plan(self, core: SchedulerCore) -> bool:
        """Never wait: plan now."""
        return False

    def after_plan(self) -> None:
        """Nothing to refresh."""

    def on_reply(self, core: SchedulerCore, reply: DraftReply) -> None:
        """No draft actor answers this scheduler."""

    def on_timeout(self, core: SchedulerCore) -> None:
        """Nothing was awaited."""

    async def flush_releases(self, core: SchedulerCore) -> None:
        """No draft KV to free."""

    def on_down(self, core: SchedulerCore) -> None:
        """No draft actor."""

    def on_up(self) -> None:
        """No draft actor."""

    async def calibrate(self, core: SchedulerCore, *args: object, **kw: object) -> int:
        """No cost model to feed: nothing timed."""
        return 0


class RunnerProposals(CalibratesTarget, NoDraftLink):
    """``--speculative mtp``: the runner proposes with each step's result, so there is
    nothing to ask or wait for; only the cost model is seeded at start-up, as with a
    draft actor."""


def make_link(ctx: zmq.asyncio.Context, config: ServeConfig, peers: Peers) -> Draft:
    """The scheduler's link for ``config.speculation``: a draft actor's, the runner's
    proposals (MTP), or none."""
    spec = config.speculation
    if spec.uses_draft_actor:
        return DraftLink(ctx, config, peers)
    return RunnerProposals() if spec.proposes_in_runner else NoDraftLink()


#: What the scheduler actor holds: the link, or its stand-in when speculation is off.
Draft = DraftLink | NoDraftLink | RunnerProposals
