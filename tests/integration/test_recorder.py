"""The recorder actor: telemetry from emitters reaches the database; under a flood with a
slow database it drops and counts, and the engine's steps do not slow down."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import statistics
import threading
import time
from pathlib import Path

import pytest
import zmq.asyncio
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from houchu.actors.recorder import RecorderActor, retention_of
from houchu.options.serve_config import Launch, ServeConfig
from houchu.options.telemetry_options import TelemetryOptions
from houchu.storage import migrations
from houchu.storage.db import open_db
from houchu.storage.ledger_view import counters
from houchu.storage.models import CounterRow, EventRow, LeverRow, RequestRow, StepRow
from houchu.storage.writer import TelemetryWriter
from houchu.transport.channel import Outbox
from houchu.transport.endpoints import Endpoints
from houchu.transport.messages import Shutdown
from houchu.transport.telemetry import LeverSample, StepRecord, Telemetry, TelemetryBatch

#: the newest schema revision: the number of the last migration file
LATEST_SCHEMA = max(
    p.name[:4] for p in (Path(migrations.__file__).parent / "versions").glob("0*.py")
)

pytestmark = pytest.mark.slow


def _config(endpoints: Endpoints, db_url: str, **telemetry: object) -> ServeConfig:
    return ServeConfig(
        model="unused",
        telemetry=TelemetryOptions(db_url=db_url, **telemetry),
        launch=Launch(endpoints=endpoints),
    )


async def test_telemetry_reaches_the_database(tmp_path):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    ctx = zmq.asyncio.Context()
    config = _config(Endpoints.inproc("rec1"), url)
    actor = RecorderActor(ctx, config)
    info = await actor.start()
    assert f"schema {LATEST_SCHEMA}" in info  # migrated to the newest revision
    run = asyncio.create_task(actor.run())
    tel = Telemetry(ctx, config.endpoints["recorder"], "scheduler", flush_interval_s=0.02)
    tel.start()
    now = time.time()
    tel.event("r1", "queued", prompt_tokens=12)
    tel.event("r1", "finished", finish_reason="stop", completion_tokens=3)
    tel.step(StepRecord(1, now, 0.01, 1, 12, 0, "prefill"))
    tel.lever(LeverSample("radix_prefix_cache", "skip", 8.0, "tokens", 1.0, "pages", now, "r1"))
    await tel.close()  # the final flush
    out = Outbox(ctx, config.endpoints["recorder"])
    await out.send(Shutdown("test"))
    await asyncio.wait_for(run, 5)
    await actor.close()
    out.close()
    ctx.destroy(linger=0)
    e = open_db(url)
    with Session(e) as s:
        assert s.scalar(select(func.count()).select_from(EventRow)) == 2
        assert s.scalar(select(func.count()).select_from(StepRow)) == 1
        assert s.scalar(select(func.count()).select_from(LeverRow)) == 1
        req = s.get(RequestRow, "r1")
        assert (req.status, req.prompt_tokens, req.completion_tokens) == ("finished", 12, 3)
    assert counters(e)["records_written"] == 4
    e.dispose()


def test_retention_from_config():
    ep = Endpoints.inproc("x")
    r = retention_of(_config(ep, "sqlite://", retention_requests=50, retention_days=2.0))
    assert (r.max_requests, r.max_age_s, r.max_steps) == (50, 2 * 86400.0, 2500)
    r = retention_of(_config(ep, "sqlite://", retention_requests=0, retention_days=0.0))
    assert (r.max_requests, r.max_age_s, r.max_steps) == (None, None, None)


def test_writer_drops_and_counts_when_the_database_falls_behind(tmp_path):
    writing, release = threading.Event(), threading.Event()

    class Stuck(TelemetryWriter):
        def write_batches(self, session, batches):
            writing.set()
            release.wait(60)  # the database is stuck until the test releases it
            super().write_batches(session, batches)

    e = open_db(f"sqlite:///{tmp_path / 'w.db'}")
    w = Stuck(e, max_pending=100)
    w.start()
    steps = [StepRecord(i, 0.0, 0.0, 1, 1, 0, "prefill") for i in range(40)]

    def submit() -> bool:
        return w.submit(TelemetryBatch(actor="a", steps=steps, num_dropped=1))

    accepted = [submit()]
    assert writing.wait(30)  # the writer is in the database, and stays there
    # submit never waits for the database: these return while it is stuck
    accepted += [submit() for _ in range(49)]
    assert not release.is_set()
    release.set()
    assert not all(accepted)
    assert w.flush(20)
    w.close()
    c = counters(e)
    assert c["records_written"] + c["dropped_by_recorder"] == 50 * 40
    assert c["dropped_by_recorder"] == w.stats.dropped_by_recorder > 0
    assert c["dropped_by_actors"] == 50
    e.dispose()


def test_writer_counts_database_errors(tmp_path):
    class Broken(TelemetryWriter):
        def write_batches(self, session, batches):
            from sqlalchemy.exc import OperationalError

            raise OperationalError("INSERT", {}, Exception("disk I/O error"))

    e = open_db(f"sqlite:///{tmp_path / 'b.db'}")
    w = Broken(e)
    w.start()
    w.submit(TelemetryBatch(actor="a", steps=[StepRecord(1, 0.0, 0.0, 1, 1, 0, "decode")]))
    deadline = time.monotonic() + 10
    while w.stats.dropped_by_errors == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    w.close(2.0)
    assert w.stats.dropped_by_errors == 1 and w.stats.write_errors >= 1
    e.dispose()


# ------------------------------------------------------------------ the flood


def _slow_recorder_main(config_json: bytes, delay_s: float, max_pending: int) -> None:
    """A recorder process whose database takes ``delay_s`` seconds per transaction."""
    import houchu.actors.recorder as rec

    class SlowWriter(TelemetryWriter):
        def write_batches(self, session, batches):
            time.sleep(delay_s)
            super().write_batches(session, batches)

    rec.TelemetryWriter = SlowWriter
    config = ServeConfig.from_json(config_json)

    async def main() -> None:
        ctx = zmq.asyncio.Context()
        actor = rec.RecorderActor(ctx, config, max_pending=max_pending)
        await actor.start()
        await actor.run()
        await actor.close()
        ctx.destroy(linger=0)

    asyncio.run(main())


async def _written_at_least(url: str, n: int, timeout_s: float) -> None:
    """Wait until the recorder's database at ``url`` counts ``n`` records written (read
    without migrating it: the recorder owns that)."""
    import sqlite3

    path = url.removeprefix("sqlite:///")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
                row = db.execute(
                    f"SELECT value FROM {CounterRow.__tablename__} WHERE name = 'records_written'"
                ).fetchone()
            if row is not None and row[0] >= n:
                return
        except sqlite3.Error:
            pass  # not created or not migrated yet
        assert time.monotonic() < deadline, f"no {n} records written in {timeout_s} s"
        await asyncio.sleep(0.05)


def _work() -> int:
    """A fixed amount of CPU work standing in for a forward pass (a few ms)."""
    return sum(i * i for i in range(60_000))


async def test_flood_keeps_step_time_and_counts_drops(tmp_path):
    url = f"sqlite:///{tmp_path / 'flood.db'}"
    config = _config(Endpoints.ipc(tmp_path), url)
    proc = mp.get_context("spawn").Process(
        target=_slow_recorder_main, args=(config.to_json(), 0.2, 2000)
    )
    proc.start()
    ctx = zmq.asyncio.Context()
    on = Telemetry(ctx, config.endpoints["recorder"], "runner", flush_interval_s=0.02)
    off = Telemetry(ctx, None, "runner")
    on.start()
    try:
        # the recorder process has started and migrated once a first record is written
        on.event("probe", "queued")
        await _written_at_least(url, 1, timeout_s=120)
        # CPU time of this thread (robust to other load on the machine) and wall time
        cpu: dict[bool, list[float]] = {True: [], False: []}
        wall: dict[bool, list[float]] = {True: [], False: []}
        emit_s, emitted = 0.0, 0
        for i in range(400):
            tel = on if i % 2 else off  # interleaved: both see the same machine load
            w0, c0 = time.perf_counter(), time.thread_time()
            _work()
            e0 = time.thread_time()
            for j in range(100):
                tel.event(f"r{i}", "decode", tokens=j)
            tel.step(StepRecord(i, time.time(), 0.004, 8, 0, 8, "decode"))
            if tel is on:
                emit_s += time.thread_time() - e0
                emitted += 101
            cpu[tel is on].append(time.thread_time() - c0)
            wall[tel is on].append(time.perf_counter() - w0)
            await asyncio.sleep(0)  # let the flush task run, as an actor's loop would
        await on.close()
        out = Outbox(ctx, config.endpoints["recorder"])
        await out.send(Shutdown("test"))
        out.close()
        await asyncio.to_thread(proc.join, 60)
    finally:
        if proc.is_alive():
            proc.kill()
        ctx.destroy(linger=0)
    assert proc.exitcode == 0
    assert emit_s / emitted < 20e-6, f"one emit took {1e6 * emit_s / emitted:.1f} µs of CPU"
    for times, bound in ((cpu, 1.5), (wall, 2.0)):
        with_tel, without = statistics.median(times[True]), statistics.median(times[False])
        assert with_tel < bound * without, f"step {with_tel * 1e3:.2f} vs {without * 1e3:.2f} ms"
    e = open_db(url)
    c = counters(e)
    dropped = c.get("dropped_by_actors", 0) + c.get("dropped_by_recorder", 0)
    assert dropped > 0, c
    assert c["records_written"] + dropped == emitted + 1, c  # every record (and the probe)
    e.dispose()
