"""The measured parts of a ``ModelRunner``'s start-up: the decode paths per batch bucket
(``houchu.model.autotune``), the accelerated decode step (``houchu.model.accel``: the
compiled step or CUDA graphs, kept only where measured faster) and the lever counters
that account for both."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from houchu.model.accel import DecodeAccelerator
from houchu.model.attention import AttentionBackend
from houchu.model.autotune import Tuned, available_paths, tune_model
from houchu.model.config import resolve_model_file
from houchu.model.decisions import DecisionCache, model_key
from houchu.model.kv_pool import KVPool
from houchu.model.lever_counters import LeverCounters, StepCost
from houchu.model.quant import QuantSpec


@dataclass
class RunnerSetup:
    """What the measurements need: the loaded model (``torch.nn.Module``) and its dtype and
    device, its KV pool and attention backend, the model's path (the decision cache's
    key), its quantization and the decode batch buckets (tokens)."""

    model: torch.nn.Module
    dtype: torch.dtype
    device: torch.device
    pool: KVPool
    backend: AttentionBackend
    model_path: str | Path
    quant: QuantSpec
    buckets: tuple[int, ...]

    def _key(self, *extra: object) -> str:
        """The decision cache's key of this model, format, pool and backend."""
        return model_key(
            resolve_model_file(self.model_path),
            self.quant.label(),
            self.dtype,
            self.pool.k.dtype,
            self.backend.name,
            self.model.fused is not None,
            self.buckets,
            *extra,
        )

    def tune(self) -> Tuned | None:
        """Measure the decode paths per bucket (or read the cached measurement)."""
        m = self.model
        # the candidate paths in the key: a measurement without a path timed now is stale
        key = self._key(tuple(available_paths(m)))
        return tune_model(m, self.pool, self.backend, self.buckets, DecisionCache(), key)

    def accelerator(self, compile: str, cuda_graph: bool, tuned: Tuned | None) -> DecodeAccelerator:
        """The decode accelerator (compiled step / CUDA graphs), set up: measured against
        the eager step, or its verdict read from the cache on CPU."""
        on_cpu = self.device.type == "cpu"
        accel = DecodeAccelerator(
            self.model,
            self.pool,
            self.backend,
            compile=compile,
            cuda_graph=cuda_graph,
            buckets=self.buckets,
            verdicts=DecisionCache() if on_cpu else None,
            verdict_key=self._key(tuned.route.table if tuned else None),
        )
        accel.setup()
        return accel

    def levers(self, accel: DecodeAccelerator, kv_dtype: str) -> LeverCounters:
        """The lever counters: the weight and KV bytes per step against bf16, and what
        the accelerator measured (``kv_dtype``: the KV cache's ``--kv-cache-dtype``)."""
        wb, wb16 = self.model.weight_bytes()
        p = self.pool
        cost = StepCost(
            wb, wb16, p.bytes_per_token, p.bf16_bytes_per_token, self.quant.label(), kv_dtype
        )
        a = accel
        return LeverCounters(
            cost,
            a.kind,
            a.eager_step_s,
            a.accel_step_s,
            a.setup_s,
            a.kv_rel_error,
            a.dropped,
            cached=a.cached,
        )
