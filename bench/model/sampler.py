"""Sampler benchmark: the top-p filter and the draw of one token per row, on the default
model's real next-token distributions, houchu's against the textbook forms.

    python -m houchu.bench.model.sampler [--batches 1,8,32] [--temperatures 0.7,1.0]
        [--top-p 0.9,0.95] [--reps 5]

The rows are the exact model's log-probabilities at the positions of a fixed English
text (``bench/data/quality_en.txt``, or a built-in sentence where the tests are not
installed), divided by the temperature. Per batch size, temperature and ``top_p`` it
prints the milliseconds per step (the fastest of ``--reps``) of:

- ``apply_top_p`` (candidates first, ``houchu.model.sampling.warpers``) against a full
  stable sort of every row (its reference), and the nucleus size (median tokens kept);
- ``draw_rows`` (inversion) against one ``torch.multinomial`` per row.

Printed, not asserted; the CPU's ISA flags head the table.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from houchu.bench.texts import QUALITY_EN
from houchu.cpu import isa as cpu_isa
from houchu.model.fetch import fetch_default_model
from houchu.model.quant.quality import text_logprobs
from houchu.model.sampling.warpers import _top_p_drop_sorted, apply_top_p, draw_rows
from houchu.model.weights.loader import load_model
from houchu.text.tokenizer.core import load_tokenizer

_TEXT = QUALITY_EN
_FALLBACK = "The kitchen was quiet before the lunch rush, and the cooks " * 40


def _best_ms(fn, reps: int) -> float:  # noqa: ANN001 (a zero-argument callable)
    """Fastest of ``reps`` calls of ``fn`` after one untimed call, in milliseconds."""
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def real_rows(max_rows: int = 512) -> torch.Tensor:
    """``[N, V]`` float32 log-probabilities of the default model at the positions of a
    fixed English text (N <= ``max_rows``)."""
    path = fetch_default_model(quiet=True)
    text = _TEXT.read_text() if _TEXT.exists() else _FALLBACK
    ids = load_tokenizer(path).encode(text)[: max_rows + 1]
    model = load_model(path, torch.float32)
    with torch.inference_mode():
        return text_logprobs(model, ids, chunk=64)[:-1]


def main(argv: list[str] | None = None) -> None:
    """Print the table (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--temperatures", default="0.7,1.0")
    ap.add_argument("--top-p", default="0.9,0.95")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    rows = real_rows(max(batches) * 4)
    flags = " ".join(sorted(cpu_isa.isa_flags()))
    print(f"CPU flags: {flags}; {torch.get_num_threads()} threads; rows {tuple(rows.shape)}")
    head = "| batch | temp | top_p | nucleus | top-p ms | full sort ms | draw ms | multinomial ms |"
    print(head + "\n|" + "---|" * 8)
    gen = torch.Generator().manual_seed(0)
    for b in batches:
        for t in (float(x) for x in args.temperatures.split(",")):
            for p in (float(x) for x in args.top_p.split(",")):
                x = (rows[:b] / t).contiguous()  # [b, V]
                pp = torch.full((b,), p)
                kept = apply_top_p(x, pp)
                nucleus = statistics.median(int(n) for n in torch.isfinite(kept).sum(-1))
                fast = _best_ms(lambda x=x, pp=pp: apply_top_p(x, pp), args.reps)
                full = _best_ms(lambda x=x, pp=pp: _top_p_drop_sorted(x, pp), args.reps)
                probs = kept.softmax(-1)
                draw = _best_ms(lambda q=probs: draw_rows(q, [None] * len(q), gen), args.reps)
                multi = _best_ms(
                    lambda q=probs: [torch.multinomial(r, 1, generator=gen) for r in q],
                    args.reps,
                )
                print(
                    f"| {b} | {t} | {p} | {nucleus} | {fast:.2f} | {full:.2f} | {draw:.2f} "
                    f"| {multi:.2f} |"
                )


if __name__ == "__main__":
    main()
