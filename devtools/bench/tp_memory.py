"""Peak resident memory of each rank of a tensor-parallel runner, once loaded.

    python -m houchu.devtools.bench.tp_memory [--tp 3] [--model PATH] [--quantization auto]
        [--dtype float32] [--kv-cache-mb 16]

Starts a ``ModelRunner`` at ``--tensor-parallel-size --tp`` (gloo, 1 thread per rank,
the runner's start-up warm-up included) and prints, per rank, its process's peak
resident set (``VmHWM`` of ``/proc/PID/status``: the most physical memory the process
held at once, so a rank that read the whole checkpoint before slicing it shows that),
its resident set after loading (``VmRSS``) and the private part of that (``RssAnon``:
the weights, the KV pool and the heap; the rest is mapped files, libraries and the page
cache of the checkpoint, which the ranks share). Rank 0's process is this one (the
runner's Python, torch and tokenizer state included); its resident set before the
runner starts is printed first, the part of every rank's figure that is not the model. Without ``--model``, the default model
(``~/.cache/houchu``); ``--model random``: ``tp_bench``'s random Llama (12 heads, 4 KV
heads, hidden 768, 12 layers; safetensors, float32). Printed, not asserted.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from houchu.options.runner_options import RunnerOptions
from houchu.runner.model_runner import ModelRunner


def status_mib(pid: int | str, key: str) -> float:
    """``key`` (``VmHWM``, ``VmRSS``, ``RssAnon``) of ``/proc/PID/status`` in MiB.

    Raises:
        OSError: no such process (or not Linux).
        KeyError: the file has no such line.
    """
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024  # kB
    raise KeyError(key)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tp", type=int, default=3)
    ap.add_argument("--model", default=None, help="a model (default: houchu's default)")
    ap.add_argument("--quantization", default="auto")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--kv-cache-mb", type=float, default=16, help="each rank's KV pool")
    args = ap.parse_args()
    if args.model is None:
        from houchu.model.fetch import default_model_path

        args.model = str(default_model_path())
    with tempfile.TemporaryDirectory() as tmp:
        if args.model == "random":  # made in a child: transformers' model is not rank 0's
            args.model = str(Path(tmp) / "m")
            subprocess.run([sys.executable, "-c", _MAKE_RANDOM, args.model], check=True)
        report(args)


_MAKE_RANDOM = """
import sys
from houchu.devtools.bench.tensor_parallel import SHAPE
from houchu.devtools.tiny_models import make_tiny_model
make_tiny_model(sys.argv[1], "llama", **SHAPE)
"""


def report(args: argparse.Namespace) -> None:
    """Load the runner of ``args`` and print each rank's memory."""
    os.environ.setdefault("HOUCHU_TP_OVERSUBSCRIBE", "1")  # the ranks share the cores
    options = RunnerOptions(
        device="cpu",
        dtype=args.dtype,
        quantization=args.quantization,
        compile="off",
        threads=1,
        kv_cache_mb=args.kv_cache_mb,
        tensor_parallel_size=args.tp,
    )
    base, base_anon = status_mib("self", "VmRSS"), status_mib("self", "RssAnon")
    runner = ModelRunner(args.model, options, quiet=True)
    try:
        pids = ["self"] + [str(p.pid) for p in getattr(runner.tp, "procs", [])]
        print(
            f"model: {args.model} ({args.quantization}, {args.dtype}), tp {args.tp}, "
            f"KV pool {args.kv_cache_mb:g} MiB per rank"
        )
        print(f"rank 0 before the runner: RSS {base:,.0f} MiB, private {base_anon:,.0f} MiB")
        print("| rank | peak RSS (VmHWM) | RSS after load (VmRSS) | of it private (RssAnon) |")
        print("|---|---|---|---|")
        for rank, pid in enumerate(pids):
            hwm, rss = status_mib(pid, "VmHWM"), status_mib(pid, "VmRSS")
            anon = status_mib(pid, "RssAnon")
            print(f"| {rank} | {hwm:,.0f} MiB | {rss:,.0f} MiB | {anon:,.0f} MiB |")
    finally:
        runner.close()


if __name__ == "__main__":
    main()
