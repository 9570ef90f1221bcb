"""The model runner actor: receives step plans, runs them on the model, returns tokens.

A thin loop around ``houchu.gpu.runner.ModelRunner``, which owns the weights and the
device KV pool. Steps run one at a time, in the order their plans arrive.
"""

from __future__ import annotations

import time
import traceback

import zmq.asyncio

from houchu.actors.config import ServeConfig
from houchu.transport.channel import BadMessage, Inbox, Outbox
from houchu.transport.messages import RunnerInbox, Shutdown, StepPlan, StepResult


class RunnerActor:
    """Owns the model; one inbox of ``StepPlan`` messages from the scheduler."""

    name = "runner"

    def __init__(self, ctx: zmq.asyncio.Context, config: ServeConfig) -> None:
        self.config = config
        self.inbox: Inbox[RunnerInbox] = Inbox(ctx, config.endpoints["runner"], RunnerInbox)
        self.to_scheduler = Outbox(ctx, config.endpoints["scheduler"])
        self.runner = None

    async def start(self) -> str:
        from houchu.gpu.runner import ModelRunner

        c = self.config
        self.runner = ModelRunner(
            c.model_path,
            dtype=c.dtype,
            page_size=c.page_size,
            num_pages=c.num_pages,
            kv_cache_memory_bytes=c.kv_cache_memory_bytes,
            max_context=c.max_context,
            num_threads=c.num_threads,
        )
        info = self.runner.info()
        await self.to_scheduler.send(info)
        return (
            f"{info.model_name}: {info.num_pages} pages x {info.page_size} tokens, "
            f"context {info.max_context}"
        )

    async def run(self) -> None:
        while True:
            try:
                msg = await self.inbox.recv()
            except BadMessage as e:
                print(f"houchu runner: dropped a bad message: {e}", flush=True)
                continue
            match msg:
                case StepPlan():
                    await self.to_scheduler.send(self._execute(msg))
                case Shutdown():
                    return

    def _execute(self, plan: StepPlan) -> StepResult:
        t0 = time.perf_counter()
        try:
            return self.runner.execute(plan)
        except Exception as e:  # a bad plan or a kernel failure fails its requests only
            traceback.print_exc()
            return StepResult(
                step_id=plan.step_id,
                outputs=[],
                duration_s=time.perf_counter() - t0,
                num_tokens=0,
                error=f"{type(e).__name__}: {e}",
            )

    async def close(self) -> None:
        self.inbox.close()
        self.to_scheduler.close()
