"""Per-request state held by the scheduler.

A request's token range, and what each region means::

    | prompt_ids ........................ | output_ids ........... |
    | 0 .............. num_computed-1 | num_computed ... len(all)-1 |
      KV in pages (page_table)          tokens still to compute (prefill rest, or
                                        the last sampled token before a decode)

``num_computed`` only grows, except on preemption, when it drops to 0 and the KV is
recomputed from ``prompt_ids + output_ids``.

With the overlap scheduler a request may be in a step whose result has not come back
yet. Those steps' effect is kept apart, as an overlay on the confirmed state above:
``num_ahead`` positions they compute and ``num_pending`` tokens they sample (values not
known yet). Planning looks through the overlay (``plan_computed``, ``plan_tokens``,
``plan_prefilling``); applying a result moves its share from the overlay to the
confirmed state. A pending token is the last token of the request, so it is only ever
the input of a one-token decode, sent as a placeholder the runner resolves
(``SeqWork.use_last_sampled``).
"""

from __future__ import annotations

import enum
import time
from typing import TYPE_CHECKING

from houchu.speculative.state import SpecState
from houchu.transport.limits import tokens_left
from houchu.transport.messages import PromptLogprobs, SamplingParams, SeqWork

if TYPE_CHECKING:
    from houchu.cache_tiers.radix_tree import Node


class Status(enum.Enum):
    WAITING = "waiting"  # queued: no pages yet (new, or preempted)
    RUNNING = "running"  # holds pages; prefilling or decoding
    FINISHED = "finished"


class Request:
    """One request's scheduling state.

    Args:
        rid: request id.
        prompt_ids: prompt token ids (list[int], len >= 1).
        sampling: decoding parameters.
        stop_ids: token ids that end generation (``TokenizedRequest.stop_ids``).
        arrival_time: seconds (time.time()) when the gateway accepted it.
        prefill_group: the client request it is a choice of ("" alone;
            ``houchu.scheduler.groups``).
        prefill_group_size: how many choices that client request has (1 alone).
    """

    def __init__(
        self,
        rid: str,
        prompt_ids: list[int],
        sampling: SamplingParams,
        stop_ids: list[int],
        arrival_time: float = 0.0,
        prefill_group: str = "",
        prefill_group_size: int = 1,
    ) -> None:
        self.rid = rid
        self.prefill_group = prefill_group
        self.prefill_group_size = prefill_group_size
        self.shares_prefill = False  # started from another choice's prompt pages
        self.prompt_ids = prompt_ids
        self.output_ids: list[int] = []
        self.sampling = sampling
        self.stop_ids = frozenset(stop_ids)
        self.arrival_time = arrival_time or time.time()
        self.status = Status.WAITING
        self.page_table: list[int] = []
        self.num_computed = 0
        self.num_tree_pages = 0  # leading pages of page_table indexed by the radix tree
        self.tree_node: Node | None = None  # radix tree node of the last indexed page
        # leading pages of page_table released as outside every sliding window
        # (placeholders now: never read, never freed again; scheduler.window_pages)
        self.num_dead_pages = 0
        self.window_pages_released = 0  # over its life, preemptions included
        self.max_itl_s = 0.0  # longest gap between two of its tokens, seconds
        self.last_token_time = 0.0
        self.num_chunks = 0  # prefill steps taken
        self.is_tier_checked = False  # lower tiers were asked for its prefix
        self.tier_pages: dict[str, int] = {}  # pages loaded from each lower tier
        self.num_ahead = 0  # positions computed by steps in flight, not applied yet
        self.num_pending = 0  # tokens sampled by steps in flight, not applied yet
        self.cached_tokens = 0
        self.num_preemptions = 0
        self.recomputing = False  # resumed after a preemption; no token sampled since
        self.is_registered = False  # runner holds its sampling state
        self.runner_pages: list[int] | None = None  # its page table as the runner holds it
        self.is_aborted = False
        self.finish_reason: str | None = None
        self.spec = SpecState()  # speculative decoding: proposals, counters
        self.prompt_logprobs: PromptLogprobs | None = None  # scored so far, not yet sent

    @property
    def num_prompt(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens."""
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_uncomputed(self) -> int:
        """Tokens whose KV is not in pages yet (>= 1 while running)."""
        return self.num_tokens - self.num_computed

    @property
    def is_prefilling(self) -> bool:
        return self.num_uncomputed > 1 or not self.output_ids

    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def give_pages(self, w: SeqWork) -> None:
        """Put in ``w`` (this request's work, once the plan is built) only the pages the
        runner lacks: the whole ``page_table`` when the runner's copy is not a prefix of
        it (the first work, after a preemption, or after pages were taken back), else
        the pages appended since (``SeqWork.new_pages``, often none). The runner applies
        plans in the order they are sent (``houchu.runner.page_tables``)."""
        table, held = self.page_table, self.runner_pages
        if held is not None and len(held) <= len(table) and table[: len(held)] == held:
            w.page_table, w.new_pages = None, table[len(held) :]
            held.extend(w.new_pages)
        else:
            w.page_table, w.new_pages = list(table), []
            self.runner_pages = list(table)

    def unregister(self) -> None:
        """The runner forgets this request (released, or its runner is gone): its sampling
        state and page table are sent again if it runs again."""
        self.is_registered = False
        self.runner_pages = None

    # ---------------------------------------------------------- planning view (overlap)

    @property
    def is_in_flight(self) -> bool:
        """A step whose result has not been applied computes or samples for it."""
        return bool(self.num_ahead or self.num_pending)

    @property
    def plan_computed(self) -> int:
        """Positions whose KV is in pages once the steps in flight have run."""
        return self.num_computed + self.num_ahead

    @property
    def plan_tokens(self) -> int:
        """Tokens once the steps in flight have run (pending ones are not known yet)."""
        return self.num_tokens + self.num_pending

    @property
    def plan_prefilling(self) -> bool:
        """``is_prefilling`` once the steps in flight have run."""
        return self.plan_tokens - self.plan_computed > 1 or not (
            self.output_ids or self.num_pending
        )

    @property
    def ends_when_applied(self) -> bool:
        """The pending tokens will surely finish it (``max_tokens``; prompt +
        ``max_tokens`` never exceeds the context, see ``SchedulerCore.add``): nothing more
        to plan for it."""
        return self.num_pending > 0 and (
            len(self.output_ids) + self.num_pending >= self.sampling.max_tokens
        )

    def tokens_left(self, max_context: int) -> int:
        """Tokens it may still generate (0 or less: none): before ``max_tokens`` or the
        context window of ``max_context`` tokens (``houchu.transport.limits.tokens_left``)."""
        n = len(self.output_ids)
        return tokens_left(max_context, self.num_tokens, self.sampling.max_tokens, n)

    def max_length(self, max_context: int) -> int:
        """Tokens it holds at its longest: prompt + ``max_tokens``, capped by the context
        window of ``max_context`` tokens."""
        return self.num_tokens + self.tokens_left(max_context)

    def check_finished(self, max_context: int) -> str | None:
        """The finish reason after the latest token, or None to keep going.

        "stop": the last token is EOS or a stop token id; "length": ``max_tokens``
        generated or the context window is full (no token left).
        """
        if self.output_ids and self.output_ids[-1] in self.stop_ids:
            return "stop"
        if self.tokens_left(max_context) <= 0:
            return "length"
        return None
