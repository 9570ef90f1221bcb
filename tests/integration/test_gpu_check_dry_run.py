"""``python -m houchu.devtools.gpu_check --dry-run``, every step, on the CPU: it serves the
default model and benchmarks one stream, prints a small runner table, and marks the GPU
steps skipped with the reason (about 100 s on 2 cores)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_whole_dry_run(tmp_path, real_model_path):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "houchu.devtools.gpu_check", str(out), "--dry-run"]
    cmd += ["--work", str(tmp_path / "work"), "--model", str(real_model_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-5000:]
    record = json.loads((out / "gpu_check.json").read_text())
    by = {s["name"]: s for s in record["steps"]}
    assert {n: s["status"] for n, s in by.items()} == {
        "install": "ok",
        "machine": "ok",
        "model": "ok",
        "gpu_tests": "skipped",
        "serve_bench": "ok",
        "runner_bench": "skipped",
        "golden": "skipped",
    }
    for name in ("gpu_tests", "runner_bench", "golden"):
        assert by[name]["reason"].startswith("dry run: no GPU used"), by[name]
    golden = by["golden"]["results"]  # the real model's golden test, collected
    assert golden["test"] == "tests/integration/test_golden.py" and "note" not in golden
    assert golden["tests"]["collected"] > 0
    serve = by["serve_bench"]["results"]
    assert serve["device"] == "cpu" and serve["mode"].startswith("reduced")
    one = serve["bench"]["1"]
    assert one["completed"] == 3 and one["failed"] == 0
    assert one["output_tok_s"] > 0 and one["tpot_median_ms"] > 0 and one["ttft_median_ms"] > 0
    assert any("houchu: serving" in line for line in serve["startup"])
    rows = by["runner_bench"]["results"]["rows"]
    assert [(r["fmt"], r["mode"], r["what"]) for r in rows] == [("fp32", "eager", "decode b=1")]
    assert record["model"]["kind"] == "given" and record["model"]["golden"]
    assert [g["status"] for g in record["goals"]] == ["not measured"] * 3
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.json", "gpu_check.log"]
