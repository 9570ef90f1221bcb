"""Baseline target: Hugging Face transformers' ``generate()`` with static batching, in
process.

Requests queue up; whenever the model is free, every waiting request (up to
``max_batch``) becomes one left-padded batch and one ``generate()`` call, which runs
until its longest member is done — what a server built on ``generate()`` does. A
stopping-criteria hook timestamps every decoding step, so each request gets the same
timings as a streamed one: its k-th token arrives at step k, it ends at its own last
token. Token counts are exact (the ids themselves).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from houchu.bench.backends.base import GenParams, fail
from houchu.bench.metrics import RequestResult
from houchu.bench.workloads import Message, RequestSpec


@dataclass
class _Job:
    ids: list[int]
    max_tokens: int
    result: RequestResult
    future: asyncio.Future[None]


class HFBackend:
    """Static-batching ``generate()`` on a GGUF file or a Hugging Face model folder.

    Args:
        model_path: a ``.gguf`` file (dequantized by transformers) or a model folder.
        params: request settings (greedy when ``temperature`` is 0).
        max_batch: most requests per ``generate()`` call.
        threads: torch CPU threads (None: leave torch's default).
    """

    name = "hf"

    def __init__(
        self, model_path: Path, params: GenParams, max_batch: int = 16, threads: int | None = None
    ) -> None:
        self.model_path = Path(model_path)
        self.params = params
        self.max_batch = max(1, max_batch)
        self.threads = threads
        self._queue: asyncio.Queue[_Job] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        self._model: Any = None
        self._tok: Any = None

    def info(self) -> dict[str, Any]:
        """The model path, batch cap and threads."""
        return {
            "backend": self.name,
            "model_path": str(self.model_path),
            "max_batch": self.max_batch,
            "threads": self.threads,
        }

    async def start(self) -> None:
        """Load the model (in a thread) and start the batching loop."""
        await asyncio.to_thread(self._load)
        self._worker = asyncio.create_task(self._loop())

    def _load(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if self.threads:
            torch.set_num_threads(self.threads)
        p = self.model_path
        kw: dict[str, Any] = {"gguf_file": p.name} if p.suffix == ".gguf" else {}
        where = str(p.parent) if p.suffix == ".gguf" else str(p)
        self._tok = AutoTokenizer.from_pretrained(where, **kw)
        self._tok.padding_side = "left"
        self._model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32, **kw).eval()

    async def close(self) -> None:
        """Stop the batching loop (a running batch finishes first)."""
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
            self._worker = None

    def encode(self, spec: RequestSpec, history: list[Message]) -> list[int]:
        """Prompt ids: the chat template, or the raw prompt's tokens."""
        if self.params.use_chat(spec, history):
            ids = self._tok.apply_chat_template(
                spec.chat(history), add_generation_prompt=True, tokenize=True
            )
            return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        return list(self._tok(spec.completion(history))["input_ids"])

    async def generate(
        self, spec: RequestSpec, history: list[Message], result: RequestResult
    ) -> None:
        """Queue one request for the next batch and wait for it; never raises."""
        loop = asyncio.get_running_loop()
        job = _Job(self.encode(spec, history), spec.max_tokens, result, loop.create_future())
        result.input_tokens = len(job.ids)
        await self._queue.put(job)
        try:
            await asyncio.wait_for(asyncio.shield(job.future), self.params.timeout_s)
        except asyncio.TimeoutError:
            fail(
                result,
                "timeout",
                f"not done within {self.params.timeout_s:g} s",
                time.perf_counter(),
            )
            job.future.cancel()

    async def _loop(self) -> None:
        while True:
            jobs = [await self._queue.get()]
            while len(jobs) < self.max_batch and not self._queue.empty():
                jobs.append(self._queue.get_nowait())
            jobs = [j for j in jobs if not j.future.done()]
            if not jobs:
                continue
            try:
                steps, out = await asyncio.to_thread(self._run_batch, jobs)
            except Exception as exc:  # a failed batch fails its requests, not the run
                for j in jobs:
                    if not j.future.done():
                        fail(
                            j.result,
                            "server_error",
                            f"generate() failed: {exc}",
                            time.perf_counter(),
                        )
                        j.future.set_result(None)
                continue
            for j, ids in zip(jobs, out, strict=True):
                if j.future.done():
                    continue
                self._finish(j, ids, steps)
                j.future.set_result(None)

    def _finish(self, job: _Job, ids: list[int], steps: list[float]) -> None:
        r = job.result
        n = len(ids)
        r.token_times = steps[:n]
        r.end = steps[n - 1] if n else time.perf_counter()
        r.output_tokens = r.counted_tokens = n
        r.usage_reported = True
        r.text = self._tok.decode(ids, skip_special_tokens=True)

    def _run_batch(self, jobs: list[_Job]) -> tuple[list[float], list[list[int]]]:
        """One ``generate()`` over ``jobs``; returns step times and each job's new ids."""
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        steps: list[float] = []

        class _Clock(StoppingCriteria):
            def __call__(
                self, input_ids: torch.Tensor, scores: torch.Tensor, **kw: Any
            ) -> torch.Tensor:
                steps.append(time.perf_counter())
                return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

        pad = self._tok.pad_token_id if self._tok.pad_token_id is not None else 0
        width = max(len(j.ids) for j in jobs)
        input_ids = torch.tensor([[pad] * (width - len(j.ids)) + j.ids for j in jobs])
        mask = torch.tensor([[0] * (width - len(j.ids)) + [1] * len(j.ids) for j in jobs])
        new = max(j.max_tokens for j in jobs)
        kw: dict[str, Any] = {"max_new_tokens": new, "pad_token_id": pad}
        if self.params.ignore_eos:
            kw["min_new_tokens"] = new
        if self.params.temperature > 0:
            kw.update(do_sample=True, temperature=self.params.temperature)
        else:
            kw["do_sample"] = False
        with torch.inference_mode():
            out = self._model.generate(
                input_ids=input_ids,
                attention_mask=mask,
                stopping_criteria=StoppingCriteriaList([_Clock()]),
                **kw,
            )
        eos = set(self._eos_ids())
        result = []
        for row, j in zip(out[:, width:].tolist(), jobs, strict=True):
            ids = row[: j.max_tokens]
            if not self.params.ignore_eos:
                cut = next((k for k, t in enumerate(ids) if t in eos), None)
                ids = ids if cut is None else ids[:cut]
            result.append(ids)
        return steps, result

    def _eos_ids(self) -> list[int]:
        cfg = self._model.generation_config
        eos = cfg.eos_token_id
        return [] if eos is None else (list(eos) if isinstance(eos, list) else [eos])
