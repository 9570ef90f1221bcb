"""The scheduler's batching options: the "batching" group of ``houchu serve``'s flags."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta


class BatchingOptions(msgspec.Struct, frozen=True, kw_only=True):
    """What the scheduler (``houchu.scheduler.core.SchedulerCore`` and its ``Batcher``)
    batches; each field is the ``houchu serve`` flag of its name.

    Attributes:
        max_batch_tokens: tokens computed per step (decode tokens plus prefill chunks).
        chunked_prefill_size: most prefill tokens of one request per step (0: no
            chunking, the whole prompt in one step, which may then exceed the budget for
            that step only).
        max_running_requests: requests holding pages (decoded together) at most.
        max_queued_tokens: prompt tokens the waiting queue may hold; a request that
            would pass it is refused (HTTP 429), unless the queue is empty.
        disable_radix_cache: do not reuse the KV of cached prompt prefixes.
        overlap_schedule: plan step N+1 while step N runs: "on", "off", or "auto"
            (``houchu.scheduler.overlap.resolve_overlap``).
    """

    max_batch_tokens: Annotated[int, Meta(ge=1)] = 512
    chunked_prefill_size: Annotated[int, Meta(ge=0)] = 512
    max_running_requests: Annotated[int, Meta(ge=1)] = 64
    max_queued_tokens: Annotated[int, Meta(ge=1)] = 262_144
    disable_radix_cache: bool = False
    overlap_schedule: Literal["auto", "on", "off"] = "auto"
