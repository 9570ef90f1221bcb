"""The scheduler's side of the KV tiers: host slots to write back into, lookups in
flight, and the page copies each step plan carries.

Regions of a request that waits on a lookup (pages, by index)::

    | device hit 0..m-1 | lower-tier hit m..m+k-1 (host slots) | recompute ... |

The device hit is shared from the radix tree; the lower-tier hit is copied into fresh
device pages by the runner before the step that first computes the request.
"""

from __future__ import annotations

import time

from houchu.cache_tiers.page_hash import chain_hashes
from houchu.cache_tiers.radix_tree import Node, RadixTree
from houchu.scheduler.request import Request
from houchu.transport.messages import PageCopy
from houchu.transport.stats import KVTierStats, TierManagerStats
from houchu.transport.tier_messages import (
    HostSlotGrant,
    TierLookup,
    TierLookupResult,
    TierRelease,
    TierStats,
    TierStore,
)

#: What the tier manager sends the scheduler.
TierReply = HostSlotGrant | TierLookupResult | TierStats


class Lookup:
    """A lookup of pages ``start_page ..`` of one request."""

    def __init__(self, start_page: int, hashes: list[bytes], sent_at: float) -> None:
        self.start_page = start_page
        self.hashes = hashes
        self.sent_at = sent_at
        self.result: TierLookupResult | None = None


