"""A preemption reaches the dashboard: the scheduler core preempts a request for lack of
pages and says so ("preempted", then "resumed"); the recorder's writer stores the events
and the dashboard's data counts the preemption and draws it on the request's timeline."""

from __future__ import annotations

import itertools
import time

from houchu.dashboard.store import DashboardStore
from houchu.options.batching_options import BatchingOptions
from houchu.scheduler.core import SchedulerCore
from houchu.storage.db import open_db
from houchu.storage.writer import TelemetryWriter
from houchu.transport.messages import RunnerInfo
from houchu.transport.telemetry import LeverSample, LifecycleEvent, TelemetryBatch
from tests.support.scheduler import req, run_step


class EventLog:
    """A telemetry sink keeping the scheduler's events as the recorder receives them, on
    a clock that ticks 10 ms per event (so their order never rests on a tie)."""

    def __init__(self) -> None:
        self.events: list[LifecycleEvent] = []
        self._ticks = itertools.count()
        self._t0 = time.time() - 60.0

    def event(self, rid: str, kind: str, t: float | None = None, **data: float | int | str):
        t = self._t0 + 0.01 * next(self._ticks)
        self.events.append(LifecycleEvent(rid, kind, t, "scheduler", dict(data)))

    def lever(self, sample: LeverSample) -> None:
        pass

    def kinds(self, rid: str) -> list[str]:
        return [e.kind for e in self.events if e.rid == rid]


def preempt_one(log: EventLog) -> SchedulerCore:
    """Two requests fill a 4-page pool; the newest is preempted at its third page, then
    recomputed once the other finished. Runs both to the end."""
    info = RunnerInfo(
        num_pages=4,
        page_size=4,
        max_context=256,
        kv_bytes_per_token=8,
        num_params=1,
        model_name="tiny",
    )
    options = BatchingOptions(max_running_requests=8, disable_radix_cache=True)
    core = SchedulerCore(info, options, telemetry=log)
    core.add(req("old", 7, max_tokens=9))
    core.add(req("new", 7, max_tokens=9))
    for _ in range(40):
        if not core.has_work:
            break
        run_step(core)
    assert not core.has_work
    return core


def test_the_scheduler_says_when_it_preempts():
    log = EventLog()
    core = preempt_one(log)
    assert core.stats()["num_preemptions"] == 1
    new = log.kinds("new")
    assert new.count("preempted") == 1 and new.count("resumed") == 1
    assert new.index("first_token") < new.index("preempted") < new.index("resumed")
    assert "preempted" not in log.kinds("old")


async def test_a_preemption_shows_up_in_the_dashboard_data(tmp_path):
    log = EventLog()
    preempt_one(log)
    engine = open_db(f"sqlite:///{tmp_path / 'd.db'}")
    writer = TelemetryWriter(engine)
    writer.start()
    writer.submit(TelemetryBatch(actor="scheduler", events=log.events))
    assert writer.flush(20.0), "the events were not written in time"
    writer.close()
    store = DashboardStore(engine)
    try:
        new, old = await store.request("new"), await store.request("old")
        listed = await store.requests(limit=10)
    finally:
        store.close()
    assert new["num_preemptions"] == 1 and old["num_preemptions"] == 0
    assert {r["rid"]: r["num_preemptions"] for r in listed} == {"new": 1, "old": 0}
    stages = [s["stage"] for s in new["segments"]]
    assert stages[stages.index("preempted") + 1] == "prefill"  # recomputed after it
    assert {"preempted", "resumed"} <= {m["kind"] for m in new["markers"]}
    assert new["status"] == old["status"] == "finished"
