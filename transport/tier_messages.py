"""Messages between the scheduler and the KV-tier manager (host memory and SSD tiers).

Bulk KV never travels here: a page is named by its chained hash (``bytes``, 16) and by
its slot in the shared host pool. Flow::

    tier manager --HostSlotGrant--> scheduler        free host slots to write back into
    scheduler --TierStore--> tier manager            the runner wrote these slots
    scheduler --TierLookup--> tier manager --TierLookupResult--> scheduler
    scheduler --TierRelease--> tier manager          loaded slots may be reused
    tier manager --TierStats--> scheduler            counters, about once a second
"""

from __future__ import annotations

from msgspec import Struct, field

from houchu.transport.stats import TierManagerStats


class HostSlotGrant(Struct, tag=True):
    """Free host slots the scheduler may fill (each used once, then stored)."""

    slots: list[int]


class TierStore(Struct, tag=True):
    """Host slots now holding pages: (chained page hash, slot). ``unused``: granted slots
    handed back without being written."""

    entries: list[tuple[bytes, int]]
    unused: list[int] = field(default_factory=list)


class TierLookup(Struct, tag=True):
    """Find the longest run of ``hashes`` (consecutive pages of one prefix) in the lower
    tiers, loading SSD hits into host slots."""

    rid: str
    hashes: list[bytes]


class TierLookupResult(Struct, tag=True):
    """Host slots holding ``hashes[0 .. len(slots) - 1]`` of the lookup, pinned until
    released; ``tiers[i]`` is "host" or "ssd" (where slot i was found); ``load_s``:
    seconds spent reading SSD files."""

    rid: str
    slots: list[int]
    tiers: list[str]
    load_s: float = 0.0


class TierRelease(Struct, tag=True):
    """Unpin slots returned by a lookup (their pages are on the device now, or unused)."""

    slots: list[int]


class TierStats(Struct, tag=True):
    """The tier manager's counters (hits, misses, evictions, bytes moved per tier)."""

    stats: TierManagerStats
