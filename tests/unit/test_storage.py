"""Storage: migrations from an empty database, round trips of every record kind, request
summaries from events in any order, retention, benchmark runs."""

from __future__ import annotations

import math
import time

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import func, inspect, select
from sqlalchemy.orm import Session

from houchu.storage import ledger_view, live_view, requests_view
from houchu.storage.bench_runs import (
    BenchRunError,
    delete_bench_run,
    get_bench_run,
    list_bench_runs,
    save_bench_run,
)
from houchu.storage.db import (
    DatabaseUrlError,
    create_db_engine,
    default_url,
    downgrade,
    has_schema,
    head_revision,
    migrate,
    open_db,
    resolve_url,
    schema_revision,
)
from houchu.storage.ingest import ingest
from houchu.storage.models import Base, EventRow, LeverRow, RequestRow, StepRow
from houchu.storage.retention import Retention, prune
from houchu.transport.telemetry import LeverSample, LifecycleEvent, StepRecord, TelemetryBatch
from tests.support.dashboard_data import fill, request_batches, step_batches

TABLES = {
    "requests",
    "events",
    "steps",
    "lever_samples",
    "ledger_totals",
    "counters",
    "bench_runs",
}


@pytest.fixture
def db_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'houchu.db'}"


@pytest.fixture
def engine(db_url):
    e = open_db(db_url)
    yield e
    e.dispose()


def write(engine, batches) -> None:
    with Session(engine) as s, s.begin():
        ingest(s, batches)


# ------------------------------------------------------------------ schema


def test_migrate_from_empty_database(db_url):
    e = create_db_engine(db_url)
    assert not has_schema(e) and schema_revision(e) is None
    migrate(e)
    assert schema_revision(e) == head_revision()
    assert TABLES <= set(inspect(e).get_table_names())
    with e.connect() as c:
        assert c.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    migrate(e)  # idempotent at head
    assert schema_revision(e) == head_revision()
    e.dispose()


def test_models_match_migrations(engine):
    with engine.connect() as c:
        ctx = MigrationContext.configure(c, opts={"compare_type": True})
        assert compare_metadata(ctx, Base.metadata) == []


def test_downgrade_to_empty_and_back(engine):
    downgrade(engine, "base")
    assert not (TABLES & set(inspect(engine).get_table_names()))
    migrate(engine)
    assert has_schema(engine)


def test_default_url_is_under_the_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HOUCHU_CACHE", str(tmp_path / "c"))
    assert default_url() == f"sqlite:///{tmp_path / 'c' / 'houchu.db'}"
    assert resolve_url(None) == resolve_url("") == default_url()
    e = open_db(None)
    assert (tmp_path / "c" / "houchu.db").exists() and has_schema(e)
    e.dispose()


def test_bad_url_is_a_clear_error():
    with pytest.raises(DatabaseUrlError, match="not a database URL"):
        resolve_url("no-such-scheme:://x")
    with pytest.raises(DatabaseUrlError):
        create_db_engine("nosuchdialect://host/db")


def test_in_memory_database_works():
    e = open_db("sqlite://")
    write(e, request_batches("r", time.time()))
    assert requests_view.request_detail(e, "r", time.time())["status"] == "finished"


# ------------------------------------------------------------------ round trips


