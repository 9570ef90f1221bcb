"""Data-parallel options: the "data parallel" group of ``houchu serve``'s flags."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

#: The load-balancing policies of SGLang's Model Gateway (``smg launch --policy``).
RouterPolicy = Literal[
    "cache_aware",
    "round_robin",
    "random",
    "power_of_two",
    "least_load",
    "prefix_hash",
    "consistent_hashing",
]


class ClusterOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Engine replicas on one machine behind SGLang's Model Gateway (``smg``); each
    field is the ``houchu serve`` flag of its name (``houchu.cluster`` runs them).

    Attributes:
        data_parallel_size: engine replicas (1: one engine, no router). Each replica is
            a whole ``houchu serve`` (its own actors) with its share of the cores
            (``--threads`` split evenly) or its own GPU.
        router_policy: ``smg``'s ``--policy``: ``cache_aware`` keeps an approximate
            radix tree of the prompts sent to each replica and routes a request to the
            replica with the longest match, falling back to the shortest queue when
            the load is imbalanced.
        router_args: more ``smg launch`` flags, as one shell-quoted string (they win
            over houchu's own choices of the same flags).
    """

    data_parallel_size: Annotated[int, Meta(ge=1)] = 1
    router_policy: RouterPolicy = "cache_aware"
    router_args: str = ""
