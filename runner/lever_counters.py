"""The runner's lever counters (docs/architecture.md, "The lever ledger"): what weight quantization,
KV quantization, 16-bit compute and the compiled / graph-captured decode step saved and
spent, from counters the runner keeps per step (never from estimates it does not measure).

``LeverCounters.samples()`` returns the amounts accrued since its previous call as
``LeverSample``s (engine-wide, ``rid`` None), for the runner actor to emit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from houchu.transport.levers import (
    ACCEL_LEVERS,
    HALF_PRECISION_LEVERS,
    KV_QUANT_LEVERS,
    WEIGHT_QUANT_LEVERS,
    Lever,
    Unit,
    Verb,
)
from houchu.transport.telemetry import LeverSample


@dataclass
class StepCost:
    """Per-step byte costs fixed at startup.

    Attributes:
        weight_bytes: matmul weight bytes one step reads as stored.
        weight_bf16_bytes: the same weights in bfloat16.
        kv_token_bytes: K + V bytes per token as stored (scales included).
        kv_token_bf16_bytes: the same in bfloat16.
        weight_label: e.g. "int4-g32"; "none" (dense): no weight lever is reported.
        kv_label: e.g. "int8"; "auto" (model dtype): no KV lever is reported.
        half_label: "bf16" or "fp16" when the model computes in 16 bits (``--dtype``;
            "auto" on CUDA), reported against float32 as "half_precision_<label>"; ""
            (float32): not reported.
        score_pair_bytes: bytes an attention that materialises its scores would write
            and read again for one (query token, key token) pair, over every layer and
            query head (float32 scores: 4 bytes written, 4 read); 0 when the backend
            does not tile attention on chip (then "flash_attention" is not reported).
    """

    weight_bytes: int
    weight_bf16_bytes: int
    kv_token_bytes: int
    kv_token_bf16_bytes: int
    weight_label: str
    kv_label: str
    half_label: str = ""
    score_pair_bytes: int = 0


#: attention backends whose kernels keep the scores on chip (FlashAttention, Dao et al.
#: 2022: tiles with an online softmax), so the score matrix never reaches memory
TILED_BACKENDS = ("flash-attn", "triton")


def score_pair_bytes(backend: str, num_layers: int, num_heads: int) -> int:
    """``StepCost.score_pair_bytes`` for an attention backend (its ``name``): 8 bytes
    (a float32 score written, then read) per layer and query head on a tiled backend
    (``TILED_BACKENDS``), else 0."""
    return 8 * num_layers * num_heads if backend in TILED_BACKENDS else 0


class LeverCounters:
    """Accumulates per-step counters and turns them into lever samples.

    Args:
        cost: the per-step byte costs.
        accel: "compiled_decode", "cuda_graph" or None (no accelerated decode step).
        eager_step_s, accel_step_s: the startup warm-up step's time eager and accelerated
            (seconds), or None when not measured.
        accel_setup_s: seconds spent compiling or capturing at startup.
        kv_rel_error: relative RMS error of quantized K/V measured at startup, or None.
        dropped: the accelerated step was built but measured slower, so decode runs
            eagerly (the setup time is still reported as spent).
        cached: the startup timings are an earlier start's (cached, nothing compiled).
    """

    def __init__(
        self,
        cost: StepCost,
        accel: str | None = None,
        eager_step_s: float | None = None,
        accel_step_s: float | None = None,
        accel_setup_s: float = 0.0,
        kv_rel_error: float | None = None,
        dropped: bool = False,
        cached: bool = False,
    ) -> None:
        self.cost, self.accel, self.dropped, self.cached = cost, accel, dropped, cached
        self.eager_step_s, self.accel_step_s = eager_step_s, accel_step_s
        self.accel_setup_s, self.kv_rel_error = accel_setup_s, kv_rel_error
        self._setup_reported = False
        self._reset()

    def _reset(self) -> None:
        self.steps = 0  # forward passes
        self.kv_written = 0  # tokens whose K/V were stored
        self.kv_read = 0  # tokens of K/V attended over, summed over sequences
        self.accel_steps = 0  # steps run compiled / graph-replayed
        self.weight_saved = 0  # bytes: bf16 weight bytes minus those actually read
        self.dense_read = 0  # bytes: 16-bit dense weights read (float32 would read twice)
        self.score_pairs = 0  # (query, key) pairs attended, summed over sequences

    def record(
        self,
        kv_written: int,
        kv_read: int,
        accelerated: bool,
        weight_bytes: int | None = None,
        score_pairs: int = 0,
    ) -> None:
        """Count one forward pass: ``kv_written`` tokens stored, ``kv_read`` tokens of
        KV attended over (summed over sequences), whether it ran accelerated, the
        matmul weight bytes it read (default: ``cost.weight_bytes``; layers that switch
        to a dense copy for many rows read more), and the (query token, key token) pairs
        its attention scored (``StepBatch.attention_pairs``)."""
        read = self.cost.weight_bytes if weight_bytes is None else weight_bytes
        self.weight_saved += self.cost.weight_bf16_bytes - read
        self.dense_read += read if self.cost.weight_label == "none" else 0
        self.steps += 1
        self.kv_written += kv_written
        self.kv_read += kv_read
        self.accel_steps += int(accelerated)
        self.score_pairs += score_pairs

    def samples(self, now: float | None = None) -> list[LeverSample]:
        """Lever samples for what accrued since the last call (then reset)."""
        t = time.time() if now is None else now
        c, out = self.cost, []
        if c.weight_label != "none" and self.steps:
            out.append(
                LeverSample(
                    WEIGHT_QUANT_LEVERS[c.weight_label.split("-")[0]],
                    Verb.MOVE_LESS,
                    float(self.weight_saved),
                    Unit.BYTES,
                    0.0,
                    Unit.NONE,  # dequantization work: not measured (transport.levers)
                    t,
                )
            )
        if c.kv_label != "auto" and (self.kv_written or self.kv_read):
            per = c.kv_token_bf16_bytes - c.kv_token_bytes
            err = self.kv_rel_error or 0.0
            kvq, rms = KV_QUANT_LEVERS[c.kv_label], Unit.RELATIVE_RMS_ERROR
            out.append(
                LeverSample(kvq, Verb.MOVE_LESS, float(per * self.kv_read), Unit.BYTES, err, rms, t)
            )
            out.append(
                LeverSample(
                    kvq, Verb.OCCUPY_LESS, float(per * self.kv_written), Unit.BYTES, err, rms, t
                )
            )
        out += self._half_samples(t)
        if c.score_pair_bytes and self.score_pairs:
            saved = float(c.score_pair_bytes * self.score_pairs)
            flash = Lever.FLASH_ATTENTION  # spends no work in serving: Unit.NONE
            out.append(LeverSample(flash, Verb.MOVE_LESS, saved, Unit.BYTES, 0.0, Unit.NONE, t))
        if self.accel is not None and (self.accel_steps or not self._setup_reported):
            gain = 0.0
            if self.eager_step_s is not None and self.accel_step_s is not None:
                gain = max(0.0, self.eager_step_s - self.accel_step_s) * self.accel_steps
            spent = 0.0 if self._setup_reported else self.accel_setup_s
            self._setup_reported = True
            accel, sec = ACCEL_LEVERS[self.accel], Unit.SECONDS
            out.append(LeverSample(accel, Verb.FILL, gain, sec, spent, sec, t))
        self._reset()
        return out

    def _half_samples(self, t: float) -> list[LeverSample]:
        """16-bit compute against float32: the dense weight bytes and the KV bytes (an
        unquantized pool's) not read (move_less), and the KV bytes not stored
        (occupy_less); at 16 bits each byte read or stored is one float32 would double.
        Quantized weights and KV count under their own levers instead."""
        c = self.cost
        if not c.half_label or not self.steps:
            return []
        kv = c.kv_label == "auto"
        name, b, none = HALF_PRECISION_LEVERS[c.half_label], Unit.BYTES, Unit.NONE
        moved = self.dense_read + (c.kv_token_bytes * self.kv_read if kv else 0)
        # what it spends (precision) is not measured per step: Unit.NONE
        out = [LeverSample(name, Verb.MOVE_LESS, float(moved), b, 0.0, none, t)]
        if kv and self.kv_written:
            held = float(c.kv_token_bytes * self.kv_written)
            out.append(LeverSample(name, Verb.OCCUPY_LESS, held, b, 0.0, none, t))
        return out

    def summary(self) -> str:
        """One line: bytes per decode step and the accelerated step's startup timing."""
        c = self.cost
        s = (
            f"weights {c.weight_label}: {c.weight_bytes / 2**20:.1f} MiB/step "
            f"({c.weight_bytes / c.weight_bf16_bytes:.2f}x the bytes of bf16); KV {c.kv_label}: "
            f"{c.kv_token_bytes} B/token ({c.kv_token_bytes / c.kv_token_bf16_bytes:.2f}x the bytes of bf16)"
        )
        if self.accel is not None and self.eager_step_s and self.accel_step_s:
            s += (
                f"; {self.accel} in {self.accel_setup_s:.1f}s, warm-up step eager "
                f"{self.eager_step_s * 1e3:.1f} ms vs {self.accel_step_s * 1e3:.1f} ms"
            )
            s += " (not faster: decoding eagerly)" if self.dropped else " (kept)"
            s += " [cached measurement: not compiled again]" if self.cached else ""
        return s
