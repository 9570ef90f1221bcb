"""Radix prefix cache in the scheduler: reuse, sharing, eviction, and invariants under
random operations (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from houchu.cache_tiers.page_allocator import PageAllocator
from houchu.cache_tiers.radix_tree import HOLLOW, RadixTree
from houchu.scheduler.admission import Rejected
from tests.support.scheduler import check_page_tables, make_core, req, run_step

PS = 4


def finish(core, rid: str) -> None:
    while core.batcher.get(rid) is not None:
        run_step(core)


def test_second_request_reuses_full_pages_of_the_first():
    core = make_core(num_pages=32, page_size=PS, radix=True)
    core.add(req("a", 10, max_tokens=2))
    finish(core, "a")
    # "a" computed 11 tokens: pages 0 and 1 (8 tokens) are full and cached.
    assert core.tree.num_pages == 2
    core.add(req("b", 10, max_tokens=2))
    plan, events = run_step(core)
    (w,) = plan.work
    assert w.start_pos == 8 and w.token_ids == [18, 19]
    assert events[0].cached_tokens == 8
    check_page_tables(core)
    assert core.stats()["prefix_tokens_reused"] == 8


def test_fully_cached_prompt_still_computes_its_last_token():
    core = make_core(num_pages=32, page_size=PS, radix=True)
    core.add(req("a", 8, max_tokens=3))  # exactly 2 full pages
    finish(core, "a")
    core.add(req("b", 8, max_tokens=1))
    plan, events = run_step(core)
    (w,) = plan.work
    # 8 tokens cached, but the last one must be computed to sample: back off a page.
    assert w.start_pos == 4 and w.token_ids == [14, 15, 16, 17]
    assert events[0].cached_tokens == 4


def test_multi_turn_extension_hits():
    core = make_core(num_pages=32, page_size=PS, radix=True)
    core.add(req("turn1", 9, max_tokens=4))
    finish(core, "turn1")
    # The second turn resends the first turn's prompt plus its answer plus more.
    first = list(range(10, 19)) + [7, 7, 7]
    core.add(
        req("turn2", 0, max_tokens=2).__class__(
            rid="turn2",
            prompt_ids=first + [30, 31, 32],
            sampling=req("x", 1).sampling,
            stop_ids=[2],
        )
    )
    plan, _ = run_step(core)
    assert plan.work[0].start_pos == 12  # 3 full pages of prompt + answer reused


def test_eviction_makes_room_lru_first():
    core = make_core(num_pages=6, page_size=PS, radix=True)
    for i, rid in enumerate(["a", "b"]):
        core.add(
            req(rid, 9, max_tokens=1).__class__(
                rid=rid,
                prompt_ids=[100 * (i + 1) + t for t in range(9)],
                sampling=req("x", 1, max_tokens=1).sampling,
                stop_ids=[2],
            )
        )
        finish(core, rid)
    assert core.tree.num_pages == 4 and core.allocator.num_free == 2
    core.add(req("c", 16, max_tokens=4))  # needs 5 pages: evicts 3 cached pages
    finish(core, "c")
    check_page_tables(core)
    assert core.tree.num_evicted >= 3


def test_concurrent_identical_prompts_share_pages():
    core = make_core(num_pages=32, page_size=PS, radix=True, max_batch_tokens=64)
    core.add(req("a", 12, max_tokens=5))
    run_step(core)
    core.add(req("b", 12, max_tokens=5))
    run_step(core)
    a, b = core.batcher.get("a"), core.batcher.get("b")
    assert a.page_table[:2] == b.page_table[:2]  # the cached pages are shared
    check_page_tables(core)


def test_abort_keeps_cached_pages_consistent():
    core = make_core(num_pages=32, page_size=PS, radix=True)
    core.add(req("a", 12, max_tokens=8))
    run_step(core)
    run_step(core)
    core.abort("a")
    check_page_tables(core)
    assert core.allocator.num_free + core.tree.num_pages == 32


@settings(max_examples=120, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "step", "step", "step", "abort", "evict"]),
            st.integers(0, 3),  # which shared prefix
            st.integers(1, 14),  # prompt length
            st.integers(1, 6),  # max tokens
        ),
        min_size=1,
        max_size=60,
    ),
    st.booleans(),
)
def test_invariants_under_random_operations(ops, radix):
    core = make_core(
        num_pages=12, page_size=PS, radix=radix, max_batch_tokens=16, chunked_prefill_size=8
    )
    n = 0
    finals: dict[str, int] = {}
    for op, prefix, length, max_tokens in ops:
        if op == "add":
            rid = f"r{n}"
            n += 1
            ids = [1000 * prefix + t for t in range(length)]
            try:
                core.add(
                    req(rid, 1, max_tokens).__class__(
                        rid=rid,
                        prompt_ids=ids,
                        sampling=req("x", 1, max_tokens).sampling,
                        stop_ids=[2],
                    )
                )
                finals[rid] = 0
            except Rejected:  # does not fit the pool or the queue: refused, never queued
                pass
        elif op == "step" and core.has_work:
            plan = core.next_plan()
            if plan is not None:
                from houchu.transport.messages import SeqOutput, StepResult

                outs = [SeqOutput(rid=w.rid, token_id=5 + prefix) for w in plan.work if w.sample]
                for ev in core.apply(
                    StepResult(step_id=plan.step_id, outputs=outs, duration_s=0, num_tokens=0)
                ):
                    if ev.finish_reason:
                        finals[ev.rid] += 1
        elif op == "abort" and finals:
            rid = sorted(finals)[prefix % len(finals)]
            if core.abort(rid):
                finals[rid] += 1
        elif op == "evict" and core.tree:
            core.tree.evict(length)
        check_page_tables(core)
    # drain: everything left finishes, and only tree-held pages stay out of the free list
    for _ in range(500):
        if not core.has_work:
            break
        plan = core.next_plan()
        if plan is None:
            break
        from houchu.transport.messages import SeqOutput, StepResult

        outs = [SeqOutput(rid=w.rid, token_id=3) for w in plan.work if w.sample]
        for ev in core.apply(
            StepResult(step_id=plan.step_id, outputs=outs, duration_s=0, num_tokens=0)
        ):
            if ev.finish_reason:
                finals[ev.rid] += 1
        check_page_tables(core)
    assert not core.batcher.running and not core.batcher.waiting
    assert all(v == 1 for v in finals.values()), finals  # exactly one end per request
    cached = core.tree.num_pages if core.tree else 0
    assert core.allocator.num_free == core.allocator.num_pages - cached


def test_tree_match_insert_evict_directly():
    a = PageAllocator(8, 2)
    tree = RadixTree(a)
    pages = a.allocate(3)
    node = tree.insert([1, 2, 3, 4, 5, 6], pages, 0, tree.root)
    assert tree.num_pages == 3 and all(a.ref_count(p) == 2 for p in pages)
    got, last = tree.match([1, 2, 3, 4, 9, 9], max_tokens=6)
    assert got == pages[:2] and last is node.parent
    a.free(pages)  # the request leaves; the tree keeps its reference
    assert tree.evict(1) == 1 and tree.num_pages == 2  # the leaf [5, 6] goes first
    assert tree.match([1, 2, 3, 4, 5, 6], 6)[0] == pages[:2]


def test_a_windowed_tree_frees_pages_behind_every_window():
    """Window 8, pages of 4: a prefix of m pages is usable while its last two pages hold
    KV. Under pressure the unlocked pages behind the windows are freed first (the
    interior nodes hollowed), a longer match still finds its window, a shorter one whose
    window lost its KV shrinks, and a new sequence fills a hollow node again."""
    a = PageAllocator(8, 4)
    tree = RadixTree(a, window=8)
    tokens = list(range(100, 124))  # 6 pages
    pages = a.allocate(6)
    tree.insert(tokens, pages, 0, tree.root)
    a.free(pages)  # the request leaves; only the tree holds them
    assert tree.evict(2) == 2 and tree.num_hollowed == 2 and tree.num_pages == 4
    assert a.num_free == 4  # pages 0 and 1 of the path went back to the pool
    got, node = tree.match(tokens + [1], 25)  # 6 pages: its window is pages 4 and 5
    assert got == [HOLLOW] * 4 + pages[4:] and node.page == pages[5]
    assert tree.match(tokens, 12) == ([], tree.root)  # pages 0-1 (its window) are gone
    got, _ = tree.match(tokens, 16)  # 4 pages: window pages 2 and 3 are intact
    assert got == [HOLLOW, HOLLOW, pages[2], pages[3]]
    fresh = a.allocate(2)
    tree.insert(tokens[:8], fresh, 0, tree.root)  # recomputed: the hollow nodes fill
    assert tree.num_pages == 6 and tree.match(tokens, 8)[0] == fresh
    a.free(fresh)
    assert tree.evict(10) == 6 and tree.num_pages == 0 and not tree.root.children
    assert a.num_free == 8


def test_a_tree_without_window_never_hollows():
    a = PageAllocator(8, 4)
    tree = RadixTree(a)
    pages = a.allocate(3)
    tree.insert(list(range(12)), pages, 0, tree.root)
    a.free(pages)
    assert tree.evict(1) == 1 and tree.num_hollowed == 0
    assert tree.match(list(range(12)), 12)[0] == pages[:2]  # the leaf went, not page 0
