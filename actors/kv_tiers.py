"""The KV-tier manager actor: owns the host-memory and SSD tiers and their index.

The scheduler owns the device tier. It writes evicted device pages (write-back) or every
new cached page (write-through) into host slots this actor granted it, then reports them
(``TierStore``). A prefix that misses on the device is looked up here (``TierLookup``):
host hits are pinned, SSD hits are read into free host slots first, and the slots go back
(``TierLookupResult``) for the runner to load. Host slots under pressure spill to SSD,
least recently used first. SSD file I/O runs in a worker thread, so lookups and stores
never stall on a disk inside the event loop.

Restarts: when the scheduler is replaced, this actor takes back every slot granted to it
or pinned for it and grants fresh ones to the new scheduler. When this actor is replaced,
the host pool (shared memory, owned by the launcher) survives but its index does not, so
the new one starts with every host slot free; the SSD tier is found again by re-scanning
its directory.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec
import zmq.asyncio

from houchu.cache_tiers.host_pool import HostPool
from houchu.cache_tiers.host_tier import HostTier
from houchu.cache_tiers.ssd_tier import SsdTier
from houchu.options.serve_config import ServeConfig
from houchu.paths import cache_dir
from houchu.transport.actor_base import ActorBase
from houchu.transport.messages import ActorDown, ActorUp, Shutdown
from houchu.transport.stats import TierManagerStats
from houchu.transport.tier_messages import (
    HostSlotGrant,
    TierLookup,
    TierLookupResult,
    TierRelease,
    TierStats,
    TierStore,
)

KVTierInbox = TierStore | TierLookup | TierRelease | Shutdown | ActorDown | ActorUp

#: seconds between two ``TierStats`` sent unasked to the scheduler
TIER_STATS_S = 1.0


class KVTierActor(ActorBase[KVTierInbox]):
    """Host and SSD KV tiers behind the scheduler's radix cache."""

    name = "kv_tiers"

    def __init__(self, ctx: zmq.asyncio.Context, config: ServeConfig) -> None:
        super().__init__(ctx, config.endpoints, KVTierInbox)
        self.config = config
        self.to_scheduler = self.peers.outbox("scheduler")
        # Slots kept granted to the scheduler: one eviction burst can write back this many
        # pages; the rest of the host tier serves lookups and SSD loads.
        pages = config.launch.host_pool_pages
        self.stash = max(4, min(512, pages // 2))
        self.pool: HostPool | None = None
        self.host = HostTier(pages)
        self.ssd: SsdTier | None = None
        self.host_hits = 0
        self.host_misses = 0
        self.load_s = 0.0
        self.spill_bytes = 0
        self.stats_sent_at = 0.0  # time.monotonic() of the last TierStats sent unasked

    async def start(self) -> str:
        c, launch = self.config.kv_tiers, self.config.launch
        self.pool = HostPool(launch.host_pool_name, launch.host_pool_pages, launch.host_slot_bytes)
        if c.ssd_kv_mb > 0:
            root = Path(c.kv_cache_dir) if c.kv_cache_dir else cache_dir() / "kv"
            fp = bytes.fromhex(launch.kv_fingerprint)
            self.ssd = await asyncio.to_thread(SsdTier, root, fp, c.ssd_kv_bytes)
        await self._refill()
        ssd = f", SSD {c.ssd_kv_mb} MiB ({len(self.ssd.index)} pages found)" if self.ssd else ""
        pages = f"{launch.host_pool_pages} pages x {launch.host_slot_bytes} B"
        return f"host {pages}{ssd}, {c.kv_write_policy}"

    def wake_in(self) -> float:
        """The scheduler gets fresh counters at least every ``TIER_STATS_S`` seconds."""
        return TIER_STATS_S

    async def on_quiet(self) -> None:
        await self._send_stats_if_due()

    async def after_messages(self) -> None:
        await self._send_stats_if_due()

    async def _send_stats_if_due(self) -> None:
        if time.monotonic() - self.stats_sent_at > TIER_STATS_S:
            self.stats_sent_at = time.monotonic()
            await self.to_scheduler.send(TierStats(self.stats()))

    async def handle(self, msg: KVTierInbox) -> None:
        match msg:
            case TierStore(entries=entries, unused=unused):
                await self._store(entries, unused)
            case TierLookup():
                await self.to_scheduler.send(await self._lookup(msg))
                # fresh counters with the result, so /stats agrees with the loads
                await self.to_scheduler.send(TierStats(self.stats()))
            case TierRelease(slots=slots):
                self.host.release(slots)

    async def on_peer_down(self, name: str) -> None:
        if name == "scheduler":
            await self._on_scheduler_replaced()

    async def on_shutdown(self) -> None:
        await self._flush_to_ssd()

    async def _on_scheduler_replaced(self) -> None:
        """Take back what the dead scheduler held (granted slots, pinned lookups) and
        grant fresh slots to its replacement."""
        self.host.give_back(sorted(self.host.granted))
        self.host.pins.clear()
        await self._refill()

    async def _store(self, entries: list[tuple[bytes, int]], unused: list[int]) -> None:
        self.host.give_back(unused)
        for h, slot in entries:
            kept = self.host.store(h, slot)
            if kept and self.ssd is not None and self.config.kv_tiers.write_through:
                await self._write_ssd(h, slot)
        await self._refill()

    async def _refill(self) -> None:
        """Keep ``stash`` slots granted to the scheduler, spilling LRU slots if needed."""
        want = self.stash - len(self.host.granted)
        if want <= 0:
            return
        if len(self.host.free) < want:
            await self._spill(want - len(self.host.free))
        slots = self.host.grant(want)
        if slots:
            await self.to_scheduler.send(HostSlotGrant(slots))

    async def _spill(self, n: int) -> None:
        """Free ``n`` host slots: LRU unpinned pages go to SSD (if any) and are dropped."""
        for h, slot in self.host.victims(n):
            if self.ssd is not None and h not in self.ssd:
                await self._write_ssd(h, slot)
            self.host.give_back([slot])

    async def _write_ssd(self, h: bytes, slot: int) -> None:
        with self.pool.slot(slot) as view:
            data = bytes(view)
        if await asyncio.to_thread(self.ssd.write, h, data):
            self.spill_bytes += len(data)

    async def _lookup(self, msg: TierLookup) -> TierLookupResult:
        slots = self.host.lookup(msg.hashes)
        tiers = ["host"] * len(slots)
        self.host_hits += len(slots)
        t0 = time.perf_counter()
        for h in msg.hashes[len(slots) :]:
            more = self.host.lookup([h])  # a run may alternate between host and SSD
            if more:
                slots += more
                tiers.append("host")
                self.host_hits += 1
                continue
            if self.ssd is None or h not in self.ssd:
                break
            slot = self.host.take_free()
            if slot is None:
                await self._spill(1)
                slot = self.host.take_free()
            if slot is None:
                break  # every host slot is pinned or granted: stop here, recompute the rest
            view = self.pool.slot(slot)
            ok = await asyncio.to_thread(self.ssd.read, h, view)
            view.release()
            if not ok:
                self.host.give_back([slot])
                break
            self.host.store(h, slot)
            self.host.pin(slot)
            slots.append(slot)
            tiers.append("ssd")
        if len(slots) < len(msg.hashes):
            self.host_misses += 1
        self.load_s += time.perf_counter() - t0
        return TierLookupResult(msg.rid, slots, tiers, time.perf_counter() - t0)

    async def _flush_to_ssd(self) -> None:
        """At shutdown, keep what the host tier holds: write it to SSD (within its cap)."""
        if self.ssd is None:
            return
        for h, slot in list(self.host.by_hash.items()):
            if h not in self.ssd:
                await self._write_ssd(h, slot)

    def stats(self) -> TierManagerStats:
        """The tiers' counters for the scheduler's ``/stats`` (pages, bytes, seconds)."""
        host, ssd = self.host, self.ssd
        out = TierManagerStats(
            host_pages_total=host.num_slots,
            host_pages_stored=host.num_stored_now,
            host_pages_pinned=len(host.pins),
            host_hits=self.host_hits,
            host_lookup_misses=self.host_misses,
            host_evictions=host.num_evictions,
            tier_load_s=self.load_s,
        )
        if ssd is not None:
            out = msgspec.structs.replace(
                out,
                ssd_pages_stored=len(ssd.index),
                ssd_bytes=ssd.num_bytes,
                ssd_capacity_bytes=ssd.capacity_bytes,
                ssd_hits=ssd.num_hits,
                ssd_misses=ssd.num_misses,
                ssd_corrupt=ssd.num_corrupt,
                ssd_evictions=ssd.num_evictions,
                ssd_bytes_written=ssd.bytes_written,
                ssd_bytes_read=ssd.bytes_read,
            )
        return out

    async def on_close(self) -> None:
        if self.pool is not None:
            self.pool.close()
