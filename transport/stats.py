"""The engine's counters (``GET /stats``) as one typed struct, ``EngineStats``.

The scheduler builds it from its parts (one sub-struct per part that counts something:
the KV pool, the totals, the prefix cache, sliding-window pages, step round trips, the
lever ledger, overlap, the KV tiers, speculation), its actor adds what only it knows, and
it travels to the gateway in ``StatsReply``. ``/stats`` serves it flat, as one JSON object
(``EngineStats.flat``): every leaf field is one key, a field that is None is left out (a
counter that does not apply: no radix cache, no tiers, speculation off). No two leaf
fields anywhere in the struct share a name (checked when this module is imported), so two
parts can never write the same key.

Units are in the names: ``_s`` seconds, ``_ms`` milliseconds, ``_bytes`` bytes, pages are
KV pages of ``page_size`` tokens; counts are since the scheduler started.
"""

from __future__ import annotations

import types
import typing

from msgspec import Struct, field


class PoolStats(Struct, kw_only=True):
    """The KV pool and the queue (``houchu.scheduler.pool_stats``).

    ``kv_bytes_reserved``: bytes of the live pages the running requests hold;
    ``kv_bytes_max_length``: the bytes they would hold at their longest (prompt +
    ``max_tokens``, capped by the context).
    """

    model: str = ""
    num_running: int = 0
    num_waiting: int = 0
    num_waiting_tokens: int = 0
    num_pages_total: int = 0
    num_pages_free: int = 0
    num_pages_used: int = 0
    page_size: int = 0
    kv_bytes_per_token: int = 0
    kv_bytes_reserved: int = 0
    kv_bytes_max_length: int = 0
    max_context: int = 0
    cpu_isa: str = ""
    decode_paths: str = ""
    deterministic: str = ""
    num_preemptions: int = 0


class CounterStats(Struct, kw_only=True):
    """The scheduler's totals (``houchu.scheduler.counters``): ``busy_fraction`` is busy
    seconds per second since start, ``tp_allreduce_share`` the collectives' share of them."""

    num_refused_queue_full: int = 0
    num_steps: int = 0
    num_prompt_tokens: int = 0
    num_generated_tokens: int = 0
    jump_forward_tokens: int = 0
    num_finished: int = 0
    num_aborted: int = 0
    num_failed: int = 0
    busy_fraction: float = 0.0
    tp_allreduce_s: float = 0.0
    tp_allreduce_s_per_step: float = 0.0
    tp_allreduce_share: float = 0.0


class PrefixStats(Struct, kw_only=True):
    """The radix prefix cache's pages (``radix_cache``: 1 when on, 0 off; without it
    ``num_pages_hollowed`` is left out)."""

    num_pages_cached: int = 0
    num_pages_evicted: int = 0
    num_pages_hollowed: int | None = None
    radix_cache: int = 0


class WindowStats(Struct, kw_only=True):
    """Sliding-window pages: the window (tokens), pages released, freed, and left to the
    radix cache."""

    sliding_window: int = 0
    window_pages_released: int = 0
    window_pages_freed: int = 0
    window_pages_cached: int = 0


class StepStats(Struct, kw_only=True):
    """``round_trip_ms``: the mean round trip of the steps landed lately (left out when
    none landed)."""

    round_trip_ms: float | None = None


class LedgerStats(Struct, kw_only=True):
    """The scheduler's share of the lever ledger (``houchu.scheduler.ledger``)."""

    prefix_tokens_reused: int = 0
    prefix_tokens_queried: int = 0
    prefix_hit_rate: float = 0.0
    prefix_flops_saved: float = 0.0
    pages_shared: int = 0
    parallel_sampling_tokens_shared: int = 0
    forward_passes: int = 0
    tokens_per_forward: float = 0.0
    requests_per_forward: float = 0.0
    chunked_prefill_tokens: int = 0
    chunked_prefill_extra_steps: int = 0
    max_itl_s: float = 0.0
    max_itl_60s: float = 0.0


class OverlapStats(Struct, kw_only=True):
    """The overlap scheduler (``houchu.scheduler.overlap``): seconds and tokens."""

    overlap_schedule: int = 0
    overlap_hidden_s: float = 0.0
    overlap_scheduler_s: float = 0.0
    overlap_hidden_fraction: float = 0.0
    overlap_discarded_tokens: int = 0
    overlap_steps_ahead: int = 0


class TierManagerStats(Struct, kw_only=True):
    """The KV-tier manager's counters (``houchu.actors.kv_tiers``; the ``ssd_`` ones only
    with an SSD tier)."""

    host_pages_total: int = 0
    host_pages_stored: int = 0
    host_pages_pinned: int = 0
    host_hits: int = 0
    host_lookup_misses: int = 0
    host_evictions: int = 0
    tier_load_s: float = 0.0
    ssd_pages_stored: int | None = None
    ssd_bytes: int | None = None
    ssd_capacity_bytes: int | None = None
    ssd_hits: int | None = None
    ssd_misses: int | None = None
    ssd_corrupt: int | None = None
    ssd_evictions: int | None = None
    ssd_bytes_written: int | None = None
    ssd_bytes_read: int | None = None


