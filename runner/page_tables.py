"""The page table of each request as the runner holds it between steps.

A step plan carries only the pages the runner lacks (``SeqWork.page_table`` whole, or
``SeqWork.new_pages`` to append), as vLLM v1's scheduler sends ``new_block_ids``
(``vllm/v1/core/sched/output.py``) rather than every block table every step. The
scheduler's side is ``Request.give_pages``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from msgspec import structs

from houchu.transport.step_messages import SeqWork


class PageTables:
    """Each registered request's page table (list[int] of page indices), updated by the
    work items of the plans in the order they run.

    ``resolve`` checks a plan's updates and returns its work with whole tables, without
    changing anything; ``commit`` keeps them once the plan is accepted, so a plan that
    is refused changes nothing.
    """

    def __init__(self) -> None:
        self._tables: dict[str, list[int]] = {}

    def __len__(self) -> int:
        return len(self._tables)

    def get(self, rid: str) -> list[int] | None:
        """The table held for ``rid`` (None: none)."""
        return self._tables.get(rid)

    def resolve(
        self, work: Sequence[SeqWork], released: Iterable[str] = ()
    ) -> tuple[list[SeqWork], dict[str, list[int]]]:
        """The work items with whole page tables, and the tables to keep after the
        step (``commit``). ``released``: rids the plan releases first (their tables are
        gone before its work runs).

        The tables' page indices are checked against the pool where the batch is built
        (``houchu.model.batch.build_batch``).

        Raises:
            ValueError: new pages for a request with no table (or a released one).
        """
        gone = set(released)
        out: list[SeqWork] = []
        updates: dict[str, list[int]] = {}
        for w in work:
            if w.page_table is not None:
                table = w.page_table  # never changed in place: a delta makes a new list
            else:
                held = None if w.rid in gone else self._tables.get(w.rid)
                if held is None:
                    raise ValueError(
                        f"request {w.rid!r}: new pages but no page table (send page_table)"
                    )
                table = held + w.new_pages
            updates[w.rid] = table
            out.append(w if w.page_table is not None else structs.replace(w, page_table=table))
        return out, updates

    def commit(self, updates: dict[str, list[int]], released: Iterable[str] = ()) -> None:
        """Forget the ``released`` requests' tables, then keep ``updates`` (``resolve``'s)."""
        for rid in released:
            self._tables.pop(rid, None)
        self._tables.update(updates)

    def clear(self) -> None:
        """Forget every table (the scheduler that sent them is gone)."""
        self._tables.clear()
