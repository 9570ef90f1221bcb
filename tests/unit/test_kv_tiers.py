"""KV tiers without a model: page hashes, the host index, SSD files, the scheduler's
tier bookkeeping, and device <-> host page copies."""

from __future__ import annotations

import os
import time

import pytest
import torch

from houchu.cache_tiers.host_pool import HostPool
from houchu.cache_tiers.host_tier import HostTier
from houchu.cache_tiers.page_allocator import PageAllocator
from houchu.cache_tiers.page_hash import chain_hashes, page_hash
from houchu.cache_tiers.radix_tree import RadixTree
from houchu.cache_tiers.ssd_tier import SsdTier
from houchu.model.kv.pool import KVPool
from houchu.model.kv.transfer import HostKVMirror
from houchu.scheduler.tiers import TierClient
from houchu.transport.messages import PageCopy
from houchu.transport.tier_messages import HostSlotGrant, TierLookupResult, TierRelease, TierStore

FP = bytes(range(16))


def test_chain_hashes_depend_on_the_whole_prefix():
    a = chain_hashes(FP, [1, 2, 3, 4, 5, 6], 2, 3)
    b = chain_hashes(FP, [9, 2, 3, 4, 5, 6], 2, 3)
    assert len(a) == 3 and len(set(a) | set(b)) == 6  # one changed token changes every hash
    assert a[1] == page_hash(a[0], [3, 4])
    assert chain_hashes(bytes(16), [1, 2], 2, 1) != a[:1]  # another model fingerprint


def test_radix_nodes_carry_chain_hashes_and_report_evictions():
    alloc = PageAllocator(8, 2)
    tree = RadixTree(alloc, FP)
    evicted = []
    tree.on_evict = lambda node: evicted.append((node.page, node.hash))
    pages = alloc.allocate(3)
    tree.insert([1, 2, 3, 4, 5, 6], pages, 0, tree.root)
    alloc.free(pages)
    tree.evict(3)
    assert sorted(h for _, h in evicted) == sorted(chain_hashes(FP, [1, 2, 3, 4, 5, 6], 2, 3))


def test_host_tier_states():
    t = HostTier(6)
    granted = t.grant(4)
    assert len(granted) == 4 and len(t.free) == 2
    assert t.store(b"a" * 16, granted[0]) and t.store(b"b" * 16, granted[1])
    assert not t.store(b"a" * 16, granted[2])  # a duplicate frees its slot
    t.give_back([granted[3]])
    assert t.lookup([b"a" * 16, b"b" * 16, b"c" * 16]) == granted[:2]
    assert t.victims(2) == []  # both pinned
    t.release(granted[:2])
    assert [s for _, s in t.victims(1)] == [granted[0]]  # least recently used first
    t.check()


def test_ssd_tier_round_trip_and_restart(tmp_path):
    ssd = SsdTier(tmp_path, FP, 1 << 20)
    payload = os.urandom(1000)
    assert ssd.write(b"h" * 16, payload)
    again = SsdTier(tmp_path, FP, 1 << 20)  # a restart: the index is rebuilt from files
    out = bytearray(1000)
    assert again.read(b"h" * 16, memoryview(out)) and bytes(out) == payload


@pytest.mark.parametrize("damage", ["truncate", "flip", "fingerprint", "delete"])
def test_ssd_tier_corrupt_file_is_a_miss(tmp_path, damage):
    ssd = SsdTier(tmp_path, FP, 1 << 20)
    ssd.write(b"h" * 16, os.urandom(1000))
    path = next(ssd.dir.glob("*.page"))
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        path.write_bytes(data[:500])
    elif damage == "flip":
        data[-10] ^= 0xFF
        path.write_bytes(data)
    elif damage == "fingerprint":
        other = SsdTier(tmp_path / "other", bytes(16), 1 << 20)  # another model
        other.write(b"h" * 16, os.urandom(1000))
        path.write_bytes(next(other.dir.glob("*.page")).read_bytes())
    else:
        path.unlink()
    assert not ssd.read(b"h" * 16, memoryview(bytearray(1000)))
    assert b"h" * 16 not in ssd and not path.exists()


def test_ssd_tier_never_exceeds_its_cap(tmp_path):
    ssd = SsdTier(tmp_path, FP, 5000)
    for i in range(10):
        ssd.write(bytes([i]) * 16, os.urandom(1000))
        assert ssd.num_bytes <= 5000
    assert ssd.num_evictions > 0
    assert sum(f.stat().st_size for f in ssd.dir.glob("*.page")) <= 5000


def test_tier_client_lookup_take_and_timeout():
    c = TierClient(FP, page_size=2, write_through=False, lookup_timeout_s=0.05)
    c.on_grant(HostSlotGrant([7, 8]))
    assert c.save(3, b"x" * 16) and c.save(4, b"y" * 16) and not c.save(5, b"z" * 16)
    saves, loads = c.plan_copies(0, [])
    assert saves == [PageCopy(3, 8), PageCopy(4, 7)] and loads == []
    c.on_step_done(0, ok=True)
    (store,) = c.drain()
    assert isinstance(store, TierStore) and len(store.entries) == 2
    c.start_lookup("r", list(range(10)), start_page=1, end_page=4)
    assert c.is_pending("r")
    c.on_result(TierLookupResult("r", [11, 12, 13], ["host", "ssd", "ssd"]))
    assert c.num_usable("r", device_pages=2) == 2  # a device hit grew by one page meanwhile
    slots, tiers = c.take("r", device_pages=2)
    assert slots == [12, 13] and tiers == ["ssd", "ssd"]
    assert any(isinstance(m, TierRelease) and m.slots == [11] for m in c.drain())
    c.start_lookup("late", list(range(10)), 0, 4)
    c.drain()
    time.sleep(0.06)
    assert not c.is_pending("late") and c.num_timeouts == 1  # recompute instead
    c.take("late", 0)
    c.on_result(TierLookupResult("late", [1], ["host"]))
    assert c.drain() == [TierRelease([1])]  # a late answer is released


def test_page_copies_round_trip_through_shared_memory():
    pool = KVPool(
        num_layers=2, num_pages=4, page_size=2, num_kv_heads=1, head_dim=4, dtype=torch.float32
    )
    pool.k.copy_(torch.randn_like(pool.k))
    pool.v.copy_(torch.randn_like(pool.v))
    page_bytes = 2 * 2 * 2 * 1 * 4 * 4
    host = HostPool(f"houchu-test-{os.getpid()}", 3, page_bytes, create=True)
    try:
        mirror = HostKVMirror(pool, host)
        k1, v1 = pool.k[:, 1].clone(), pool.v[:, 1].clone()
        mirror.save([PageCopy(1, 2)])
        mirror.load([PageCopy(3, 2)])
        assert torch.equal(pool.k[:, 3], k1) and torch.equal(pool.v[:, 3], v1)
        # on the CPU the copies are done when save / load return: no stream, no pinning
        assert mirror.stream is None and not mirror.pinned
        mirror.finish()
        mirror.close()
        assert mirror.describe() == "host KV tier: 3 slots of 128 B pages"
        with pytest.raises(ValueError):
            mirror.check([PageCopy(0, 3)])
    finally:
        del mirror
        host.close()
