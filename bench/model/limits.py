"""This machine's limits, measured in the same run as the figures they divide (they
swing by several times when anything else runs): memory copy bandwidth and the matmul
peaks of the formats the runner computes in, on the CPU or on a CUDA GPU."""

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


def _best(fn, seconds: float = 1.0, min_reps: int = 3, sync=None) -> float:  # noqa: ANN001
    """Fastest single call of ``fn`` (seconds) within about ``seconds`` of trying;
    ``sync`` (e.g. ``torch.cuda.synchronize``) is called after each call, inside its
    time, so that a GPU call is timed to its end, not to its launch."""
    done = sync or (lambda: None)
    fn()
    done()
    best, t_end, reps = float("inf"), time.perf_counter() + seconds, 0
    while reps < min_reps or time.perf_counter() < t_end:
        t0 = time.perf_counter()
        fn()
        done()
        best = min(best, time.perf_counter() - t0)
        reps += 1
    return best


def _sync_of(device: torch.device):  # noqa: ANN202
    """What waits for ``device``'s queued work: ``torch.cuda.synchronize`` on CUDA."""
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None


def copy_bandwidth(mib: int = 256, device: str | torch.device = "cpu") -> float:
    """GB/s of copying a ``mib`` MiB float32 tensor on ``device`` (counting bytes read
    and written; on a GPU: device memory to device memory)."""
    dev = torch.device(device)
    a = torch.ones(mib << 18, device=dev)
    b = torch.empty_like(a)
    t = _best(lambda: b.copy_(a), sync=_sync_of(dev))
    return 2 * a.numel() * 4 / t / 1e9


def matmul_peak(dtype: torch.dtype, n: int = 1024, device: str | torch.device = "cpu") -> float:
    """FLOP/s of an ``n``-cubed GEMM in ``dtype`` on ``device`` (int8: ``torch._int_mm``,
    int8 OP/s)."""
    dev = torch.device(device)
    if dtype == torch.int8:
        a = torch.randint(-64, 64, (n, n), dtype=torch.int8, device=dev)
        b = torch.randint(-64, 64, (n, n), dtype=torch.int8, device=dev)
        t = _best(lambda: torch._int_mm(a, b), sync=_sync_of(dev))
    else:
        a = torch.randn(n, n, device=dev).to(dtype)
        b = torch.randn(n, n, device=dev).to(dtype)
        t = _best(lambda: a @ b, sync=_sync_of(dev))
    return 2 * n**3 / t


#: GEMM size of the peaks on a GPU: 1024-cubed takes microseconds there, too short to
#: fill the chip; 8192-cubed runs about 1 ms in bf16 on an H100.
GPU_MATMUL_N = 8192


def measure(device: str | torch.device = "cpu") -> Limits:
    """All limits of ``device``, now (a GPU's copy bandwidth is device memory to device
    memory; its fp32 peak is torch's default fp32 matmul, TF32 only if enabled)."""
    dev = torch.device(device)
    n = GPU_MATMUL_N if dev.type == "cuda" else 1024
    return Limits(
        copy_bandwidth(1024 if dev.type == "cuda" else 256, dev),
        matmul_peak(torch.float32, n, dev),
        matmul_peak(torch.bfloat16, n, dev),
        matmul_peak(torch.int8, n, dev),
    )
