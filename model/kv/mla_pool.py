"""The KV pool of a multi-head latent attention model (``houchu.model.attention.mla``): per token
and layer, the compressed latent ``c`` and the decoupled RoPE key ``k_pe``, paged as
``houchu.model.kv.pool.KVPool`` pages its K/V (Kwon et al. 2023), so the scheduler, the
prefix cache and the host tiers see pages as they do for every other model.
"""

from __future__ import annotations

import torch

from houchu.model.config.core import ModelConfig, mla_of
from houchu.model.kv.page_pool import PagePool, kv_page_bytes, pages_in_budget


class LatentKVPool(PagePool):
    """The paged KV pool of an MLA model: per token and layer, the latent ``c`` and
    the RoPE key ``k_pe`` side by side.

    Attributes:
        kv: ``[num_layers, num_pages + scratch_pages, page_size, kv_lora_rank +
            qk_rope_head_dim]`` in the model dtype, zero-initialised.
        k: the same tensor (what code that asks a pool for its storage dtype reads).
        num_layers, num_pages, page_size, scratch_pages, dtype: as ``KVPool``'s.
        kv_lora_rank: elements of ``c`` (the first ones of each slot).
        full_kv_bytes: bytes per token of the same model with full multi-head K/V at
            this dtype (``ModelConfig.num_heads · (qk_head_dim + v_head_dim)`` per layer).

    Raises:
        ValueError: fewer than one page, or a page of fewer than one token.
    """

    quantized = False
    kv_dtype = "auto"
    k_scale = v_scale = None
    num_kv_heads = 1

    def __init__(
        self,
        cfg: ModelConfig,
        *,
        num_pages: int,
        page_size: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        scratch_pages: int = 0,
    ) -> None:
        super().__init__(
            num_layers=cfg.num_layers,
            num_pages=num_pages,
            page_size=page_size,
            dtype=dtype,
            scratch_pages=scratch_pages,
        )
        m = mla_of(cfg)
        self.kv_lora_rank = m.kv_lora_rank
        self.head_dim = m.latent_dim
        shape = (cfg.num_layers, num_pages + scratch_pages, page_size, m.latent_dim)
        self.kv = torch.zeros(shape, dtype=dtype, device=device)  # [L, P, ps, r + dr]
        self.k = self.v = self.kv
        elem = self.kv.element_size()
        self.full_kv_bytes = full_mha_bytes_per_token(cfg, elem)

    @classmethod
    def for_model(
        cls,
        cfg: ModelConfig,
        *,
        page_size: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        num_pages: int | None = None,
        memory_bytes: int = 1 << 30,
        scratch_pages: int = 0,
    ) -> LatentKVPool:
        """``num_pages`` if given, else as many pages as fit in ``memory_bytes``.

        Raises:
            ValueError: the budget holds not even one page.
        """
        if num_pages is None:
            num_pages = pages_in_budget(memory_bytes, kv_page_bytes(cfg, page_size, dtype))
        return cls(
            cfg,
            num_pages=num_pages,
            page_size=page_size,
            dtype=dtype,
            device=device,
            scratch_pages=scratch_pages,
        )

    @property
    def bytes_per_token(self) -> int:
        """Bytes of ``[c, k_pe]`` per token slot, all layers."""
        return self.num_layers * self.head_dim * self.kv.element_size()

    @property
    def bf16_bytes_per_token(self) -> int:
        """The same latents in bfloat16 (the KV-quantization lever's baseline)."""
        return self.num_layers * self.head_dim * 2

    def page_tensors(self) -> list[torch.Tensor]:
        """The one tensor holding page data, ``[L, P, ...]`` (for host-tier copies)."""
        return [self.kv]

    def write(self, layer: int, slots: torch.Tensor, c: torch.Tensor, k_pe: torch.Tensor) -> None:
        """Store new tokens' latents: slots ``[T]`` int64 (all distinct), c ``[T, r]``,
        k_pe ``[T, dr]`` (RoPE applied), model dtype."""
        flat = self.kv[layer].view(-1, self.head_dim)  # [P·ps, r + dr]
        flat.index_copy_(0, slots, torch.cat([c, k_pe], dim=-1))

    def gather(self, layer: int, page_table: torch.Tensor, kv_len: int) -> torch.Tensor:
        """One sequence's latents at positions ``0 .. kv_len-1``: page_table
        ``[n_pages]`` int64 -> ``[kv_len, r + dr]`` (a copy)."""
        n = -(-kv_len // self.page_size)
        return self.kv[layer].index_select(0, page_table[:n]).flatten(0, 1)[:kv_len]

    def gather_padded(self, layer: int, page_tables: torch.Tensor) -> torch.Tensor:
        """Several sequences' latents: page_tables ``[B, n_pages]`` int64 ->
        ``[B, n_pages · page_size, r + dr]`` (positions past a sequence's length hold
        whatever the padding pages hold: mask them)."""
        b, n = page_tables.shape
        lat = self.kv[layer].index_select(0, page_tables.reshape(-1))  # [B·n, ps, r + dr]
        return lat.view(b, n * self.page_size, self.head_dim)


def full_mha_bytes_per_token(cfg: ModelConfig, element_size: int) -> int:
    """Bytes per token, all layers, of ``cfg`` with full multi-head K/V (every head's
    ``qk_head_dim`` key and ``v_head_dim`` value stored, as without the latent)."""
    m = mla_of(cfg)
    return cfg.num_layers * cfg.num_heads * (m.qk_head_dim + m.v_head_dim) * element_size
