"""Prefill groups: the choices of one client request (``n > 1``, ``best_of``) share one
prompt, which is prefilled once.

The gateway sends each choice as its own request, all with the same ``prefill_group``.
The first one admitted prefills the prompt; the others stay queued (others may pass
them) until it has computed the prompt's shareable pages — every full page before the
last prompt token, the most a radix match gives (``PrefixCache.match``) — which the
batcher indexes in the radix tree as they are computed. Then they are admitted, match
those pages and compute only the rest of the prompt (under a page). vLLM's parallel
sampling shares the prompt's KV blocks the same way, through its prefix cache.

The choices start together, so that the same seeded request computes the same steps
whatever the timing (the same seed gives the same choices): none is admitted until all
``prefill_group_size`` have arrived (or ``ARRIVAL_WAIT_S`` has passed since the first,
when one was refused or dropped before reaching the scheduler), and the first stops
its prefill at the shareable pages while another choice still waits. Then every choice
computes the rest of the prompt (under a page) in one step and samples its first token
there, and they decode side by side; whether the prompt's pages were cached before or
computed now, each step has the same rows. (Over rows whose kernels are not
row-independent, other traffic beside them still changes the logits' last bits: the
README's "Seeds".)

Without the radix cache (``--disable-radix-cache``) nothing can be shared: the choices
still start together, each prefilling its own prompt. What the choices did not recompute is
the ``parallel_sampling`` lever (``SchedulerLedger.on_admitted``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from houchu.scheduler.request import Request, Status

#: Seconds the choices that arrived wait for the rest of their group before starting
#: without them (a choice refused by the scheduler, or aborted on its way, never comes).
ARRIVAL_WAIT_S = 1.0


class PrefillGroups:
    """The requests of each prefill group still queued or running.

    Args:
        enabled: the radix cache is on (else nothing is shared, and a choice is held only
            for the rest of its group to arrive).
        page_size: tokens per KV page.
        clock: seconds, monotonic (the arrival wait).
    """

    def __init__(
        self, enabled: bool, page_size: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.enabled = enabled
        self.page_size = page_size
        self._clock = clock
        self._members: dict[str, list[Request]] = {}
        self._started: set[str] = set()  # groups a choice of which was admitted
        # groups not all arrived yet: choices that reached the scheduler, and when the
        # first of them did (clock)
        self._arrived: dict[str, int] = {}
        self._first_at: dict[str, float] = {}

    def shareable(self, req: Request) -> int:
        """Prompt tokens of ``req`` that another choice's pages can give it."""
        return (req.num_prompt - 1) // self.page_size * self.page_size

    def arrived(self, group: str, size: int) -> None:
        """A choice of ``group`` (of ``size`` choices) reached the scheduler, queued or
        refused (a refused one is not waited for)."""
        if not group:
            return
        num = self._arrived.get(group, 0) + 1
        if num >= size:  # complete: nothing more to wait for
            self._arrived.pop(group, None)
            self._first_at.pop(group, None)
            return
        self._arrived[group] = num
        self._first_at.setdefault(group, self._clock())

    def add(self, req: Request) -> None:
        """A request was queued (one of a group when ``req.prefill_group`` is set); its
        arrival is counted by ``arrived`` first."""
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
            self._arrived.pop(req.prefill_group, None)
            self._first_at.pop(req.prefill_group, None)

    def _arrival_wait(self, group: str) -> float:
        """Seconds the choices of ``group`` still wait for the rest of it (0: none)."""
        first = self._first_at.get(group)
        if first is None or group in self._started:
            return 0.0
        return max(first + ARRIVAL_WAIT_S - self._clock(), 0.0)

    def wake_in(self) -> float | None:
        """Seconds until queued choices stop waiting for the rest of their group (None:
        none waits), so that the scheduler plans then even if no message comes."""
        waits = []
        for group in list(self._first_at):
            wait = self._arrival_wait(group)
            if wait > 0:
                waits.append(wait)
            elif group not in self._members:  # every choice that came was refused
                self._arrived.pop(group, None)
                self._first_at.pop(group, None)
        return min(waits) if waits else None

    def is_held(self, req: Request) -> bool:
        """Whether queued ``req`` waits: choices of its group have not all arrived yet, or
        another one is running and has not computed the prompt's shareable pages yet."""
        if not req.prefill_group or req.num_preemptions:
            return False
        if self._arrival_wait(req.prefill_group) > 0:
            return True
        if not self.enabled:
            return False
        need = self.shareable(req)
        if need == 0:
            return False
        return any(
            m is not req and m.status is Status.RUNNING and m.num_computed < need
            for m in self._members.get(req.prefill_group, ())
        )

    def prefill_stop(self, req: Request) -> int | None:
        """The position ``req``'s prefill may not pass in this plan (None: no bound).

        While another choice of its group still waits, the first choice computes the
        shareable pages and no further, and plans nothing more until they are applied,
        so that every choice computes the rest of the prompt in the same step."""
        if not self.enabled or not req.prefill_group or req.num_preemptions:
            return None
        need = self.shareable(req)
        if need == 0 or req.num_computed >= need:
            return None
        siblings = self._members.get(req.prefill_group, ())
        if any(m is not req and m.status is Status.WAITING for m in siblings):
            return need
        return None

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
