"""The model runner actor: receives step plans, runs them on the model, returns tokens.

A thin loop around ``houchu.model.model_runner.ModelRunner``, which owns the weights and the
device KV pool. Steps run one at a time, in the order their plans arrive, on one worker
thread that does all of this process's torch work (loading, compiling, stepping), so the
event loop stays responsive during a long step: it keeps sending heartbeats, with the
seconds the current step has run (``busy_s``). Each executed step is reported to the
recorder as a ``StepRecord`` (compute time, batch, tokens).

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
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import zmq.asyncio

from houchu.actors.config import ServeConfig
from houchu.actors.heap import HeapTrimmer
from houchu.actors.startup_errors import StartupFailure
from houchu.transport.channel import Inbox
from houchu.transport.failures import internal, unavailable
from houchu.transport.messages import (
    ActorDown,
    ActorUp,
    RunnerInbox,
    RunnerInfo,
    Shutdown,
    StepPlan,
    StepResult,
)
from houchu.transport.peers import Peers, serve
from houchu.transport.telemetry import StepRecord, Telemetry

if TYPE_CHECKING:
    from houchu.model.model_runner import ModelRunner

#: The actors besides the scheduler that read the runner's limits from its ``RunnerInfo``.
INFO_READERS = ("tokenizer", "gateway")
#: seconds between checks of the tensor-parallel ranks' processes while idle
RANK_WATCH_S = 1.0


class PromptLengths:
    """Prompt length of each registered request, to tell prefill work from decode."""

    def __init__(self) -> None:
        self._len: dict[str, int] = {}

    def update(self, plan: StepPlan) -> None:
        """Register the plan's new requests (call before the step runs)."""
        for init in plan.init:
            self._len[init.rid] = len(init.prompt_ids)

    def clear(self) -> None:
        """Forget every request (the scheduler that sent them is gone)."""
        self._len.clear()

    def release(self, plan: StepPlan) -> None:
        """Forget the requests the plan releases (call after the step ran)."""
        for rid in plan.release:
            self._len.pop(rid, None)

    def record(self, plan: StepPlan, t: float, duration_s: float) -> StepRecord:
        """The step record of ``plan``: one new token at or past the prompt is decode, and
        so is a token with proposals to verify; anything else (prompt chunks,
        recomputation after preemption) is prefill."""
        prefill = decode = 0
        for w in plan.work:
            n = len(w.token_ids)
            if w.num_draft or (n == 1 and w.start_pos >= self._len.get(w.rid, 0)):
                decode += n  # a decode token, or one with proposals to verify
            else:
                prefill += n
        phase = "mixed" if prefill and decode else ("prefill" if prefill else "decode")
        return StepRecord(plan.step_id, t, duration_s, len(plan.work), prefill, decode, phase)


