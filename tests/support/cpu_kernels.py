"""Quantized weights and activations for the CPU kernels' tests, their float references,
the KV pools they read, and whether an ISA level's kernels run here."""

from __future__ import annotations

import torch

from houchu.cpu import isa as cpu_isa
from houchu.cpu import kernels as cpu_kernels
from houchu.model.kv.pool import KVPool


def int4_weight(n: int, k: int, group: int, dtype: torch.dtype, seed: int):
    """Random codes [N, K] uint8, scale and offset [N, K/G] in dtype, and the dense
    float32 weight [N, K] they stand for."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    scale = (torch.rand(n, k // group, generator=g) * 0.02 + 1e-3).to(dtype)
    offset = (-8 * scale.float() + 1e-3 * torch.randn(n, k // group, generator=g)).to(dtype)
    dense = q.float().view(n, k // group, group) * scale.float()[..., None]
    dense = (dense + offset.float()[..., None]).view(n, k)
    return q, scale, offset, dense


def int8_weight(n: int, k: int, dtype: torch.dtype, seed: int):
    """Random int8 [N, K], per-row scale [N] in dtype, and the dense float32 weight."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    scale = (torch.rand(n, generator=g) * 0.01 + 1e-4).to(dtype)
    return q, scale, q.float() * scale.float()[:, None]


def a16_activations(x: torch.Tensor) -> torch.Tensor:
    """x [M, K] -> float32 [M, K]: x as the int16 activations of ``gemv_a16.h`` stand for
    it: per block of 64 inputs, round(x * (16383 / amax)) * (amax / 16383) (float32
    steps, round half to even; an all-zero block stays zero)."""
    m, k = x.shape
    kp = -(-k // 64) * 64
    xb = torch.nn.functional.pad(x.float(), (0, kp - k)).view(m, kp // 64, 64)
    amax = xb.abs().amax(-1, keepdim=True)  # [M, K/64, 1]
    inv = torch.where(amax > 0, torch.tensor(16383.0) / amax, torch.zeros(()))
    q = torch.round(xb * inv)  # [M, K/64, 64] integers, |q| <= 16383
    return (q * (amax / 16383)).view(m, kp)[:, :k]


# (N, K, G): SmolLM2-135M's projections (qkv 960, o 576, gate_up 3072, down 576x1536),
# a feature count that leaves a partial block of 16, and a small odd shape
INT4_SHAPES = [
    (960, 576, 32),
    (576, 576, 64),
    (3072, 576, 32),
    (576, 1536, 128),
    (192, 1536, 64),
    (200, 576, 32),
    (7, 64, 8),
]


def a8_reference(x: torch.Tensor, q: torch.Tensor, scale, offset, group: int) -> torch.Tensor:
    """x [M, K] float -> [M, N] float32: per block b of A = 16 inputs (8 where 16 does not
    divide the group), s * xs_b * (q . round(x / xs_b)) with xs_b = amax|x_b| / 127, plus
    o * sum_(b in g) xs_b * sum(round(x_b / xs_b)) per weight group (the quantized
    activations' sums, as ggml's q8_1; in float64 here)."""
    m, k = x.shape
    n = q.shape[0]
    a = 16 if group % 16 == 0 else 8
    xb = x.float().view(m, k // a, a)
    amax = xb.abs().amax(-1, keepdim=True)  # [M, K/A, 1]
    inv = torch.where(amax > 0, torch.tensor(127.0) / amax, torch.zeros(()))
    xq = torch.round(xb * inv).double()  # [M, K/A, A], exact small integers
    dot = torch.einsum("mbk,nbk->mnb", xq, q.double().view(n, k // a, a))  # [M, N, K/A]
    xs = (amax / 127).squeeze(-1).double()  # [M, K/A]
    s = scale.double().repeat_interleave(group // a, dim=1)  # [N, K/A]
    xd = (xq * xs[..., None]).view(m, k // group, group)  # [M, ng, G] dequantized
    y = (dot * s[None] * xs[:, None, :]).sum(-1)
    y = y + (xd.sum(-1)[:, None, :] * offset.double()[None]).sum(-1)
    return y.float()


def why_not_loaded(level: str) -> str | None:
    """Why ``level``'s kernels cannot run here (None: they are loaded)."""
    lv = cpu_isa.level(level)
    if not cpu_isa.runs(lv):
        return cpu_isa.why_not(lv)
    return cpu_kernels.unavailable_reason(level)


def make_pool(kv_dtype: str, dtype: torch.dtype, ps: int, hkv: int, d: int) -> KVPool:
    return KVPool(
        num_layers=2,
        num_pages=40,
        page_size=ps,
        num_kv_heads=hkv,
        head_dim=d,
        dtype=dtype,
        device="cpu",
        kv_dtype=kv_dtype,
    )