def test_round_trip_every_record_kind(engine):
    t0 = time.time() - 10
    ev = LifecycleEvent("r1", "arrived", t0, "gateway", {"max_tokens": 8, "preview": "hi there"})
    step = StepRecord(7, t0 + 1, 0.025, 3, 100, 2, "mixed")
    lever = LeverSample("radix_prefix_cache", "skip", 32.0, "tokens", 2.0, "pages", t0 + 1, "r1")
    wide = LeverSample("continuous_batching", "fill", 2.0, "forward_passes", 0.0, "seconds", t0 + 1)
    write(engine, [TelemetryBatch(actor="x", events=[ev], steps=[step], levers=[lever, wide])])
    with Session(engine) as s:
        e = s.scalars(select(EventRow)).one()
        assert (e.rid, e.kind, e.t, e.actor, e.data) == ("r1", "arrived", t0, "gateway", ev.data)
        st_ = s.scalars(select(StepRow)).one()
        assert (st_.actor, st_.step_id, st_.t, st_.duration_s) == ("x", 7, t0 + 1, 0.025)
        assert (st_.batch_size, st_.num_prefill_tokens, st_.num_decode_tokens) == (3, 100, 2)
        assert st_.phase == "mixed"
        rows = {r.lever: r for r in s.scalars(select(LeverRow))}
        r = rows["radix_prefix_cache"]
        assert (r.verb, r.saved, r.saved_unit, r.spent, r.spent_unit, r.rid, r.actor) == (
            "skip",
            32.0,
            "tokens",
            2.0,
            "pages",
            "r1",
            "x",
        )
        assert rows["continuous_batching"].rid is None
        req = s.get(RequestRow, "r1")
        assert req.preview == "hi there" and req.params == {"max_tokens": 8}
    totals = {r["lever"]: r for r in ledger_view.ledger_rows(engine, time.time())}
    assert totals["radix_prefix_cache"]["saved"] == 32.0
    assert totals["continuous_batching"]["samples"] == 1
    windowed = ledger_view.ledger_rows(engine, time.time(), window_s=60)
    assert {r["lever"] for r in windowed} == {"radix_prefix_cache", "continuous_batching"}
    assert ledger_view.ledger_rows(engine, time.time() + 1000, window_s=60) == []


def test_request_summary_and_timeline(engine):
    t0 = time.time() - 5
    write(engine, request_batches("r1", t0, cached=32))
    d = requests_view.request_detail(engine, "r1", time.time())
    assert d["status"] == "finished" and d["finish_reason"] == "length"
    assert (d["prompt_tokens"], d["completion_tokens"], d["cached_tokens"]) == (40, 16, 32)
    assert d["ttft_s"] == pytest.approx(0.2, abs=1e-6)
    assert d["e2e_s"] == pytest.approx(0.61, abs=1e-6)
    assert d["tpot_s"] == pytest.approx((0.61 - 0.2) / 15, abs=1e-6)
    assert [s["stage"] for s in d["segments"]] == ["tokenize", "queue", "prefill", "decode"]
    kinds = [m["kind"] for m in d["markers"]]
    assert "prefix_matched" in kinds and "lever" in kinds and "finished" in kinds
    assert {lv["lever"] for lv in d["ledger"]} == {"radix_prefix_cache", "paged_kv"}
    assert len(d["events"]) == 9
    assert requests_view.request_detail(engine, "nope", time.time()) is None


def test_structured_output_request_carries_grammar_kind_and_mask_time(engine):
    t0 = time.time() - 5
    batches = request_batches("so", t0) + request_batches("free", t0)
    batches[0].events[0].data["grammar"] = "json_schema"  # the gateway's arrived event
    mask = [
        LeverSample("structured_output_mask", "fill", 0.003, "seconds", 0.001, "seconds", t0, "so"),
        LeverSample("structured_output_mask", "fill", 0.002, "seconds", 0.0, "seconds", t0, "so"),
    ]
    batches.append(TelemetryBatch(actor="runner", levers=mask))
    write(engine, batches)
    d = requests_view.request_detail(engine, "so", time.time())
    assert d["structured"]["kind"] == "json_schema"
    assert d["structured"]["mask_s"] == pytest.approx(0.006)
    assert requests_view.request_detail(engine, "free", time.time())["structured"] is None
    listed = {r["rid"]: r for r in requests_view.recent_requests(engine, time.time())}
    assert listed["so"]["structured"] == d["structured"] and listed["free"]["structured"] is None