class TierClient:
    """Bookkeeping of the scheduler's traffic with the KV-tier manager.

    Args:
        fingerprint: model + KV layout fingerprint (16 bytes), the root of page hashes.
        page_size: tokens per page.
        write_through: save every newly cached page, not only evicted ones.
        lookup_timeout_s: seconds to wait for a lookup before recomputing instead.
    """

    def __init__(
        self, fingerprint: bytes, page_size: int, write_through: bool, lookup_timeout_s: float
    ) -> None:
        self.fingerprint = fingerprint
        self.page_size = page_size
        self.write_through = write_through
        self.timeout_s = lookup_timeout_s
        self.stash: list[int] = []  # granted host slots
        self.saves: list[tuple[PageCopy, bytes]] = []  # for the next plan
        self.saves_in_flight: dict[int, list[tuple[PageCopy, bytes]]] = {}
        self.loads_in_flight: dict[int, list[int]] = {}  # step -> host slots to release
        self.lookups: dict[str, Lookup] = {}
        self.outbox: list = []  # messages for the tier manager
        self.tier_stats: TierManagerStats | None = None  # the manager's, as last sent
        self.pages_loaded = {"host": 0, "ssd": 0}
        self.pages_saved = 0
        self.pages_dropped = 0  # evicted with no host slot to write back into
        self.num_lookups = 0
        self.num_timeouts = 0

    def receive(self, msg: TierReply) -> None:
        """Take in a message of the tier manager: host slots granted, a lookup's answer,
        or its counters (shown in the stats)."""
        match msg:
            case HostSlotGrant():
                self.on_grant(msg)
            case TierLookupResult():
                self.on_result(msg)
            case TierStats(stats=stats):
                self.tier_stats = stats

    @property
    def is_looking_up(self) -> bool:
        """Some lookup was sent and not taken yet (lookups time out: look now and then)."""
        return bool(self.lookups)

    # ------------------------------------------------------------------ write side

    def watch(self, tree: RadixTree) -> None:
        """Copy the radix tree's pages to the host tier as they leave the device
        (write-back), or as soon as they are cached (write-through)."""
        tree.on_evict = self._on_evict
        if self.write_through:
            tree.on_insert = self._on_insert

    def _on_evict(self, node: Node) -> None:
        """Write-back: a cached page leaves the device; copy it to the host tier."""
        if not node.is_saved:
            self.save(node.page, node.hash)
            node.is_saved = True

    def _on_insert(self, node: Node) -> None:
        """Write-through: every newly cached page is copied to the host tier."""
        node.is_saved = self.save(node.page, node.hash)

    def on_grant(self, msg: HostSlotGrant) -> None:
        """Host slots granted by the tier manager, to write pages into."""
        self.stash.extend(msg.slots)

    def save(self, device_page: int, page_hash: bytes) -> bool:
        """Queue a copy of ``device_page`` into a granted host slot (False: none left)."""
        if not self.stash:
            self.pages_dropped += 1
            return False
        self.saves.append((PageCopy(device_page, self.stash.pop()), page_hash))
        return True

    # ------------------------------------------------------------------ read side

    def hashes(self, tokens: list[int], num_pages: int) -> list[bytes]:
        """The chained hashes of the first ``num_pages`` full pages of ``tokens``."""
        return chain_hashes(self.fingerprint, tokens, self.page_size, num_pages)

    def begin_lookup(self, req: Request) -> bool:
        """Ask for ``req``'s full pages after its device hit, once per admission. True
        when a lookup was started (the request waits for its answer; the caller gives
        its device pages back, matched again once the answer is in)."""
        if req.is_tier_checked:
            return False
        first = len(req.page_table)
        last = (req.num_tokens - 1) // self.page_size
        if last <= first:
            return False
        req.is_tier_checked = True
        self.start_lookup(req.rid, req.all_ids(), first, last)
        return True

    def start_lookup(self, rid: str, tokens: list[int], start_page: int, end_page: int) -> None:
        """Ask for pages ``start_page .. end_page - 1`` of ``tokens``."""
        hashes = self.hashes(tokens, end_page)[start_page:]
        self.lookups[rid] = Lookup(start_page, hashes, time.monotonic())
        self.outbox.append(TierLookup(rid, hashes))
        self.num_lookups += 1

    def on_result(self, msg: TierLookupResult) -> bool:
        """Record a lookup's answer. False (and its slots released) if nobody waits."""
        lookup = self.lookups.get(msg.rid)
        if lookup is None or lookup.result is not None:
            if msg.slots:
                self.outbox.append(TierRelease(msg.slots))
            return False
        lookup.result = msg
        return True

    def is_pending(self, rid: str) -> bool:
        """Waiting for an answer that has not timed out yet."""
        lookup = self.lookups.get(rid)
        if lookup is None or lookup.result is not None:
            return False
        if time.monotonic() - lookup.sent_at > self.timeout_s:
            self.num_timeouts += 1
            lookup.result = TierLookupResult(rid, [], [])  # recompute; a late answer is released
            return False
        return True

    def num_usable(self, rid: str, device_pages: int) -> int:
        """Pages of the answer usable after a device hit of ``device_pages`` pages."""
        lookup = self.lookups.get(rid)
        if lookup is None or lookup.result is None:
            return 0
        skip = device_pages - lookup.start_page
        n = len(lookup.result.slots)
        return n - skip if 0 <= skip < n else 0

    def take(self, rid: str, device_pages: int) -> tuple[list[int], list[str]]:
        """The host slots usable after a device hit of ``device_pages`` pages (the rest of
        the answer is released), and their tiers."""
        lookup = self.lookups.pop(rid, None)
        if lookup is None or lookup.result is None:
            return [], []
        slots, tiers = lookup.result.slots, lookup.result.tiers
        skip = device_pages - lookup.start_page
        if skip < 0 or skip >= len(slots):
            if slots:
                self.outbox.append(TierRelease(slots))
            return [], []
        if skip:
            self.outbox.append(TierRelease(slots[:skip]))
        for tier in tiers[skip:]:
            self.pages_loaded[tier] += 1
        return slots[skip:], tiers[skip:]

    def forget(self, rid: str) -> None:
        """The request is gone: release whatever its lookup holds."""
        lookup = self.lookups.pop(rid, None)
        if lookup is not None and lookup.result is not None and lookup.result.slots:
            self.outbox.append(TierRelease(lookup.result.slots))

    # ------------------------------------------------------------------ per step

    @property
    def has_saves(self) -> bool:
        """Pages are queued for saving: the next plan carries them even if it has no
        work."""
        return bool(self.saves)

    def plan_copies(
        self, step_id: int, loads: list[PageCopy]
    ) -> tuple[list[PageCopy], list[PageCopy]]:
        """The saves and loads of step ``step_id``."""
        saves, self.saves = self.saves, []
        if saves:
            self.saves_in_flight[step_id] = saves
        if loads:
            self.loads_in_flight[step_id] = [c.host_slot for c in loads]
        return [c for c, _ in saves], loads

    def on_step_done(self, step_id: int, ok: bool) -> None:
        """The runner finished the step: report saved slots, release loaded ones."""
        saves = self.saves_in_flight.pop(step_id, [])
        if saves:
            entries = [(h, c.host_slot) for c, h in saves] if ok else []
            unused = [] if ok else [c.host_slot for c, _ in saves]
            self.outbox.append(TierStore(entries, unused))
            self.pages_saved += len(entries)
        loads = self.loads_in_flight.pop(step_id, [])
        if loads:
            self.outbox.append(TierRelease(loads))

    def drop_saves(self) -> None:
        """The device pages queued for saving are gone (the runner was replaced): their
        host slots go back to the stash unused."""
        self.stash.extend(c.host_slot for c, _ in self.saves)
        self.saves = []

    def reset(self) -> None:
        """The tier manager was replaced: its grants, pins and answers are void. Pending
        lookups become misses (recompute), queued copies and messages are dropped."""
        self.stash.clear()
        self.saves = []
        self.saves_in_flight.clear()
        self.loads_in_flight.clear()
        self.outbox = []
        self.tier_stats = None
        for rid, lookup in self.lookups.items():
            lookup.result = TierLookupResult(rid, [], [])

    def drain(self) -> list:
        """The messages for the tier manager queued since the last call."""
        out, self.outbox = self.outbox, []
        return out

    def stats(self) -> KVTierStats:
        """The tier manager's counters and the scheduler's (tokens and pages)."""
        ps = self.page_size
        return KVTierStats(
            manager=self.tier_stats,
            tier_tokens_loaded_host=self.pages_loaded["host"] * ps,
            tier_tokens_loaded_ssd=self.pages_loaded["ssd"] * ps,
            tier_pages_saved=self.pages_saved,
            tier_pages_dropped=self.pages_dropped,
            tier_lookups=self.num_lookups,
            tier_lookup_timeouts=self.num_timeouts,
            host_slots_granted=len(self.stash),
        )
