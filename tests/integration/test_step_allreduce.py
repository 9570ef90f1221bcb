"""The all-reduce time of each tensor-parallel step: measured by rank 0's ``TPGroup``,
put by the runner actor into the step's ``StepRecord``, stored in the steps table
(migration 0003), read back per step and per bucket, and shown on the dashboard's
tensor-parallel panel (a real browser checks it)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import zmq.asyncio
from sqlalchemy import inspect

from houchu.actors.runner import RunnerActor
from houchu.api.app import make_app
from houchu.cli.main import build_parser
from houchu.dashboard.store import DashboardStore
from houchu.devtools.tiny_models import make_tiny_llama
from houchu.model.expert_load import ExpertLoadReader
from houchu.options.checks import check_serve_args
from houchu.options.parser import config_from_args
from houchu.storage.db import downgrade, migrate, open_db
from houchu.storage.live_view import recent_rates, recent_steps, step_series
from houchu.storage.writer import TelemetryWriter
from houchu.transport.endpoints import Endpoints
from houchu.transport.messages import Phase, SamplingParams, SeqInit, SeqWork, StepPlan
from houchu.transport.telemetry import StepRecord, TelemetryBatch
from tests.support.dashboard_browser import CHROMIUM, dashboard_page
from tests.support.fake_api import MoeStatsEngine

pytestmark = pytest.mark.slow


def _actor(model: Path, tp: int, name: str) -> tuple[RunnerActor, zmq.asyncio.Context]:
    parser = build_parser()
    args = parser.parse_args(
        ["serve", "--model", str(model), "--tensor-parallel-size", str(tp), "--threads", "1"]
        + ["--quantization", "none", "--compile", "off", "--page-size", "4"]
        + ["--num-pages", "16"]
    )
    check_serve_args(parser, args)
    config = config_from_args(args).with_launch(endpoints=Endpoints.inproc(name))
    ctx = zmq.asyncio.Context()
    actor = RunnerActor(ctx, config)
    actor.runner = actor._load()
    actor.expert_load = ExpertLoadReader(actor.runner.model)
    return actor, ctx


async def _two_steps(actor: RunnerActor) -> list[StepRecord]:
    """A prefill of 6 tokens and one decode step, through ``RunnerActor._step``; the
    step records it queued for the recorder. Closes the actor."""
    greedy = SamplingParams(temperature=0.0, max_tokens=4)
    ids = [5, 9, 13, 17, 21, 25]
    init = SeqInit(rid="a", sampling=greedy, prompt_ids=ids)
    prefill = SeqWork(rid="a", token_ids=ids, start_pos=0, page_table=[0, 1], sample=True)
    res = await actor._step(StepPlan(step_id=1, init=[init], work=[prefill]))
    tok = res.outputs[0].token_id
    decode = SeqWork(
        rid="a", token_ids=[tok], start_pos=6, page_table=[0, 1], sample=True, phase=Phase.DECODE
    )
    await actor._step(StepPlan(step_id=2, work=[decode]))
    records = list(actor.telemetry._batch.steps)
    await actor.close()  # its sockets, and a tensor-parallel runner's other ranks
    return records


@pytest.mark.parametrize("tp", [1, 2])
def test_the_runner_actor_records_each_steps_allreduce(tmp_path, tp):
    """At tp 2 every step record carries the seconds rank 0 spent in the collectives;
    at tp 1 it carries None (no collectives)."""
    model = make_tiny_llama(tmp_path / "m", seed=3, intermediate_size=128)
    actor, ctx = _actor(model, tp, f"allreduce-{tp}")
    try:
        records = asyncio.run(_two_steps(actor))
    finally:
        ctx.destroy(linger=0)
    assert [r.phase for r in records] == ["prefill", "decode"]
    if tp == 1:
        assert all(r.allreduce_s is None for r in records)
    else:
        for r in records:
            assert 0 < r.allreduce_s < r.duration_s


def fill(engine, now: float) -> None:
    """Six tp 2 steps 0.1 s apart ending 1 s before ``now`` (each 20 ms, of it
    ``2 + i`` ms in collectives), then one tp 1 step."""
    steps = [
        StepRecord(i, now - 1.6 + 0.1 * i, 0.02, 2, 0, 2, "decode", [], (2 + i) / 1000)
        for i in range(6)
    ]
    steps.append(StepRecord(6, now - 1.0, 0.03, 1, 8, 0, "prefill"))
    writer = TelemetryWriter(engine)
    writer.start()
    writer.submit(TelemetryBatch(actor="runner", steps=steps))
    assert writer.flush(20.0)
    writer.close()


def test_the_steps_table_keeps_each_steps_allreduce(tmp_path):
    engine = open_db(f"sqlite:///{tmp_path / 'd.db'}")
    now = time.time()
    fill(engine, now)
    steps = recent_steps(engine, now)
    assert [s["step_id"] for s in steps] == list(range(7))  # oldest first
    assert [s["allreduce_ms"] for s in steps[:6]] == pytest.approx([2, 3, 4, 5, 6, 7])
    assert steps[6]["allreduce_ms"] is None and steps[6]["step_ms"] == pytest.approx(30)
    assert [s["step_id"] for s in recent_steps(engine, now, limit=2)] == [5, 6]
    rates = recent_rates(engine, now)
    assert rates["allreduce_ms"] == pytest.approx(4.5)  # the tp steps' mean
    assert rates["allreduce_share"] == pytest.approx(27 / 120)  # of the tp steps' time
    series = step_series(engine, now, 10.0, 0.5)  # the tp steps fall in 2 to 3 buckets
    means = [v for v in series["allreduce_ms"] if v is not None]
    assert 2 <= len(means) <= 3 and all(2 <= v <= 7 for v in means), means
    assert recent_rates(engine, now + 60)["allreduce_share"] is None  # none in the window


def test_migration_0003_adds_and_drops_the_column(tmp_path):
    engine = open_db(f"sqlite:///{tmp_path / 'd.db'}")

    def columns() -> set[str]:
        return {c["name"] for c in inspect(engine).get_columns("steps")}

    assert "allreduce_s" in columns()
    downgrade(engine, "0002")
    assert "allreduce_s" not in columns() and "expert_load" in columns()
    migrate(engine)
    assert "allreduce_s" in columns()


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed")
def test_dashboard_shows_each_steps_allreduce_in_a_browser(tmp_path):
    engine = open_db(f"sqlite:///{tmp_path / 'd.db'}")
    fill(engine, time.time())
    store = DashboardStore(engine)
    app = make_app(MoeStatsEngine(), model_name="tp", max_context=512, store=store)
    try:
        with dashboard_page(app) as (page, errors):
            assert page.is_visible("#tp-steps")
            assert page.get_attribute("#tp-steps", "data-steps") == "6"
            assert page.get_attribute("#tp-steps", "data-last-allreduce-ms") == "7"
            assert "7 ms" in page.inner_text("#kpi-allreduce-last")
            assert "step 5" in page.inner_text("#kpi-allreduce-last")
            assert "35 %" in page.inner_text("#kpi-allreduce-last")  # 7 of 20 ms
            assert "4.5 ms" in page.inner_text("#kpi-allreduce-mean")
            bars = page.evaluate(
                "document.getElementById('tp-step-bars').data.map(t => [t.name, t.x, t.y])"
            )
            assert [b[0] for b in bars] == ["compute", "all-reduce"]
            assert bars[1][1] == ["0", "1", "2", "3", "4", "5"]  # one bar per step
            assert bars[1][2] == pytest.approx([2, 3, 4, 5, 6, 7])
            assert bars[0][2] == pytest.approx([18, 17, 16, 15, 14, 13])
            names = page.evaluate("document.getElementById('spark-step').data.map(t => t.name)")
            assert "all-reduce" in names
            assert "all-reduce" in page.inner_text("#kpi-step")
            assert not errors, errors
    finally:
        store.close()
