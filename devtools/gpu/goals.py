"""The device check's numbers (``houchu.devtools.gpu_check``): what it reads off pytest, a
``houchu bench`` record and the runner benchmark's table, and issue 18's goals evaluated on
them.

Goals (the default model on the GPU):
    * 64 concurrent streams: at least 10,000 output tok/s (``houchu bench``);
    * one stream: median TPOT under 3 ms (time per output token after the first);
      either is missed where a request of its bench run failed;
    * CUDA graphs faster than eager at batch 1 (the runner benchmark's decode b=1 row,
      ms per step, in every format measured both ways).

Standard library only.
"""

from __future__ import annotations

import re
from typing import Any

GOAL_TOK_S_64 = 10_000.0  # output tok/s at 64 concurrent streams, at least
GOAL_TPOT_1_MS = 3.0  # single-stream median TPOT, ms, under

_PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")
_COLLECTED = re.compile(r"(\d+) tests? collected")
_RUNNER_ROW = re.compile(
    r"^(?P<fmt>\S+)\s+(?P<mode>\S+)\s+(?P<kernels>.+?)\s+(?P<what>decode b=\d+|prefill \d+)\s+"
    r"(?P<tok_s>[\d.]+)\s+(?P<ms>[\d.]+)\s+(?P<med_ms>[\d.]+)\s+(?P<mb>[\d.]+)\s+"
    r"(?P<gbs>[\d.]+)\s+(?P<bw_pct>[\d.]+)\s+(?P<gflops>[\d.]+)\s+(?P<peak_pct>[\d.]+|-)\s*$"
)


def pytest_counts(output: str) -> dict[str, int]:
    """Outcome -> count from pytest's closing line (``"43 passed, 7 skipped in 4.1s"``),
    or from ``--collect-only -q`` (``"12 tests collected"`` -> ``{"collected": 12}``);
    "error" and "errors" both count as ``errors``. {} when no such line."""
    for line in reversed(output.splitlines()):
        found = _PYTEST_COUNT.findall(line)
        collected = _COLLECTED.search(line)
        if collected and not found:
            return {"collected": int(collected.group(1))}
        if found and (" in " in line or line.strip().startswith("=")):
            counts: dict[str, int] = {}
            for n, what in found:
                key = "errors" if what.startswith("error") else what
                counts[key] = counts.get(key, 0) + int(n)
            return counts
    return {}


def bench_numbers(record: dict[str, Any]) -> dict[str, Any]:
    """The numbers of one ``houchu bench`` JSON record: ``output_tok_s`` (output tokens
    per second over the run), TTFT and TPOT in ms (median and mean), ``itl_p99_ms``,
    ``completed`` / ``failed`` requests and ``duration_s``."""
    r = record["results"]
    return {
        "output_tok_s": r.get("output_throughput"),
        "ttft_median_ms": r.get("median_ttft_ms"),
        "ttft_mean_ms": r.get("mean_ttft_ms"),
        "tpot_median_ms": r.get("median_tpot_ms"),
        "tpot_mean_ms": r.get("mean_tpot_ms"),
        "itl_p99_ms": r.get("p99_itl_ms"),
        "completed": r.get("completed"),
        "failed": r.get("failed"),
        "duration_s": r.get("duration_s"),
    }


def runner_rows(output: str, progress: bool = False) -> list[dict[str, Any]]:
    """The rows of the runner benchmark's final table(s) (the lines after each header
    that starts with "format"; the progress lines before it are not counted), or with
    ``progress`` every row-shaped line (the progress rows a run prints as each format and
    mode finishes: what is left of a run cut short): format, mode, kernels, what ("decode
    b=N" / "prefill N"), tok/s, ms/step (fastest), median ms, MB/step, GB/s, %BW,
    GFLOP/s and %peak (None where "-")."""
    rows: list[dict[str, Any]] = []
    in_table = progress
    for line in output.splitlines():
        if line.startswith("format ") and "tok/s" in line:
            in_table = True
            continue
        if not in_table or line.startswith("---"):
            continue
        m = _RUNNER_ROW.match(line.strip())
        if m is None:
            in_table = progress
            continue
        g = m.groupdict()
        row: dict[str, Any] = {k: g[k] for k in ("fmt", "mode", "kernels", "what")}
        for k in ("tok_s", "ms", "med_ms", "mb", "gbs", "bw_pct", "gflops"):
            row[k] = float(g[k])
        row["peak_pct"] = None if g["peak_pct"] == "-" else float(g["peak_pct"])
        rows.append(row)
    return rows


def _goal(name: str, target: str, value: Any, met: bool | None, note: str = "") -> dict:
    status = "not measured" if met is None else ("met" if met else "missed")
    return {"goal": name, "target": target, "value": value, "status": status, "note": note}


