"""Per-step attention metadata of the torch backend and the backends built on it
(``houchu.model.attention.torch``, ``attention_cpu``, ``attention_triton``): which rows
decode, which prefill, their pages and masks, made once per step by ``prepare`` and shared
by every layer."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from houchu.model.attention.window import LayerAttention


@dataclass
class PrefillSeq:
    """One sequence of a step with several new tokens after its cached KV (prefill),
    attended on its own: its rows of the step, positions, pages and mask."""

    rows: tuple[int, int]  # [a, b) rows of T
    start: int  # position of the first new token
    kv_len: int
    pages: torch.Tensor  # [n_pages] int64, from the page holding position base
    mask: torch.Tensor | None  # [n_new, kv_len - base] bool (True = attend); None = causal
    base: int = 0  # position of the first key read (a window's first page)
    windowed: bool = False  # the mask drops keys before a query's window


@dataclass
class MultiQuery:
    """Sequences with a few new tokens after cached KV (speculative verification),
    attended in one batched call; each padded to ``n`` queries with its last one."""

    rows: torch.Tensor  # [B, n] int64 rows of T
    valid: torch.Tensor  # [B, n] bool, False on padding
    pages: torch.Tensor  # [B, n_pages] int64
    mask: torch.Tensor  # [B, 1, n, n_pages * page_size] bool (True = attend)


#: Sequences with at most this many new tokens after cached KV are batched (verification).
MAX_BATCHED_QUERY = 16
#: A sequence with 2 to this many new tokens after cached KV (a speculative verification,
#: a jump-forward chunk) runs each token as a decode row of its own, on the decode
#: kernels, where no attention window binds (``attention_torch._decode_rows``).
MAX_EXTEND_AS_DECODE = 16


@dataclass
class TorchMeta:
    """A step's attention metadata for one window (``TorchSDPABackend.prepare``): the
    decode rows batched, the prefill sequences one by one, verification rows batched."""

    all_decode: bool
    decode_rows: torch.Tensor | None = None  # [B] int64 rows of T (q_len == 1 sequences)
    decode_pages: torch.Tensor | None = None  # [B, n_pages] int64
    decode_lens: torch.Tensor | None = None  # [B] int32 KV length of each decode row
    decode_mask: torch.Tensor | None = None  # [B, 1, 1, L] bool, made by length_mask
    prefill: list[PrefillSeq] = field(default_factory=list)
    multi: MultiQuery | None = None
    #: [B] int32 first position each decode row attends within its pages (a window's
    #: start; None: 0). decode_pages then start at the window's first page.
    decode_starts: torch.Tensor | None = None

    def length_mask(self, span: int) -> torch.Tensor:
        """``[B, 1, 1, span]`` bool, True at each decode row's positions
        ``decode_starts .. decode_lens - 1``; made on first use (once per step), as a
        kernel that reads the lengths itself never needs it."""
        if self.decode_mask is None:
            pos = torch.arange(span, device=self.decode_lens.device)  # [L]
            keep = pos[None, :] < self.decode_lens[:, None]  # [B, L]
            if self.decode_starts is not None:
                keep &= pos[None, :] >= self.decode_starts[:, None]
            self.decode_mask = keep[:, None, None, :]
        return self.decode_mask


@dataclass
class LayeredMeta:
    """A step's metadata when layers attend differently: one ``TorchMeta`` per window."""

    layers: tuple[LayerAttention, ...]
    metas: dict[int, TorchMeta]
