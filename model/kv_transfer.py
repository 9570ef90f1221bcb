"""Copies of KV pages between the device pool and the shared host pool.

A host slot holds one page of every pool tensor, back to back: for each tensor ``t`` of
``KVPool.page_tensors()`` (shaped ``[L, P, ...]``, page dimension 1) the bytes of
``t[:, page]``, contiguous. On a CUDA device the host block would be pinned for DMA; on
the CPU a copy is a memcpy.
"""

from __future__ import annotations

import torch

from houchu.kvcache.host_pool import HostPool
from houchu.model.kv_pool import KVPool
from houchu.transport.messages import PageCopy


class HostKVMirror:
    """Views of the host pool's slots shaped like device pages.

    Args:
        pool: the device KV pool.
        host: the attached shared host pool.
    Raises:
        ValueError: a host slot is smaller than one device page.
    """

    def __init__(self, pool: KVPool, host: HostPool) -> None:
        self.pool = pool
        # each [L, P, ...]: K and V, plus scales when the pool stores quantized KV
        self.tensors = pool.page_tensors() if hasattr(pool, "page_tensors") else [pool.k, pool.v]
        self.page_bytes = sum(t[:, 0].numel() * t.element_size() for t in self.tensors)
        if self.page_bytes > host.slot_bytes:
            raise ValueError(
                f"host slots of {host.slot_bytes} B cannot hold a {self.page_bytes} B page"
            )
        raw = torch.frombuffer(host.shm.buf, dtype=torch.uint8)  # [num_slots * slot_bytes]
        self.slots = raw[: host.num_slots * host.slot_bytes].view(host.num_slots, host.slot_bytes)
        self.num_slots = host.num_slots

    def _views(self, slot: int) -> list[torch.Tensor]:
        """Slot ``slot`` seen as one ``t[:, page]``-shaped tensor per pool tensor."""
        out, off = [], 0
        for t in self.tensors:
            shape = (t.shape[0], *t.shape[2:])  # [L, ps, Hkv, D]
            n = t[:, 0].numel() * t.element_size()
            out.append(self.slots[slot, off : off + n].view(t.dtype).view(shape))
            off += n
        return out

    def check(self, copies: list[PageCopy]) -> None:
        """Raises ValueError for a page or slot index out of range."""
        for c in copies:
            if not 0 <= c.device_page < self.pool.num_pages:
                raise ValueError(f"kv copy: device page {c.device_page} outside the pool")
            if not 0 <= c.host_slot < self.num_slots:
                raise ValueError(f"kv copy: host slot {c.host_slot} outside the host pool")

    def save(self, copies: list[PageCopy]) -> int:
        """Device page -> host slot, for each copy. Returns bytes copied."""
        for c in copies:
            for t, view in zip(self.tensors, self._views(c.host_slot), strict=True):
                view.copy_(t[:, c.device_page])
        return len(copies) * self.page_bytes

    def load(self, copies: list[PageCopy]) -> int:
        """Host slot -> device page, for each copy. Returns bytes copied."""
        for c in copies:
            for t, view in zip(self.tensors, self._views(c.host_slot), strict=True):
                t[:, c.device_page].copy_(view)
        return len(copies) * self.page_bytes
