"""This machine's limits, measured in the same run as the figures they divide (they
swing by several times when anything else runs): memory copy bandwidth and the matmul
peaks of the formats the runner computes in."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass
class Limits:
    """Measured limits.

    Attributes:
        copy_gbs: memory bandwidth of a large tensor copy, GB/s (read + write bytes).
        fp32_flops, bf16_flops: dense GEMM peaks, FLOP/s.
        int8_ops: ``torch._int_mm`` peak, int8 OP/s (2 per multiply-add).
    """

    copy_gbs: float
    fp32_flops: float
    bf16_flops: float
    int8_ops: float

    def best(self, other: Limits) -> Limits:
        """Each limit's higher value of two measurements (the machine's best this run)."""
        return Limits(
            max(self.copy_gbs, other.copy_gbs),
            max(self.fp32_flops, other.fp32_flops),
            max(self.bf16_flops, other.bf16_flops),
            max(self.int8_ops, other.int8_ops),
        )

    def compute_peak(self, fmt: str) -> float:
        """The peak of the arithmetic format ``fmt`` computes in (FLOP/s or OP/s)."""
        return {"fp32": self.fp32_flops, "int8": self.int8_ops, "w8a8": self.int8_ops}.get(
            fmt, self.bf16_flops
        )

    def line(self, units: frozenset[str] = frozenset({"fp32", "bf16", "int8"})) -> str:
        """The limits in words; a matmul format outside ``units`` (the CPU's native
        formats) is marked as emulated: its figure is no peak."""

        def mark(fmt: str) -> str:
            return "" if fmt in units else " (emulated, no unit)"

        return (
            f"copy {self.copy_gbs:.1f} GB/s, fp32 matmul {self.fp32_flops / 1e9:.0f} GFLOP/s, "
            f"bf16 matmul {self.bf16_flops / 1e9:.0f} GFLOP/s{mark('bf16')}, int8 matmul "
            f"{self.int8_ops / 1e9:.0f} GOP/s{mark('int8')}"
        )


def _best(fn, seconds: float = 1.0, min_reps: int = 3) -> float:  # noqa: ANN001
    """Fastest single call of ``fn`` (seconds) within about ``seconds`` of trying."""
    fn()
    best, t_end, reps = float("inf"), time.perf_counter() + seconds, 0
    while reps < min_reps or time.perf_counter() < t_end:
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        reps += 1
    return best


def copy_bandwidth(mib: int = 256) -> float:
    """GB/s of copying a ``mib`` MiB float32 tensor (counting bytes read and written)."""
    a = torch.ones(mib << 18)
    b = torch.empty_like(a)
    t = _best(lambda: b.copy_(a))
    return 2 * a.numel() * 4 / t / 1e9


def matmul_peak(dtype: torch.dtype, n: int = 1024) -> float:
    """FLOP/s of an ``n``-cubed GEMM in ``dtype`` (int8: ``torch._int_mm``)."""
    if dtype == torch.int8:
        a = torch.randint(-64, 64, (n, n), dtype=torch.int8)
        b = torch.randint(-64, 64, (n, n), dtype=torch.int8)
        t = _best(lambda: torch._int_mm(a, b))
    else:
        a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
        t = _best(lambda: a @ b)
    return 2 * n**3 / t


def measure() -> Limits:
    """All limits, now."""
    return Limits(
        copy_bandwidth(),
        matmul_peak(torch.float32),
        matmul_peak(torch.bfloat16),
        matmul_peak(torch.int8),
    )
