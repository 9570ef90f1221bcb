"""Fused Triton kernels for the model's memory-bound glue: RMSNorm (+ residual add),
RoPE, SiLU·mul, and the KV page store (with int8 / fp8 quantization). Each reads its
inputs once and writes its outputs once, where the torch reference (``houchu.model.ops``)
makes a pass per elementwise op.

Triton (Tillet et al. 2019) compiles for CUDA; on the CPU the same kernels run in
Triton's interpreter (``TRITON_INTERPRET=1``, set before this module is imported), which
is how the tests check them against the torch reference. Numerics follow the reference:
RMSNorm in float32, cast to the input dtype before the weight multiply; RoPE and SiLU in
float32 with one rounding at the end.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from houchu.model.ops import TorchOps


def _pow2(n: int) -> int:
    return triton.next_power_of_2(n)


@triton.jit
def _rms_norm_kernel(
    x_ptr, d_ptr, w_ptr, y_ptr, r_ptr, n, eps, HAS_RES: tl.constexpr, BLOCK: tl.constexpr
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < n
    x = tl.load(x_ptr + row * n + cols, mask=m, other=0.0)
    if HAS_RES:
        x = x + tl.load(d_ptr + row * n + cols, mask=m, other=0.0)
        tl.store(r_ptr + row * n + cols, x, mask=m)
    xf = x.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / n + eps)
    y = (xf * inv).to(x.dtype)
    w = tl.load(w_ptr + cols, mask=m, other=0.0)
    tl.store(y_ptr + row * n + cols, (w * y).to(x.dtype), mask=m)


@triton.jit
def _rope_kernel(
    x_ptr, cos_ptr, sin_ptr, o_ptr, sx_t, sx_h, n_heads, HALF: tl.constexpr, BLOCK: tl.constexpr
):
    t = tl.program_id(0)
    h = tl.program_id(1)
    i = tl.arange(0, BLOCK)
    m = i < HALF
    src = x_ptr + t * sx_t + h * sx_h
    x1 = tl.load(src + i, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF + i, mask=m, other=0.0).to(tl.float32)
    c1 = tl.load(cos_ptr + t * 2 * HALF + i, mask=m, other=0.0).to(tl.float32)
    c2 = tl.load(cos_ptr + t * 2 * HALF + HALF + i, mask=m, other=0.0).to(tl.float32)
    s1 = tl.load(sin_ptr + t * 2 * HALF + i, mask=m, other=0.0).to(tl.float32)
    s2 = tl.load(sin_ptr + t * 2 * HALF + HALF + i, mask=m, other=0.0).to(tl.float32)
    dst = o_ptr + (t * n_heads + h) * 2 * HALF
    ty = o_ptr.dtype.element_ty
    tl.store(dst + i, (x1 * c1 - x2 * s1).to(ty), mask=m)
    tl.store(dst + HALF + i, (x2 * c2 + x1 * s2).to(ty), mask=m)


@triton.jit
def _silu_mul_kernel(gu_ptr, o_ptr, inter, s_row, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < inter
    g = tl.load(gu_ptr + row * s_row + cols, mask=m, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * s_row + inter + cols, mask=m, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(o_ptr + row * inter + cols, y.to(o_ptr.dtype.element_ty), mask=m)


@triton.jit
def _kv_store_kernel(
    x_ptr,
    slot_ptr,
    c_ptr,
    s_ptr,
    sx_t,
    sx_h,
    n_heads,
    D: tl.constexpr,
    QMAX: tl.constexpr,
    QUANT: tl.constexpr,
    ROUND: tl.constexpr,
    BLOCK: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.program_id(1)
    d = tl.arange(0, BLOCK)
    m = d < D
    slot = tl.load(slot_ptr + t).to(tl.int64)
    x = tl.load(x_ptr + t * sx_t + h * sx_h + d, mask=m, other=0.0)
    dst = c_ptr + (slot * n_heads + h) * D + d
    if QUANT:
        xf = x.to(tl.float32)
        scale = tl.max(tl.abs(xf), axis=0) / QMAX
        scale = tl.minimum(tl.maximum(scale, 6.103515625e-05), 65504.0).to(tl.float16)
        y = xf / scale.to(tl.float32)
        y = tl.minimum(tl.maximum(y, -QMAX), QMAX)
        if ROUND:
            y = tl.where(y >= 0, tl.floor(y + 0.5), tl.ceil(y - 0.5))
        tl.store(dst, y.to(c_ptr.dtype.element_ty), mask=m)
        tl.store(s_ptr + slot * n_heads + h, scale)
    else:
        tl.store(dst, x, mask=m)


class TritonOps(TorchOps):
    """``TorchOps``' interface on fused Triton kernels (inputs on a CUDA device, or any
    device under the interpreter)."""

    name = "triton"

    @staticmethod
    def _norm(x: torch.Tensor, delta: torch.Tensor | None, w: torch.Tensor, eps: float):
        x = x.contiguous()
        n_rows, n = x.shape
        y = torch.empty_like(x)
        r = torch.empty_like(x) if delta is not None else y
        d = delta.contiguous() if delta is not None else x
        _rms_norm_kernel[(n_rows,)](x, d, w, y, r, n, eps, delta is not None, _pow2(n))
        return y, r

    @classmethod
    def rms_norm(cls, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        """See ``TorchOps.rms_norm``. x: ``[N, hidden]``."""
        return cls._norm(x, None, w, eps)[0]

    @classmethod
    def add_rms_norm(
        cls, x: torch.Tensor, delta: torch.Tensor, w: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """See ``TorchOps.add_rms_norm``: one kernel for the add and the norm."""
        return cls._norm(x, delta, w, eps)

    @staticmethod
    def _rope1(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        t, h, d = x.shape
        if x.stride(2) != 1:
            x = x.contiguous()
        out = torch.empty((t, h, d), dtype=x.dtype, device=x.device)
        c, s = cos.reshape(t, d).contiguous(), sin.reshape(t, d).contiguous()
        if t:
            _rope_kernel[(t, h)](x, c, s, out, x.stride(0), x.stride(1), h, d // 2, _pow2(d // 2))
        return out

    @classmethod
    def rope(
        cls, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """See ``TorchOps.rope``. q: ``[T, H, D]``, k: ``[T, Hkv, D]`` (strided views of
        the qkv projection are read in place)."""
        return cls._rope1(q, cos, sin), cls._rope1(k, cos, sin)

    @staticmethod
    def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
        """See ``TorchOps.silu_mul``. gate_up: ``[N, 2I]`` -> ``[N, I]``."""
        gu = gate_up if gate_up.stride(1) == 1 else gate_up.contiguous()
        n, inter = gu.shape[0], gu.shape[1] // 2
        out = torch.empty((n, inter), dtype=gu.dtype, device=gu.device)
        block = min(1024, _pow2(inter))
        if n:
            _silu_mul_kernel[(n, triton.cdiv(inter, block))](gu, out, inter, gu.stride(0), block)
        return out


def store_kv(pool, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:  # noqa: ANN001
    """Write new K/V ``[T, Hkv, D]`` at ``slots`` ``[T]`` int64 of ``pool`` (a ``KVPool``),
    quantizing per (token, head) in a quantized pool like ``KVPool.write``."""
    t, hkv, d = k.shape
    if t == 0:
        return
    quant = pool.quantized
    qmax = 127.0 if pool.k.dtype == torch.int8 else 448.0
    for x, cache, scale in (
        (k, pool.k[layer], pool.k_scale[layer] if quant else None),
        (v, pool.v[layer], pool.v_scale[layer] if quant else None),
    ):
        x = x if x.stride(2) == 1 else x.contiguous()
        _kv_store_kernel[(t, hkv)](
            x,
            slots,
            cache,
            scale if quant else cache,
            x.stride(0),
            x.stride(1),
            hkv,
            d,
            qmax,
            quant,
            pool.k.dtype == torch.int8,
            _pow2(d),
        )
