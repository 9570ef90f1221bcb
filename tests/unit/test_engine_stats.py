"""``/stats`` as one typed struct: each key written by one part, parts that do not apply
left out, the same flat JSON object on both sides of the wire."""

from __future__ import annotations

import msgspec

from houchu.transport.messages import StatsReply
from houchu.transport.stats import (
    EngineStats,
    KVTierStats,
    PoolStats,
    SpecStats,
    SpecTotalsStats,
    TierManagerStats,
    duplicate_keys,
    leaf_names,
)


def test_every_key_has_one_owner():
    names = leaf_names(EngineStats)
    assert len(names) == len(set(names))
    assert names[:2] == ["model", "num_running"]  # the pool's keys first, as before


def test_a_key_written_by_two_parts_is_found():
    class Twice(msgspec.Struct, kw_only=True):
        pool: PoolStats = msgspec.field(default_factory=PoolStats)
        num_running: int = 0

    assert duplicate_keys(Twice) == ["num_running"]
    assert duplicate_keys(EngineStats) == []


def test_flat_leaves_out_what_does_not_apply_and_survives_the_wire():
    off = EngineStats().flat()
    assert off["speculative"] == "off" and "spec_verify_steps" not in off
    assert "round_trip_ms" not in off and "num_pages_hollowed" not in off
    assert "tier_lookups" not in off and "request_known" not in off
    on = EngineStats(
        spec=SpecStats(speculative="ngram", spec_max_tokens=4, totals=SpecTotalsStats()),
        tiers=KVTierStats(manager=TierManagerStats(host_pages_total=8)),
        request_known=1,
    )
    reply = StatsReply(query_id=1, stats=on)
    got = msgspec.msgpack.decode(msgspec.msgpack.encode(reply), type=StatsReply).stats.flat()
    assert got == on.flat()
    assert got["spec_max_tokens"] == 4 and got["spec_verify_steps"] == 0
    assert got["host_pages_total"] == 8 and "ssd_bytes" not in got
    assert list(got).index("host_pages_total") < list(got).index("tier_tokens_loaded_host")
