"""``python -m houchu.bench.compare`` end to end against houchu alone: the command starts
``houchu serve``, runs the workload, prints the table and the runner's start-up line (its
kernels and measured decode route, what a reader needs to trust the row) and keeps that
line in the JSON record."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_compare_prints_and_records_houchus_runner_line(tmp_path: Path, real_model_path) -> None:
    out = tmp_path / "compare.json"
    cmd = [
        sys.executable, "-m", "houchu.bench.compare", "--targets", "houchu",
        "--model", str(real_model_path), "--workload", "random", "--num-requests", "2",
        "--input-len", "8", "--output-len", "4", "--concurrency", "1", "--no-db",
        "--no-progress", "--output", str(out), "--houchu-arg=--compile=off",
    ]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    runner_lines = [ln for ln in run.stdout.splitlines() if ln.startswith("houchu runner:")]
    assert any("CPU ISA" in ln or "cuda" in ln for ln in runner_lines), run.stdout
    assert "completed requests" in run.stdout
    record = json.loads(out.read_text())["records"]["houchu"]
    assert record["settings"]["runner_startup"] == runner_lines
    assert record["settings"]["model"] is None  # the GGUF path is not sent as the model field