def graphs_vs_eager(rows: list[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """Format -> (eager ms, graph ms) of the decode b=1 rows measured both ways."""
    at1 = {(r["fmt"], r["mode"]): r["ms"] for r in rows if r["what"] == "decode b=1"}
    return {
        fmt: (at1[(fmt, "eager")], at1[(fmt, "graph")])
        for fmt, mode in at1
        if mode == "eager" and (fmt, "graph") in at1
    }


def _all_done(numbers: dict[str, Any]) -> bool:
    """Whether every request of a bench run completed (``serve_bench_step`` marks a
    run with failed requests ``status`` "failed")."""
    return numbers.get("status") != "failed"


def _bench_note(numbers: dict[str, Any], value: Any, note: str, absent: str) -> str:
    if value is None:
        return absent
    if not _all_done(numbers):
        return "; ".join(x for x in (f"{numbers.get('failed')} requests failed", note) if x)
    return note


def evaluate_goals(
    bench: dict[str, dict[str, Any]],
    rows: list[dict[str, Any]],
    on_gpu: bool,
    note: str = "",
) -> list[dict[str, Any]]:
    """Issue 18's three goals on ``bench`` (concurrency as text -> ``bench_numbers``) and
    the runner rows ``rows``; ``on_gpu`` False (numbers from the CPU, or none) leaves each
    "not measured". ``note`` (e.g. that a stand-in model ran) goes on each measured goal.

    Returns:
        One dict per goal: ``goal``, ``target``, ``value``, ``status`` ("met", "missed"
        or "not measured") and ``note``.
    """
    if not on_gpu:
        why = "no GPU numbers (dry run, or no CUDA GPU)"
        return [
            _goal("64 streams output tok/s", f">= {GOAL_TOK_S_64:,.0f}", None, None, why),
            _goal("1 stream median TPOT ms", f"< {GOAL_TPOT_1_MS:g}", None, None, why),
            _goal("CUDA graphs vs eager at batch 1", "graph ms < eager ms", None, None, why),
        ]
    at64, at1 = bench.get("64") or {}, bench.get("1") or {}
    tok_s, tpot = at64.get("output_tok_s"), at1.get("tpot_median_ms")
    goals = [
        _goal(
            "64 streams output tok/s",
            f">= {GOAL_TOK_S_64:,.0f}",
            tok_s,
            None if tok_s is None else tok_s >= GOAL_TOK_S_64 and _all_done(at64),
            _bench_note(at64, tok_s, note, "the 64-stream bench did not run"),
        ),
        _goal(
            "1 stream median TPOT ms",
            f"< {GOAL_TPOT_1_MS:g}",
            tpot,
            None if tpot is None else tpot < GOAL_TPOT_1_MS and _all_done(at1),
            _bench_note(at1, tpot, note, "the 1-stream bench did not run"),
        ),
    ]
    pairs = graphs_vs_eager(rows)
    value = {fmt: {"eager_ms": e, "graph_ms": g} for fmt, (e, g) in pairs.items()} or None
    met = all(g < e for e, g in pairs.values()) if pairs else None
    why = note if pairs else "no decode b=1 row measured both eager and graph"
    goals.append(_goal("CUDA graphs vs eager at batch 1", "graph ms < eager ms", value, met, why))
    return goals


def machine_line(facts: dict[str, Any]) -> str:
    """The machine in one line: Python, torch and its CUDA, the GPU (name, memory in GiB,
    compute capability) or "no CUDA GPU", triton and flash_attn."""
    gpu = (
        f"{facts.get('gpu')} {facts.get('gpu_memory_gib')} GiB sm {facts.get('capability')}"
        if facts.get("gpu_count")
        else "no CUDA GPU"
    )
    return (
        f"python {facts.get('python')}, torch {facts.get('torch')} (CUDA "
        f"{facts.get('torch_cuda') or 'none'}), {gpu}, triton {facts.get('triton') or 'absent'}, "
        f"flash_attn {facts.get('flash_attn') or 'absent'}"
    )


def summary_lines(
    steps: list[dict[str, Any]],
    goals: list[dict[str, Any]],
    facts: dict[str, Any] | None = None,
    model: dict[str, Any] | None = None,
) -> list[str]:
    """The closing summary: the machine (``facts``) and the model, one line per step
    (status, seconds, reason and its results' ``note``), the serve bench's numbers and
    one line per goal."""
    out = ["", "== houchu gpu_check summary"]
    if facts:
        out.append(f"machine: {machine_line(facts)}")
    if model:
        out.append(f"model: {model.get('kind')} {model.get('path') or ''}".rstrip())
    out.append("steps:")
    for s in steps:
        said = [t for t in (s.get("reason"), s.get("results", {}).get("note")) if t]
        why = f"  ({'; '.join(said)})" if said else ""
        out.append(f"  {s['name']:14} {s['status']:8} {s['duration_s']:7.1f} s{why}")
    bench = next((s["results"].get("bench") for s in steps if s["name"] == "serve_bench"), None)
    if bench:
        out.append("serve bench (output tok/s, median TTFT ms, median TPOT ms):")
        for conc, b in bench.items():
            cells = [_fmt(b.get(k)) for k in ("output_tok_s", "ttft_median_ms", "tpot_median_ms")]
            bad = f"  ({b.get('failed')} requests failed)" if not _all_done(b) else ""
            out.append(
                f"  {conc:>3} streams: {cells[0]:>10} tok/s  {cells[1]:>8}  {cells[2]:>8}{bad}"
            )
    out.append("goals:")
    for g in goals:
        value = g["value"]
        if isinstance(value, dict):
            value = ", ".join(
                f"{k} eager {v['eager_ms']:.2f} / graph {v['graph_ms']:.2f} ms"
                for k, v in value.items()
            )
        shown = _fmt(value) if not isinstance(value, str) else value
        note = f"  ({g['note']})" if g.get("note") else ""
        out.append(f"  {g['status'].upper():13} {g['goal']} {g['target']}: {shown}{note}")
    return out


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:,.2f}" if isinstance(v, float) else str(v)
