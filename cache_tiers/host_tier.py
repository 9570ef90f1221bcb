"""The host-memory tier's index: which slot of the shared host pool holds which page.

A slot is in exactly one state::

    free ──grant──▶ granted ──store──▶ stored ──evict──▶ (spilling to SSD) ──▶ free
                      │                  ▲  │
                      └──return──▶ free  │  └──lookup──▶ stored + pinned (until release)
                                         └──load from SSD (a free slot is filled)

Only stored, unpinned slots are evicted, least recently used first. Pure Python; the
bytes live in the shared memory block that ``host_pool.HostPool`` maps.
"""

from __future__ import annotations

from collections import OrderedDict


class HostTier:
    """Slot bookkeeping for ``num_slots`` host pages.

    Raises:
        ValueError: from methods, for a slot used in the wrong state (a bug upstream).
    """

    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self.free: list[int] = list(range(num_slots - 1, -1, -1))
        self.granted: set[int] = set()
        self.by_hash: OrderedDict[bytes, int] = OrderedDict()  # LRU order: oldest first
        self.hash_of: dict[int, bytes] = {}
        self.pins: dict[int, int] = {}
        self.num_hits = 0
        self.num_misses = 0
        self.num_evictions = 0
        self.num_stored = 0

    @property
    def num_stored_now(self) -> int:
        return len(self.by_hash)

    def grant(self, n: int) -> list[int]:
        """Up to ``n`` free slots, now owned by the scheduler."""
        out = [self.free.pop() for _ in range(min(n, len(self.free)))]
        self.granted.update(out)
        return out

    def take_free(self) -> int | None:
        """One free slot for the tier manager itself (an SSD load), or None."""
        return self.free.pop() if self.free else None

    def give_back(self, slots: list[int]) -> None:
        """Granted or taken slots returned unused."""
        for s in slots:
            self.granted.discard(s)
            self.free.append(s)

    def store(self, h: bytes, slot: int) -> bool:
        """Index ``slot`` as holding page ``h``. If ``h`` is already stored elsewhere the
        slot is freed instead; returns whether the slot was kept."""
        self.granted.discard(slot)
        if h in self.by_hash:
            self.by_hash.move_to_end(h)
            self.free.append(slot)
            return False
        self.by_hash[h] = slot
        self.hash_of[slot] = h
        self.num_stored += 1
        return True

    def lookup(self, hashes: list[bytes]) -> list[int]:
        """Slots of the longest stored run ``hashes[0..k-1]``; pins them and marks used."""
        out = []
        for h in hashes:
            slot = self.by_hash.get(h)
            if slot is None:
                break
            self.by_hash.move_to_end(h)
            self.pins[slot] = self.pins.get(slot, 0) + 1
            out.append(slot)
        return out

    def pin(self, slot: int) -> None:
        self.pins[slot] = self.pins.get(slot, 0) + 1

    def release(self, slots: list[int]) -> None:
        for s in slots:
            n = self.pins.get(s, 0)
            if n <= 1:
                self.pins.pop(s, None)
            else:
                self.pins[s] = n - 1

    def victims(self, n: int) -> list[tuple[bytes, int]]:
        """Up to ``n`` (hash, slot) of the least recently used unpinned stored slots,
        removed from the index (the caller spills them to SSD, then calls ``give_back``)."""
        out: list[tuple[bytes, int]] = []
        for h, slot in self.by_hash.items():
            if len(out) == n:
                break
            if slot not in self.pins:
                out.append((h, slot))
        for h, slot in out:
            del self.by_hash[h]
            del self.hash_of[slot]
            self.num_evictions += 1
        return out

    def check(self) -> None:
        """Assert the state invariants (tests): every slot in exactly one state."""
        stored = set(self.by_hash.values())
        free = set(self.free)
        assert len(free) == len(self.free), "a slot freed twice"
        assert not (stored & free) and not (stored & self.granted) and not (free & self.granted)
        assert set(self.pins) <= stored
