"""The model-runner benchmark on a CUDA GPU (``python -m houchu.bench.model.runner --device
cuda``): the same rows as on the CPU (``houchu.bench.model.runner``), in one table, against
the GPU's own limits (device-memory copy bandwidth, fp32 / bf16 / int8 GEMM peaks,
``houchu.bench.model.limits.measure``).

Modes: "eager" (each decode step launched op by op, no CUDA graphs), "graph" (decode steps
captured as CUDA graphs per batch bucket and replayed) and "compiled" (``torch.compile``,
no graphs). The kernels column names the attention backend and the decode path, e.g.
"triton cuda_graph". Timings are wall-clock seconds per ``ModelRunner.execute``, which
waits for the GPU (it returns the sampled token ids to the host).
"""

from __future__ import annotations

import argparse
import gc

import torch

from houchu.bench.model import limits as runner_limits
from houchu.bench.model.runner import FORMATS, INT8_ACTS, Row, print_table, run_format
from houchu.model.device import DeviceError, resolve_device
from houchu.model.linear.w8a8 import W8A8_MIN_ROWS

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
