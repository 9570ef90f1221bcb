"""Model-runner benchmark: decode and prefill speed per weight format, eager and compiled,
against this machine's measured limits.

    python -m houchu.bench.model.runner [--model PATH] [--formats fp32,bf16,int8,int4,w8a8]
        [--modes eager,compiled] [--batches 1,8,32] [--context 128] [--prefill 512]
        [--cpu-isa all|LEVEL[,LEVEL...]] [--device cpu|cuda[:N]]

With ``--device cuda`` it measures the GPU instead (``run_cuda``):
one table, modes eager and graph (CUDA graphs) by default, the limits those of the GPU.

One table per CPU ISA level (``houchu.cpu.isa``; default: every level this CPU runs,
e.g. avx512_bf16, avx512, avx2 and generic on an AVX512-BF16 host), each measured in a
fresh process of its own: houchu's kernels at that level, and torch's own kernels (ATen,
oneDNN, MKL) held to it too where it is below the CPU's best (``cpu_isa.torch_env``), so
a forced level measures what a CPU of that level runs. Every row names its level and
kernel path. The quantized formats compute in bfloat16 where the level has native
bfloat16, else in float32, as the runner's linear layers do.

First measures memory copy bandwidth and the fp32 / bf16 / int8 matmul peaks, then for
each format and mode times decode steps (one new token per sequence, ``--context``
tokens of KV each) at each batch size through ``ModelRunner.execute`` (sampling
included) and a ``--prefill``-token prompt; measures the limits again at the end, and
divides by the better of the two measurements. Per decode step it reports bytes moved
(matmul weights in the layout the step's kernels read at that row count, e.g. houchu's
int4 GEMV blob with its scale headers or a kept dense copy, + KV read + KV written), achieved GB/s and FLOP/s (2 × matmul
weights × tokens + attention 4 × layers × heads × head_dim × KV tokens; a prefill runs
the LM head on its last token only), each as a
fraction of the limit: bandwidth for GB/s; for FLOP/s, the time the step's ops would take
at the peak of the format each computes in (fp32; bf16; w8a8's GEMMs from W8A8_MIN_ROWS
rows at the int8 peak, its attention at the bf16 one; on a GPU with FP8 tensor cores
w8a8's GEMMs run FP8, whose peak is not measured: "-") over the measured time, only where
the level computes that format natively (else "-": a peak measured on emulation is no
peak). Printed, not asserted.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from houchu import env as env_vars
from houchu.bench.model import limits as runner_limits
from houchu.cpu import isa as cpu_isa
from houchu.cpu import kernels as cpu_kernels
from houchu.model.device import DeviceError, resolve_device
from houchu.model.linear.quantized import quant_act_dtype
from houchu.model.linear.w8a8 import W8A8_MIN_ROWS, int_mm_pays
from houchu.model.moe import MoEMLP
from houchu.options.runner_options import RunnerOptions
from houchu.runner.model_runner import ModelRunner
from houchu.transport.messages import SamplingParams, SeqInit, SeqWork, StepPlan

FORMATS = {  # name: (model dtype, quantization); "act": the linear layers' activation dtype
    "fp32": ("float32", "none"),
    "bf16": ("bfloat16", "none"),
    "int8": ("act", "int8"),
    "int4": ("act", "int4"),
    "w8a8": ("act", "w8a8"),
    "w4a8": ("act", "int4"),  # int4 weights x int8 activations (--int4-activations int8)
}
INT8_ACTS = {"w4a8"}  # formats whose int4 layers quantize their activations to int8
GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)
WARMUP_STEPS = 4  # untimed decode steps before the timed ones


@dataclass
class Row:
    """One measured configuration (step_s: seconds of the fastest step; med_s: seconds
    of the median step, 0 when not measured; tokens: new tokens per step; bytes: bytes
    moved per step; flops: floating-point (or int8) ops per step)."""

    fmt: str
    mode: str
    what: str
    step_s: float
    tokens: int
    bytes: float
    flops: float
    attn_flops: float = 0.0  # the part of flops in attention
    compute: str = "bf16"  # the format the step computes in: fp32 or bf16 (w8a8: GEMMs int8)
    kernels: str = ""  # the CPU ISA level and the kernel path, e.g. "avx2 fused"
    med_s: float = 0.0  # the median step's seconds (the best is step_s)


class Bench:
    """Drives one ``ModelRunner`` through decode batches and a prefill."""

    def __init__(self, runner: ModelRunner, context: int) -> None:
        self.r, self.context, self.step = runner, context, 0
        cfg = runner.config
        self.attn_per_kv_token = 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim
        self.ids = min(1000, cfg.vocab_size - 10)  # prompt token ids: 10 .. 10 + ids - 1
        self.model = runner.model
        linears = runner.model.linears()  # the LM head last
        # a token runs top_k of a MoE layer's E experts: the others' weights do no FLOPs
        moes = [m for m in runner.model.modules() if isinstance(m, MoEMLP)]
        idle = sum((m.num_experts - m.top_k) * m.expert_params for m in moes)
        self.matmul_params = sum(m.out_features * m.in_features for m in linears) - idle
        self.head_params = linears[-1].out_features * linears[-1].in_features

    def _plan(self, **kw) -> StepPlan:  # noqa: ANN003
        self.step += 1
        return StepPlan(step_id=self.step, **kw)

    def decode(self, batch: int, steps: int) -> Row:
        """Best-of-``steps`` decode step at ``batch`` sequences of ``context`` tokens (and
        the median step), after ``WARMUP_STEPS`` untimed steps: the first steps after a
        prefill run slower (caches, the thread team waking, the governor's first trial)."""
        r, ps, ctx = self.r, self.r.pool.page_size, self.context
        pages = -(-(ctx + WARMUP_STEPS + steps + 1) // ps)
        rids = [f"b{batch}-{i}" for i in range(batch)]
        tables = {rid: list(range(i * pages, (i + 1) * pages)) for i, rid in enumerate(rids)}
        prompt = [(7 * i) % self.ids + 10 for i in range(ctx)]
        init = [SeqInit(rid=x, sampling=GREEDY, prompt_ids=prompt) for x in rids]
        for x in rids:  # prefill one sequence per step (keeps the pool small)
            w = SeqWork(rid=x, token_ids=prompt, start_pos=0, page_table=tables[x], sample=False)
            r.execute(self._plan(init=[i for i in init if i.rid == x], work=[w]))
        times: list[float] = []  # seconds per timed step
        for s in range(WARMUP_STEPS + steps):
            work = [
                SeqWork(rid=x, token_ids=[11], start_pos=ctx + s, page_table=tables[x], sample=True)
                for x in rids
            ]
            t0 = time.perf_counter()
            r.execute(self._plan(work=work))
            if s >= WARMUP_STEPS:
                times.append(time.perf_counter() - t0)
        r.execute(self._plan(work=[], release=rids))
        ctx += WARMUP_STEPS
        kv = r.pool.bytes_per_token * batch * (ctx + steps // 2 + 1)
        flops = 2 * self.matmul_params * batch + self.attn_per_kv_token * batch * (ctx + steps // 2)
        attn = self.attn_per_kv_token * batch * (ctx + steps // 2)
        weights = self.model.weight_bytes_at(batch, batch)  # the copies this row count reads
        row = Row("", "", f"decode b={batch}", min(times), batch, weights + kv, flops, attn)
        row.med_s = statistics.median(times)
        return row

    def prefill(self, n: int, reps: int) -> Row:
        """Best-of-``reps`` time to prefill one ``n``-token prompt (sampling its last)."""
        r, ps = self.r, self.r.pool.page_size
        prompt = [(13 * i) % self.ids + 10 for i in range(n)]
        table = list(range(-(-n // ps)))
        times: list[float] = []  # seconds per prefill
        for k in range(reps):
            rid = f"p{k}"
            plan = self._plan(
                init=[SeqInit(rid=rid, sampling=GREEDY, prompt_ids=prompt)],
                work=[
                    SeqWork(rid=rid, token_ids=prompt, start_pos=0, page_table=table, sample=True)
                ],
            )
            t0 = time.perf_counter()
            r.execute(plan)
            times.append(time.perf_counter() - t0)
            r.execute(self._plan(work=[], release=[rid]))
        kv = r.pool.bytes_per_token * n
        layers = self.matmul_params - self.head_params  # the LM head runs on the last row only
        attn = self.attn_per_kv_token * n * (n + 1) // 2
        flops = 2 * (layers * n + self.head_params) + attn
        weights = self.model.weight_bytes_at(n, 1)
        row = Row("", "", f"prefill {n}", min(times), n, weights + kv, flops, attn)
        row.med_s = statistics.median(times)
        return row


def run_format(fmt: str, mode: str, args: argparse.Namespace) -> list[Row]:
    """The rows of one format and mode: decode at each of ``args.batches`` and, eager,
    one prefill. ``mode``: "eager", "compiled" (``torch.compile``) or, on CUDA, "graph"
    (CUDA graphs); on CUDA, eager and compiled capture no graphs."""
    device = getattr(args, "device", "cpu")
    on_cuda = device.startswith("cuda")
    dtype, quant = FORMATS[fmt]
    if dtype == "act":
        dtype = str(quant_act_dtype("cuda" if on_cuda else "cpu")).removeprefix("torch.")
    pages = max(args.batches) * (-(-(args.context + WARMUP_STEPS + args.steps + 2) // 16)) + 64
    t0 = time.perf_counter()
    options = RunnerOptions(
        device=device,
        dtype=dtype,
        quantization=quant,
        page_size=16,
        num_pages=max(pages, -(-args.prefill // 16) + 1),
        threads=args.threads,
        compile="on" if mode == "compiled" else "off",
        decode_batch_sizes=tuple(sorted(set(args.batches))),
        decode_paths="rules",
        int4_activations="int8" if fmt in INT8_ACTS else "float",
        disable_cuda_graph=mode != "graph",
    )
    runner = ModelRunner(args.model, options, quiet=True)
    print(f"  {fmt} {mode}: ready in {time.perf_counter() - t0:.1f}s; {runner.levers.summary()}")
    b = Bench(runner, args.context)
    rows = [b.decode(n, args.steps) for n in args.batches]
    if mode == "eager" and args.prefill > 0:
        rows.append(b.prefill(args.prefill, 3))
    fused = runner.model.fused
    for row in rows:
        row.fmt, row.mode = fmt, mode
        row.compute = "fp32" if dtype == "float32" else "bf16"
        decode = row.what.startswith("decode")  # the fused layers run decode steps only
        if on_cuda:  # the attention backend and how decode steps run
            row.kernels = f"{runner.backend.name} {runner.accel.kind or 'eager'}"
            continue
        path = "fused" if decode and fused and fused.applies(row.tokens) else runner.model.ops.name
        row.kernels = f"{runner.cpu_isa} {path}"
    runner.close()
    return rows


def cpu_w8a8_gemm() -> str | None:
    """The format W8A8's GEMMs compute in on this CPU from ``W8A8_MIN_ROWS`` rows: int8
    where ``int_mm_pays`` (probed once), else None (its rows run weight-only)."""
    return "int8" if int_mm_pays() else None


def print_table(
    rows: list[Row],
    lim: runner_limits.Limits,
    header: bool = True,
    units: frozenset[str] = frozenset({"fp32", "bf16", "int8"}),
    w8a8_gemm: Callable[[], str | None] = cpu_w8a8_gemm,
) -> None:
    """One line per row: speed, bytes and ops per step, and their fractions of ``lim``;
    %peak only where every format the step computes in is in ``units`` (the CPU's native
    matmul formats, ``cpu_isa.native_units``; a GPU's measured peaks), else "-".
    ``w8a8_gemm`` says what w8a8's GEMMs compute in from ``W8A8_MIN_ROWS`` rows (called
    only for such a row): the CPU's probe by default; on CUDA "fp8" or "int8"
    (``runner_bench_gpu``), FP8 having no measured peak here ("-")."""
    head = (
        f"{'format':6} {'mode':8} {'kernels':18} {'step':13} {'tok/s':>9} {'ms/step':>8} {'med ms':>7} "
        f"{'MB/step':>8} {'GB/s':>6} {'%BW':>5} {'GFLOP/s':>8} {'%peak':>6}"
    )
    if header:
        print(head)
        print("-" * len(head))
    for r in rows:
        gbs = r.bytes / r.step_s / 1e9
        fl = r.flops / r.step_s
        # w8a8's quantized GEMMs run from W8A8_MIN_ROWS (on the CPU where the probe found
        # them paying); below, its rows run weight-only at the activation format
        gemm = w8a8_gemm() if r.fmt == "w8a8" and r.tokens >= W8A8_MIN_ROWS else None
        gemm_fmt = gemm or ("int8" if r.fmt in INT8_ACTS else r.compute)
        peak = "     -"
        if {gemm_fmt, r.compute} <= units:
            # the step's time at the peaks of the formats its parts compute in: only
            # w8a8's quantized GEMMs differ from its attention
            ideal_s = (r.flops - r.attn_flops) / lim.compute_peak(gemm_fmt) + r.attn_flops / (
                lim.compute_peak(r.compute)
            )
            peak = f"{100 * ideal_s / r.step_s:6.1f}"
        print(
            f"{r.fmt:6} {r.mode:8} {r.kernels:18} {r.what:13} {r.tokens / r.step_s:9.1f} "
            f"{r.step_s * 1e3:8.2f} {(r.med_s or r.step_s) * 1e3:7.2f} {r.bytes / 1e6:8.1f} {gbs:6.2f} "
            f"{100 * gbs / lim.copy_gbs:5.1f} {fl / 1e9:8.1f} {peak}"
        )


#: The GPU's native matmul formats for %peak (tensor cores: bf16 and int8; fp32 runs on
#: the CUDA cores, or TF32 where torch allows it).
GPU_UNITS = frozenset({"fp32", "bf16", "int8"})
#: Compute capability from which W8A8 runs FP8 (``houchu.model.linear.w8a8``).
FP8_CAPABILITY = (9, 0)


def cuda_w8a8_gemm(capability: tuple[int, int]) -> str:
    """The format W8A8's GEMMs compute in from ``W8A8_MIN_ROWS`` rows on a GPU of compute
    ``capability``: "fp8" (``torch._scaled_mm``) from 9.0, else "int8" (``torch._int_mm``),
    as ``houchu.model.linear.w8a8.W8A8Linear`` picks; never the CPU's probe."""
    return "fp8" if capability >= FP8_CAPABILITY else "int8"


def run_cuda(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Every format and mode of ``args`` on ``args.device`` (a CUDA device), one table.

    Returns:
        0 (the exit status); a device torch cannot use, or a CPU-only format, is a usage
        error through ``parser.error``.
    """
    try:
        device = resolve_device(args.device)
    except DeviceError as exc:
        parser.error(str(exc))
    cpu_only = sorted(set(args.formats.split(",")) & INT8_ACTS)
    if cpu_only:
        parser.error(f"format(s) {', '.join(cpu_only)} run on houchu's CPU kernels only")
    args.device = device
    torch.cuda.set_device(torch.device(device))
    props = torch.cuda.get_device_properties(torch.device(device))
    print(
        f"\n== {device}: {props.name}, {props.total_memory / 2**30:.1f} GiB, "
        f"sm_{props.major}{props.minor}, {props.multi_processor_count} SMs "
        f"(torch {torch.__version__}, CUDA {torch.version.cuda})"
    )
    gemm8 = cuda_w8a8_gemm((props.major, props.minor))
    print(f"houchu runner benchmark: {args.model}; w8a8's GEMMs from {W8A8_MIN_ROWS} rows: {gemm8}")
    before = runner_limits.measure(device)
    print(f"limits (start): {before.line(GPU_UNITS)}")
    print("progress, against the start limits (the final table uses the best of start and end):")
    rows: list[Row] = []
    for fmt in args.formats.split(","):
        for mode in args.modes.split(","):
            new = run_format(fmt, mode, args)
            print_table(new, before, header=False, units=GPU_UNITS, w8a8_gemm=lambda: gemm8)
            rows += new
            gc.collect()
            torch.cuda.empty_cache()  # the next runner's KV pool and graphs
    after = runner_limits.measure(device)
    print(f"limits (end):   {after.line(GPU_UNITS)}")
    lim = before.best(after)
    print(f"limits used (best of both): {lim.line(GPU_UNITS)}\n")
    print_table(rows, lim, units=GPU_UNITS, w8a8_gemm=lambda: gemm8)
    print(
        "ms/step: the fastest timed step (tok/s, GB/s, %BW, GFLOP/s and %peak are of it); "
        "med ms: the median step; %BW: bytes moved per step / step time, over the GPU's "
        "device-to-device copy bandwidth; %peak: the time the step's work would take at "
        "the GEMM peak of its format, over the measured time ('-' for w8a8's FP8 GEMMs: "
        "no FP8 peak measured); mode graph: CUDA graphs "
        f"replayed, eager: launched op by op; formats: {', '.join(FORMATS)}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m houchu.bench.model.runner", description=__doc__)
    p.add_argument("--model", help="a .gguf file or HF folder (default: the fetched model)")
    p.add_argument("--formats", default=",".join(FORMATS), help="comma-separated formats")
    p.add_argument(
        "--modes",
        help="eager, compiled and (CUDA) graph (default: eager,compiled on the CPU, "
        "eager,graph on CUDA)",
    )
    p.add_argument("--batches", default="1,8,32", help="decode batch sizes")
    p.add_argument("--context", type=int, default=128, help="KV tokens per sequence")
    p.add_argument(
        "--steps", type=int, default=32, help="timed decode steps (best and median taken)"
    )
    p.add_argument(
        "--prefill", type=int, default=512, help="prefill prompt length (0: no prefill row)"
    )
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    p.add_argument(
        "--cpu-isa",
        default="all",
        help="comma-separated CPU ISA levels, one table each (all: every level this CPU "
        f"runs; levels: {', '.join(cpu_isa.NAMES)})",
    )
    p.add_argument(
        "--device",
        default="cpu",
        help="cpu (one table per ISA level) or cuda[:N] (one table, the GPU's limits)",
    )
    args = p.parse_args(argv)
    on_cuda = args.device.startswith("cuda")
    args.modes = args.modes or ("eager,graph" if on_cuda else "eager,compiled")
    bad_modes = set(args.modes.split(",")) - (
        {"eager", "compiled", "graph"} if on_cuda else {"eager", "compiled"}
    )
    if bad_modes:
        p.error(f"--modes: unknown or not on {args.device}: {', '.join(sorted(bad_modes))}")
    try:
        args.batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        p.error(f"--batches must be comma-separated integers, got {args.batches!r}")
    unknown = set(args.formats.split(",")) - set(FORMATS)
    if unknown:
        p.error(
            f"unknown format(s) {', '.join(sorted(unknown))} (choose from {', '.join(FORMATS)})"
        )
    if min(args.batches) < 1 or args.context < 1 or args.steps < 1 or args.prefill < 0:
        p.error("--batches, --context and --steps must be positive, --prefill not negative")
    if on_cuda:
        return run_cuda(args, p)
    levels = cpu_isa.usable() if args.cpu_isa == "all" else args.cpu_isa.split(",")
    levels = [cpu_isa.usable()[0] if lv == "auto" else lv for lv in levels]
    for lv in levels:
        if lv not in cpu_isa.NAMES:
            p.error(f"--cpu-isa: unknown level {lv!r} (all, auto, {', '.join(cpu_isa.NAMES)})")
        if not cpu_isa.runs(cpu_isa.level(lv)):
            p.error(f"--cpu-isa {lv}: {cpu_isa.why_not(cpu_isa.level(lv))}")
    levels = list(dict.fromkeys(levels))  # each level once
    if args.model is None:
        from houchu.model.fetch import fetch_default_model

        args.model = str(fetch_default_model(quiet=True))
    level = env_vars.runner_bench_level()  # set in the per-level child processes
    if level:
        return run_level(level, args)
    status = 0
    for lv in levels:  # each level in a fresh process: torch reads its ISA caps at load
        env = {
            **os.environ,
            **cpu_isa.torch_env_for(lv),
            env_vars.RUNNER_BENCH_LEVEL: lv,
            env_vars.CPU_ISA: lv,
        }
        cmd = [sys.executable, "-m", "houchu.bench.model.runner", *(argv or sys.argv[1:])]
        status |= subprocess.run([*cmd, "--model", args.model], env=env, check=False).returncode
    return status


def run_level(level: str, args: argparse.Namespace) -> int:
    """All formats and modes at one CPU ISA level, in this process."""
    cpu_kernels.select(level)
    units = cpu_isa.native_units(level)
    if args.threads:
        torch.set_num_threads(args.threads)
    held = cpu_isa.torch_env_for(level)
    print(
        f"\n== CPU ISA {level} (CPU flags: {' '.join(sorted(cpu_isa.isa_flags()))}"
        f"{'; torch held to it: ' + ' '.join(f'{k}={v}' for k, v in held.items()) if held else ''})"
    )
    print(f"houchu runner benchmark: {args.model}, {torch.get_num_threads()} threads")
    before = runner_limits.measure()
    print(f"limits (start): {before.line(units)}")
    print("progress, against the start limits (the final table uses the best of start and end):")
    rows: list[Row] = []
    for fmt in args.formats.split(","):
        for mode in args.modes.split(","):
            new = run_format(fmt, mode, args)
            print_table(new, before, header=False, units=units)
            rows += new
    after = runner_limits.measure()
    print(f"limits (end):   {after.line(units)}")
    lim = before.best(after)
    print(f"limits used (best of both): {lim.line(units)}\n")
    print_table(rows, lim, units=units)
    print(
        "ms/step: the fastest timed step (tok/s, GB/s, %BW, GFLOP/s and %peak are of it); "
        "med ms: the median step; %BW: bytes moved per step / step time, over the copy "
        "bandwidth; %peak: the time "
        "the step's work would take at the matmul peak of the format each part computes in "
        "(w8a8 prefill: GEMMs int8; else the row's activation format), over the measured "
        "time; '-' where the CPU has no unit for that format at this level"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
