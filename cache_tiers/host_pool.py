"""The shared host KV pool: one block of shared memory, ``num_slots`` slots of
``slot_bytes`` bytes, mapped by the model runner (which copies pages in and out of the
device pool) and by the KV-tier manager (which spills slots to SSD and fills them back).

The launcher creates the block and unlinks it at shutdown; actors attach by name.
"""

from __future__ import annotations

from multiprocessing import resource_tracker, shared_memory


class HostPool:
    """A named shared-memory block of ``num_slots * slot_bytes`` bytes.

    Args:
        name: the shared memory name.
        num_slots: slots in the pool.
        slot_bytes: bytes per slot (one KV page over all layers).
        create: create the block (the launcher) or attach to it (the actors).
    Raises:
        FileNotFoundError: attaching to a block that does not exist.
    """

    def __init__(self, name: str, num_slots: int, slot_bytes: int, create: bool = False) -> None:
        self.num_slots = num_slots
        self.slot_bytes = slot_bytes
        size = max(num_slots * slot_bytes, 1)
        self.shm = shared_memory.SharedMemory(name=name, create=create, size=size)
        self.is_owner = create
        if not create:
            # Before Python 3.13, attaching registers the block with this process's
            # resource tracker, which would unlink it when this process exits — and an
            # actor may exit (or be restarted) long before the launcher. Only the
            # creator (the launcher) owns and unlinks it. The tracker knows the block by
            # its POSIX name, which is the public name behind a leading slash.
            resource_tracker.unregister("/" + self.shm.name, "shared_memory")

    def slot(self, i: int) -> memoryview:
        """The bytes of slot ``i`` (a writable view into shared memory)."""
        if not 0 <= i < self.num_slots:
            raise ValueError(f"host slot {i} outside 0..{self.num_slots - 1}")
        buf = self.shm.buf
        if buf is None:
            raise ValueError("the host pool is closed")
        return buf[i * self.slot_bytes : (i + 1) * self.slot_bytes]

    def close(self) -> None:
        """Unmap (and, for the creator, remove) the block. Views still exported (e.g. a
        torch tensor over it) keep the mapping alive until they are gone."""
        try:
            self.shm.close()
        except BufferError:
            pass
        if self.is_owner:
            self.shm.unlink()
