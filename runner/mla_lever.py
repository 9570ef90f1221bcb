"""What multi-head latent attention saves, for the start-up line and the lever ledger:
the latent pool's bytes per token against the same model with full multi-head K/V, the
tokens and max-context requests the pool holds each way, and the runner's levers that
do not apply to an MLA model (said at start-up, never silently).
"""

from __future__ import annotations

from typing import Any

from houchu.model.config.core import ModelConfig
from houchu.model.kv.mla_pool import LatentKVPool
from houchu.transport.levers import Lever, Unit, Verb
from houchu.transport.telemetry import LeverSample

_O = Verb.OCCUPY_LESS


def mla_summary(pool: LatentKVPool, max_context: int) -> str:
    """One line for the start-up summary: the latent's bytes per token against full
    multi-head K/V, and the tokens and max-context requests the pool holds each way."""
    full_tokens = pool.num_bytes // pool.full_kv_bytes
    ratio = pool.full_kv_bytes / pool.bytes_per_token
    return (
        f"MLA latent KV {pool.bytes_per_token} B/token vs {pool.full_kv_bytes} B/token with "
        f"full multi-head K/V ({ratio:.1f}x): the pool holds {pool.num_tokens} tokens "
        f"instead of {full_tokens} ({pool.num_tokens // max(max_context, 1)} instead of "
        f"{full_tokens // max(max_context, 1)} requests of {max_context} tokens)"
    )


class MLALever:
    """The "mla" lever (occupy_less), against the same model with full multi-head K/V:
    once, the extra token slots the pool holds ("tokens" saved) and the extra requests
    of ``max_context`` tokens it holds at once ("requests" saved: the concurrency the
    latent buys); then per call, the KV bytes not stored for the tokens written since
    the previous call ("bytes" saved). The spent amount is not measured (``Unit.NONE``):
    the latent is the model's own structure, and the absorbed decode's extra query work
    is inside its step time.

    Args:
        pool: the latent pool.
        max_context: tokens a request may hold at most.
    """

    def __init__(self, pool: LatentKVPool, max_context: int) -> None:
        self.pool, self.max_context = pool, max(max_context, 1)
        self.tokens_written = 0
        self._capacity_reported = False

    def record(self, tokens: int) -> None:
        """Count ``tokens`` whose latents a step stored."""
        self.tokens_written += tokens

    def samples(self, t: float) -> list[LeverSample]:
        """The samples accrued since the previous call (then the count restarts)."""
        p, out = self.pool, []
        if not self._capacity_reported:
            self._capacity_reported = True
            full_tokens = p.num_bytes // p.full_kv_bytes
            extra = float(p.num_tokens - full_tokens)
            more = float(p.num_tokens // self.max_context - full_tokens // self.max_context)
            out.append(LeverSample(Lever.MLA, _O, extra, Unit.TOKENS, 0.0, Unit.NONE, t))
            out.append(LeverSample(Lever.MLA, _O, more, Unit.REQUESTS, 0.0, Unit.NONE, t))
        if self.tokens_written:
            per = p.full_kv_bytes - p.bytes_per_token
            saved = float(per * self.tokens_written)
            out.append(LeverSample(Lever.MLA, _O, saved, Unit.BYTES, 0.0, Unit.NONE, t))
        self.tokens_written = 0
        return out


def mla_levers_note(cfg: ModelConfig, options: Any, backend: str) -> str:
    """Say at start-up which of the runner's levers do not apply to an MLA model, and
    return the KV dtype its pool uses ("auto": the latent is stored in the model dtype).

    Args:
        cfg: the model's configuration.
        options: the runner's ``RunnerOptions``.
        backend: the attention backend's name.
    """
    notes = []
    if options.kv_cache_dtype != "auto":
        notes.append(
            f"--kv-cache-dtype {options.kv_cache_dtype} does not apply to the latent KV "
            f"cache (stored in {options.dtype})"
        )
    if backend not in ("torch-sdpa", "cpu"):
        notes.append(f"attention runs on torch ops, not the {backend} backend's kernels")
    # the fused decode layers being off is said by ``structure_notes`` (every family
    # whose blocks are not plain Llama blocks)
    for n in notes:
        print(f"houchu runner: {cfg.architecture} (MLA): {n}", flush=True)
    return "auto"