def test_summary_without_scheduler_events(engine):
    """An older scheduler sends nothing: TTFT comes from the tokenizer's first_token_t."""
    t0 = time.time() - 5
    batches = [b for b in request_batches("r2", t0) if b.actor != "scheduler"]
    write(engine, batches)
    d = requests_view.request_detail(engine, "r2", time.time())
    assert d["ttft_s"] == pytest.approx(0.21, abs=1e-6)
    assert [s["stage"] for s in d["segments"]] == ["tokenize", "queue+prefill", "decode"]


_EVENTS = [b for b in request_batches("r3", 1000.0, cached=16)]


@settings(max_examples=25, deadline=None)
@given(st.permutations([(b.actor, e) for b in _EVENTS for e in b.events]), st.integers(1, 4))
def test_summary_does_not_depend_on_arrival_order(pairs, n_batches):
    e = open_db("sqlite://")
    size = math.ceil(len(pairs) / n_batches)
    for i in range(0, len(pairs), size):
        chunk = pairs[i : i + size]
        write(e, [TelemetryBatch(actor=a, events=[ev]) for a, ev in chunk])
    d = requests_view.request_detail(e, "r3", 2000.0)
    assert (d["status"], d["finish_reason"], d["cached_tokens"]) == ("finished", "length", 16)
    assert d["ttft_s"] == pytest.approx(0.2) and d["e2e_s"] == pytest.approx(0.61)
    assert [s["stage"] for s in d["segments"]] == ["tokenize", "queue", "prefill", "decode"]
    e.dispose()


def test_status_ranks_finished_over_aborted_and_failed_over_all(engine):
    t = time.time()
    ev = LifecycleEvent
    write(engine, [TelemetryBatch(actor="s", events=[ev("a", "aborted", t, "scheduler", {})])])
    write(
        engine,
        [
            TelemetryBatch(
                actor="t", events=[ev("a", "finished", t, "tokenizer", {"finish_reason": "stop"})]
            )
        ],
    )
    write(
        engine,
        [TelemetryBatch(actor="t", events=[ev("b", "failed", t, "tokenizer", {"error": "boom"})])],
    )
    write(engine, [TelemetryBatch(actor="s", events=[ev("b", "aborted", t, "scheduler", {})])])
    a = requests_view.request_detail(engine, "a", t)
    b = requests_view.request_detail(engine, "b", t)
    assert (a["status"], a["finish_reason"]) == ("finished", "stop")
    assert (b["status"], b["finish_reason"], b["error"]) == ("failed", "error", "boom")


def test_preemption_stage(engine):
    t = 100.0
    ev = LifecycleEvent
    kinds = ["arrived", "tokenized", "scheduled", "first_token", "preempted", "resumed"]
    kinds += ["decode", "finished"]
    write(
        engine,
        [
            TelemetryBatch(
                actor="s", events=[ev("p", k, t + i, "s", {}) for i, k in enumerate(kinds)]
            )
        ],
    )
    d = requests_view.request_detail(engine, "p", 200.0)
    stages = [s["stage"] for s in d["segments"]]
    assert stages == ["tokenize", "queue", "prefill", "decode", "preempted", "prefill", "decode"]
    assert d["num_preemptions"] == 1


def test_unfinished_request_without_news_is_drawn_as_lost(engine):
    t = 1000.0
    write(engine, [b for b in request_batches("old", t, done=False)])
    d = requests_view.request_detail(engine, "old", t + 5000)
    assert not d["segments"][-1]["open"] and d["segments"][-1]["end"] == pytest.approx(t + 0.2)
    assert "lost" in {m["kind"] for m in d["markers"]}
    assert requests_view.request_detail(engine, "old", t + 10)["segments"][-1]["open"]


def test_recent_requests_filters_and_limits(engine):
    fill(engine, n_requests=5)
    now = time.time()
    rows = requests_view.recent_requests(engine, now, limit=3)
    assert len(rows) == 3 and rows[0]["started_at"] >= rows[1]["started_at"]
    running = requests_view.recent_requests(engine, now, status="running")
    assert [r["status"] for r in running] == ["running"] and running[0]["segments"][-1]["open"]
    with pytest.raises(ValueError):
        requests_view.recent_requests(engine, now, limit=0)
    with pytest.raises(ValueError):
        requests_view.recent_requests(engine, now, status="bogus")


