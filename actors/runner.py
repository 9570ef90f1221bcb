"""The model runner actor: receives step plans, runs them on the model, returns tokens.

A thin loop around ``houchu.gpu.runner.ModelRunner``, which owns the weights and the
device KV pool. Steps run one at a time, in the order their plans arrive. Each executed
step is reported to the recorder as a ``StepRecord`` (compute time, batch, tokens).
"""

from __future__ import annotations

import time
import traceback

import zmq.asyncio

from houchu.actors.config import ServeConfig
from houchu.transport.channel import BadMessage, Inbox, Outbox
from houchu.transport.messages import RunnerInbox, Shutdown, StepPlan, StepResult
from houchu.transport.telemetry import StepRecord, Telemetry


class PromptLengths:
    """Prompt length of each registered request, to tell prefill work from decode."""

    def __init__(self) -> None:
        self._len: dict[str, int] = {}

    def update(self, plan: StepPlan) -> None:
        """Register the plan's new requests (call before the step runs)."""
        for init in plan.init:
            self._len[init.rid] = len(init.prompt_ids)

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
        self.to_scheduler = Outbox(ctx, config.endpoints["scheduler"])
        self.runner = None
        address = config.endpoints["recorder"] if config.telemetry else None
        self.telemetry = Telemetry(ctx, address, self.name)
        self.prompts = PromptLengths()
        self.levers_sent_at = 0.0

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
            quantization=c.quantization,
            group_size=c.quant_group_size,
            kv_cache_dtype=c.kv_cache_dtype,
            attention_backend=c.attention_backend,
            compile=c.compile,
            decode_buckets=tuple(c.decode_batch_sizes),
            cuda_graph=c.cuda_graph,
        )
        if c.kv_tiers:
            from houchu.cache_tiers.host_pool import HostPool

            self.host_pool = HostPool(c.host_kv_name, c.host_kv_pages, c.host_slot_bytes)
            self.runner.attach_host_pool(self.host_pool)
        info = self.runner.info()
        self.telemetry.start()
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
        t_wall = time.time()
        t0 = time.perf_counter()
        self.prompts.update(plan)
        try:
            result = self.runner.execute(plan)
        except Exception as e:  # a bad plan or a kernel failure fails its requests only
            traceback.print_exc()
            result = StepResult(
                step_id=plan.step_id,
                outputs=[],
                duration_s=time.perf_counter() - t0,
                num_tokens=0,
                error=f"{type(e).__name__}: {e}",
            )
        if plan.work:
            self.telemetry.step(self.prompts.record(plan, t_wall, time.perf_counter() - t0))
        self.prompts.release(plan)
        if time.monotonic() - self.levers_sent_at > 1.0:  # the runner's levers, once a second
            self.levers_sent_at = time.monotonic()
            for sample in self.runner.lever_samples():
                self.telemetry.lever(sample)
        return result

    async def close(self) -> None:
        await self.telemetry.close()
        self.inbox.close()
        self.to_scheduler.close()
