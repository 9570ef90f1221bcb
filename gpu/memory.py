"""The KV pool's size on a CUDA GPU from its free memory (``--mem-fraction-static``), and
the device facts the runner's start-up line names.

As SGLang's ``--mem-fraction-static F``: after the weights load, the KV pool gets

    pool bytes = F x total - (total - free) - reserve

where ``total`` and ``free`` are ``torch.cuda.mem_get_info``'s (bytes; ``total - free``
is what this process, its weights included, and every other process already hold) and
``reserve`` leaves room for what a step allocates beside the pool (activations, logits,
the CUDA graphs' memory pools, cuBLAS / flash-attn workspaces:
``activation_reserve_bytes``). The bytes become pages at the pool's bytes per page
(scratch pages included). vLLM's ``--gpu-memory-utilization`` is the same fraction.

Which option sizes the pool (``kv_pool_size``): ``--num-pages`` when given; else, on
CUDA, ``--mem-fraction-static`` when given; else ``--kv-cache-mb``. On the CPU the
fraction is ignored with a note, as vLLM ignores ``--gpu-memory-utilization`` there.
The arithmetic is pure (``fraction_pool_bytes``, ``fraction_pool_pages``), so it is
tested without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from houchu.model.config.core import ModelConfig

GiB = 2**30
#: Fixed part of the reserve (bytes): the CUDA graphs' private pools, cuBLAS and
#: flash-attn workspaces, the allocator's fragmentation.
RESERVE_FIXED_BYTES = 256 * 2**20
#: Tokens of the largest step the reserve holds activations for (8x ``houchu serve``'s
#: default ``--max-batch-tokens`` of 512).
RESERVE_TOKENS = 4096
#: Rows of float32 logits the reserve holds (sampled rows of one step).
RESERVE_LOGIT_ROWS = 256


class MemFractionError(ValueError):
    """A ``--mem-fraction-static`` outside (0, 1], or one that leaves no room for a page."""


@dataclass(frozen=True)
class DeviceFacts:
    """What the start-up line says about a CUDA GPU.

    Attributes:
        name: the GPU's name ("NVIDIA H200").
        index: its CUDA device index.
        total_bytes: its memory, bytes.
        free_bytes: its free memory when measured (after the weights load), bytes.
    """

    name: str
    index: int
    total_bytes: int
    free_bytes: int

    def describe(self) -> str:
        """ "NVIDIA H200, 139.8 GiB, 120.3 GiB free after the weights"."""
        return (
            f"{self.name}, {self.total_bytes / GiB:.1f} GiB, "
            f"{self.free_bytes / GiB:.1f} GiB free after the weights"
        )


def cuda_device_facts(device: torch.device) -> DeviceFacts:
    """The facts of CUDA ``device`` now (its cached-but-unused blocks returned first, so
    ``free_bytes`` counts them free, as SGLang does before it sizes its pool)."""
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return DeviceFacts(torch.cuda.get_device_name(index), index, int(total), int(free))


def check_mem_fraction(fraction: float) -> None:
    """Raises:
    MemFractionError: ``fraction`` is not in (0, 1]."""
    if not 0.0 < fraction <= 1.0:
        raise MemFractionError(f"--mem-fraction-static must be in (0, 1], got {fraction}")


def activation_reserve_bytes(
    cfg: ModelConfig,
    elem_bytes: int,
    tokens: int = RESERVE_TOKENS,
    logit_rows: int = RESERVE_LOGIT_ROWS,
) -> int:
    """Bytes a step allocates beside the KV pool, estimated from the model's shapes:
    per token the residual stream and its normed copy, q/k/v and the attention output,
    the MLP's gate, up and product (``tokens`` of them, ``elem_bytes`` each), plus
    ``logit_rows`` rows of float32 logits twice (the logits and the sampler's copy),
    plus ``RESERVE_FIXED_BYTES``."""
    qkv = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
    per_token = (4 * cfg.hidden_size + qkv + 3 * cfg.intermediate_size) * elem_bytes
    logits = 2 * logit_rows * cfg.vocab_size * 4
    return RESERVE_FIXED_BYTES + tokens * per_token + logits


def fraction_pool_bytes(
    fraction: float, total_bytes: int, free_bytes: int, reserve_bytes: int
) -> int:
    """``fraction x total - (total - free) - reserve``, bytes (may be <= 0: no room).

    Raises:
        MemFractionError: ``fraction`` not in (0, 1].
    """
    check_mem_fraction(fraction)
    used = total_bytes - free_bytes
    return int(fraction * total_bytes) - used - reserve_bytes


def fraction_pool_pages(
    fraction: float,
    total_bytes: int,
    free_bytes: int,
    reserve_bytes: int,
    page_bytes: int,
    scratch_pages: int = 0,
) -> int:
    """The pages the scheduler gets from ``fraction`` of the GPU: the bytes of
    ``fraction_pool_bytes`` in pages of ``page_bytes`` (bytes, all layers), less the
    ``scratch_pages`` the pool also holds.

    Raises:
        MemFractionError: ``fraction`` not in (0, 1], or too little memory left for one
            page; the message gives the numbers and what to change.
    """
    budget = fraction_pool_bytes(fraction, total_bytes, free_bytes, reserve_bytes)
    pages = max(budget, 0) // page_bytes - scratch_pages
    if pages < 1:
        raise MemFractionError(
            f"--mem-fraction-static {fraction}: {fraction} x {total_bytes / GiB:.2f} GiB "
            f"- {(total_bytes - free_bytes) / GiB:.2f} GiB in use (weights included) - "
            f"{reserve_bytes / GiB:.2f} GiB activation reserve leaves "
            f"{budget / GiB:.2f} GiB, less than one KV page ({page_bytes} bytes): raise "
            "--mem-fraction-static, or size the pool with --num-pages"
        )
    return pages


@dataclass
class PoolSize:
    """How the KV pool is sized: ``num_pages`` pages, or (None) as many as fit in
    ``memory_bytes``; ``source`` says which option decided ("--kv-cache-mb 1024");
    ``notes``: lines for the start-up notes."""

    num_pages: int | None
    memory_bytes: int
    source: str
    notes: list[str] = field(default_factory=list)


def kv_pool_size(
    *,
    num_pages: int | None,
    kv_cache_mb: float,
    mem_fraction: float | None,
    facts: DeviceFacts | None,
    page_bytes: int,
    reserve_bytes: int,
    scratch_pages: int = 0,
) -> PoolSize:
    """Which option sizes the pool and what it gives: ``num_pages`` when set; else
    ``mem_fraction`` on a CUDA GPU (``facts`` not None); else ``kv_cache_mb`` (MiB).

    Raises:
        MemFractionError: see ``fraction_pool_pages``.
    """
    mb = f"{kv_cache_mb:g}"
    budget = int(kv_cache_mb * 2**20)
    if mem_fraction is not None:
        check_mem_fraction(mem_fraction)
    if num_pages is not None:
        notes = []
        if mem_fraction is not None:
            notes.append(f"--num-pages {num_pages} sizes the KV pool, not --mem-fraction-static")
        return PoolSize(num_pages, budget, f"--num-pages {num_pages}", notes)
    if mem_fraction is None:
        return PoolSize(None, budget, f"--kv-cache-mb {mb}")
    if facts is None:
        note = (
            f"--mem-fraction-static {mem_fraction:g} applies to CUDA GPUs only (as vLLM's "
            f"--gpu-memory-utilization); on the CPU --kv-cache-mb {mb} sizes the KV pool"
        )
        return PoolSize(None, budget, f"--kv-cache-mb {mb}", [note])
    t, f = facts.total_bytes, facts.free_bytes
    pages = fraction_pool_pages(mem_fraction, t, f, reserve_bytes, page_bytes, scratch_pages)
    source = (
        f"--mem-fraction-static {mem_fraction:g} ({mem_fraction:g} x {t / GiB:.1f} GiB - "
        f"{(t - f) / GiB:.1f} GiB in use - {reserve_bytes / GiB:.2f} GiB reserve)"
    )
    return PoolSize(pages, pages * page_bytes, source)
