"""The device check's CPU side (``houchu.devtools.gpu_check``): its dry run end to end (fewer
steps here; all of them in ``tests/integration/test_gpu_check_dry_run.py``), the wheels
list read off pyproject, the install plan, the parsers, and the goals on given numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from houchu.bench.model.limits import Limits
from houchu.bench.model.runner import Row, print_table
from houchu.devtools.gpu import goals as gpu_goals
from houchu.devtools.gpu import install as gpu_install
from houchu.devtools.gpu import steps as gpu_check_steps
from houchu.devtools.gpu import wheels as gpu_wheels
from houchu.devtools.gpu.run import Context, Step

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]  # the repository


def run_check(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    """``python -m houchu.devtools.gpu_check OUT --dry-run ARGS`` -> (process, its JSON)."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "houchu.devtools.gpu_check", str(out), "--dry-run"]
    cmd += ["--work", str(tmp_path / "work"), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    return proc, json.loads((out / "gpu_check.json").read_text())


def test_dry_run_skips_the_gpu_steps_and_runs_the_others(tmp_path, real_model_path):
    steps = "install,machine,model,gpu_tests,golden"
    proc, record = run_check(tmp_path, "--steps", steps, "--model", str(real_model_path))
    assert proc.returncode == 0, proc.stdout[-3000:]
    by = {s["name"]: s for s in record["steps"]}
    assert list(by) == list(gpu_check_steps_order())
    assert record["dry_run"] and record["finished"]
    for name in ("install", "machine", "model"):
        assert by[name]["status"] == "ok", by[name]
    assert by["install"]["results"]["mode"] == "check only"
    assert by["install"]["results"]["missing"] == []
    assert "torch" in by["install"]["results"]["modules"]
    assert record["machine"]["cuda_available"] is False  # CUDA hidden from the children
    assert record["model"]["kind"] == "given" and record["model"]["golden"]
    for name in ("gpu_tests", "golden"):  # needs the GPU: collected, then skipped
        assert by[name]["status"] == "skipped"
        assert by[name]["reason"].startswith("dry run: no GPU used")
        assert by[name]["results"]["tests"]["collected"] > 0
    assert by["golden"]["results"]["test"] == gpu_check_steps.GOLDEN_TEST  # the real model's
    assert "note" not in by["golden"]["results"]
    for name in ("serve_bench", "runner_bench"):
        assert by[name]["status"] == "skipped" and "--steps" in by[name]["reason"]
    assert [g["status"] for g in record["goals"]] == ["not measured"] * 3
    log = (tmp_path / "out" / "gpu_check.log").read_text()
    assert "--collect-only" in log and "gpu_check summary" in log
    assert "gpu_tests      skipped" in proc.stdout


def test_golden_step_on_a_stand_in_runs_the_tiny_trained_golden(tmp_path):
    """Without the default model's GGUF (a stand-in serves) the golden step runs the
    tiny trained Llama's golden test instead of skipping, and says so; in a dry run
    that file is collected only."""
    ctx = Context(tmp_path, 300, REPO, echo=None)
    ctx.model = {"path": str(tmp_path / "m.standin.gguf"), "kind": "stand-in", "golden": None}
    ctx.dry_run = True
    step = Step("golden")
    gpu_check_steps.golden_step(ctx, step, 240)
    ctx.close()
    assert step.results["test"] == gpu_check_steps.TINY_GOLDEN_TEST
    note = "the default model cannot travel: golden on a tiny trained Llama"
    assert step.results["note"] == note
    assert step.status == "skipped" and step.reason.startswith("dry run: no GPU used"), step
    assert step.results["tests"]["collected"] >= 5  # 2 x 2 backends and the logprobs one
    log = ctx.log_path.read_text()
    assert f"--collect-only {gpu_check_steps.TINY_GOLDEN_TEST}" in log
    lines = gpu_goals.summary_lines([step.record()], [])
    assert any(line.strip().startswith("golden") and note in line for line in lines)


def gpu_check_steps_order() -> tuple[str, ...]:
    from houchu.devtools.gpu_check import STEPS

    return STEPS


def test_a_bad_step_name_is_a_usage_error(tmp_path):
    cmd = [sys.executable, "-m", "houchu.devtools.gpu_check", str(tmp_path), "--steps", "nope"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "unknown nope" in proc.stderr


def test_wheels_list_keeps_pins_and_leaves_out_what_the_device_has():
    reqs = gpu_wheels.needed_requirements(gpu_wheels.load_pyproject(), "3.12")
    by = {gpu_wheels.canonicalize_name(r.name): r for r in reqs}
    for device_has in ("torch", "numpy", "transformers", "safetensors", "aiohttp", "uvloop"):
        assert device_has not in by
    assert str(by["llguidance"].specifier) == str(
        gpu_wheels.Requirement("llguidance>=1.9,<2").specifier
    )
    assert str(by["msgspec"].specifier) == ">=0.18"
    assert {"gguf", "pyzmq", "sqlalchemy", "alembic", "pytest-asyncio"} <= set(by)
    assert all(r.marker is None for r in reqs)
    cmd = gpu_wheels.download_command(reqs, "/w", "3.12")
    assert cmd[3:6] == ["download", "--only-binary=:all:", "--python-version"]
    assert "3.12" in cmd and "--no-deps" not in cmd
    plats = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--platform"]
    assert plats == list(gpu_wheels.PLATFORMS)
    assert "manylinux_2_31_x86_64" in plats  # llguidance>=1.9's only wheels


def test_markers_are_evaluated_for_the_gpu_machine():
    pyproject = {
        "project": {
            "dependencies": [
                "torch==2.13.0",
                "winonly>=1; sys_platform == 'win32'",
                "oldpy>=2; python_version < '3.11'",
                "linux-x86>=3; platform_machine == 'x86_64'",
            ],
            "optional-dependencies": {"test": ["pytest>=8", "ruff>=0.6"]},
        }
    }
    names = [r.name for r in gpu_wheels.needed_requirements(pyproject, "3.12")]
    assert names == ["linux-x86", "pytest"]  # ruff: not a check extra
    assert "oldpy" in [r.name for r in gpu_wheels.needed_requirements(pyproject, "3.10")]


def _wheel(folder: Path, name: str) -> Path:
    path = folder / name
    path.write_bytes(b"")
    return path


def test_prune_and_unmet_read_the_folder(tmp_path):
    _wheel(tmp_path, "numpy-2.5.5-cp312-cp312-manylinux_2_28_x86_64.whl")
    _wheel(tmp_path, "nvidia_cublas-13.0.0-py3-none-manylinux_2_28_x86_64.whl")
    _wheel(tmp_path, "msgspec-0.23.0-cp312-cp312-manylinux2014_x86_64.whl")
    _wheel(tmp_path, "llguidance-2.0.0-cp39-abi3-manylinux_2_31_x86_64.whl")
    gone = gpu_wheels.prune_device_provided(tmp_path)
    assert [g.split("-")[0] for g in gone] == ["numpy", "nvidia_cublas"]
    versions = gpu_wheels.wheel_versions(tmp_path)
    assert versions == {"msgspec": "0.23.0", "llguidance": "2.0.0"}
    reqs = [gpu_wheels.Requirement(t) for t in ("msgspec>=0.18", "llguidance>=1.9,<2", "gguf")]
    bad = gpu_wheels.unmet(reqs, versions)
    assert len(bad) == 2 and "(folder: 2.0.0)" in bad[0] and "(folder: none)" in bad[1]


def test_install_plan_never_touches_torch(tmp_path):
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    _wheel(tmp_path, "torch-2.13.0-cp312-cp312-manylinux_2_28_x86_64.whl")
    _wheel(tmp_path, "houchu_absent_pkg-1.0-py3-none-any.whl")  # not installed: installed
    _wheel(tmp_path, "pytest-1.0-py3-none-any.whl")  # installed, satisfies: kept
    _wheel(tmp_path, "msgspec-99.0-cp99-cp99-manylinux_2_28_x86_64.whl")  # no such Python
    _wheel(tmp_path, f"sqlalchemy-99.0-{py}-{py}-manylinux_2_17_x86_64.whl")  # outdated
    reqs = [gpu_wheels.Requirement(t) for t in ("pytest>=1", "sqlalchemy>=99", "torch==9")]
    plan = gpu_install.plan_wheels(tmp_path, reqs)
    assert plan.refused == ["torch-2.13.0-cp312-cp312-manylinux_2_28_x86_64.whl"]
    assert [n for n, _, _ in plan.install] == ["houchu-absent-pkg", "sqlalchemy"]
    assert [n for n, _ in plan.present] == ["pytest"]
    assert (
        plan.incompatible[0][0].startswith("msgspec-99.0") and "not this" in plan.incompatible[0][1]
    )
    assert gpu_install.import_name("pyzmq") == "zmq"
    assert gpu_install.import_name("prometheus_client") == "prometheus_client"


def test_goals_on_given_numbers():
    bench = {"1": {"tpot_median_ms": 2.9}, "64": {"output_tok_s": 10_000.0}}
    rows = [
        {"fmt": "int4", "mode": "eager", "what": "decode b=1", "ms": 4.0},
        {"fmt": "int4", "mode": "graph", "what": "decode b=1", "ms": 1.5},
        {"fmt": "int4", "mode": "graph", "what": "decode b=16", "ms": 9.0},
    ]
    goals = gpu_goals.evaluate_goals(bench, rows, on_gpu=True, note="stand-in")
    assert [g["status"] for g in goals] == ["met", "met", "met"]
    assert goals[2]["value"] == {"int4": {"eager_ms": 4.0, "graph_ms": 1.5}}
    assert goals[0]["note"] == "stand-in"
    slow = {"1": {"tpot_median_ms": 3.0}, "64": {"output_tok_s": 9_999.9}}
    rows.append({"fmt": "bf16", "mode": "eager", "what": "decode b=1", "ms": 1.0})
    rows.append({"fmt": "bf16", "mode": "graph", "what": "decode b=1", "ms": 1.2})
    goals = gpu_goals.evaluate_goals(slow, rows, on_gpu=True)
    assert [g["status"] for g in goals] == ["missed", "missed", "missed"]
    partial = gpu_goals.evaluate_goals({"1": {"tpot_median_ms": 1.0}}, [], on_gpu=True)
    assert [g["status"] for g in partial] == ["not measured", "met", "not measured"]
    cpu = gpu_goals.evaluate_goals(bench, rows, on_gpu=False)
    assert {g["status"] for g in cpu} == {"not measured"}
    facts = {"python": "3.12.3", "torch": "2.11.0", "torch_cuda": "13.0", "gpu_count": 1}
    facts |= {"gpu": "NVIDIA H200", "gpu_memory_gib": 139.8, "capability": "9.0"}
    lines = gpu_goals.summary_lines([], goals, facts, {"kind": "stand-in", "path": "/m"})
    assert any(line.strip().startswith("MISSED") and "10,000" in line for line in lines)
    assert "NVIDIA H200 139.8 GiB sm 9.0" in lines[2] and "flash_attn absent" in lines[2]
    assert lines[3] == "model: stand-in /m"


def test_runner_table_is_read_back(capsys):
    lim = Limits(copy_gbs=3000.0, fp32_flops=50e12, bf16_flops=800e12, int8_ops=1600e12)
    rows = [
        Row("int4", "graph", "decode b=1", 0.0015, 1, 9e7, 2e8, 1e6, "bf16", "triton cuda_graph"),
        Row("bf16", "eager", "prefill 512", 0.02, 512, 3e8, 1e11, 1e9, "bf16", "torch eager"),
    ]
    print("  int4 graph: ready in 1.0s; levers")  # progress lines are not table rows
    print_table(rows, lim, units=frozenset({"fp32"}))  # bf16 outside: %peak "-"
    print("ms/step: the fastest timed step")
    got = gpu_goals.runner_rows(capsys.readouterr().out)
    assert [(r["fmt"], r["mode"], r["kernels"], r["what"]) for r in got] == [
        ("int4", "graph", "triton cuda_graph", "decode b=1"),
        ("bf16", "eager", "torch eager", "prefill 512"),
    ]
    assert got[0]["ms"] == pytest.approx(1.5) and got[0]["tok_s"] == pytest.approx(666.7)
    assert got[0]["peak_pct"] is None


def test_pytest_counts():
    assert gpu_goals.pytest_counts("..s\n43 passed, 7 skipped in 43.52s\n") == {
        "passed": 43,
        "skipped": 7,
    }
    out = "==== 1 failed, 2 passed, 1 error in 3.0s ===="
    assert gpu_goals.pytest_counts(out) == {"failed": 1, "passed": 2, "errors": 1}
    assert gpu_goals.pytest_counts("x\n\n50 tests collected in 0.4s\n") == {"collected": 50}
    assert gpu_goals.pytest_counts("no summary") == {}


def test_a_command_past_its_timeout_is_killed(tmp_path):
    ctx = Context(tmp_path, 60, REPO, echo=None)
    res = ctx.run([sys.executable, "-c", "print('hi', flush=True); import time; time.sleep(60)"], 1)
    ctx.close()
    assert res.timed_out and res.rc is None and res.duration_s < 15
    assert "hi" in res.output and "timed out after 1 s" in ctx.log_path.read_text()


def test_runner_bench_on_cuda_without_a_gpu_is_one_line():
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    cmd = [sys.executable, "-m", "houchu.bench.model.runner", "--device", "cuda", "--model", "x"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "torch sees no CUDA GPU" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_serve_command_per_device(tmp_path):
    ctx = Context(tmp_path, 60, REPO, echo=None)
    ctx.model = {"path": "/m.gguf"}
    cpu = gpu_check_steps.serve_command(ctx, 18001, tmp_path / "db")
    assert cpu[cpu.index("--device") + 1] == "cpu" and "--compile" in cpu
    ctx.facts = {"cuda_available": True, "gpu_count": 1}
    gpu = gpu_check_steps.serve_command(ctx, 18001, tmp_path / "db")
    assert gpu[gpu.index("--device") + 1] == "cuda" and gpu[gpu.index("--dtype") + 1] == "bfloat16"
    assert gpu[gpu.index("--decode-batch-sizes") + 1].endswith(",64")
    ctx.dry_run = True  # a dry run never uses the GPU, even where there is one
    assert not ctx.cuda() and ctx.why_no_gpu().startswith("dry run")
    ctx.close()


def test_a_runner_bench_cut_short_keeps_the_formats_it_finished(capsys):
    """Cut short, the runner benchmark printed progress rows per finished format and
    mode but no final table: those rows are read back, and the graphs goal is judged on
    the format measured both ways."""
    lim = Limits(copy_gbs=3000.0, fp32_flops=50e12, bf16_flops=800e12, int8_ops=1600e12)
    print("limits (start): copy 3000.0 GB/s")
    print("progress, against the start limits (the final table uses the best of start and end):")
    for mode, ms in (("eager", 0.004), ("graph", 0.0015)):
        print(f"  int4 {mode}: ready in 2.0s; levers")
        row = Row("int4", mode, "decode b=1", ms, 1, 9e7, 2e8, 1e6, "bf16", "triton eager")
        print_table([row], lim, header=False, units=gpu_goals_units())
    print("  bf16 eager: ready in 1.0s; levers")
    row = Row("bf16", "eager", "decode b=1", 0.002, 1, 9e7, 2e8, 1e6, "bf16", "triton eager")
    print_table([row], lim, header=False, units=gpu_goals_units())
    out = capsys.readouterr().out  # killed here, while bf16 graph ran
    assert gpu_goals.runner_rows(out) == []  # no final table
    rows = gpu_goals.runner_rows(out, progress=True)
    assert [(r["fmt"], r["mode"]) for r in rows] == [
        ("int4", "eager"),
        ("int4", "graph"),
        ("bf16", "eager"),
    ]
    assert gpu_goals.graphs_vs_eager(rows) == {"int4": (4.0, 1.5)}
    goals = gpu_goals.evaluate_goals({}, rows, on_gpu=True)
    assert goals[2]["status"] == "met"


def gpu_goals_units() -> frozenset[str]:
    from houchu.bench.model.runner import GPU_UNITS

    return GPU_UNITS


def test_a_bench_run_with_failed_requests_fails_its_concurrency():
    ok = {"completed": 4, "failed": 0, "output_tok_s": 900.0, "tpot_median_ms": 2.0}
    assert gpu_check_steps.bench_failure(ok, 4) == ""
    assert gpu_check_steps.bench_failure({**ok, "failed": 1, "completed": 3}, 4) == (
        "1 of 4 requests failed"
    )
    assert gpu_check_steps.bench_failure({**ok, "completed": 3}, 4) == "3 of 4 requests completed"
    bad64 = {"completed": 120, "failed": 8, "output_tok_s": 12_000.0, "status": "failed"}
    goals = gpu_goals.evaluate_goals({"1": ok, "64": bad64}, [], on_gpu=True, note="stand-in")
    assert goals[0]["status"] == "missed" and goals[0]["note"] == "8 requests failed; stand-in"
    assert goals[1]["status"] == "met" and goals[1]["note"] == "stand-in"
    steps = [{"name": "serve_bench", "status": "failed", "duration_s": 1.0, "reason": "x"}]
    steps[0]["results"] = {"bench": {"1": ok, "64": bad64}}
    lines = gpu_goals.summary_lines(steps, goals)
    assert any("64 streams" in ln and "(8 requests failed)" in ln for ln in lines)
    assert not any("  1 streams" in ln and "failed" in ln for ln in lines)


def test_the_budget_leaves_a_rerun_in_a_lease():
    """The whole check ends within 6 minutes (a 15-minute lease holds it, a rerun and
    the machine starts); no step's cap is above the budget."""
    from houchu.devtools.gpu_check import DEFAULT_TIMEOUT_S, STEP_CAPS

    assert DEFAULT_TIMEOUT_S <= 360 and max(STEP_CAPS.values()) < DEFAULT_TIMEOUT_S
    assert sum(gpu_check_steps.GPU_STREAMS.values()) <= 200
