"""The model runner actor: receives step plans, runs them on the model, returns tokens.

A thin loop around ``houchu.runner.model_runner.ModelRunner``, which owns the weights and the
device KV pool. Steps run one at a time, in the order their plans arrive, on one worker
thread that does all of this process's torch work (loading, compiling, stepping), so the
event loop stays responsive during a long step: it keeps sending heartbeats, with the
seconds the current step has run (``busy_s``). Each executed step is reported to the
recorder as a ``StepRecord`` (compute time, batch, tokens).

The event loop hands each plan to the worker thread as it arrives, and the worker
thread sends the step's result to the scheduler itself as soon as the step ends
(``ThreadOutbox``): between a step's end and the next plan's start the loop is woken
once, for the plan, not for the result. It collects the steps' records for the recorder
every ``REPORT_S`` seconds (``_report_steps``). A plan that arrives while a step runs
(the overlap scheduler sends step N+1's plan while N executes) is queued on the worker
thread behind that step, which goes from one to the next without waiting for the loop.

Its ``RunnerInfo`` (pool geometry and the limits every request must fit:
``houchu.transport.limits``) goes to the scheduler, the tokenizer and the gateway once
the model is loaded, and again to any of them that is replaced (``ActorDown``). When
the scheduler is replaced, the runner also drops every request's state (the new
scheduler knows none of them); the new scheduler waits for the ``RunnerInfo`` before it
plans.
"""

from __future__ import annotations

import asyncio
import os
import time
import traceback
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, NamedTuple

import zmq.asyncio

from houchu.actors.heap import HeapTrimmer
from houchu.options.serve_config import ServeConfig
from houchu.startup_errors import StartupFailure
from houchu.transport.actor_base import ActorBase
from houchu.transport.channel import ThreadOutbox
from houchu.transport.failures import internal, unavailable
from houchu.transport.messages import Phase, RunnerInbox, RunnerInfo, StepPlan, StepResult
from houchu.transport.telemetry import LeverSample, StepRecord

if TYPE_CHECKING:
    from houchu.runner.model_runner import ModelRunner

#: The actors besides the scheduler that read the runner's limits from its ``RunnerInfo``.
INFO_READERS = ("tokenizer", "gateway")
#: seconds between checks of the tensor-parallel ranks' processes while idle
RANK_WATCH_S = 1.0
#: seconds between two collections of the finished steps' records (``_report_steps``)
REPORT_S = 0.1


def step_record(plan: StepPlan, t: float, duration_s: float) -> StepRecord:
    """The step record of ``plan`` (started at ``t``, wall-clock seconds; ``duration_s``
    seconds long): its tokens counted by the phase the scheduler gave each work item
    (``SeqWork.phase``), and the step's phase, "prefill", "decode" or "mixed"."""
    prefill = decode = 0
    for w in plan.work:
        if w.phase is Phase.DECODE:
            decode += len(w.token_ids)
        else:
            prefill += len(w.token_ids)
    phase = "mixed" if prefill and decode else ("prefill" if prefill else "decode")
    return StepRecord(plan.step_id, t, duration_s, len(plan.work), prefill, decode, phase)


class StepDone(NamedTuple):
    """What the torch thread hands back for one step: its ``result`` for the scheduler,
    its ``record`` (None for a step of no work) and ``levers`` for the recorder."""

    result: StepResult
    record: StepRecord | None
    levers: list[LeverSample]


