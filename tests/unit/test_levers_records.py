"""houchu levers' sweep on recorded runs: the runner line's facts, the roofline's binding
constraint, the records' JSON and the answers drawn from them."""

from __future__ import annotations

import pytest
from rich.console import Console

from houchu.bench.model.limits import Limits
from houchu.bench.sweep.answers import analyze
from houchu.bench.sweep.levers import lever
from houchu.bench.sweep.plan import Load, build_plan
from houchu.bench.sweep.records import (
    CellRun,
    ServerFacts,
    StepTotals,
    parse_runner_line,
    summary_line,
)
from houchu.bench.sweep.roofline import binding
from tests.support.levers import CPU, SERVE_FLAGS, run

LINE = (
    "houchu runner: llama 'Smollm2 135M', 134.5M params (matmul 77.9M/token, LM head 28.3M), "
    "float32 on cpu, 30 layers, KV pool "
    "91 pages x 16 = 1456 tokens, 64.0 MiB (46080 B/token), max context 1456, attention cpu; "
    "weights int4-g32: 90.4 MiB/step (0.35x the bytes of bf16); KV auto: 46080 B/token"
)


def test_runner_line_facts():
    f = parse_runner_line(LINE, 12.5)
    assert f.params == pytest.approx(134.5e6)
    assert f.matmul_params == pytest.approx(77.9e6) and f.lm_head_params == pytest.approx(28.3e6)
    older = parse_runner_line(LINE.replace(" (matmul 77.9M/token, LM head 28.3M)", ""), 1.0)
    assert older.params == pytest.approx(134.5e6) and older.dtype == "float32"
    assert older.matmul_params == 0.0
    assert f.dtype == "float32" and f.weights == "int4-g32"
    assert f.kv_pool_tokens == 1456 and f.kv_bytes_per_token == 46080
    assert f.weight_bytes_per_step == pytest.approx(90.4 * 2**20)
    dense = parse_runner_line(LINE.replace("; weights int4-g32: 90.4 MiB/step", ""), 1.0)
    assert dense.weight_bytes_per_step == pytest.approx(134.5e6 * 4)


def test_the_summary_is_found_among_the_runners_lines():
    """``--compile auto`` prints its verdict first: the facts come from the summary line
    wherever it is (found by a review: int4 and the defaults had every fact 0)."""
    skipped = "houchu runner: --compile auto skipped: the decode route runs the fused C++ layers"
    assert summary_line([skipped, LINE]) == LINE
    assert summary_line([skipped]) == ""
    assert parse_runner_line(summary_line([skipped, LINE]), 1.0).kv_pool_tokens == 1456


def test_binding_constraint_from_step_time_against_the_roofline():
    lim = Limits(copy_gbs=10.0, fp32_flops=100e9, bf16_flops=100e9, int8_ops=200e9)
    facts = ServerFacts(1.0, params=1e8, weight_bytes_per_step=1e8, kv_bytes_per_token=0.0)
    r = run("x", 1, 1.0)
    # 100 decode steps of 1 token: bytes 1e10 -> 1 s at 10 GB/s; flops 2e10 -> 0.2 s
    r.steps = StepTotals(steps=100, seconds=1.25, prefill_tokens=0, decode_tokens=100)
    b = binding(r, facts, lim, "fp32")
    assert b.kind == "bandwidth" and b.bandwidth_frac == pytest.approx(0.8)
    # one prefill step of 2,000 tokens: 4e11 flops -> 4 s; bytes 0.01 s
    r.steps = StepTotals(steps=1, seconds=5.0, prefill_tokens=2000, decode_tokens=0)
    assert binding(r, facts, lim, "fp32").kind == "compute"
    r.steps = StepTotals(steps=100, seconds=10.0, prefill_tokens=0, decode_tokens=100)
    assert binding(r, facts, lim, "fp32").kind == "overhead"
    r.preemptions = 2
    assert binding(r, facts, lim, "fp32").kind == "capacity"
    assert binding(run("x", 1, 1.0), facts, lim, "fp32").kind == "unknown"


def test_roofline_counts_the_lm_head_only_for_rows_that_sample():
    lim = Limits(copy_gbs=1e6, fp32_flops=1e9, bf16_flops=1e9, int8_ops=1e9)
    split = ServerFacts(1.0, params=1.3e8, matmul_params=1e8, lm_head_params=3e7)
    r = run("x", 1, 1.0)
    r.metrics["completed"] = 1
    # one request: a 1,000-token prefill (one row sampled) and 9 decode tokens:
    # 2 x (1e8 x 1,009 + 3e7 x 10) = 2.024e11 FLOPs -> 202.4 s at 1 GFLOP/s
    r.steps = StepTotals(steps=10, seconds=202.4, prefill_tokens=1000, decode_tokens=9)
    assert binding(r, split, lim, "fp32").compute_frac == pytest.approx(1.0)
    # an older record, no split: every token through every parameter
    old = ServerFacts(1.0, params=1.3e8)
    assert binding(r, old, lim, "fp32").compute_frac == pytest.approx(2 * 1.3e8 * 1009 / 202.4e9)


