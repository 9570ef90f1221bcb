"""A MoE model's expert load per step: counted by the MoE layers, read by the runner
actor into each ``StepRecord``, stored with the step, and shown on the dashboard
(imbalance tiles, series and a layers × experts heat map; a real browser checks the
panel)."""

from __future__ import annotations

import time

import pytest

from houchu.api.app import make_app
from houchu.dashboard.store import DashboardStore
from houchu.devtools.tiny_models import make_tiny_model
from houchu.model.expert_load import ExpertLoadReader
from houchu.runner.model_runner import ModelRunner
from houchu.storage.db import open_db
from houchu.storage.expert_load_view import expert_load, imbalance, step_imbalance
from houchu.storage.live_view import step_series
from houchu.storage.writer import TelemetryWriter
from houchu.transport.messages import SamplingParams, SeqInit, SeqWork, StepPlan
from houchu.transport.telemetry import StepRecord, TelemetryBatch
from tests.support.dashboard_browser import CHROMIUM, dashboard_page
from tests.support.fake_api import MoeStatsEngine
from tests.support.runner_options import exact

pytestmark = pytest.mark.slow

MOE = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 48}
#: two MoE layers of 4 experts: layer 0 even (1.0), layer 1 all on expert 2 (4.0)
LOAD = [[3, 3, 3, 3], [0, 0, 12, 0]]


def test_moe_layers_count_the_tokens_each_expert_received(tmp_path):
    """Per step and layer, the counts sum to the layer's tokens × top_k, restart after
    each read, and a dense model has none."""
    path = make_tiny_model(tmp_path / "moe", "qwen3_moe", seed=3, **MOE)
    runner = ModelRunner(str(path), exact(num_pages=16, page_size=4), quiet=True)
    reader = ExpertLoadReader(runner.model)
    assert len(reader.layers) == 2
    greedy = SamplingParams(temperature=0.0, max_tokens=4)
    ids = list(range(3, 14))  # 11 tokens
    init = [SeqInit(rid="a", sampling=greedy, prompt_ids=ids)]
    work = SeqWork(rid="a", token_ids=ids, start_pos=0, page_table=[0, 1, 2], sample=True)
    reader.take()  # nothing ran yet: all zero, and the count starts here
    runner.execute(StepPlan(step_id=0, work=[work], init=init))
    load = reader.take()
    assert [len(layer) for layer in load] == [8, 8]
    # every token through layer 0; only the sampled row reaches the last layer's MLP
    assert [sum(layer) for layer in load] == [11 * 2, 1 * 2]
    assert reader.take() == [[0] * 8, [0] * 8]
    dense = make_tiny_model(tmp_path / "dense", "qwen2", seed=3)
    assert (
        ExpertLoadReader(ModelRunner(str(dense), exact(num_pages=8), quiet=True).model).take() == []
    )


def test_imbalance_is_max_over_mean():
    assert imbalance([3, 3, 3, 3]) == 1.0
    assert imbalance([0, 0, 12, 0]) == 4.0
    assert imbalance([0, 0]) is None
    assert step_imbalance(LOAD) == 4.0  # the worst layer
    assert step_imbalance([]) is None and step_imbalance(None) is None


def fill(engine, now: float, n: int = 10) -> None:
    """``n`` MoE steps 50 ms apart ending 1 s before ``now`` (the last one ``LOAD``,
    the others even), and one dense step."""
    even = [[2, 2, 2, 2], [2, 2, 2, 2]]
    steps = [
        StepRecord(i, now - 1 - 0.05 * (n - i), 0.01, 2, 0, 2, "decode", even) for i in range(n)
    ]
    steps.append(StepRecord(n, now - 1, 0.01, 2, 0, 2, "decode", LOAD))
    writer = TelemetryWriter(engine)
    writer.start()
    writer.submit(TelemetryBatch(actor="runner", steps=steps))
    assert writer.flush(20.0)
    writer.close()


def test_the_steps_table_keeps_each_steps_expert_load(tmp_path):
    engine = open_db(f"sqlite:///{tmp_path / 'd.db'}")
    now = time.time()
    assert expert_load(engine, now) is None  # no MoE step yet
    fill(engine, now)
    got = expert_load(engine, now)
    assert got["steps"] == 11 and (got["layers"], got["experts"]) == (2, 4)
    assert got["last"]["tokens"] == LOAD and got["last"]["imbalance"] == 4.0
    assert got["imbalance_max"] == 4.0
    assert got["imbalance_mean"] == pytest.approx((10 * 1.0 + 4.0) / 11)
    assert got["tokens"] == [[23, 23, 23, 23], [20, 20, 32, 20]]
    series = step_series(engine, now, 10.0, 2.0)
    assert max(v for v in series["expert_imbalance"] if v is not None) > 1.0
    assert expert_load(engine, now + 3600) is None  # out of the window


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed")
def test_dashboard_shows_the_expert_load_in_a_browser(tmp_path):
    engine = open_db(f"sqlite:///{tmp_path / 'd.db'}")
    fill(engine, time.time())
    store = DashboardStore(engine)
    app = make_app(MoeStatsEngine(), model_name="moe", max_context=512, store=store)
    try:
        with dashboard_page(app) as (page, errors):
            assert page.is_visible("#experts")
            assert page.get_attribute("#experts", "data-imbalance") == "4"
            assert "4 ×" in page.inner_text("#kpi-imbalance-last")
            assert "2 × 4" in page.inner_text("#kpi-experts")
            assert "worst 4 ×" in page.inner_text("#kpi-imbalance-window")
            heat = page.evaluate("document.getElementById('expert-heat').data[0].z")
            assert heat == [[23, 23, 23, 23], [20, 20, 32, 20]]
            assert not errors, errors
    finally:
        store.close()