class RunnerActor:
    """Owns the model; one inbox of ``StepPlan`` messages from the scheduler."""

    name = "runner"

    def __init__(self, ctx: zmq.asyncio.Context, config: ServeConfig) -> None:
        self.config = config
        self.inbox: Inbox[RunnerInbox] = Inbox(ctx, config.endpoints["runner"], RunnerInbox)
        self.peers = Peers(ctx, config.endpoints)
        self.to_scheduler = self.peers.outbox("scheduler")
        #: who is told the runner's limits (``RunnerInfo``), by actor name
        self.to_info = {"scheduler": self.to_scheduler}
        self.to_info.update({name: self.peers.outbox(name) for name in INFO_READERS})
        self.runner = None
        address = config.recorder_address()
        self.telemetry = self.peers.track("recorder", Telemetry(ctx, address, self.name))
        self.prompts = PromptLengths()
        self.levers_sent_at = 0.0
        # all torch work on one thread: thread-local torch state stays consistent
        self.torch = ThreadPoolExecutor(1, thread_name_prefix="houchu-runner")
        self.step_started: float | None = None  # time.monotonic() of the running step
        self.heap = HeapTrimmer()
        self.trimmer: asyncio.Task[None] | None = None  # _trim_when_idle, from start()
        self.rank_lost = False  # a tensor-parallel rank is gone: exit after the result
        self.rank_watch: asyncio.Task[None] | None = None  # _watch_ranks, with tp only

    async def start(self) -> str:
        launch = self.config.launch
        loop = asyncio.get_running_loop()
        from houchu.model.calibration import CalibrationError
        from houchu.model.ops import TritonUnusable
        from houchu.model.quant import QuantShapeError

        try:
            self.runner = await loop.run_in_executor(self.torch, self._load)
        except (TritonUnusable, QuantShapeError, CalibrationError) as exc:  # said in one line
            raise StartupFailure(str(exc)) from exc
        from houchu.model.expert_load import ExpertLoadReader

        self.expert_load = ExpertLoadReader(self.runner.model)  # each step's, for its record
        if self.config.kv_tiers.enabled:
            from houchu.kvcache.host_pool import HostPool

            self.host_pool = HostPool(
                launch.host_pool_name, launch.host_pool_pages, launch.host_slot_bytes
            )
            self.runner.attach_host_pool(self.host_pool)
            print(f"houchu runner: {self.runner.host_kv.describe()}", flush=True)
        self.runner.grammar.warm()  # structured output's tokenizer, in the background
        info = self.info()
        self.telemetry.start()
        self.trimmer = asyncio.create_task(self._trim_when_idle())
        if self.runner.tp is not None:
            self.rank_watch = asyncio.create_task(self._watch_ranks())
        for out in self.to_info.values():
            await out.send(info)
        return (
            f"{info.model_name}: {info.num_pages} pages x {info.page_size} tokens, "
            f"context {info.max_context}"
        )

    def _load(self) -> ModelRunner:
        """The model runner of ``config.model`` with the runner options (``--device``
        and the rest of the "model runner" flags); with ``--speculative mtp``, its MTP
        proposer (``houchu.spec.mtp``; ``MTPUnavailable`` when the checkpoint has none).
        """
        from houchu.model.model_runner import ModelRunner

        runner = ModelRunner(self.config.model, self.config.runner)
        spec = self.config.speculation
        if spec.proposes_in_runner:
            from houchu.spec.mtp import attach_mtp

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

    async def run(self) -> None:
        await serve(self.inbox, self._handle, self.name)

    async def _trim_when_idle(self) -> None:
        """Return the freed heap to the OS once a busy period is over (``HeapTrimmer``);
        on the torch thread, so it never runs beside a step."""
        if not self.heap.available:
            return
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.heap.idle_s / 2)
            if self.heap.due() and self.step_started is None:
                await loop.run_in_executor(self.torch, self.heap.trim)

    async def _watch_ranks(self) -> None:
        """Tensor parallel: check the other ranks' processes every ``RANK_WATCH_S``
        seconds; one that died while the server was idle restarts the runner at once,
        so ``/health`` stops answering ready instead of the next request failing."""
        from houchu.model.tp_worker import dead_rank

        while True:
            await asyncio.sleep(RANK_WATCH_S)
            if self.step_started is None and (why := dead_rank(self.runner.tp)):
                print(f"houchu runner: {why}; exiting to restart every rank", flush=True)
                self._exit_for_ranks()

    def _exit_for_ranks(self) -> None:
        """Exit (status 1) after a lost rank, killing the ranks left first (a hung one
        would outlive this process), so that the supervisor restarts every rank."""
        from houchu.model.tp_worker import kill_ranks

        kill_ranks(self.runner.tp)
        os._exit(1)

    async def _handle(self, msg: RunnerInbox) -> bool:
        """Act on one message; False on ``Shutdown``."""
        match msg:
            case StepPlan():
                await self.to_scheduler.send(await self._step(msg))
                if self.rank_lost:  # its requests are told why; restart every rank
                    await asyncio.sleep(0.2)  # let the result leave before exiting
                    self._exit_for_ranks()
            case ActorDown(name=name):
                if not await self.peers.replaced(name, self.inbox, self._handle, self.name):
                    return False
                if name == "scheduler":
                    # the new scheduler knows none of the old requests: forget them all
                    loop = asyncio.get_running_loop()
                    await loop.run_in_executor(self.torch, self.runner.forget_requests)
                    self.prompts.clear()
                if name in self.to_info:  # its replacement learns the limits again
                    await self.to_info[name].send(self.info())
            case ActorUp():
                pass
            case Shutdown():
                return False
        return True

    async def _step(self, plan: StepPlan) -> StepResult:
        """Run ``plan`` on the torch thread; report it to the recorder."""
        loop = asyncio.get_running_loop()
        t_wall = time.time()
        t0 = time.perf_counter()
        self.prompts.update(plan)
        self.step_started = time.monotonic()
        try:
            result = await loop.run_in_executor(self.torch, self._execute, plan)
        finally:
            self.step_started = None
            self.heap.note_step()
        if plan.work:
            record = self.prompts.record(plan, t_wall, time.perf_counter() - t0)
            record.expert_load = self.expert_load.take()  # [] for a dense model
            if self.runner.tp is not None:  # the step's collectives, rank 0's view
                record.allreduce_s = result.allreduce_s
            self.telemetry.step(record)
        self.prompts.release(plan)
        if time.monotonic() - self.levers_sent_at > 1.0:  # the runner's levers, once a second
            self.levers_sent_at = time.monotonic()
            for sample in self.runner.lever_samples():
                self.telemetry.lever(sample)
        return result

    def _execute(self, plan: StepPlan) -> StepResult:
        t0 = time.perf_counter()
        try:
            return self.runner.execute(plan)
        except Exception as e:  # a bad plan or a kernel failure fails its requests only
            traceback.print_exc()  # the whole story, for the log
            error = internal(f"{type(e).__name__}: {e}")
            if self.runner.tp is not None and self.runner.tp.broken:
                # a rank is gone: the step's requests get a plain message (TPRankLost's),
                # then the runner exits (_handle) so that the supervisor restarts every rank
                from houchu.model.tp_group import TPRankLost

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

    async def close(self) -> None:
        for task in (self.trimmer, self.rank_watch):
            if task is not None:
                task.cancel()
        await self.telemetry.close()
        self.inbox.close()
        self.peers.close()
        self.torch.shutdown(wait=False, cancel_futures=True)
        if self.runner is not None:  # a tensor-parallel runner's other ranks
            self.runner.close()
