"""MTP benchmark: decode speed with and without ``--speculative mtp`` on a tiny DeepSeek-V3
with one next-token-prediction module, and the acceptance length, printed (not asserted).

Two checkpoints are written here (``houchu.devtools.tiny_models``): ``random``, the tiny random
model with a random MTP module (``add_mtp_layer``: its proposals are almost never the
target's, so it shows what the MTP passes cost), and ``exact``, the same model made a
bigram model whose MTP module predicts the target's own next token (``make_mtp_exact``:
every proposal is accepted, so it shows the most MTP can save at that size). Each is
served without speculation and with ``--speculative mtp`` (speculating at every batch
size: ``--speculative-max-batch 1024``); for each batch size the modes take turns,
``--repeats`` rounds of ``B`` concurrent greedy requests, and the median round is
reported (``houchu.bench.served.speculation.run_batch``). Run::

    python -m houchu.devtools.bench.mtp [--batch-sizes 1,4] [--max-tokens 64] [--k 2]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
from pathlib import Path

from houchu.bench.served.speculation import run_batch
from houchu.bench.servers import running_server

#: The tiny DeepSeek-V3 (``houchu.devtools.tiny_models.TINY_MLA``: MLA, DeepSeekMoE), two layers
CONFIG = {
    "num_hidden_layers": 2,
    "n_group": 2,
    "topk_group": 1,
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
}
SERVE = ("--quantization", "none", "--compile", "off", "--kv-cache-mb", "64")


def payloads(n: int, max_tokens: int, prompt_len: int = 32) -> list[dict]:
    """``n`` greedy requests of ``prompt_len`` token ids each (drawn per request, seeded;
    the tiny model's context is 512 tokens), EOS ignored."""
    import random

    base = {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    rngs = [random.Random(i) for i in range(n)]
    return [{"prompt": [r.randrange(3, 128) for _ in range(prompt_len)], **base} for r in rngs]


def write_models(root: Path) -> dict[str, Path]:
    """The ``random`` and ``exact`` checkpoints (see the module docstring) under ``root``."""
    from houchu.devtools.tiny_models import (
        TINY_MLA,
        add_mtp_layer,
        make_mtp_exact,
        make_tiny_model,
        write_tiny_tokenizer,
    )

    cfg = {**TINY_MLA, **CONFIG}
    path = make_tiny_model(root / "random", "deepseek_v3", seed=5, **cfg)
    add_mtp_layer(path, 5, **cfg)
    write_tiny_tokenizer(path, 128)
    return {"random": path, "exact": make_mtp_exact(path, root / "exact")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch-sizes", default="1,4")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=2, help="--num-speculative-tokens")
    ap.add_argument("--repeats", type=int, default=3, help="rounds per measurement (median)")
    ap.add_argument("--server-flags", default="", help="extra `houchu serve` flags (use =)")
    args = ap.parse_args()
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    mtp = ["--speculative", "mtp", "--num-speculative-tokens", str(args.k)]
    modes = {"off": [], "mtp": [*mtp, "--speculative-max-batch", "1024"]}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in write_models(Path(tmp)).items():
            with contextlib.ExitStack() as stack:
                urls = {}
                for mode, flags in modes.items():
                    extra = [*SERVE, *flags, *args.server_flags.split()]
                    extra += ["--max-running-requests", str(max(sizes))]
                    urls[mode] = stack.enter_context(running_server(path, *extra))
                    asyncio.run(run_batch(urls[mode], payloads(1, 8)))  # warm-up
                for b in sizes:
                    rounds: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
                    for _ in range(args.repeats):
                        for mode in modes:
                            body = payloads(b, args.max_tokens)
                            rounds[mode].append(asyncio.run(run_batch(urls[mode], body)))
                    for mode in modes:
                        runs = sorted(rounds[mode], key=lambda r: r["stream_tok_s"])
                        rows.append((name, b, mode, runs[len(runs) // 2]))
                        r = rows[-1][3]
                        print(
                            f"  {name:<7} {mode:<4} batch {b:>3}: {r['stream_tok_s']:8.1f} "
                            f"tok/s per stream, mean length {r['mean_len']:.2f}",
                            flush=True,
                        )
    print(
        f"\nTiny DeepSeek-V3 with an MTP module, greedy, {args.max_tokens} tokens per "
        f"request, k = {args.k}, median of {args.repeats} rounds"
    )
    head = ("mtp module", "batch", "mode", "tok/s/stream", "tok/s total", "vs off")
    print("{:<11}{:>6}  {:<6}{:>13}{:>12}{:>8}".format(*head), end="")
    print("{:>9}{:>10}{:>14}".format("accept", "mean len", "verify steps"))
    base = {(n, b): r for n, b, m, r in rows if m == "off"}
    for name, b, mode, r in rows:
        ratio = r["stream_tok_s"] / base[(name, b)]["stream_tok_s"]
        accept = f"{r['acceptance']:.2f}" if r["proposed"] else "-"
        print(
            f"{name:<11}{b:>6}  {mode:<6}{r['stream_tok_s']:>13.1f}{r['total_tok_s']:>12.1f}"
            f"{ratio:>7.2f}x{accept:>9}{r['mean_len']:>10.2f}{r['verify_share']:>14.0%}"
        )


if __name__ == "__main__":
    main()
