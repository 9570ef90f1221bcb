"""The measured parts of a ``ModelRunner``'s start-up: the decode paths per batch bucket
(``houchu.runner.autotune``), the accelerated decode step (``houchu.runner.accel``: the
compiled step or CUDA graphs, kept only where measured faster) and the lever counters
that account for both."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from houchu.cpu.threads import CpuLoad, ThreadGovernor
from houchu.gpu.memory import (
    DeviceFacts,
    PoolSize,
    activation_reserve_bytes,
    kv_pool_size,
)
from houchu.model.attention.base import AttentionBackend
from houchu.model.config.core import ModelConfig, resolve_model_file
from houchu.model.kv.page_pool import kv_page_bytes
from houchu.model.kv.pool import KVPool
from houchu.model.quant.functions import QuantSpec
from houchu.options.runner_options import RunnerOptions
from houchu.runner.accel import DecodeAccelerator
from houchu.runner.autotune import Tuned, available_paths, thread_priors, tune_model
from houchu.runner.decisions import DecisionCache, model_key
from houchu.runner.lever_counters import LeverCounters, StepCost, score_pair_bytes


def make_kv_pool(
    cfg: ModelConfig,
    o: RunnerOptions,
    dtype: torch.dtype,
    device: torch.device,
    kv_dtype: str,
    scratch_pages: int,
    facts: DeviceFacts | None,
) -> tuple[KVPool, PoolSize]:
    """The runner's KV pool, sized by ``--num-pages``, ``--mem-fraction-static`` (on a
    CUDA GPU: ``facts`` measured after the weights loaded) or ``--kv-cache-mb``
    (``houchu.gpu.memory.kv_pool_size``), and how it was sized. ``o.page_size``
    must be concrete (``houchu.runner.choices.resolve_attention``).

    Raises:
        ValueError: a budget below one page (``MemFractionError`` for the fraction), an
            unknown or inapplicable ``kv_dtype``.
    """
    assert o.page_size is not None
    elem = torch.empty((), dtype=dtype).element_size()
    size = kv_pool_size(
        num_pages=o.num_pages,
        kv_cache_mb=o.kv_cache_mb,
        mem_fraction=o.mem_fraction_static,
        facts=facts,
        page_bytes=kv_page_bytes(cfg, o.page_size, dtype, kv_dtype),
        reserve_bytes=activation_reserve_bytes(cfg, elem) if facts is not None else 0,
        scratch_pages=scratch_pages,
    )
    pool = KVPool.for_model(
        cfg,
        page_size=o.page_size,
        dtype=dtype,
        device=device,
        num_pages=size.num_pages,
        memory_bytes=size.memory_bytes,
        kv_dtype=kv_dtype,
        scratch_pages=scratch_pages,
    )
    return pool, size


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

    def governor(self, tuned: Tuned | None) -> ThreadGovernor:
        """The CPU thread governor (``houchu.cpu.threads``) over torch's thread count,
        starting each kind of step from what an earlier run settled on (the decision
        cache, kind "threads", keyed by this model, format, ISA level, kernel build,
        thread budget and route), else from the startup measurement's thread timings
        (``autotune.thread_priors``), and keeping what it settles on there."""
        cache = DecisionCache()
        key = self._key(tuned.route.table if tuned else None, "threads")
        threads = torch.get_num_threads()
        cached = thread_priors(tuned, threads)
        for kind, by_held in (cache.get("threads", key) or {}).items():
            cached.setdefault(kind, {}).update(
                {h: e for h, e in by_held.items() if h != "measured"}
            )
        load = CpuLoad()
        load.watch()  # the last quarter second's load, idle periods included
        return ThreadGovernor(
            threads, load=load, cached=cached, save=lambda v: cache.put("threads", key, v)
        )

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
        """The lever counters: the weight and KV bytes per step against bf16, the model
        dtype (16-bit compute is a lever against float32), and what the accelerator
        measured (``kv_dtype``: the KV cache's ``--kv-cache-dtype``)."""
        wb, wb16 = self.model.weight_bytes()
        p = self.pool
        half = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(self.dtype, "")
        cfg = getattr(self.model, "full_cfg", self.model.cfg)  # every rank's heads
        pair = score_pair_bytes(self.backend.name, cfg.num_layers, cfg.num_heads)
        cost = StepCost(
            wb,
            wb16,
            p.bytes_per_token,
            p.bf16_bytes_per_token,
            self.quant.label(),
            kv_dtype,
            half,
            pair,
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
