"""The accelerated decode step, set up once at startup: ``torch.compile`` on the CPU
(``houchu.cpu.compiled``), CUDA graphs on a CUDA GPU (``houchu.gpu.cuda_graph``), or
none. Setup times one warm-up decode step eagerly and accelerated (the lever ledger's
"eager vs compiled step time") and, with a quantized KV pool, measures the quantization
error on that step's real K/V.

A compiled step is only kept where it pays: setup compiles the smallest bucket first,
times a warm-up step of that size both ways, and unless the compiled one is at least
10% faster (``KEEP_BELOW``; measured on the benchmark machine's CPU: the projections' oneDNN matmuls are ~80% of a
SmolLM2-135M decode step and Dynamo's per-call guards cost about what fusing the glue
saves) it stops there and decodes eagerly, saying so; else it compiles the rest.
CUDA graphs are always kept (they remove per-kernel launch costs a GPU step is made of).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import torch

from houchu.cpu import kernels as cpu_kernels
from houchu.cpu.isa import forced_below_best
from houchu.model.attention.base import AttentionBackend
from houchu.model.batch import StepBatch, warmup_batch
from houchu.model.kv.pool import KVPool, dequantize_kv, quantize_kv
from houchu.model.llama import LlamaModel
from houchu.runner.autotune import FUSED_PATHS
from houchu.runner.decisions import DecisionCache

KEEP_BELOW = 0.9  # "auto" keeps the compiled step only if at least 10% faster


class _ErrorProbe(AttentionBackend):
    """Wraps a backend; accumulates the int8/fp8 round-trip error of the K/V it stores."""

    def __init__(self, inner: AttentionBackend, pool: KVPool) -> None:
        self.inner, self.pool = inner, pool
        self.err2 = self.ref2 = 0.0

    def prepare(self, batch: StepBatch, layers: tuple = ()) -> Any:
        return self.inner.prepare(batch, layers)

    def forward(self, layer, q, k, v, pool, batch, meta):  # noqa: ANN001 (see base class)
        for x, dt in ((k, pool.k.dtype), (v, pool.v.dtype)):
            back = dequantize_kv(*quantize_kv(x, dt), torch.float32)
            self.err2 += float((back - x.float()).pow(2).sum())
            self.ref2 += float(x.float().pow(2).sum())
        return self.inner.forward(layer, q, k, v, pool, batch, meta)


class DecodeAccelerator:
    """Runs decode-only steps compiled or graph-replayed where it can.

    Args:
        model, pool, backend: the runner's.
        compile: "off", "auto" (keep the compiled step only if measured faster; on the
            CPU not compiled where the model's measured route runs the fused C++ layers
            at its smallest bucket) or "on"
            (``torch.compile``; any device, on CUDA only without graphs).
        cuda_graph: capture CUDA graphs (CUDA only; needs a backend with a static
            decode path).
        buckets: batch sizes compiled / captured.
        verdicts, verdict_key: where "auto"'s verdict (compiled faster or not) is kept
            between starts, and its key: a cached "not faster" skips the compilation.
    Raises:
        ValueError: an unknown ``compile`` policy.
    """

    def __init__(
        self,
        model: LlamaModel,
        pool: KVPool,
        backend: AttentionBackend,
        *,
        compile: str,
        cuda_graph: bool,
        buckets: tuple[int, ...],
        verdicts: DecisionCache | None = None,
        verdict_key: str = "",
    ) -> None:
        self.model, self.pool, self.backend = model, pool, backend
        self.keep_slower = compile == "on"
        self.impl: Any = None
        self.kind: str | None = None
        dev = model.embed.device
        if (
            compile == "auto"
            and dev.type == "cpu"
            and forced_below_best(cpu_kernels.active_level())
        ):
            # houchu's kernels at a forced lower level inside graphs Inductor compiled for
            # this CPU's own (higher) level have corrupted the heap (not with torch held
            # to the level too, as on a CPU of that level): auto does not compile there
            print(
                f"houchu runner: --compile auto skipped at the forced CPU ISA level "
                f"{cpu_kernels.active_level()} (below this CPU's best); decoding eagerly",
                flush=True,
            )
            compile = "off"
        route = getattr(model, "route", None)  # the decode paths measured (model.autotune)
        first = route.path_for(min(route.table)) if route is not None and route.table else None
        if compile == "auto" and dev.type == "cpu" and first in FUSED_PATHS:
            # the compiled step runs each layer's pieces as graphs around the kernels, one
            # projection at a time: it cannot run the fused layers (all layers in one C++
            # call) that the route measured fastest, so measuring it would only be thrown
            # away (7.6 ms compiled against 3.6 ms fused at batch 1, AVX512-BF16)
            print(
                f"houchu runner: --compile auto skipped: the decode route runs the fused "
                f"C++ layers ({first}) at batch {min(route.table)}; decoding eagerly",
                flush=True,
            )
            compile = "off"
        if model.cfg.is_mla and (compile != "off" or (cuda_graph and dev.type == "cuda")):
            # MLA layers attend inside the model (model.mla), not through layer.pre/post
            print(
                "houchu runner: MLA models decode eagerly (no compiled step, no CUDA graphs)",
                flush=True,
            )
            compile, cuda_graph = "off", False
        # a MoE step's shapes depend on its routing (tokens per expert): not capturable;
        # the static decode path attends plainly (no window, scale or soft-cap)
        plain = all(s.is_plain for s in model.attention)
        static = getattr(backend, "supports_static", False)
        if dev.type == "cuda" and cuda_graph and static and model.cfg.is_moe:
            print(
                "houchu runner: CUDA graphs are off for MoE models: a step's shapes depend on "
                "its routing (tokens per expert)",
                flush=True,
            )
            static = False
        if dev.type == "cuda" and cuda_graph and static and not plain:
            print(
                "houchu runner: CUDA graphs are off: the static decode path does not compute "
                "this model's sliding windows, score scale or soft-capping",
                flush=True,
            )
            static = False
        if dev.type == "cuda" and cuda_graph and static:
            from houchu.gpu.cuda_graph import CudaGraphDecode

            self.impl, self.kind = CudaGraphDecode(model, pool, backend, buckets), "cuda_graph"
        elif compile not in ("off", "auto", "on"):
            raise ValueError(f"compile must be off, auto or on, got {compile!r}")
        elif compile != "off":
            from houchu.cpu.compiled import CompiledDecode

            self.impl, self.kind = CompiledDecode(model, buckets), "compiled_decode"
        self.setup_s = 0.0
        self.eager_step_s: float | None = None
        self.accel_step_s: float | None = None
        self.kv_rel_error: float | None = None
        self.dropped = False  # compiled, measured slower, not used
        self.cached = False  # the verdict came from the cache (nothing compiled)
        self.verdicts, self.verdict_key = verdicts, verdict_key

    def setup(self) -> None:
        """Compile / capture, time a warm-up step both ways, keep what pays."""
        impl, n = self.impl, min(8, self.pool.num_pages)
        known = self._known_verdict()
        if known is not None:  # measured slower at an earlier start: not compiled again
            self.impl, self.dropped, self.cached = None, True, True
            self.eager_step_s, self.accel_step_s = known["eager_s"], known["compiled_s"]
            if self.pool.quantized:
                self._probe_kv_error(self._warmup_batch(n))
            return
        if self.kind == "compiled_decode":
            n = min(n, impl.buckets[0])
            try:
                self.setup_s = impl.warmup(impl.buckets[:1])
            except Exception as e:  # noqa: BLE001 (Inductor raises many kinds; "auto" survives all)
                if self.keep_slower:  # "on": the user asked for it
                    raise
                msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
                print(f"houchu: torch.compile failed ({msg}); decoding eagerly", file=sys.stderr)
                impl, self.impl, self.dropped = None, None, True
        elif impl is not None:
            self.setup_s = impl.warmup()
            n = min(n, impl.buckets[-1])
        batch = self._warmup_batch(n)
        with torch.inference_mode():
            if self.pool.quantized:
                self._probe_kv_error(batch)
            self.eager_step_s = _best_time(lambda: self.model(batch, self.pool, self.backend))
            if impl is not None:
                self.accel_step_s = _best_time(lambda: self.forward(batch))
        if self.kind == "compiled_decode" and impl is not None:
            if self.accel_step_s > KEEP_BELOW * self.eager_step_s and not self.keep_slower:
                self.impl, self.dropped = None, True
            else:
                self.setup_s += impl.warmup(impl.buckets[1:])
            if self.verdicts is not None and not self.keep_slower:
                verdict = {"keep": not self.dropped, "eager_s": self.eager_step_s}
                self.verdicts.put(
                    "compile", self.verdict_key, verdict | {"compiled_s": self.accel_step_s}
                )

    def _known_verdict(self) -> dict | None:
        """A cached "compiled is not faster" for "auto", else None."""
        if self.kind != "compiled_decode" or self.keep_slower or self.verdicts is None:
            return None
        v = self.verdicts.get("compile", self.verdict_key)
        return v if isinstance(v, dict) and v.get("keep") is False else None

    def _probe_kv_error(self, batch: StepBatch) -> None:
        """The quantized KV pool's relative RMS error on one step's real K/V."""
        with torch.inference_mode():
            probe = _ErrorProbe(self.backend, self.pool)
            self.model(batch, self.pool, probe)
            self.kv_rel_error = (probe.err2 / max(probe.ref2, 1e-30)) ** 0.5

    def _warmup_batch(self, n: int) -> StepBatch:
        """n one-token sequences on pages 0..n-1 (``batch.warmup_batch``)."""
        return warmup_batch(
            n,
            page_size=self.pool.page_size,
            num_pages=self.pool.num_pages,
            vocab_size=self.model.cfg.vocab_size,
            device=self.model.embed.device,
        )

    def forward(self, batch: StepBatch) -> torch.Tensor | None:
        """``[R, vocab]`` float32 logits if this step ran accelerated, else None (the
        caller runs the model eagerly)."""
        if self.impl is None or batch.prompt_seqs:  # a prompt's rows: the prefill kernel
            return None
        bucket = self.impl.bucket(batch)
        if bucket is None:
            return None
        return self.impl.forward(batch, self.pool, self.backend, bucket)


def _best_time(fn: Any, reps: int = 3) -> float:
    """Fastest of ``reps`` calls of ``fn``, in seconds (after one untimed call)."""
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best