class KVTierStats(Struct, kw_only=True):
    """The KV tiers: the manager's counters as it last sent them (None before), and the
    scheduler's (tokens loaded per tier, pages saved and dropped, lookups)."""

    manager: TierManagerStats | None = None
    tier_tokens_loaded_host: int = 0
    tier_tokens_loaded_ssd: int = 0
    tier_pages_saved: int = 0
    tier_pages_dropped: int = 0
    tier_lookups: int = 0
    tier_lookup_timeouts: int = 0
    host_slots_granted: int = 0


class SpecTotalsStats(Struct, kw_only=True):
    """Speculation's totals over every request (``houchu.speculative.ledger``)."""

    spec_verify_steps: int = 0
    spec_proposed_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_rejected_tokens: int = 0
    spec_acceptance_rate: float = 0.0
    spec_mean_acceptance_length: float = 0.0
    spec_forward_passes_saved: int = 0
    spec_draft_s: float = 0.0


class SpecStats(Struct, kw_only=True):
    """Speculative decoding: ``speculative`` names the proposer ("off": the other fields
    are left out)."""

    speculative: str = "off"
    spec_max_tokens: int | None = None
    spec_break_even_batch: int | None = None
    spec_max_batch: int | None = None
    spec_acceptance_estimate: float | None = None
    spec_draft_calls: int | None = None
    spec_last_batch: int | None = None
    spec_last_requests_speculating: int | None = None
    draft_num_seqs: int | None = None
    draft_pages_used: int | None = None
    draft_pages_total: int | None = None
    totals: SpecTotalsStats | None = None


class EngineStats(Struct, kw_only=True):
    """Everything ``/stats`` says about the engine (the gateway adds its own keys).

    Attributes:
        pool, counters, prefix, window, steps, ledger, overlap, tiers, spec: the
            scheduler's parts (``tiers`` None without KV tiers).
        request_known: with a request id asked: 1 when the scheduler holds it, else 0.
        step_in_flight: steps sent to the runner and not answered yet.
        runner_ready: 1 once the runner announced itself (0 while it loads).
        telemetry_dropped: telemetry records the scheduler dropped.
    """

    pool: PoolStats = field(default_factory=PoolStats)
    counters: CounterStats = field(default_factory=CounterStats)
    prefix: PrefixStats = field(default_factory=PrefixStats)
    window: WindowStats = field(default_factory=WindowStats)
    steps: StepStats = field(default_factory=StepStats)
    ledger: LedgerStats = field(default_factory=LedgerStats)
    overlap: OverlapStats = field(default_factory=OverlapStats)
    tiers: KVTierStats | None = None
    spec: SpecStats = field(default_factory=SpecStats)
    request_known: int | None = None
    step_in_flight: int | None = None
    runner_ready: int | None = None
    telemetry_dropped: int | None = None

    def flat(self) -> dict[str, float | int | str]:
        """The JSON object ``/stats`` serves: each leaf field a key, in field order, the
        None ones left out."""
        out: dict[str, float | int | str] = {}
        _flatten(self, out)
        return out


def _flatten(part: Struct, out: dict[str, float | int | str]) -> None:
    for name in part.__struct_fields__:
        value = getattr(part, name)
        if value is None:
            continue
        if isinstance(value, Struct):
            _flatten(value, out)
        else:
            out[name] = value


def _struct_of(hint: object) -> type[Struct] | None:
    """The Struct type a field holds (``X`` or ``X | None``), else None."""
    if isinstance(hint, type) and issubclass(hint, Struct):
        return hint
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        for arg in typing.get_args(hint):
            if isinstance(arg, type) and issubclass(arg, Struct):
                return arg
    return None


def leaf_names(cls: type[Struct]) -> list[str]:
    """Every key ``flat`` may write for ``cls``, nested parts expanded, in order."""
    hints = typing.get_type_hints(cls)
    names: list[str] = []
    for name in cls.__struct_fields__:
        sub = _struct_of(hints[name])
        names.extend(leaf_names(sub) if sub is not None else [name])
    return names


def duplicate_keys(cls: type[Struct]) -> list[str]:
    """The keys two leaf fields of ``cls`` would both write (none for ``EngineStats``:
    this module does not import otherwise)."""
    names = leaf_names(cls)
    return sorted({n for n in names if names.count(n) > 1})


if duplicate_keys(EngineStats):
    raise TypeError(f"EngineStats: keys written by two parts: {duplicate_keys(EngineStats)}")
