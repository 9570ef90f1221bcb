"""What ``houchu serve --deterministic`` (batch-invariant inference,
``houchu.runner.deterministic``) costs on this CPU: decode ms per step at two batch sizes
and prefill tokens per second, default vs deterministic, on the default int4 path and
the exact float32 path (``--quantization none``).

    python -m houchu.bench.model.deterministic [--model PATH] [--paths int4,exact]
        [--batches 1,16] [--context 128] [--prefill 256] [--steps 8] [--threads N]
        [--compile off|auto]

Each configuration is a fresh ``ModelRunner`` driven by ``runner_bench.Bench`` (decode
steps of one new token per sequence over ``--context`` tokens of KV, sampling included,
best of ``--steps``; a ``--prefill``-token prompt, best of 3). "default" is ``houchu
serve``'s runner as it starts (the measured decode route, ``--compile`` as given: off by
default, since compiling costs minutes on 2 cores and the int4 route's fused layers are
not compiled anyway); "deterministic" adds ``deterministic=True``. Prints the CPU's
feature flags and the thread count with the table. Printed, not asserted.
"""

from __future__ import annotations

import argparse
import time

import torch

from houchu.bench.model.runner import Bench
from houchu.cpu.isa import isa_flags
from houchu.options.runner_options import RunnerOptions
from houchu.runner.model_runner import ModelRunner

QUANTIZATION_OF_PATH = {"int4": "auto", "exact": "none"}  # path name: --quantization


def measure(model: str, quant: str, det: bool, args: argparse.Namespace) -> dict[str, float]:
    """Decode seconds per step per batch size ("b=N") and prefill tokens/s ("prefill")
    of one fresh runner; "start" is its start-up in seconds."""
    pages = max(args.batches) * -(-(args.context + args.steps + 2) // 16) + 64
    o = RunnerOptions(
        device="cpu",
        quantization=quant,
        page_size=16,
        num_pages=max(pages, -(-args.prefill // 16) + 1),
        threads=args.threads,
        compile=args.compile,
        decode_batch_sizes=(1, 2, 4, 8, 16, 32),
        deterministic=det,
    )
    t0 = time.perf_counter()
    runner = ModelRunner(model, o, quiet=True)
    out = {"start": time.perf_counter() - t0}
    bench = Bench(runner, args.context)
    for b in args.batches:
        out[f"b={b}"] = bench.decode(b, args.steps).step_s
    if args.prefill > 0:
        row = bench.prefill(args.prefill, 3)
        out["prefill"] = row.tokens / row.step_s
    what = runner.deterministic or runner.decode_paths() or "rules"
    print(f"  {quant} {'deterministic' if det else 'default'}: {what}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    from houchu.model.fetch import fetch_default_model

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="GGUF or HF folder (default: SmolLM2-135M)")
    p.add_argument("--paths", default="int4,exact", help="comma list of int4, exact")
    p.add_argument("--batches", default="1,16", help="decode batch sizes")
    p.add_argument("--context", type=int, default=128, help="KV tokens per decode sequence")
    p.add_argument("--prefill", type=int, default=256, help="prompt tokens (0: none)")
    p.add_argument("--steps", type=int, default=8, help="decode steps timed (best taken)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    p.add_argument("--compile", choices=["off", "auto"], default="off")
    args = p.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    paths = args.paths.split(",")
    if unknown := [x for x in paths if x not in QUANTIZATION_OF_PATH]:
        p.error(f"--paths: unknown {unknown}; choose from {list(QUANTIZATION_OF_PATH)}")
    model = args.model or str(fetch_default_model(quiet=True))
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    print(
        f"CPU flags: {' '.join(sorted(isa_flags()))}; {torch.get_num_threads()} threads; compile {args.compile}"
    )
    cols = [f"b={b}" for b in args.batches]
    header = " | ".join(f"decode {c} ms" for c in cols) + " | prefill tok/s"
    lines = [f"| path | mode | {header} |", "|---|---|" + "---|" * (len(cols) + 1)]
    for path in paths:
        res = {det: measure(model, QUANTIZATION_OF_PATH[path], det, args) for det in (False, True)}
        for det in (False, True):
            r, base = res[det], res[False]
            cells = [f"{r[c] * 1e3:.1f}" for c in cols]
            if det:  # the cost: x the default's time, x its throughput
                cells = [f"{r[c] * 1e3:.1f} ({r[c] / base[c]:.2f}x)" for c in cols]
            pre = "-"
            if "prefill" in r:
                pre = f"{r['prefill']:.0f}"
                pre += f" ({r['prefill'] / base['prefill']:.2f}x)" if det else ""
            mode = "deterministic" if det else "default"
            lines.append(f"| {path} | {mode} | {' | '.join(cells)} | {pre} |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