class RunnerActor(ActorBase[RunnerInbox]):
    """Owns the model; one inbox of ``StepPlan`` messages from the scheduler."""

    name = "runner"

    def __init__(self, ctx: zmq.asyncio.Context, config: ServeConfig) -> None:
        super().__init__(ctx, config.endpoints, RunnerInbox)
        self.config = config
        self.to_scheduler = self.peers.outbox("scheduler")
        #: the torch thread's own link to the scheduler, for the steps' results (used
        #: and reconnected on that thread only)
        self.results_to = ThreadOutbox(ctx, config.endpoints["scheduler"])
        #: who is told the runner's limits (``RunnerInfo``), by actor name
        self.to_info = {"scheduler": self.to_scheduler}
        self.to_info.update({name: self.peers.outbox(name) for name in INFO_READERS})
        self.runner = None
        self.telemetry = self.telemetry_to(config.recorder_address())
        self.levers_sent_at = 0.0
        # all torch work on one thread: thread-local torch state stays consistent
        self.torch = ThreadPoolExecutor(1, thread_name_prefix="houchu-runner")
        self.step_started: float | None = None  # time.monotonic() of the running step
        self.heap = HeapTrimmer()
        self.rank_lost = False  # a tensor-parallel rank is gone: exit after the result
        #: the steps handed to the torch thread, in plan order, not yet reported
        self.steps: deque[Future[StepDone]] = deque()

    async def start(self) -> str:
        launch = self.config.launch
        loop = asyncio.get_running_loop()
        from houchu.gpu.triton.probe import TritonUnusable
        from houchu.model.quant.calibration import CalibrationError
        from houchu.model.quant.functions import QuantShapeError

        try:
            self.runner = await loop.run_in_executor(self.torch, self._load)
        except (TritonUnusable, QuantShapeError, CalibrationError) as exc:  # said in one line
            raise StartupFailure(str(exc)) from exc
        from houchu.model.expert_load import ExpertLoadReader

        self.expert_load = ExpertLoadReader(self.runner.model)  # each step's, for its record
        if self.config.kv_tiers.enabled:
            from houchu.cache_tiers.host_pool import HostPool

            self.host_pool = HostPool(
                launch.host_pool_name, launch.host_pool_pages, launch.host_slot_bytes
            )
            self.runner.attach_host_pool(self.host_pool)
            print(f"houchu runner: {self.runner.host_kv.describe()}", flush=True)
        self.runner.grammar.warm()  # structured output's tokenizer, in the background
        info = self.info()
        self.telemetry.start()
        self.spawn(self._trim_when_idle())
        # a failure outside a step's own (which fails only its requests), raised on the
        # torch thread, ends the actor as one in the loop does
        self.spawn(self._report_steps(), vital=True)
        if self.runner.tp is not None:
            self.spawn(self._watch_ranks())
        for out in self.to_info.values():
            await out.send(info)
        return (
            f"{info.model_name}: {info.num_pages} pages x {info.page_size} tokens, "
            f"context {info.max_context}"
        )

    def _load(self) -> ModelRunner:
        """The model runner of ``config.model`` with the runner options (``--device``
        and the rest of the "model runner" flags); with ``--speculative mtp``, its MTP
        proposer (``houchu.speculative.mtp``; ``MTPUnavailable`` when the checkpoint has none).
        """
        from houchu.runner.model_runner import ModelRunner

        runner = ModelRunner(self.config.model, self.config.runner)
        spec = self.config.speculation
        if spec.proposes_in_runner:
            from houchu.speculative.mtp import attach_mtp

            info = attach_mtp(runner, self.config.model, spec.num_speculative_tokens)
            print(f"houchu runner: {info}", flush=True)
        return runner

    def info(self) -> RunnerInfo:
        """This runner's geometry and limits (``RunnerInfo``)."""
        return self.runner.info()

    def busy_s(self) -> float:
        """Seconds the current step has run (0 between steps); sent with heartbeats."""
        started = self.step_started
        return 0.0 if started is None else time.monotonic() - started

    async def _trim_when_idle(self) -> None:
        """Return the freed heap to the OS once a busy period is over (``HeapTrimmer``);
        on the torch thread, so it never runs beside a step."""
        if not self.heap.available:
            return
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.heap.idle_s / 2)
            if self.heap.due() and self.idle():
                await loop.run_in_executor(self.torch, self.heap.trim)

    async def _watch_ranks(self) -> None:
        """Tensor parallel: check the other ranks' processes every ``RANK_WATCH_S``
        seconds; one that died while the server was idle restarts the runner at once,
        so ``/health`` stops answering ready instead of the next request failing."""
        from houchu.runner.tensor_parallel.ranks import dead_rank

        while True:
            await asyncio.sleep(RANK_WATCH_S)
            if self.idle() and (why := dead_rank(self.runner.tp)):
                print(f"houchu runner: {why}; exiting to restart every rank", flush=True)
                self._exit_for_ranks()

    def _exit_for_ranks(self) -> None:
        """Exit (status 1) after a lost rank, killing the ranks left first (a hung one
        would outlive this process), so that the supervisor restarts every rank."""
        from houchu.runner.tensor_parallel.ranks import kill_ranks

        kill_ranks(self.runner.tp)
        os._exit(1)

    async def handle(self, msg: RunnerInbox) -> None:
        if isinstance(msg, StepPlan):
            received = time.time()  # the token path's stamp (StepStamps)
            self.steps.append(self.torch.submit(self._run_step, msg, received, True))

    async def on_peer_down(self, name: str) -> None:
        if name == "scheduler":
            # on the torch thread, after every step already taken (whose results go to
            # the old process, dropped): the results' link starts afresh, and the new
            # scheduler knows none of the old requests: forget them
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self.torch, self._forget_scheduler)
        if name in self.to_info:  # its replacement learns the limits again
            await self.to_info[name].send(self.info())

    def _forget_scheduler(self) -> None:
        """The scheduler was replaced (on the torch thread): reconnect the results' link
        and drop every request's state."""
        self.results_to.reconnect()
        self.runner.forget_requests()

    def idle(self) -> bool:
        """No step is running or queued, and every step is reported."""
        return self.step_started is None and not self.steps

    async def _step(self, plan: StepPlan) -> StepResult:
        """Run ``plan`` alone on the torch thread and report it to the recorder; its
        result, not sent (the torch thread sends the result of each plan the loop
        takes)."""
        loop = asyncio.get_running_loop()
        done = await loop.run_in_executor(self.torch, self._run_step, plan, time.time(), False)
        self._report(done)
        return done.result

    def _run_step(self, plan: StepPlan, received: float, send: bool) -> StepDone:
        """Run ``plan`` (on the torch thread); with ``send``, send its result to the
        scheduler at once. Returns the result, with the token path's stamps (when the
        plan was sent, and taken here at ``received``, wall-clock seconds), the step's
        record and, once a second, the runner's lever samples."""
        t_wall = time.time()
        t0 = time.perf_counter()
        self.step_started = time.monotonic()
        try:
            result = self._execute(plan)
        finally:
            self.step_started = None
            self.heap.note_step()
        elapsed = time.perf_counter() - t0
        result.plan_sent_at, result.received_at = plan.sent_at, received
        if send:
            result.sent_at = time.time()  # the token path's stamp (StepStamps)
            self.results_to.send(result)
        record = None
        if plan.work:
            record = step_record(plan, t_wall, elapsed)
            record.expert_load = self.expert_load.take()  # [] for a dense model
            if self.runner.tp is not None:  # the step's collectives, rank 0's view
                record.allreduce_s = result.allreduce_s
        levers = []
        if time.monotonic() - self.levers_sent_at > 1.0:  # the runner's levers, once a second
            self.levers_sent_at = time.monotonic()
            levers = self.runner.lever_samples()
        return StepDone(result, record, levers)

    async def _report_steps(self) -> None:
        """Every ``REPORT_S`` seconds, hand the finished steps' records and levers to the
        recorder, in plan order (the torch thread sent their results). Raises what a
        step raised outside its own failure (which ``_execute`` answers); after a step
        that lost a tensor-parallel rank, exits (its requests were told why)."""
        while True:
            await asyncio.sleep(REPORT_S)
            while self.steps and self.steps[0].done():
                self._report(self.steps.popleft().result())
            if self.rank_lost:  # restart every rank
                await asyncio.sleep(0.2)  # let the result leave before exiting
                self._exit_for_ranks()

    def _report(self, done: StepDone) -> None:
        """Hand a step's record and levers to the recorder's buffer."""
        if done.record is not None:
            self.telemetry.step(done.record)
        for sample in done.levers:
            self.telemetry.lever(sample)

    def _execute(self, plan: StepPlan) -> StepResult:
        t0 = time.perf_counter()
        try:
            return self.runner.execute(plan)
        except Exception as e:  # a bad plan or a kernel failure fails its requests only
            traceback.print_exc()  # the whole story, for the log
            error = internal(f"{type(e).__name__}: {e}")
            if self.runner.tp is not None and self.runner.tp.broken:
                # a rank is gone: the step's requests get a plain message (TPRankLost's),
                # then the runner exits (_report_steps) so that the supervisor restarts every rank
                from houchu.runner.tensor_parallel.group import TPRankLost

                lost = str(e) if isinstance(e, TPRankLost) else "a tensor-parallel rank stopped"
                print(f"houchu runner: {lost}; exiting to restart every rank", flush=True)
                error = unavailable(f"{lost}; the model runner is restarting, retry")
                self.rank_lost = True
            return StepResult(
                step_id=plan.step_id,
                outputs=[],
                duration_s=time.perf_counter() - t0,
                num_tokens=0,
                error=error,
            )

    async def on_close(self) -> None:
        self.results_to.close()
        self.torch.shutdown(wait=False, cancel_futures=True)
        if self.runner is not None:  # a tensor-parallel runner's other ranks
            self.runner.close()
