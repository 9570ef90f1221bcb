"""``houchu levers`` end to end on the default model: a minimal sweep (two levers and one
that cannot apply on a CPU, two loads, a few short requests) starts its own servers one
after another, measures every cell, reads each lever's own counters back, writes its
JSON record and stores it in the database, where the dashboard draws its heat map and
gain curves in a real browser (Debian's chromium) with no console error.

The sweep runs as a ``houchu levers`` process that is sent SIGINT once its record holds
the first server's cells: it stops the server it was starting, leaves a partial record
and the command that resumes it, and exits 130; the resumed sweep (in this process)
measures only the missing cells and ends with the record of the whole sweep.

The dashboard's server is started beside the sweep, not after it: it only reads the
database when the page asks (after the sweep stored its record), and its start-up (about
5 s on 2 cores) overlaps the sweep's idle seconds (each cell waits a second before each
of its two counter flushes) instead of adding to the test's wall time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from houchu.cli.main import main
from tests.support.dashboard_browser import CHROMIUM, CHROMIUM_ARGS
from tests.support.server import Server, start_server, stop_server

pytestmark = pytest.mark.slow


def test_minimal_sweep_writes_its_record(tmp_path, real_model_path, capsys):
    out = tmp_path / "levers.json"
    db = f"sqlite:///{tmp_path / 'houchu.db'}"
    with ThreadPoolExecutor(1) as pool:
        dashboard = (
            pool.submit(_dashboard_server, real_model_path, db) if CHROMIUM.exists() else None
        )
        try:
            _sweep_and_check(out, db, real_model_path, capsys, dashboard)
        finally:
            if dashboard is not None and dashboard.exception() is None:
                stop_server(dashboard.result())


def _sweep_args(out: Path, db: str, model: Path) -> list[str]:
    return [
        "levers",
        "--model",
        str(model),
        "--levers",
        "radix-cache,chunked-prefill,cuda-graph",
        "--pairs",
        "none",
        "--concurrency",
        "1,2",
        "--repeats",
        "1",
        "--workload",
        "shared-prefix",
        "--num-prefixes",
        "1",
        "--prefix-len",
        "64",
        "--num-requests",
        "3",
        "--input-len",
        "8",
        "--output-len",
        "4",
        "--serve-args",
        "--compile off --decode-paths rules --kv-cache-mb 16",
        "--output",
        str(out),
        "--db",
        db,
        "--no-progress",
    ]


def _interrupted_sweep(args: list[str], out: Path, tmp: Path) -> dict:
    """Run the sweep as a process, SIGINT it once its record holds the first server's
    cells; returns that partial record (its servers must all be gone)."""
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}  # its servers' databases: found by path
    logs = tmp / "stdout", tmp / "stderr"  # files: a pipe not read could fill and block
    with logs[0].open("w") as o, logs[1].open("w") as e:
        proc = subprocess.Popen(
            [sys.executable, "-m", "houchu.cli", *args], stdout=o, stderr=e, env=env
        )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if out.exists() and json.loads(out.read_text())["sweep"]["measured"]:
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=120)
    stdout, stderr = (p.read_text() for p in logs)
    assert proc.returncode == 130, stdout + stderr
    assert "interrupted by SIGINT" in stderr and "houchu levers levers" not in stderr
    assert f"--resume {out}" in stderr and "houchu levers --model" in stderr, stderr
    assert "4 servers, 8 measured runs" in stdout, stdout
    left = [
        pid
        for pid in os.listdir("/proc")
        if pid.isdigit() and str(tmp) in _cmdline(pid) and int(pid) != proc.pid
    ]
    assert not left, "servers left running"
    return json.loads(out.read_text())


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def _sweep_and_check(
    out: Path, db: str, model: Path, capsys, dashboard: Future[Server] | None
) -> None:
    args = _sweep_args(out, db, model)
    partial = _interrupted_sweep(args, out, out.parent / "tmp")
    state = partial["sweep"]
    assert state["complete"] is False
    assert state["measured"][:2] == [
        {"config": "baseline", "load": x, "repeat": 0} for x in (1.0, 2.0)
    ]
    assert len(state["measured"]) + len(state["missing"]) == 8
    assert {(r["config"], r["load"]) for r in partial["runs"]} >= {("baseline", 1.0)}
    rc = main([*args, "--resume", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    record = json.loads(out.read_text())
    assert record["failures"] == {}
    assert record["sweep"]["complete"] is True and record["sweep"]["missing"] == []
    assert len(record["sweep"]["parts"]) == 2 and record["name"] == partial["name"]
    assert f"resuming {out}: {len(state['measured'])} of 8 runs measured" in printed
    runs = record["runs"]
    assert {(r["config"], r["load"]) for r in runs} == {
        (c, x)
        for c in ("baseline", "defaults", "radix-cache", "chunked-prefill")
        for x in (1.0, 2.0)
    }
    for r in runs:
        assert r["metrics"]["completed"] == 3 and r["metrics"]["failed"] == 0
        assert r["steps"]["steps"] > 0 and r["steps"]["decode_tokens"] > 0
    # the levers were toggled as asked: the baseline ran without the radix cache
    reused = {
        (r["config"], r["load"]): r["ledger"].get("radix_prefix_cache", {}).get("saved tokens", 0)
        for r in runs
    }
    assert reused["baseline", 1.0] == 0 and reused["radix-cache", 1.0] > 0
    assert reused["defaults", 1.0] > 0  # houchu's defaults: the radix cache on
    answers = record["answers"]
    assert "CUDA" in answers["not_applicable"]["cuda-graph"]
    rc_answer = next(lv for lv in answers["levers"] if lv["lever"] == "radix-cache")
    # the three requests share one 64-token system prompt: the cache reused it
    assert rc_answer["loads"][0]["ledger"].get("saved tokens", 0) > 0
    assert rc_answer["loads"][0]["binding_baseline"]["kind"] in (
        "compute",
        "bandwidth",
        "overhead",
    )
    assert record["facts"]["baseline"]["params"] > 1e8
    rec = answers["recommendation"]
    assert rec["config"] in ("baseline", "defaults", "radix-cache", "chunked-prefill")
    assert rec["against_defaults"] is not None or rec["config"] == "defaults"
    assert "houchu serve --model" in printed and "Levers" in printed
    assert "database: run 1" in printed
    if dashboard is not None:
        _dashboard_shows_the_sweep(dashboard.result())


def _dashboard_server(model: Path, db: str) -> Server:
    """A server on the sweep's database, for its dashboard."""
    return start_server(model, "--kv-cache-mb", "16", "--decode-paths", "rules", "--db-url", db)


def _dashboard_shows_the_sweep(srv: Server) -> None:
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1440, "height": 1000})
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(f"{srv.url}/dashboard")
        page.wait_for_selector("#sweep-heatmap .main-svg", timeout=60_000)
        page.wait_for_selector("#sweep-curves .main-svg", timeout=60_000)
        assert page.get_attribute("#sweeps", "data-run") == "1"
        traces = page.evaluate("document.getElementById('sweep-curves').data.map(t => t.name)")
        assert traces == ["radix-cache", "chunked-prefill"]
        assert page.evaluate("document.getElementById('sweep-heatmap').data[0].type") == "heatmap"
        assert "not applicable" in page.inner_text("#sweeps")
        rec = page.inner_text("#sweep-recommendation")  # the flags and what to expect
        assert "houchu serve" in rec and "expected: TTFT" in rec and "output tok/s" in rec
        # the sweep is not offered as a benchmark run to compare
        assert page.locator("#bench-table tr[data-run]").count() == 0
        browser.close()
    assert not errors, errors