def test_cell_run_json_round_trip():
    r = run("int4", 4, 12.0, ledger={"weight_quant_int4-g32": {"saved bytes": 5.0}})
    r.steps = StepTotals(3, 0.1, 10, 20)
    assert CellRun.from_json(r.to_json()) == r


def test_answers_from_recorded_runs():
    plan = build_plan(
        ["radix-cache", "chunked-prefill"], "all", [Load("concurrency", x) for x in (1, 4)], 1, CPU
    )
    rc_ledger = {
        "radix_prefix_cache": {"saved tokens": 400.0, "saved flops": 1e11, "spent pages": 25.0}
    }
    runs = [
        run("baseline", 1, 100.0),
        run("baseline", 4, 200.0),
        run("radix-cache", 1, 130.0, ledger=rc_ledger),
        run("radix-cache", 4, 190.0, ledger=rc_ledger),
        run("chunked-prefill", 1, 110.0),
        run("chunked-prefill", 4, 220.0),
        run("chunked-prefill+radix-cache", 1, 143.0),
        run("chunked-prefill+radix-cache", 4, 150.0),
    ]
    facts = {
        c: ServerFacts(10.0, 1e8, 1e8, 1000.0, 1456, "float32", "none")
        for c in ("baseline", "radix-cache")
    }
    a = analyze(plan, runs, facts, None, frozenset({"fp32"}), {}, 4.0)
    rc = next(lv for lv in a["levers"] if lv["lever"] == "radix-cache")
    assert rc["bottleneck"] == "compute"
    assert rc["throughput_gain_curve"] == pytest.approx([1.3, 0.95])
    assert rc["break_even"]["kind"] == "stops"
    assert 1 < rc["break_even"]["load"] < 4
    assert rc["loads"][0]["ledger"] == rc_ledger["radix_prefix_cache"]
    assert rc["spent_static"]["startup_s"] == 0.0
    by_load = {p["load"]: p for p in a["pairs"]}
    assert by_load[1.0]["verdict"] == "add"  # 1.43 = 1.3 * 1.1
    assert by_load[4.0]["verdict"] == "cancel"  # 0.75 < 1.1
    assert [p["load"] for p in a["matrix"]] == [4.0]
    _report_renders(plan, a, runs)
    rec = a["recommendation"]
    assert rec["config"] == "chunked-prefill" and rec["flags"] == [
        "--disable-radix-cache",
        "--chunked-prefill-size",
        "512",
        "--max-batch-tokens",
        "512",
    ]


def test_a_levers_ledger_counts_its_reported_variants_only():
    from houchu.bench.sweep.analysis import CellSummary
    from houchu.bench.sweep.answers import lever_ledger

    cell = CellSummary(
        "int4",
        1,
        {},
        0.0,
        1,
        {
            "weight_quant_int4-g32": {"saved bytes": 3e9},
            "paged_kv": {"saved bytes": 1.0},
            "kv_tier_host": {"saved tokens": 64.0},
            "kv_tier_ssd": {"saved tokens": 16.0},
        },
    )
    assert lever_ledger(cell, lever("int4").ledger) == {"saved bytes": 3e9}
    assert lever_ledger(cell, lever("kv-tiers").ledger) == {"saved tokens": 80.0}
    assert lever_ledger(None, ("x",)) == {}


def test_amounts_in_physical_units():
    from houchu.bench.sweep.report import amount

    assert amount(3 * 2**30, "bytes") == "3 GiB"
    assert amount(1.5e12, "flops") == "1.5T FLOP"
    assert amount(1500, "tokens") == "1.5k tokens"
    assert amount(2, "forward_passes") == "2 forward passes"


def _report_renders(plan, answers, runs) -> None:
    from rich.console import Console

    from houchu.bench.sweep.report import print_report

    record = {
        "settings": {
            "model": "/m.gguf",
            "serve_args": ["--compile", "off"],
            "workload": {"workload": "shared-prefix"},
            "load_kind": "concurrency",
            "loads": [1.0, 4.0],
            "repeats": 1,
            "cpu_flags": "avx2 fma",
            "cpu_count": 2,
        },
        "limits": None,
        "load_average": {"start": [1.0, 1.0, 1.0], "end": [2.0, 1.0, 1.0]},
        "failures": {"x": "server did not start"},
        "answers": answers,
    }
    console = Console(record=True, width=200)
    print_report(record, console)
    text = console.export_text()
    assert "houchu serve --model /m.gguf --compile off --disable-radix-cache" in text
    assert "radix-cache + chunked-prefill" in text and "cancel" in text
    assert "400 tokens" in text  # radix-cache's saving at c=4
    assert "x: server did not start" in text


