"""Speculative decoding benchmark: decode speed and acceptance, speculation off vs n-gram
vs a draft model, on prompts whose output repeats their input and on open chat, at one
and at several concurrent streams — all measured in one run.

One server per mode is started here, all of them before measuring; then for every
workload and batch size ``B`` the modes take turns, ``--repeats`` rounds, each sending
``B`` concurrent greedy requests (``--max-tokens`` each, EOS ignored) and reading the
server's speculation counters before and after; the median round is reported. Taking
turns keeps a machine whose load drifts from favouring one mode. Modes:

- ``off``: no speculation;
- ``ngram`` / ``draft``: adaptive (k from acceptance and measured step costs; off above
  the measured break-even batch size);
- ``ngram-forced`` / ``draft-forced``: speculate at every batch size
  (``--speculative-max-batch 1024``), to show where it stops paying.

The draft model defaults to the target itself (every proposal accepted: it measures the
verification path and the draft's cost, not a speed-up). Run::

    python -m houchu.bench.served.speculation [--model PATH] [--draft-model PATH]
        [--modes off,ngram,ngram-forced,draft-forced] [--batch-sizes 1,4,16]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from pathlib import Path

import aiohttp

from houchu.bench.servers import running_server

CODE = '''def moving_average(values, window):
    """Average of each run of `window` consecutive values."""
    total = sum(values[:window])
    result = [total / window]
    for i in range(window, len(values)):
        total += values[i] - values[i - window]
        result.append(total / window)
    return result
'''
ARTICLE = (
    "The city council voted on Tuesday to expand the bicycle lane network by forty "
    "kilometres over the next three years. The plan connects the northern suburbs to the "
    "river district and adds secure parking at six train stations. Council members said "
    "the expansion would cost twelve million euros, paid partly by a regional transport "
    "grant. Local shop owners asked for loading zones to stay open during deliveries."
)
REPEAT_PROMPTS = [
    "Rewrite the function below, renaming the variable `total` to `acc` and changing "
    f"nothing else.\n\n```python\n{CODE}```\n\nRewritten:\n```python\n",
    f"Article: {ARTICLE}\n\nSummarize the article, reusing its own sentences.\nSummary:",
    "Add type hints to this function and change nothing else.\n\n```python\n"
    f"{CODE}```\n\nWith type hints:\n```python\n",
    f"Article: {ARTICLE}\n\nList the article's facts, one per line, in its own words.\n-",
]
CHAT_PROMPTS = [
    "What should I pack for a three-day hiking trip?",
    "Explain how a refrigerator keeps food cold.",
    "Write a short poem about the first snow of winter.",
    "Why do cats purr? Give a few possible reasons.",
]
MODES = {
    "off": [],
    "ngram": ["--speculative", "ngram"],
    "ngram-forced": ["--speculative", "ngram", "--speculative-max-batch", "1024"],
    "draft": ["--draft-model", "{draft}"],
    "draft-forced": ["--draft-model", "{draft}", "--speculative-max-batch", "1024"],
}
COUNTERS = ("spec_proposed_tokens", "spec_accepted_tokens", "spec_verify_steps", "num_steps")


def payloads(workload: str, n: int, max_tokens: int) -> list[dict]:
    """``n`` greedy requests of ``workload`` ("repeat" or "chat"), prompts cycling."""
    base = {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    if workload == "repeat":
        return [{"prompt": REPEAT_PROMPTS[i % len(REPEAT_PROMPTS)], **base} for i in range(n)]
    chats = [[{"role": "user", "content": q}] for q in CHAT_PROMPTS]
    return [{"messages": chats[i % len(chats)], **base} for i in range(n)]


async def _stream(ws_url: str, body: dict) -> tuple[float, float, int]:
    """One request; returns (first token time, end time, completion tokens), seconds on
    ``time.perf_counter``."""
    async with aiohttp.ClientSession() as s, s.ws_connect(ws_url, max_msg_size=0) as ws:
        await ws.send_json({"id": "x", **body})
        first = None
        while True:
            f = await ws.receive_json(timeout=1800)
            if f["type"] == "error":
                raise RuntimeError(f["error"])
            if f["type"] == "delta" and first is None:
                first = time.perf_counter()
            if f["type"] == "final":
                end = time.perf_counter()
                return first or end, end, f["usage"]["completion_tokens"]


async def _stats(http_url: str) -> dict:
    async with aiohttp.ClientSession() as s, s.get(f"{http_url}/stats") as r:
        return await r.json()


async def run_batch(ws_url: str, bodies: list[dict]) -> dict[str, float]:
    """Send ``bodies`` at once; decode speed and the speculation counters' deltas."""
    http_url = ws_url.replace("ws://", "http://").removesuffix("/ws")
    before = await _stats(http_url)
    t0 = time.perf_counter()
    res = await asyncio.gather(*(_stream(ws_url, b) for b in bodies))
    wall = time.perf_counter() - t0
    after = await _stats(http_url)
    d = {k: after.get(k, 0) - before.get(k, 0) for k in COUNTERS}
    tokens = sum(n for _, _, n in res)
    per_stream = [(n - 1) / max(end - first, 1e-9) for first, end, n in res]
    emitted = after.get("spec_mean_acceptance_length", 0) * after.get("spec_verify_steps", 0)
    emitted -= before.get("spec_mean_acceptance_length", 0) * before.get("spec_verify_steps", 0)
    return {
        "stream_tok_s": sum(per_stream) / len(per_stream),
        "total_tok_s": tokens / wall,
        "proposed": d["spec_proposed_tokens"],
        "acceptance": d["spec_accepted_tokens"] / max(d["spec_proposed_tokens"], 1),
        "mean_len": emitted / d["spec_verify_steps"] if d["spec_verify_steps"] else 1.0,
        "verify_share": d["spec_verify_steps"] / max(d["num_steps"], 1),
        "break_even": after.get("spec_break_even_batch", 0),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path)
    ap.add_argument("--draft-model", type=Path, help="default: the model itself")
    ap.add_argument("--modes", default="off,ngram,ngram-forced,draft-forced")
    ap.add_argument("--batch-sizes", default="1,4,16")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--workloads", default="repeat,chat")
    ap.add_argument("--repeats", type=int, default=3, help="rounds per measurement (median)")
    ap.add_argument("--server-flags", default="", help="extra `houchu serve` flags (use =)")
    args = ap.parse_args()
    from houchu.model.fetch import fetch_default_model

    model = args.model or fetch_default_model()
    draft = str(args.draft_model or model)
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        ap.error(f"unknown modes {unknown}; choose from {list(MODES)}")
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    workloads = [w for w in args.workloads.split(",") if w]
    results: dict[tuple[str, int, str], dict[str, float]] = {}
    with contextlib.ExitStack() as stack:
        urls = {}
        for mode in modes:
            flags = [f.replace("{draft}", draft) for f in MODES[mode]] + args.server_flags.split()
            flags += ["--max-running-requests", str(max(sizes)), "--kv-cache-mb", "256"]
            urls[mode] = stack.enter_context(running_server(model, *flags))
            asyncio.run(run_batch(urls[mode], payloads("chat", 1, 8)))  # warm-up
            print(f"  {mode}: serving", flush=True)
        for w in workloads:
            for b in sizes:
                rounds: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
                for _ in range(args.repeats):
                    for mode in modes:
                        r = asyncio.run(run_batch(urls[mode], payloads(w, b, args.max_tokens)))
                        rounds[mode].append(r)
                for mode in modes:
                    runs = sorted(rounds[mode], key=lambda r: r["stream_tok_s"])
                    r = results[(w, b, mode)] = runs[len(runs) // 2]
                    print(
                        f"  {mode:<13} {w:<7} batch {b:>3}: {r['stream_tok_s']:7.2f} tok/s "
                        f"per stream, acceptance {r['acceptance']:.2f}",
                        flush=True,
                    )
    print(
        f"\nGreedy decode, {args.max_tokens} tokens per request, median of {args.repeats} "
        f"rounds; draft model: {draft}"
    )
    head = (
        "workload",
        "batch",
        "mode",
        "tok/s/stream",
        "tok/s total",
        "vs off",
        "accept",
        "mean len",
        "verify steps",
        "break-even",
    )
    print("{:<8}{:>6}  {:<14}{:>13}{:>12}{:>8}{:>8}{:>10}{:>14}{:>12}".format(*head))
    order = sorted(results, key=lambda k: (workloads.index(k[0]), k[1], modes.index(k[2])))
    for w, b, mode in order:
        r = results[(w, b, mode)]
        off = results.get((w, b, "off"))
        ratio = f"{r['stream_tok_s'] / off['stream_tok_s']:.2f}x" if off else "-"
        accept = f"{r['acceptance']:.2f}" if r["proposed"] else "-"
        print(
            f"{w:<8}{b:>6}  {mode:<14}{r['stream_tok_s']:>13.2f}{r['total_tok_s']:>12.2f}"
            f"{ratio:>8}{accept:>8}{r['mean_len']:>10.2f}"
            f"{r['verify_share']:>13.0%}{int(r['break_even']):>12}"
        )


if __name__ == "__main__":
    main()
