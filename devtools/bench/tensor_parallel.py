"""Tensor-parallel benchmark: step times at tp = N (gloo, N ranks of ``--threads``
threads each) against tp = 1 (one runner of ``N × --threads`` threads: the same cores),
and the collectives' share of each tp = N step.

    python -m houchu.devtools.bench.tensor_parallel [--tp 2] [--threads 1] [--model PATH]
        [--batches 1,8] [--context 64] [--prefill 128] [--steps 5]

Without ``--model``, a random Llama (hidden 768, 12 heads, 4 KV heads, MLP 2048, 12
layers, vocabulary 32,000: GPT-2-small-sized) in float32 on the exact path. Prints, per
step kind (a prefill of ``--prefill`` tokens; decode steps of each batch size at
``--context`` cached tokens): the median step time at tp 1 and at tp N, the speed-up,
and at tp N the seconds per step inside the collectives (the all-reduces and the
logits' all-gather, waiting for the slowest rank included) and their share of the step;
with the CPU flags and the load average before and after (on a shared machine, other
processes' load skews both columns). Printed, not asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from houchu.devtools.tiny_models import make_tiny_model
from houchu.options.runner_options import RunnerOptions
from houchu.runner.model_runner import ModelRunner
from houchu.transport.messages import SamplingParams, SeqInit, SeqWork, StepPlan, StepResult

SHAPE = {
    "vocab_size": 32000,
    "hidden_size": 768,
    "intermediate_size": 2048,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
}
GREEDY_4096 = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=4096)


class Steps:
    """Plans for one runner: fresh requests on their own pages, then decode steps."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner, self.step_id, self.next_page, self.n = runner, 0, 0, 0
        self.page = runner.pool.page_size

    def _pages(self, tokens: int) -> list[int]:
        n = -(-tokens // self.page)
        pages = list(range(self.next_page, self.next_page + n))
        self.next_page += n
        return pages

    def run(self, plan: StepPlan) -> StepResult:
        self.step_id += 1
        res = self.runner.execute(plan)
        assert res.error is None, res.error
        return res

    def prefill(self, prompt_len: int, extra: int = 0) -> tuple[str, list[int], int]:
        """A new request whose prompt of ``prompt_len`` tokens is computed in one step
        (pages for ``extra`` more); ``(rid, pages, next token)``, and the step's result
        in ``self.last``."""
        self.n += 1
        rid, ids = f"r{self.n}", [(7 * i + self.n) % 1000 + 3 for i in range(prompt_len)]
        pages = self._pages(prompt_len + extra)
        init = SeqInit(rid=rid, sampling=GREEDY_4096, prompt_ids=ids)
        w = SeqWork(rid=rid, token_ids=ids, start_pos=0, page_table=pages, sample=True)
        self.last = self.run(StepPlan(step_id=self.step_id, init=[init], work=[w]))
        return rid, pages, self.last.outputs[0].token_id


def measure(runner: ModelRunner, args: argparse.Namespace) -> dict[str, tuple[float, float]]:
    """``{step kind: (median seconds, median collective seconds)}``."""
    s, out = Steps(runner), {}
    prefills = []
    for _ in range(args.steps):
        rid, _, _ = s.prefill(args.prefill)
        prefills.append(s.last)
        s.run(StepPlan(step_id=s.step_id, work=[], release=[rid]))
    out[f"prefill {args.prefill}"] = _medians(prefills)
    for b in args.batches:
        seqs = [s.prefill(args.context, extra=args.steps + 1) for _ in range(b)]
        toks = [t for _, _, t in seqs]
        results = []
        for i in range(args.steps):
            work = [
                SeqWork(
                    rid=rid,
                    token_ids=[toks[j]],
                    start_pos=args.context + i,
                    page_table=pages,
                    sample=True,
                )
                for j, (rid, pages, _) in enumerate(seqs)
            ]
            results.append(s.run(StepPlan(step_id=s.step_id, work=work)))
            toks = [o.token_id for o in results[-1].outputs]
        out[f"decode b={b}"] = _medians(results)
        s.run(StepPlan(step_id=s.step_id, work=[], release=[rid for rid, _, _ in seqs]))
    return out


def _medians(results: list[StepResult]) -> tuple[float, float]:
    return (
        statistics.median(r.duration_s for r in results),
        statistics.median(r.allreduce_s for r in results),
    )


def _options(args: argparse.Namespace, tp: int, threads: int) -> RunnerOptions:
    pages = args.steps * (args.prefill // 16 + 2) + sum(args.batches) * (
        (args.context + args.steps) // 16 + 2
    )
    return RunnerOptions(
        device="cpu",
        quantization=args.quantization,
        compile="off",
        decode_paths="rules",
        threads=threads,
        fixed_threads=True,
        disable_fused_layers=True,
        num_pages=pages + 8,
        tensor_parallel_size=tp,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="threads per rank")
    ap.add_argument("--model", default=None, help="a model (default: a random Llama)")
    ap.add_argument("--quantization", default="none")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--prefill", type=int, default=128)
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(make_tiny_model(Path(tmp) / "m", "llama", **SHAPE))
        base = ModelRunner(model, _options(args, 1, args.tp * args.threads), quiet=True)
        one = measure(base, args)
        del base
        tp = ModelRunner(model, _options(args, args.tp, args.threads), quiet=True)
        try:
            many = measure(tp, args)
        finally:
            tp.close()
    flags = sorted(
        {
            f
            for line in open("/proc/cpuinfo")
            if line.startswith("flags")
            for f in line.split()
            if f in ("avx2", "fma", "avx_vnni") or f.startswith("avx512")
        }
    )
    print(f"model: {args.model or 'random Llama ' + str(SHAPE)}, {args.quantization}, float32")
    print(f"cores: {len(os.sched_getaffinity(0))}, CPU flags: {' '.join(flags)}")
    load = " ".join(f"{x:.1f}" for x in load_before + os.getloadavg())
    print(f"load average (1, 5, 15 min) before, after: {load} (other processes included)")
    print(f"tp 1: {args.tp * args.threads} threads; tp {args.tp}: {args.threads} thread(s) each")
    print(f"| step | tp 1 | tp {args.tp} | speed-up | collectives per step | share |")
    print("|---|---|---|---|---|---|")
    for kind, (t1, _) in one.items():
        tn, coll = many[kind]
        print(
            f"| {kind} | {t1 * 1e3:.1f} ms | {tn * 1e3:.1f} ms | {t1 / tn:.2f}x | "
            f"{coll * 1e3:.1f} ms | {coll / tn:.0%} |"
        )


if __name__ == "__main__":
    main()