def test_a_stored_record_is_answered_again_the_same():
    from dataclasses import asdict

    from houchu.bench.sweep.reanalyze import reanalyze, record_limits

    loads = [Load("concurrency", x) for x in (1, 4)]
    plan = build_plan(["radix-cache", "int4"], "all", loads, 1, CPU)
    runs = [
        run(c, x, t)
        for c, x, t in (
            ("baseline", 1, 10.0),
            ("baseline", 4, 20.0),
            ("radix-cache", 1, 12.0),
            ("radix-cache", 4, 22.0),
            ("int4", 1, 20.0),
            ("int4", 4, 30.0),
            ("int4+radix-cache", 1, 24.0),
            ("int4+radix-cache", 4, 33.0),
        )
    ]
    for r in runs:
        r.steps = StepTotals(10, 1.0, 100, 50)
    facts = {"baseline": ServerFacts(5.0, 1e8, 4e8, 1000.0, 1456, "float32", "none")}
    lim = Limits(10.0, 50e9, 100e9, 200e9)
    answers = analyze(plan, runs, facts, lim, frozenset({"fp32"}), {}, 4.0)
    record = {
        "settings": {
            "backend": "houchu levers",
            "levers": ["radix-cache", "int4"],
            "pairs": ["radix-cache+int4"],
            "load_kind": "concurrency",
            "loads": [1.0, 4.0],
            "repeats": 1,
        },
        "limits": lim.line(),
        "runs": [r.to_json() for r in runs],
        "facts": {k: asdict(v) for k, v in facts.items()},
        "answers": answers,
    }
    again = reanalyze(record, SERVE_FLAGS, frozenset({"fp32"}))["answers"]
    assert again["matrix"] == answers["matrix"] and again["matrix"][0]["verdict"] == "add"
    assert again["recommendation"] == answers["recommendation"]
    assert [lv["break_even"] for lv in again["levers"]] == [
        lv["break_even"] for lv in answers["levers"]
    ]
    assert record_limits(record).copy_gbs == pytest.approx(10.0)
    with pytest.raises(ValueError):
        reanalyze({"settings": {}}, SERVE_FLAGS, frozenset())


def test_a_required_levers_gain_is_over_the_config_it_requires():
    plan = build_plan(["radix-cache", "kv-tiers"], "none", [Load("concurrency", 4)], 1, CPU)
    runs = [run("baseline", 4, 100.0), run("radix-cache", 4, 200.0), run("kv-tiers", 4, 220.0)]
    facts = {c: ServerFacts(10.0, 1e8, 1e8, 1000.0, 1456, "float32", "none") for c in ("baseline",)}
    a = analyze(plan, runs, facts, None, frozenset({"fp32"}), {}, 4.0)
    tiers = next(lv for lv in a["levers"] if lv["lever"] == "kv-tiers")
    assert tiers["against"] == "radix-cache"
    assert tiers["throughput_gain_curve"] == pytest.approx([1.1])  # 220 / 200, not 2.2


def test_a_gain_over_cells_whose_repeats_spread_is_marked_noisy():
    from houchu.bench.sweep.report import lever_table

    plan = build_plan(["int4", "radix-cache"], "none", [Load("concurrency", 4)], 2, CPU)
    runs = [run("baseline", 4, 100.0, 0), run("baseline", 4, 200.0, 1)]  # 67% spread
    runs += [run("int4", 4, 200.0, 0), run("int4", 4, 204.0, 1)]
    runs += [run("radix-cache", 4, 150.0, 0), run("radix-cache", 4, 150.0, 1)]
    facts = {"baseline": ServerFacts(10.0, 1e8, 1e8, 1000.0, 1456, "float32", "none")}
    a = analyze(plan, runs, facts, None, frozenset({"fp32"}), {}, 4.0)
    int4 = next(lv for lv in a["levers"] if lv["lever"] == "int4")
    assert int4["loads"][0]["tolerance"] == pytest.approx(2 * 100 / 150)
    console = Console(record=True, width=250)
    console.print(lever_table(a, "c"))
    assert "c=4:1.35x (noisy)" in console.export_text()
    quiet = [r for r in runs if not (r.config == "baseline" and r.repeat == 1)]
    a = analyze(plan, quiet, facts, None, frozenset({"fp32"}), {}, 4.0)
    console = Console(record=True, width=250)
    console.print(lever_table(a, "c"))
    text = console.export_text()
    assert "x (noisy)" not in text and "c=4:2.02x" in text
