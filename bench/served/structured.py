"""Structured-output benchmark: ``houchu bench`` with and without ``--structured
json-schema`` at each concurrency, side by side, against one running server.

The runs alternate (without, with, without, with, ...) so that a machine whose load
changes during the benchmark weighs on both sides alike; each side's figure is the
median over its runs, and the ratio is with / without (output tokens/s: 1.00 means no
cost; the issue's goal is at least 0.90 at 16 streams). The server's own ledger counts
the mask time (``structured_output_mask``: saved = hidden behind the forward pass,
spent = the sampler's wait).

Run (with ``houchu serve`` up)::

    python -m houchu.bench.served.structured --url ws://127.0.0.1:8000/ws \\
        --concurrency 1 16 --reps 3 --input-len 32 --output-len 48

``--runner`` measures the model runner alone, in this process (no server, no sockets,
no gateway, tokenizer or scheduler processes beside it): decode steps of ``B``
sequences at temperature 1.0, free or every one under the same JSON schema, the sampled
tokens fed back, the blocks of steps alternating as above. Its figures are the fastest
and the median step per side (the fastest is the one a busy machine disturbs least),
the median CPU time of a step (every thread of the process: the forward pass, the
sampler and the grammar worker) and tokens/s = B / median step; the ratios are free /
with (throughput with over throughput without, 1.00: no cost)::

    python -m houchu.bench.served.structured --runner --concurrency 1 16 --reps 3

``--masks`` times the parts of one step's masks alone (the fastest of many runs):
llguidance's mask per row, unpacking the bitmasks, applying them in the sampler::

    python -m houchu.bench.served.structured --masks --concurrency 1 16 --output-len 200
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
from typing import Any

#: Step ids of ``--runner``'s plans.
_STEP = itertools.count(1)

#: The metrics printed per side: (results key, label, higher is better).
STRUCTURED_METRICS = (
    ("output_throughput", "output tokens/s", True),
    ("median_tpot_ms", "median TPOT (ms)", False),
    ("median_ttft_ms", "median TTFT (ms)", False),
)


def bench_args(opts: argparse.Namespace, concurrency: int, structured: str) -> list[str]:
    """The ``houchu bench`` command line of one run."""
    n = max(opts.num_requests, concurrency)
    return [
        "bench",
        "--url",
        opts.url,
        "--workload",
        "random",
        "--num-requests",
        str(n),
        "--concurrency",
        str(concurrency),
        "--input-len",
        str(opts.input_len),
        "--output-len",
        str(opts.output_len),
        "--temperature",
        str(opts.temperature),
        "--structured",
        structured,
        "--no-db",
        "--no-progress",
    ]


def run_once(argv: list[str]) -> dict[str, Any]:
    """One ``houchu bench`` run in this process; its ``results``."""
    from houchu.bench.cli import add_bench_parser, bench_spec, make_backend
    from houchu.bench.core import benchmark
    from houchu.bench.prompts import PromptBuilder, load_encoder

    parser = argparse.ArgumentParser(prog="houchu")  # the houchu command's bench parser
    add_bench_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    spec = bench_spec(args, args.model)
    builder = PromptBuilder(load_encoder(args.tokenizer))
    record = asyncio.run(benchmark(make_backend(args, spec.params), spec, builder, "structured"))
    return record["results"]


def table(runs: dict[tuple[int, str], list[dict[str, Any]]], levels: list[int]) -> str:
    """Medians per side and the with / without ratio, one block per concurrency."""
    lines = [f"{'metric':<22}{'conc':>6}{'without':>12}{'with':>12}{'with/without':>14}"]
    lines.append("-" * len(lines[0]))
    for c in levels:
        for key, label, _ in STRUCTURED_METRICS:
            a = statistics.median(r[key] for r in runs[(c, "none")])
            b = statistics.median(r[key] for r in runs[(c, "json-schema")])
            ratio = f"{b / a:.3f}" if a else "-"
            lines.append(f"{label:<22}{c:>6}{a:>12.2f}{b:>12.2f}{ratio:>14}")
        fails = sum(r["failed"] for side in ("none", "json-schema") for r in runs[(c, side)])
        lines.append(f"{'failed requests':<22}{c:>6}{fails:>12}")
    return "\n".join(lines)


def runner_steps(
    runner: Any, batch: int, steps: int, structured: Any, tag: str, input_len: int
) -> list[tuple[float, float]]:
    """Wall and CPU seconds (every thread of this process) of each decode step of ``batch`` sequences of an ``input_len``-token
    prompt (prefilled first, not timed), every sequence under ``structured`` (a
    ``StructuredOutput``) or free (None); sampled tokens are fed back."""
    import time

    from houchu.transport.messages import SamplingParams, SeqInit, SeqWork, StepPlan

    ps = runner.pool.page_size
    pages = -(-(input_len + steps + 1) // ps)
    rids = [f"{tag}-{i}" for i in range(batch)]
    tables = {rid: list(range(i * pages, (i + 1) * pages)) for i, rid in enumerate(rids)}
    prompt = [(7 * i) % 1000 + 10 for i in range(input_len)]
    init = [
        SeqInit(
            rid=x,
            sampling=SamplingParams(temperature=1.0, seed=i, structured=structured),
            prompt_ids=prompt,
        )
        for i, x in enumerate(rids)
    ]
    work = [
        SeqWork(rid=x, token_ids=prompt, start_pos=0, page_table=tables[x], sample=True)
        for x in rids
    ]
    res = runner.execute(StepPlan(step_id=next(_STEP), init=init, work=work))
    last = {o.rid: o.token_id for o in res.outputs}
    times: list[tuple[float, float]] = []  # (wall, process CPU) seconds per step
    for s in range(steps):
        work = [
            SeqWork(
                rid=x,
                token_ids=[last[x]],
                start_pos=input_len + s,
                page_table=tables[x],
                sample=True,
            )
            for x in rids
        ]
        t0, c0 = time.perf_counter(), time.process_time()
        res = runner.execute(StepPlan(step_id=next(_STEP), work=work))
        times.append((time.perf_counter() - t0, time.process_time() - c0))
        last.update({o.rid: o.token_id for o in res.outputs})
    runner.execute(StepPlan(step_id=next(_STEP), work=[], release=rids))
    return times


def runner_main(opts: argparse.Namespace) -> None:
    """``--runner``: decode steps with and without a JSON schema, alternating."""
    from houchu.api.structured.request import json_schema_grammar
    from houchu.bench.cli import BENCH_SCHEMA
    from houchu.model.fetch import fetch_default_model
    from houchu.options.runner_options import RunnerOptions
    from houchu.runner.model_runner import ModelRunner
    from houchu.transport.structured import StructuredOutput

    model = opts.model or str(fetch_default_model())
    top = max(opts.concurrency)
    pages = top * -(-(opts.input_len + opts.output_len + 2) // 16) + 16
    options = RunnerOptions(
        device="cpu",
        page_size=16,
        num_pages=pages,
        threads=opts.threads,
        fixed_threads=True,  # both sides on the same threads
        compile="off",  # a served CPU runner decodes eagerly (start-up measures it)
        decode_paths="rules",
        jump_forward="off",  # one sampled token per step: the mask's cost per step
    )
    runner = ModelRunner(model, options, quiet=True)
    schema = StructuredOutput(kind="json_schema", grammar=json_schema_grammar(BENCH_SCHEMA))
    print(f"runner ready: {runner.levers.summary()}", flush=True)
    runner_steps(runner, 1, 4, schema, "warm", opts.input_len)  # the grammar tokenizer
    lines = [
        f"{'batch':>6}{'side':>13}{'fastest ms':>12}{'median ms':>11}{'CPU ms':>8}"
        f"{'tokens/s':>10}{'ratio':>7}{'CPU ratio':>11}"
    ]
    for b in opts.concurrency:
        times: dict[str, list[tuple[float, float]]] = {"free": [], "json-schema": []}
        for rep in range(opts.reps):
            for side in times:
                spec = schema if side == "json-schema" else None
                tag = f"b{b}-{side}-{rep}"
                times[side] += runner_steps(runner, b, opts.output_len, spec, tag, opts.input_len)
        base = statistics.median(w for w, _ in times["free"])
        base_cpu = statistics.median(c for _, c in times["free"])
        for side, ts in times.items():
            wall = statistics.median(w for w, _ in ts)
            cpu = statistics.median(c for _, c in ts)
            lines.append(
                f"{b:>6}{side:>13}{min(w for w, _ in ts) * 1e3:>12.2f}{wall * 1e3:>11.2f}"
                f"{cpu * 1e3:>8.2f}{b / wall:>10.1f}{base / wall:>7.3f}{base_cpu / cpu:>11.3f}"
            )
    mask = runner.grammar.samples()
    hidden = sum(x.saved for x in mask)
    waited = sum(x.spent for x in mask)
    print("\n".join(lines))
    print(
        f"mask time (ledger): {hidden:.3f} s hidden behind the forward pass, {waited:.3f} s waited"
    )


def masks_main(opts: argparse.Namespace) -> None:
    """``--masks``: the fastest of ``--reps`` x 50 runs of each part of one step's
    masks at each batch size: a llguidance mask per row (BENCH_SCHEMA, along a random
    walk through it), unpacking ``[B, ceil(V / 32)]`` bitmasks and applying them to
    ``[B, V]`` logits (every row constrained)."""
    import random
    import time

    import torch

    from houchu.api.structured.request import json_schema_grammar
    from houchu.bench.cli import BENCH_SCHEMA
    from houchu.model.fetch import fetch_default_model
    from houchu.model.grammar.matcher import GrammarEngine, bitmask_to_allowed, bitmask_words
    from houchu.model.sampling.sampler import apply_grammar_masks
    from houchu.transport.structured import StructuredOutput

    if opts.threads:
        torch.set_num_threads(opts.threads)
    v = 49152
    engine = GrammarEngine(opts.model or str(fetch_default_model()), v)
    spec = StructuredOutput(kind="json_schema", grammar=json_schema_grammar(BENCH_SCHEMA))
    engine.compile("warm", spec)  # loads the tokenizer
    t0 = time.perf_counter()
    g, rng, fills = engine.compile("m", spec), random.Random(0), []
    print(f"llguidance compile (tokenizer loaded): {(time.perf_counter() - t0) * 1e3:.2f} ms")
    one = torch.full((1, bitmask_words(v)), -1, dtype=torch.int32)  # [1, W]
    for _ in range(opts.output_len):
        t0 = time.perf_counter()
        g.fill(one, 0, [])
        fills.append(time.perf_counter() - t0)
        allowed = bitmask_to_allowed(one, v)[0].nonzero().flatten().tolist()
        g.commit([rng.choice(allowed)])
        if g.matcher.is_stopped():
            break
    print(
        f"llguidance mask per row: median {statistics.median(fills) * 1e3:.3f} ms, "
        f"mean {statistics.mean(fills) * 1e3:.3f} ms over {len(fills)} tokens"
    )

    def fastest(f: Any) -> float:
        best = float("inf")
        for _ in range(opts.reps * 50):
            t0 = time.perf_counter()
            f()
            best = min(best, time.perf_counter() - t0)
        return best * 1e3

    for b in opts.concurrency:
        gen = torch.Generator().manual_seed(b)
        bm = torch.randint(-(2**31), 2**31 - 1, (b, bitmask_words(v)), generator=gen)
        bm = bm.to(torch.int32)  # [B, W]
        logits = torch.randn(b, v, generator=gen)  # [B, V] float32
        allowed = bitmask_to_allowed(bm, v)  # [B, V] bool
        rows = [allowed[i] for i in range(b)]
        unpack = fastest(lambda bm=bm: bitmask_to_allowed(bm, v))
        apply = fastest(lambda logits=logits, rows=rows: apply_grammar_masks(logits, rows))
        print(f"batch {b:>3}: unpack {unpack:.3f} ms, apply {apply:.3f} ms (fastest)")


def main() -> None:
    """Command line: see the module docstring."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="ws://127.0.0.1:8000/ws")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    p.add_argument("--reps", type=int, default=2, help="runs per side and concurrency")
    p.add_argument("--num-requests", type=int, default=4, help="at least the concurrency")
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=48)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--runner", action="store_true", help="the model runner alone, in-process")
    p.add_argument("--model", default=None, help="--runner: .gguf or folder (default model)")
    p.add_argument("--threads", type=int, default=None, help="--runner, --masks: torch threads")
    p.add_argument("--masks", action="store_true", help="time the mask pipeline's parts")
    opts = p.parse_args()
    if opts.masks:
        masks_main(opts)
        return
    if opts.runner:
        runner_main(opts)
        return
    runs: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for c in opts.concurrency:
        for rep in range(opts.reps):
            for side in ("none", "json-schema"):
                res = run_once(bench_args(opts, c, side))
                runs.setdefault((c, side), []).append(res)
                print(
                    f"run {rep + 1}/{opts.reps} concurrency {c} structured {side}: "
                    f"{res['output_throughput']:.2f} output tokens/s, "
                    f"median TPOT {res['median_tpot_ms']:.1f} ms",
                    flush=True,
                )
    print(table(runs, opts.concurrency))


if __name__ == "__main__":
    main()
