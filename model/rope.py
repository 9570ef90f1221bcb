"""Rotary position embedding (RoPE, Su et al. 2021, "RoFormer"), in the rotate-half form
Hugging Face's Llama uses: dimension i is paired with i + head_dim/2.

Frequency scaling: "linear" (position interpolation, Chen et al. 2023) divides every
frequency by ``factor``; "llama3" is Meta's Llama 3.1 smoothed scaling; "yarn" (Peng et
al. 2023, "YaRN") interpolates the low frequencies, keeps the high ones and ramps
between them, and scales attention (``yarn_attention_factor``, ``yarn_mscale``); a GGUF
``rope_freqs`` tensor (llama.cpp's per-frequency divisors) is applied on top.
"""

from __future__ import annotations

import math

import torch

from houchu.model.config.core import ModelConfig


def rope_inv_freq(cfg: ModelConfig, freq_factors: torch.Tensor | None = None) -> torch.Tensor:
    """Inverse frequencies theta^(-2i/d) for i in 0..d/2-1, with the config's scaling.

    Args:
        cfg: model config (``rope_theta``, ``head_dim``, ``rope_type`` …).
        freq_factors: optional ``[head_dim/2]`` fp32 divisors (GGUF ``rope_freqs``).
    Returns:
        ``[head_dim/2]`` float32, radians per position.
    """
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    if cfg.rope_type == "linear":
        inv = inv / cfg.rope_factor
    elif cfg.rope_type == "llama3":
        factor, lo, hi = cfg.rope_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
        old = cfg.rope_original_max_position
        low_wavelen, high_wavelen = old / lo, old / hi
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv = torch.where(medium, smoothed, scaled)
    elif cfg.rope_type == "yarn":
        inv = _yarn_inv_freq(cfg, inv)
    if freq_factors is not None:
        inv = inv / freq_factors.float()
    return inv


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature ``0.1 · mscale · ln(scale) + 1`` (1 for scale <= 1)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_attention_factor(cfg: ModelConfig) -> float:
    """What YaRN multiplies cos and sin by (transformers' ``attention_factor``):
    ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)`` where the config gives
    both, else ``mscale(factor)``; 1.0 for other RoPE types."""
    if cfg.rope_type != "yarn":
        return 1.0
    f = cfg.rope_factor
    if cfg.rope_mscale and cfg.rope_mscale_all_dim:
        return yarn_mscale(f, cfg.rope_mscale) / yarn_mscale(f, cfg.rope_mscale_all_dim)
    return yarn_mscale(f)


def _yarn_inv_freq(cfg: ModelConfig, inv: torch.Tensor) -> torch.Tensor:
    """YaRN's blend of interpolated (``inv / factor``) and extrapolated (``inv``)
    frequencies over a linear ramp between the dimensions that turn ``beta_fast`` and
    ``beta_slow`` times in the original context (as transformers'
    ``_compute_yarn_parameters``, truncated bounds)."""
    d, base, old = cfg.head_dim, cfg.rope_theta, cfg.rope_original_max_position

    def dim_of(rotations: float) -> float:
        return (d * math.log(old / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(dim_of(cfg.rope_beta_fast)), 0)
    high = min(math.ceil(dim_of(cfg.rope_beta_slow)), d - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    ramp = ((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # [D/2] weight of the extrapolated (unscaled) frequency
    return (inv / cfg.rope_factor) * (1 - keep) + inv * keep


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables for the given positions, computed in fp32 then cast.

    Args:
        positions: ``[T]`` int64 token positions.
        inv_freq: ``[D/2]`` float32 from ``rope_inv_freq``.
        dtype: dtype of the result (the model dtype).
    Returns:
        ``(cos, sin)``, each ``[T, 1, D]`` in ``dtype`` (the 1 broadcasts over heads).
    """
    freqs = positions[:, None].float() * inv_freq[None, :]  # [T, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [T, D]
    return emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]


class RopeTable:
    """cos and sin of positions ``[0, n)``, computed once by ``rope_cos_sin`` and looked
    up per step (one ``index_select`` each instead of six small ops).

    Args:
        inv_freq: ``[D/2]`` float32 from ``rope_inv_freq``.
        dtype: dtype of the tables (the model dtype).
        n: positions covered (``n * D * 2`` elements in all).
    """

    def __init__(self, inv_freq: torch.Tensor, dtype: torch.dtype, n: int) -> None:
        self.n = n
        pos = torch.arange(n, device=inv_freq.device)
        self.cos, self.sin = rope_cos_sin(pos, inv_freq, dtype)  # [n, 1, D] each

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: ``[T]`` int64, each below ``n`` -> ``(cos, sin)``, ``[T, 1, D]`` each.

        Raises:
            IndexError: a position outside ``[0, n)``.
        """
        return self.cos.index_select(0, positions), self.sin.index_select(0, positions)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` by its positions: ``x * cos + rotate_half(x) * sin``.

    Args:
        x: ``[T, H, D]`` queries or keys (model dtype).
        cos, sin: ``[T, 1, D]`` from ``rope_cos_sin``.
    Returns:
        ``[T, H, D]``, same dtype.
    """
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)  # [T, H, D]
    return x * cos + rotated * sin