def test_live_views(engine):
    now = time.time()
    for b in step_batches(now - 1.5):
        write(engine, [b])
    rates = live_view.recent_rates(engine, now)
    assert rates["batch_size"] == 4 and rates["step_ms"] == pytest.approx(30)
    assert "round_trip_ms" not in rates  # the scheduler's stat, not a stored step
    assert rates["decode_tps"] == pytest.approx(30 * 4 / 10)  # runner steps only, not twice
    series = live_view.step_series(engine, now, horizon_s=10, bucket_s=1)
    assert len(series["t"]) == 10 and sum(series["decode_tps"]) == pytest.approx(120)
    with pytest.raises(ValueError):
        live_view.step_series(engine, now, horizon_s=0)


# ------------------------------------------------------------------ retention


def test_retention_by_count_and_age(engine):
    now = time.time()
    for i in range(10):
        write(engine, request_batches(f"r{i}", now - 100 + i))
    write(engine, step_batches(now - 1000))
    with Session(engine) as s, s.begin():
        n = prune(s, Retention(max_requests=4, max_age_s=None, max_steps=None), now)
    assert n > 0
    with Session(engine) as s:
        kept = set(s.scalars(select(RequestRow.rid)))
        assert kept == {"r6", "r7", "r8", "r9"}
        assert set(s.scalars(select(EventRow.rid).distinct())) == kept
        assert s.scalar(select(func.count()).select_from(StepRow)) == 0  # older than kept
    totals = {r["lever"] for r in ledger_view.ledger_rows(engine, now)}
    assert "continuous_batching" in totals  # ledger totals outlive retention
    with Session(engine) as s, s.begin():
        prune(s, Retention(max_requests=None, max_age_s=50.0, max_steps=None), now)
    with Session(engine) as s:
        assert s.scalar(select(func.count()).select_from(RequestRow)) == 0


def test_retention_caps_steps(engine):
    write(engine, step_batches(time.time(), n=50))
    with Session(engine) as s, s.begin():
        prune(s, Retention(max_requests=None, max_age_s=None, max_steps=10))
    with Session(engine) as s:
        assert s.scalar(select(func.count()).select_from(StepRow)) == 10


def test_retention_rejects_bad_bounds():
    with pytest.raises(ValueError):
        Retention(max_requests=0)
    with pytest.raises(ValueError):
        Retention(max_age_s=-1.0)


# ------------------------------------------------------------------ benchmark runs


def test_save_bench_run_round_trip(db_url):
    settings_ = {"workload": "random", "concurrency": 16}
    results = {"output_throughput": 123.5, "p99_ttft_ms": float("nan"), "by_tag": {"a": [1, 2]}}
    run_id = save_bench_run(db_url, "run one", settings_, results)
    e = open_db(db_url)
    got = get_bench_run(e, run_id)
    assert got["name"] == "run one" and got["settings"] == settings_
    assert got["results"] == {
        "output_throughput": 123.5,
        "p99_ttft_ms": None,
        "by_tag": {"a": [1, 2]},
    }
    second = save_bench_run(db_url, "run two", {}, {})
    assert [r["id"] for r in list_bench_runs(e)] == [second, run_id]
    assert delete_bench_run(e, run_id) and get_bench_run(e, run_id) is None
    e.dispose()


@pytest.mark.parametrize(
    ("name", "settings_", "results", "match"),
    [
        ("", {}, {}, "non-empty name"),
        ("x" * 201, {}, {}, "over 200"),
        ("ok", [], {}, "settings must be a dict"),
        ("ok", {}, {"t": object()}, "not JSON-serializable"),
    ],
)
def test_save_bench_run_rejects_bad_input(db_url, name, settings_, results, match):
    with pytest.raises(BenchRunError, match=match):
        save_bench_run(db_url, name, settings_, results)
