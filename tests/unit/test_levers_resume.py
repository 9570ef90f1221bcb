"""houchu levers' checkpoints, resume and estimate, without servers: the servers a
(resumed) sweep starts, its record after each server (atomic, marked incomplete), the
refusal of a record with another plan or machine, the union analyzed as one sweep,
``--reanalyze`` on a partial record, signals, the estimate and ETA on a fake clock, and
``--dry-run``."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
from rich.console import Console

from houchu.bench.sweep.answers import analyze
from houchu.bench.sweep.checkpoint import (
    SweepInterrupted,
    check_resumable,
    interrupt_on_signals,
    resume_command,
)
from houchu.bench.sweep.plan import Config, build_plan
from houchu.bench.sweep.reanalyze import reanalyze
from houchu.bench.sweep.records import ServerFacts, SweepResult
from houchu.bench.sweep.report import (
    missing_text,
    print_report,
    recommendation_text,
    save_record,
)
from houchu.bench.sweep.schedule import (
    STARTUP_ALLOWANCE_S,
    ServerEta,
    ServerJob,
    duration_text,
    estimate,
    in_plan_order,
    server_jobs,
    sweep_state,
)
from houchu.cpu.isa import cpu_model
from tests.support.levers import (
    CPU,
    LOADS2,
    SERVE_FLAGS,
    levers_args,
    run,
    runs_in_one_go,
    start_levers_session,
    two_lever_plan,
)

# ------------------------------------------------------------------ the schedule


def test_servers_of_a_sweep_and_of_a_resumed_one():
    plan = two_lever_plan()
    jobs = server_jobs(plan, fresh_per_load=False)
    assert [(j.config.name, j.repeat, j.loads) for j in jobs[:5]] == [
        ("baseline", 0, (0, 1)),
        ("radix-cache", 0, (0, 1)),
        ("int4", 0, (0, 1)),
        ("int4+radix-cache", 0, (0, 1)),
        ("baseline", 1, (0, 1)),
    ]
    assert len(jobs) == 8
    assert len(server_jobs(plan, fresh_per_load=True)) == 16  # a replay: one per load
    done = [("baseline", 1.0, 0), ("baseline", 4.0, 0), ("radix-cache", 1.0, 0)]
    left = server_jobs(plan, False, done)
    # the baseline's first server is done; radix-cache's runs only its missing load
    assert left[0] == ServerJob(Config(frozenset({"radix-cache"})), 0, (1,))
    assert len(left) == 7 and sum(len(j.loads) for j in left) == 16 - 3
    every = [(r.config, r.load, r.repeat) for r in runs_in_one_go(plan)]
    assert server_jobs(plan, False, every) == []


def test_the_union_of_two_sessions_is_analyzed_as_one_sweep():
    plan = two_lever_plan()
    one_go = runs_in_one_go(plan)
    first, second = one_go[:5], one_go[5:]
    union = in_plan_order(plan, [*second[::-1], *first])
    assert union == one_go
    facts = {"baseline": ServerFacts(5.0, 1e8, 4e8, 1000.0, 1456, "float32", "none")}
    native = frozenset({"fp32"})
    a = analyze(plan, union, facts, None, native, {}, 4.0)
    b = analyze(plan, one_go, facts, None, native, {}, 4.0)
    assert a == b and a["recommendation"]["config"] == "int4+radix-cache"


def test_the_recommendation_is_weighed_against_houchus_defaults():
    """houchu's defaults (no lever flag) are one more configuration: the recommendation
    says how it compares with them, and says so where they were the fastest."""
    plan = build_plan(["radix-cache", "int4"], "all", LOADS2, 1, CPU)
    speed = {"baseline": 10.0, "defaults": 20.0, "radix-cache": 12.0, "int4": 18.0}
    speed["int4+radix-cache"] = 25.0
    runs = [
        run(c.name, ld.value, speed[c.name] * ld.value, 0)
        for c in plan.configs()
        for ld in plan.loads
    ]
    facts = {"baseline": ServerFacts(5.0, 1e8, 4e8, 1000.0, 1456, "float32", "none")}
    a = analyze(plan, runs, facts, None, frozenset({"fp32"}), {}, 4.0)
    rec = a["recommendation"]
    assert rec["config"] == "int4+radix-cache" and rec["against_defaults"] == pytest.approx(1.25)
    record = {"answers": a, "settings": {"model": "m.gguf", "serve_args": []}}
    text = recommendation_text(a, record)
    assert "against houchu's defaults (no lever flags): 1.25x their output_throughput" in text
    assert "no clear gain" not in text  # one repeat: a 3% tolerance, well below 25%
    close = {**a, "recommendation": {**rec, "against_defaults": 1.02}}
    assert "within the repeats' spread (±3%): no clear gain" in recommendation_text(close, record)
    speed["defaults"] = 30.0
    runs = [
        run(c.name, ld.value, speed[c.name] * ld.value, 0)
        for c in plan.configs()
        for ld in plan.loads
    ]
    best = analyze(plan, runs, facts, None, frozenset({"fp32"}), {}, 4.0)
    assert best["recommendation"]["config"] == "defaults"
    assert best["recommendation"]["flags"] == []
    assert "houchu's defaults were the fastest measured" in recommendation_text(best, record)


def test_sweep_state_lists_the_measured_and_missing_cells():
    plan = two_lever_plan(repeats=1)
    state = sweep_state(plan, runs_in_one_go(plan)[:3], False, [])
    assert state["complete"] is False
    assert state["measured"][2] == {"config": "radix-cache", "load": 1.0, "repeat": 0}
    assert len(state["missing"]) == 5
    assert state["missing"][0] == {"config": "radix-cache", "load": 4.0, "repeat": 0}


# ------------------------------------------------------------------ estimate and ETA


def test_estimate_is_an_upper_bound_from_max_duration_and_start_ups():
    plan = two_lever_plan()
    jobs = server_jobs(plan, False)
    est = estimate(jobs, 30.0, warmup=1)
    assert (est.servers, est.runs) == (8, 16)
    # each run: warm-up and measured requests within 30 s each, 3 s of flushes
    assert est.upper_s == pytest.approx(16 * (2 * 30 + 3) + 8 * STARTUP_ALLOWANCE_S)
    assert estimate(jobs, 30.0, warmup=0).upper_s == pytest.approx(16 * 33 + 8 * 60)
    assert "8 servers, 16 measured runs; at most 24m 48s" in est.text()
    unbounded = estimate(jobs, None, 1)
    assert unbounded.upper_s is None and "--max-duration" in unbounded.text()


def test_eta_follows_the_measured_server_durations_on_a_fake_clock():
    now = [100.0]
    eta = ServerEta(10, clock=lambda: now[0])
    assert eta.eta_s() is None and eta.text() == "ETA after the first server"
    eta.start()
    now[0] += 240.0
    eta.server_done()
    now[0] += 160.0
    eta.server_done()  # two servers in 400 s: 200 s each, 8 left
    assert eta.eta_s() == pytest.approx(1600.0)
    assert eta.text() == "ETA 26m 40s"
    assert [duration_text(s) for s in (45, 605, 13_500)] == ["45 s", "10m 05s", "3h 45m"]


# ------------------------------------------------------------------ checkpoints


def test_a_record_is_replaced_whole_or_not_at_all(tmp_path):
    path = tmp_path / "sweep" / "levers.json"
    save_record({"runs": [1]}, path)

    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        save_record({"runs": [1, 2], "x": Unprintable()}, path)
    assert json.loads(path.read_text()) == {"runs": [1]}
    assert os.listdir(path.parent) == ["levers.json"]  # no temporary file left


def test_sigterm_and_sigint_interrupt_once_then_are_ignored_until_cleaned_up():
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with pytest.raises(SweepInterrupted) as info:
        with interrupt_on_signals():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler raises here at the latest
                pytest.fail("SIGTERM did not interrupt")
            except SweepInterrupted:
                os.kill(os.getpid(), signal.SIGINT)  # ignored while the sweep cleans up
                raise
    assert info.value.signum == signal.SIGTERM and str(info.value) == "SIGTERM"
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_resume_command_is_the_same_options_with_resume():
    argv = ["levers", "--levers", "int4", "--resume", "old.json", "--dry-run", "--name", "a b"]
    cmd = resume_command(argv, Path("/r/x.json"))
    assert cmd == "houchu levers --levers int4 --name 'a b' --resume /r/x.json"
    assert "with the sweep's options" in resume_command(None, Path("x.json"))


def test_cpu_model_from_cpuinfo():
    text = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: avx2 fma\n"
    assert cpu_model(text) == "AMD EPYC 7B13"
    assert cpu_model("") != ""  # the platform's names


# ------------------------------------------------------------------ resume, end to end


def test_a_partial_record_resumes_to_the_union_analyzed_as_one_sweep(tmp_path, capsys):
    plan, path = two_lever_plan(), tmp_path / "levers.json"
    one_go = runs_in_one_go(plan)
    facts = {"baseline": ServerFacts(5.0, 1e8, 4e8, 1000.0, 1456, "float32", "none")}
    ctx, prior, jobs = start_levers_session(levers_args(tmp_path), plan)
    assert prior is None and len(jobs) == 8
    # the sweep is interrupted after three servers: six cells measured
    partial = ctx.record(plan, SweepResult(one_go[:6], facts, {}, 90.0), {}, False, 3)
    save_record(partial, path)
    assert partial["sweep"]["complete"] is False and len(partial["sweep"]["missing"]) == 10
    assert partial["settings"]["cpu_model"] and partial["settings"]["workload"]["seed"] == 0

    # --reanalyze answers from the cells there and names the missing ones
    again = reanalyze(json.loads(path.read_text()), SERVE_FLAGS, frozenset({"fp32"}))
    assert again["sweep"]["missing"] == partial["sweep"]["missing"]
    console = Console(record=True, width=400)
    print_report(again, console)
    text = console.export_text()
    assert "Partial sweep: 10 of 16 cells not measured" in text
    assert "int4+radix-cache: c=1 #1, c=4 #1, c=1 #2, c=4 #2" in text

    ctx2, prior2, left = start_levers_session(levers_args(tmp_path, "--resume", str(path)), plan)
    assert ctx2.name == ctx.name and len(prior2.runs) == 6
    assert [(j.config.name, j.repeat) for j in left][:2] == [
        ("int4+radix-cache", 0),
        ("baseline", 1),
    ]
    assert sum(len(j.loads) for j in left) == 10
    whole = SweepResult(in_plan_order(plan, [*one_go[6:], *prior2.runs]), facts, {}, 200.0)
    final = ctx2.record(plan, whole, {}, True, len(left))
    assert final["sweep"]["missing"] == [] and final["sweep"]["complete"] is True
    assert [p["servers"] for p in final["sweep"]["parts"]] == [3, 5]
    assert final["sweep"]["parts"][1]["seconds"] == pytest.approx(110.0)
    direct = ctx.record(plan, SweepResult(one_go, facts, {}, 200.0), {}, True, 8)
    assert final["answers"] == direct["answers"] and final["runs"] == direct["runs"]
    assert missing_text(final) == ""


def test_a_record_of_another_plan_or_machine_is_refused(tmp_path):
    plan, path = two_lever_plan(), tmp_path / "levers.json"
    ctx, _, _ = start_levers_session(levers_args(tmp_path), plan)
    record = ctx.record(plan, SweepResult(runs_in_one_go(plan)[:2], {}, {}, 1.0), {}, False, 1)
    check_resumable(path, record, ctx.settings)  # the same: no error
    for key, value, why in (
        ("repeats", 3, "another plan (repeats 2 there, 3 here)"),
        ("serve_args", ["--compile", "off"], "another plan (serve_args [] there"),
        ("cpu_model", "Other CPU", "measured on another machine (cpu_model"),
        ("cpu_flags", "no-such-flag", "measured on another machine (cpu_flags"),
    ):
        with pytest.raises(ValueError, match=r"^cannot resume .*" + re.escape(why)):
            check_resumable(path, record, {**ctx.settings, key: value})
    seed = {**ctx.settings, "workload": {**ctx.settings["workload"], "seed": 1}}
    with pytest.raises(ValueError, match="workload.seed 0 there, 1 here"):
        check_resumable(path, record, seed)
    whole = {**record, "sweep": {**record["sweep"], "complete": True, "missing": []}}
    with pytest.raises(ValueError, match="the sweep is complete"):
        check_resumable(path, whole, ctx.settings)
    with pytest.raises(ValueError, match="not a houchu levers record"):
        check_resumable(path, {"settings": {}}, ctx.settings)
    # a different number of repeats on the command line is a different plan
    save_record(record, path)
    with pytest.raises(ValueError, match="repeats 2 there, 3 here"):
        start_levers_session(
            levers_args(tmp_path, "--repeats", "3", "--resume", str(path)),
            two_lever_plan(repeats=3),
        )


def test_dry_run_prints_the_plan_and_estimate(tmp_path, capsys):
    from houchu.bench.sweep.cli import OBJECTIVES, _spec
    from houchu.bench.sweep.session import dry_run

    args = levers_args(tmp_path, "--serve-args", "--compile off", "--dry-run")
    plan = two_lever_plan()
    rc = dry_run(
        args, plan, _spec(args), Path(args.model), ["--compile", "off"], OBJECTIVES["throughput"]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "4 configurations x 2 repeat(s) x 2 load level(s) = 16 measured runs" in out
    assert "8 servers, 16 measured runs; at most" in out
    assert (
        "  int4: 2 server(s), 4 run(s): --compile off --disable-radix-cache --quantization int4"
        in out
    )
