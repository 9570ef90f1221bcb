"""The KV tiers when they are off (or the radix cache is off, which they need):
``NoTiers`` stands in for ``scheduler.tiers.TierClient``, so the batcher and the core
never check which they hold."""

from __future__ import annotations

from houchu.cache_tiers.radix_tree import RadixTree
from houchu.scheduler.request import Request
from houchu.scheduler.tiers import TierClient, TierReply
from houchu.transport.messages import PageCopy
from houchu.transport.stats import KVTierStats


class NoTiers:
    """The KV tiers off (or the radix cache off, which they need): no lookups, no copies,
    every page is recomputed."""

    fingerprint: bytes | None = None  # page hashes start from no fingerprint

    def receive(self, msg: TierReply) -> None:
        """Ignore a tier manager's message (there is none)."""

    @property
    def is_looking_up(self) -> bool:
        """Never (False)."""
        return False

    def watch(self, tree: RadixTree) -> None:
        """Leave the radix tree's pages on the device only."""

    def begin_lookup(self, req: Request) -> bool:
        """No lower tier to ask (False)."""
        return False

    def is_pending(self, rid: str) -> bool:
        """No lookup is ever pending (False)."""
        return False

    def num_usable(self, rid: str, device_pages: int) -> int:
        """No page to load (0)."""
        return 0

    def take(self, rid: str, device_pages: int) -> tuple[list[int], list[str]]:
        """No host slots (``[], []``)."""
        return [], []

    def forget(self, rid: str) -> None:
        """Nothing is held for a request."""

    @property
    def has_saves(self) -> bool:
        """Never (False)."""
        return False

    def plan_copies(
        self, step_id: int, loads: list[PageCopy]
    ) -> tuple[list[PageCopy], list[PageCopy]]:
        """No saves; the loads as given (none)."""
        return [], loads

    def on_step_done(self, step_id: int, ok: bool) -> None:
        """No copies to settle."""

    def drop_saves(self) -> None:
        """No saves queued."""

    def reset(self) -> None:
        """Nothing to reset."""

    def drain(self) -> list:
        """No messages ([])."""
        return []

    def stats(self) -> KVTierStats | None:
        """No counters (None)."""
        return None


#: What the scheduler holds: the tier manager's client, or its stand-in when off.
Tiers = TierClient | NoTiers
