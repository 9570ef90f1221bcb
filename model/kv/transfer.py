"""Copies of KV pages between the device pool and the shared host pool.

A host slot holds one page of every pool tensor, back to back: for each tensor ``t`` of
``KVPool.page_tensors()`` (shaped ``[L, P, ...]``, page dimension 1) the bytes of
``t[:, page]``, contiguous. On the CPU a copy is a memcpy, done when ``save`` / ``load``
return.

On a CUDA device the shared-memory block is pinned in place (``cudaHostRegister``, so the
DMA engines read and write it directly) and the copies run ``non_blocking`` on a CUDA
stream of their own, so they overlap the host's work on the step:

- before a plan's copies the copy stream waits for the compute stream, so a page is
  saved only after the steps that wrote it, and a page is loaded only after the steps
  that read its previous contents;
- after them the compute stream waits on the copies' event, so the step never reads a
  page before its load finished nor overwrites one before its store finished;
- ``finish`` (the runner calls it before a step's result leaves) blocks the host until
  the copies are done, so the host slots a store filled are complete, and the slots a
  load read may be refilled, once the scheduler and the tier manager hear of them.

If the block cannot be pinned (``cudaHostRegister`` refused, e.g. past the locked-memory
limit) the copies still run on the copy stream, synchronously from pageable memory, and
``pinned`` says so.
"""

from __future__ import annotations

import torch

from houchu.cache_tiers.host_pool import HostPool
from houchu.model.kv.pool import KVPool
from houchu.transport.messages import PageCopy

#: cudaHostRegisterPortable: pinned for every CUDA context of the process.
_REGISTER_PORTABLE = 1


def pin_host_buffer(t: torch.Tensor) -> str | None:
    """Page-lock the host memory of contiguous CPU tensor ``t`` in place (CUDA only).

    Returns:
        None when pinned, else why not (one line).
    """
    rt = torch.cuda.cudart()  # torch's binding clears the error it returns
    rc = rt.cudaHostRegister(t.data_ptr(), t.numel() * t.element_size(), _REGISTER_PORTABLE)
    if int(rc) == 0:
        return None
    return f"cudaHostRegister failed: {rt.cudaGetErrorString(rc)} (CUDA error {int(rc)})"


class HostKVMirror:
    """Views of the host pool's slots shaped like device pages.

    Args:
        pool: the device KV pool.
        host: the attached shared host pool.
    Attributes:
        stream: the CUDA stream the copies run on (None on the CPU).
        pinned: the host block is page-locked (CUDA only).
        unpinned_reason: why it is not, on CUDA ("" otherwise).
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
        self.device = self.tensors[0].device
        self.stream: torch.cuda.Stream | None = None
        self.pinned, self.unpinned_reason = False, ""
        self._raw = raw  # keeps the registered range's address and size
        self._pending: torch.cuda.Event | None = None  # the last copies' completion
        if self.device.type == "cuda":
            self.stream = torch.cuda.Stream(self.device)
            why = pin_host_buffer(raw)
            self.pinned, self.unpinned_reason = why is None, why or ""

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
        """Device page -> host slot, for each copy (on CUDA: enqueued on ``stream``, the
        compute stream then waits for them). Returns bytes copied."""
        return self._copy(copies, to_host=True)

    def load(self, copies: list[PageCopy]) -> int:
        """Host slot -> device page, for each copy (on CUDA: enqueued on ``stream``, the
        compute stream then waits for them). Returns bytes copied."""
        return self._copy(copies, to_host=False)

    def _copy(self, copies: list[PageCopy], to_host: bool) -> int:
        if not copies:
            return 0
        if self.stream is None:
            for c in copies:
                self._copy_page(c, to_host, non_blocking=False)
            return len(copies) * self.page_bytes
        compute = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(compute)  # the pages' earlier writes and reads are done
        with torch.cuda.stream(self.stream):
            for c in copies:
                self._copy_page(c, to_host, non_blocking=True)
        done = torch.cuda.Event()
        done.record(self.stream)
        compute.wait_event(done)  # the step touches the pages only after the copies
        self._pending = done
        return len(copies) * self.page_bytes

    def _copy_page(self, c: PageCopy, to_host: bool, non_blocking: bool) -> None:
        for t, view in zip(self.tensors, self._views(c.host_slot), strict=True):
            if to_host:
                view.copy_(t[:, c.device_page], non_blocking=non_blocking)
            else:
                t[:, c.device_page].copy_(view, non_blocking=non_blocking)

    def describe(self) -> str:
        """One line for the start-up notes: slots, bytes, and on CUDA how pages move."""
        s = f"host KV tier: {self.num_slots} slots of {self.page_bytes} B pages"
        if self.stream is None:
            return s
        if self.pinned:
            return s + ", pinned in place, copied non-blocking on their own CUDA stream"
        return s + f", not pinned ({self.unpinned_reason}): copies synchronous from pageable memory"

    def finish(self) -> None:
        """Block until every copy enqueued so far is done (nothing to wait for on the
        CPU, where copies finish before ``save`` / ``load`` return)."""
        if self._pending is not None:
            self._pending.synchronize()
            self._pending = None

    def close(self) -> None:
        """Wait for the copies in flight and unpin the host block (idempotent)."""
        self.finish()
        if self.pinned:
            torch.cuda.cudart().cudaHostUnregister(self._raw.data_ptr())
            self.pinned = False
