"""W8A8 linear layers (compute less): int8 weights and dynamically quantized int8
activations through an int8 GEMM (``torch._int_mm``: int8 × int8 → int32, per-token
activation scales, per-channel weight scales), used from ``W8A8_MIN_ROWS`` rows, where a
step is compute-bound (prefill, large batches); fewer rows run the weight-only int8
kernel of ``Int8Linear``, which this layer extends. On the CPU, houchu's C++ kernels do
the float work around the GEMM (``quant.cpp``: column absmax, row quantization, and an
epilogue that adds the outlier features' product and can apply SiLU·mul). On a CUDA GPU
with FP8 tensor cores (compute capability ≥ 9.0) the layer runs ``torch._scaled_mm`` on
float8_e4m3fn with row-wise scales instead.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from houchu.cpu import isa as cpu_isa
from houchu.cpu import kernels as cpu_kernels
from houchu.model.linear.quantized import Int8Linear
from houchu.model.quant.functions import quantize_fp8, quantize_rows_int8

#: W8A8: rows from which the int8 GEMM runs; below, the weight-only int8 GEMV (fused into
#: the decode layers on the CPU), which at 32 rows took 37 ms per SmolLM2 step to the
#: GEMM's 96 ms (runner_bench; at K = 576 the GEMM's quantize, outlier and epilogue
#: passes outweigh its int8 rate)
W8A8_MIN_ROWS = 64
#: W8A8: share of input features per GEMM that are not quantized (multiplied as they are
#: with the int8 weight's columns, float32 sums), the ones of largest magnitude in the
#: batch (after LLM.int8(), Dettmers et al. 2022, which picks them by a threshold of 6.0;
#: a fixed count keeps the shapes static for torch.compile). Top-1 agreement with the
#: exact path on the quality test's English text in 64-token chunks: 0.888 with none,
#: 0.946 with 16 per GEMM; with 1/16 (36 of 576, 96 of 1536) 0.951 on an AMD EPYC but
#: 0.947 (bf16) on an AMX Xeon, whose bf16 ops round differently; with 1/8 (72 of 576,
#: 192 of 1536) 0.953 (bf16) and 0.959 (float32) there, for 25-30% more time per GEMM
#: than 1/16 (512 rows; 1/6 gains 0.003 more for 45%). Weight-only int8 reaches 0.961.
W8A8_OUTLIER_SHARE = 1 / 8
_CPU_FUSED = (torch.float32, torch.bfloat16)  # dtypes of the C++ W8A8 kernels


def _cuda_fp8_ok(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (9, 0)


class W8A8Linear(Int8Linear):
    """int8 weights and dynamically quantized int8 activations (FP8 on capable GPUs).

    Below ``w8a8_min_rows`` rows (bandwidth-bound decode) it runs as ``Int8Linear``; from
    there on it quantizes each activation row (``quantize_rows_int8``) and multiplies with
    ``torch._int_mm``: ``y = (x_q @ w_qᵀ) · s_x · s_w``, except for outlier input features,
    which are not quantized (``_int8_gemm``, after LLM.int8()).

    Args:
        w: ``[N, K]`` float weight.
        device: where the layer runs.
        fmt: "int8", "fp8", or None (fp8 on a CUDA GPU of compute capability ≥ 9.0).
        w8a8_min_rows: rows from which the quantized GEMM is used.
        num_outliers: int8 format: input features per GEMM left unquantized
            (``_int8_gemm``; None: ``W8A8_OUTLIER_SHARE`` of them); 0 quantizes all.
    """

    def __init__(
        self,
        w: torch.Tensor,
        device: torch.device | str = "cpu",
        fmt: str | None = None,
        w8a8_min_rows: int = W8A8_MIN_ROWS,
        num_outliers: int | None = None,
    ) -> None:
        super().__init__(w, device)
        dev = torch.device(device)
        self.fmt = fmt or ("fp8" if _cuda_fp8_ok(dev) else "int8")
        if self.fmt not in ("int8", "fp8"):
            raise ValueError(f"W8A8 format must be int8 or fp8, got {fmt!r}")
        self.kind, self.w8a8_min_rows = f"w8a8-{self.fmt}", w8a8_min_rows
        if num_outliers is None:
            num_outliers = max(1, int(self.in_features * W8A8_OUTLIER_SHARE))
        self.num_outliers = num_outliers
        if self.fmt == "fp8":
            q8, s8 = quantize_fp8(w)
            self.register_buffer("q_fp8", q8.to(dev))  # [N, K] float8_e4m3fn
            self.register_buffer("wscale_fp8", s8.to(dev)[None, :])  # [1, N] float32

    def weight_bytes_at(self, rows: int) -> int:
        return self.weight_bytes() if rows >= self.w8a8_min_rows else super().weight_bytes_at(rows)

    def gemv_blob(self, rows: int) -> tuple[torch.Tensor, int] | None:
        return None if rows >= self.w8a8_min_rows else super().gemv_blob(rows)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: ``[M, K]`` -> ``[M, N]``, same dtype as x."""
        m = x.shape[0]
        if m < self.w8a8_min_rows or not self._int8_gemm_here(x):
            return super().forward(x)
        if self.fmt == "fp8":
            pad = (-m) % 16  # FP8 GEMMs want 16-aligned shapes
            xq, xs = quantize_fp8(F.pad(x, (0, 0, 0, pad)) if pad else x)
            y = torch._scaled_mm(
                xq,
                self.q_fp8.t(),
                scale_a=xs[:, None],
                scale_b=self.wscale_fp8,
                out_dtype=self.act_dtype,
            )[:m]
            return y.to(x.dtype)
        return self._int8_gemm(x).to(x.dtype)

    def forward_silu_mul(
        self, x: torch.Tensor, silu_mul: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        """``silu_mul(self(x))``: x ``[M, K]`` -> ``[M, N / 2]``, x's dtype; on the C++
        GEMM path the activation runs in the epilogue's pass (same values: both halves
        are rounded to x's dtype before it)."""
        if x.shape[0] < self.w8a8_min_rows or not self._fused_at(x) or not self._int8_gemm_here(x):
            return super().forward_silu_mul(x, silu_mul)
        c = min(self.num_outliers, x.shape[1])
        return self._int8_gemm_fused(x.contiguous(), c, silu_mul=True)

    def _int8_gemm_here(self, x: torch.Tensor) -> bool:
        """Whether the quantized-activation GEMM runs for x: FP8 always; int8 only where
        ``torch._int_mm`` is exact and faster than the dense matmul (``int_mm_pays``),
        else the rows run weight-only."""
        return self.fmt != "int8" or x.device.type != "cpu" or int_mm_pays()

    def _fused_at(self, x: torch.Tensor) -> bool:
        """Whether the int8 GEMM of x runs on houchu's C++ kernels: at the x86 levels,
        whose epilogue has AVX-512 or AVX2 tiles (the NEON levels' is the portable loop:
        torch's vectorized ops serve there instead)."""
        return (
            self.fmt == "int8"
            and x.device.type == "cpu"
            and x.dtype in _CPU_FUSED
            and cpu_kernels.is_loaded()
            and cpu_isa.x86_kernels(cpu_kernels.active_level())
        )

    def _int8_gemm(self, x: torch.Tensor) -> torch.Tensor:
        """x: ``[M, K]`` -> ``[M, N]`` through ``torch._int_mm`` (float32 on the torch
        path, x's dtype on the fused one), with LLM.int8()'s mixed-precision
        decomposition: the ``num_outliers`` input features of largest magnitude in the
        batch are not quantized but multiplied as they are with the int8 weight's
        columns (exact products, summed in float32), the rest quantized per token;
        ``y = (acc · s_x + x_out · w_qᵀ[cols]) · s_w``. A per-token scale is set by the
        row's largest value, so one outlier feature of 100 would otherwise round every
        ordinary feature of that row to a handful of levels."""
        c = min(self.num_outliers, x.shape[1])
        if self._fused_at(x):
            return self._int8_gemm_fused(x.contiguous(), c)
        xf = x.float() if x.dtype != torch.float32 else x.clone()  # [M, K], ours to change
        if c:
            cols = xf.abs().amax(0).topk(c).indices  # [C]
            x_cols = xf.index_select(1, cols)  # [M, C]
            w_cols = self.q.index_select(1, cols).float()  # [N, C], int8 values (exact)
            xf.index_fill_(1, cols, 0.0)
        xq, xs = quantize_rows_int8(xf)  # [M, K] int8, [M, 1] float32
        y = torch._int_mm(xq, self.q.t()) * xs  # [M, N] int32 -> float32
        if c:
            y.addmm_(x_cols, w_cols.t())
        return y.mul_(self.wscale)

    def _int8_gemm_fused(self, x: torch.Tensor, c: int, silu_mul: bool = False) -> torch.Tensor:
        """``_int8_gemm`` with houchu's C++ kernels around ``torch._int_mm`` (one pass
        each for the column absmax and the quantization; the outliers' product, and with
        ``silu_mul`` the activation, in the epilogue's pass). x: ``[M, K]`` contiguous
        float32/bfloat16 -> ``[M, N]`` (``[M, N / 2]`` with silu_mul) in x's dtype."""
        k = cpu_kernels.ops()
        cols = k.col_absmax(x).topk(c).indices if c else x.new_empty(0, dtype=torch.int64)
        xq, xs, x_cols = k.quantize_rows_int8(x, cols)  # [M, K] int8, [M, 1] fp32, [M, C]
        acc = torch._int_mm(xq, self.q.t())  # [M, N] int32
        return k.int8_epilogue(acc, xs, self.wscale, x_cols, self.q, cols, silu_mul)


@functools.cache
def int_mm_exact() -> bool:
    """Whether the CPU's ``torch._int_mm`` is exact on int8 extremes (probed once). On a
    CPU without int8 dot products (no AVX512-VNNI / AVX-VNNI / AMX), oneDNN multiplies
    with ``vpmaddubsw``, whose 16-bit pair sums saturate: W8A8's int8 GEMM is then wrong
    as well as slow, and W8A8 layers run their int8 weights weight-only instead (printed
    once)."""
    k = 64
    a = torch.full((8, k), 127, dtype=torch.int8)
    b = torch.full((k, 8), 127, dtype=torch.int8)
    exact = bool((torch._int_mm(a, b) == k * 127 * 127).all())
    if not exact:
        print(
            "houchu: torch._int_mm saturates on this CPU (no int8 dot products): W8A8 layers "
            "run their int8 weights weight-only",
            file=sys.stderr,
        )
    return exact


#: The GEMM ``int_mm_pays`` times: a 128-token prefill through a 1024 x 1024 projection.
PROBE_SHAPE = (128, 1024, 1024)
#: How much slower than the dense matmul the int8 GEMM may be and still run: a near tie
#: (7.4 against 7.1 ms on an AMX Xeon, busy) keeps it, as a noisy probe must not flip
#: W8A8's numbers between starts; oneDNN held to AVX2_VNNI there took 1.9x (17.6 ms).
INT_MM_SLOWER = 1.5


@functools.cache
def int_mm_pays() -> bool:
    """Whether W8A8's int8 GEMM runs on this CPU (probed once, printed when not): where
    ``torch._int_mm`` is exact (``int_mm_exact``) and, on a ``PROBE_SHAPE`` GEMM, less
    than ``INT_MM_SLOWER`` times the dense matmul that weight-only rows of that size run
    (in the CPU layers' activation dtype; the fastest of 5 alternated calls each).
    Measured, not assumed from the CPU's flags: with oneDNN held to AVX2_VNNI on an
    AVX-512 host, a 128-token W8A8 prefill took 720 ms against the weight-only path's
    203 ms."""
    if not int_mm_exact():
        return False
    from houchu.model.linear.quantized import quant_act_dtype

    m, k, n = PROBE_SHAPE
    g = torch.Generator().manual_seed(0)
    a = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=g)  # [M, K]
    b = torch.randint(-127, 128, (k, n), dtype=torch.int8, generator=g)  # [K, N]
    dtype = quant_act_dtype("cpu")
    af, bf = a.to(dtype), b.to(dtype)
    best = {"int8": float("inf"), "dense": float("inf")}
    torch._int_mm(a, b), af @ bf  # warm-up: first-call costs
    for _ in range(5):
        for name, run in (("int8", lambda: torch._int_mm(a, b)), ("dense", lambda: af @ bf)):
            t0 = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - t0)
    if best["int8"] < INT_MM_SLOWER * best["dense"]:
        return True
    print(
        f"houchu: torch._int_mm is slower than the dense matmul on this CPU "
        f"({best['int8'] * 1e3:.2f} ms against {best['dense'] * 1e3:.2f} ms for "
        f"{m}x{k}x{n}): W8A8 layers run their int8 weights weight-only",
        file=sys.stderr,
    )
    return False
