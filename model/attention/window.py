"""Per-layer attention variants: a sliding window, a score scale other than 1/√D, and
tanh soft-capping of the scores; what each backend needs to read only a layer's window.

A layer with a window of W tokens lets position i attend positions i - W + 1 .. i
(Mistral, Jiang et al. 2023; Gemma 2/3's local layers; Hugging Face's
``sliding_window_overlay``). Soft-capping (Gemma 2) replaces a score s by
``c · tanh(s / c)`` before the mask and softmax, as Hugging Face's
``eager_attention_forward`` does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from houchu.model.config.core import ModelConfig


@dataclass(frozen=True)
class LayerAttention:
    """How one layer attends.

    Attributes:
        window: tokens attended, the query's own included (0: every earlier position).
        scale: the score scale (None: 1 / sqrt(head_dim)).
        softcap: scores become ``softcap * tanh(s / softcap)`` (0: off).
    """

    window: int = 0
    scale: float | None = None
    softcap: float = 0.0

    @property
    def is_plain(self) -> bool:
        """Full causal attention with the default scale and no soft-capping."""
        return not (self.window or self.softcap) and self.scale is None

    def scale_for(self, head_dim: int) -> float:
        """The score scale as a number."""
        return 1.0 / math.sqrt(head_dim) if self.scale is None else self.scale


PLAIN = LayerAttention()


def layer_attention(cfg: ModelConfig) -> tuple[LayerAttention, ...]:
    """Each layer's ``LayerAttention`` from the model config (a scale equal to
    1 / sqrt(head_dim) counts as the default)."""
    scale = cfg.attn_scale
    if scale is not None and math.isclose(scale, 1.0 / math.sqrt(cfg.head_dim), rel_tol=1e-12):
        scale = None
    return tuple(
        LayerAttention(cfg.layer_window(i), scale, cfg.attn_softcap) for i in range(cfg.num_layers)
    )


def binding_windows(layers: tuple[LayerAttention, ...], kv_lens: list[int]) -> bool:
    """Whether any layer's window, scale or soft-cap changes this step's attention (a
    window at least as long as every sequence's KV changes nothing)."""
    longest = max(kv_lens, default=0)
    return any(
        (s.window and s.window < longest) or s.softcap or s.scale is not None for s in layers
    )


def window_start(kv_len: int, window: int) -> int:
    """The first position the last of ``kv_len`` positions attends (0 without a window)."""
    return max(0, kv_len - window) if window else 0


def sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    spec: LayerAttention,
    is_causal: bool = False,
) -> torch.Tensor:
    """Scaled dot-product attention with ``spec``'s scale and soft-cap.

    Args:
        q: ``[..., Hq, n, D]``; k, v: ``[..., Hkv, L, D]`` (Hq a multiple of Hkv: grouped
            query heads, head h reading KV head h // (Hq / Hkv)).
        mask: bool, broadcastable to ``[..., Hq, n, L]``, True = attend; or None.
        spec: the layer's scale and soft-cap (its window is in ``mask`` already).
        is_causal: a causal mask aligned at the top left (with ``mask`` None).
    Returns:
        ``[..., Hq, n, D]`` in q's dtype.
    """
    if not spec.softcap:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=is_causal, scale=spec.scale, enable_gqa=True
        )
    group = q.shape[-3] // k.shape[-3]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    s = torch.matmul(q, k.transpose(-1, -2)) * spec.scale_for(q.shape[-1])  # [..., n, L]
    s = torch.tanh(s / spec.softcap) * spec.softcap
    if is_causal:
        n, n_k = s.shape[-2], s.shape[-1]
        mask = torch.ones(n, n_k, dtype=torch.bool, device=s.device).tril()
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(p, v)


class WindowLedger:
    """KV bytes the sliding windows kept attention from reading: per windowed layer and
    sequence of a step, the positions before its first query's window (attention reads
    from the page holding the window's first position; those before it are never read).

    Args:
        layers: each layer's ``LayerAttention``.
        bytes_per_token_layer: K plus V bytes of one position in one layer (the pool's).
    """

    def __init__(self, layers: tuple[LayerAttention, ...], bytes_per_token_layer: int) -> None:
        self.windows = [s.window for s in layers if s.window]
        self.bytes_per_token_layer = bytes_per_token_layer
        self.bytes_not_read = 0  # since the last take()
        self.total_bytes_not_read = 0

    def record(self, start_pos: list[int]) -> None:
        """A step whose sequences' first new tokens sit at ``start_pos``."""
        skipped = sum(window_start(p + 1, w) for w in self.windows for p in start_pos)
        n = skipped * self.bytes_per_token_layer
        self.bytes_not_read += n
        self.total_bytes_not_read += n

    def take(self) -> int:
        """The bytes not read since the previous call."""
        n, self.bytes_not_read = self.bytes_not_read, 0
        return n
