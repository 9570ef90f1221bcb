"""Prefill groups: the choices of one client request (``n > 1``, ``best_of``) share one
prompt, which is prefilled once.

The gateway sends each choice as its own request, all with the same ``prefill_group``.
The first one admitted prefills the prompt; the others stay queued (others may pass
them) until it has computed the prompt's shareable pages — every full page before the
last prompt token, the most a radix match gives (``PrefixCache.match``) — which the
batcher indexes in the radix tree as they are computed. Then they are admitted, match
those pages and compute only the rest of the prompt (under a page). vLLM's parallel
sampling shares the prompt's KV blocks the same way, through its prefix cache.

Without the radix cache (``--disable-radix-cache``) nothing can be shared, so nothing
is held: every choice prefills its own prompt. What the choices did not recompute is
the ``parallel_sampling`` lever (``SchedulerLedger.on_admitted``).
"""

from __future__ import annotations

from houchu.scheduler.request import Request, Status


class PrefillGroups:
    """The requests of each prefill group still queued or running.

    Args:
        enabled: the radix cache is on (else ``is_held`` is always False).
        page_size: tokens per KV page.
    """

    def __init__(self, enabled: bool, page_size: int) -> None:
        self.enabled = enabled
        self.page_size = page_size
        self._members: dict[str, list[Request]] = {}
        self._started: set[str] = set()  # groups a choice of which was admitted

    def shareable(self, req: Request) -> int:
        """Prompt tokens of ``req`` that another choice's pages can give it."""
        return (req.num_prompt - 1) // self.page_size * self.page_size

    def add(self, req: Request) -> None:
        """A request arrived (one of a group when ``req.prefill_group`` is set)."""
        if req.prefill_group:
            self._members.setdefault(req.prefill_group, []).append(req)

    def remove(self, req: Request) -> None:
        """A request left (finished, aborted or failed)."""
        members = self._members.get(req.prefill_group)
        if members is None:
            return
        if req in members:
            members.remove(req)
        if not members:
            del self._members[req.prefill_group]
            self._started.discard(req.prefill_group)

    def is_held(self, req: Request) -> bool:
        """Whether queued ``req`` waits: another choice of its group is running and has
        not computed the prompt's shareable pages yet."""
        if not self.enabled or not req.prefill_group or req.num_preemptions:
            return False
        need = self.shareable(req)
        if need == 0:
            return False
        return any(
            m is not req and m.status is Status.RUNNING and m.num_computed < need
            for m in self._members.get(req.prefill_group, ())
        )

    def on_admitted(self, req: Request) -> None:
        """``req`` is admitted for the first time, its cached prefix matched: it shares
        its group's prefill (``Request.shares_prefill``) when another choice was admitted
        before it and pages came from the cache."""
        group = req.prefill_group
        if not self.enabled or not group or req.num_preemptions:
            return
        req.shares_prefill = group in self._started and req.cached_tokens > 0
        self._started.add(group)

    @property
    def num_groups(self) -> int:
        """Groups with a request queued or running."""
        return len(self._members)
