"""The KV pool's part of the scheduler's stats: pages, bytes held and reserved, queue."""

from __future__ import annotations

from houchu.cache_tiers.page_allocator import PageAllocator
from houchu.scheduler.batcher import Batcher
from houchu.transport.messages import RunnerInfo
from houchu.transport.stats import PoolStats


def pool_stats(runner: RunnerInfo, batcher: Batcher, allocator: PageAllocator) -> PoolStats:
    """Counters of the running / waiting requests and the KV pool they use.

    Pages are KV pages of ``page_size`` tokens; ``kv_bytes_reserved`` counts the bytes
    of the live pages the running requests hold, ``kv_bytes_max_length`` the bytes they
    would hold at their longest (prompt + ``max_tokens``, capped by the context).
    """
    running = batcher.running.values()
    bpt = runner.kv_bytes_per_token
    held = sum(len(r.page_table) - r.num_dead_pages for r in running)
    reserved = held * runner.page_size * bpt
    max_len = sum(r.max_length(runner.max_context) for r in running)
    return PoolStats(
        model=runner.model_name,
        num_running=len(batcher.running),
        num_waiting=len(batcher.waiting),
        num_waiting_tokens=sum(r.num_prompt for r in batcher.waiting),
        num_pages_total=allocator.num_pages,
        num_pages_free=allocator.num_free,
        num_pages_used=allocator.num_used,
        page_size=allocator.page_size,
        kv_bytes_per_token=bpt,
        kv_bytes_reserved=reserved,
        kv_bytes_max_length=max_len * bpt,
        max_context=runner.max_context,
        cpu_isa=runner.cpu_isa,
        decode_paths=runner.decode_paths,
        deterministic=runner.deterministic,
        num_preemptions=batcher.num_preemptions,
    )
