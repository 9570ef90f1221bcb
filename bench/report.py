"""The benchmark's summary table, its JSON file and its row in the database."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from houchu.paths import cache_dir

log = logging.getLogger(__name__)

_SECTIONS = (
    ("ttft", "Time to First Token", "TTFT"),
    ("tpot", "Time per Output Token (excl. 1st token)", "TPOT"),
    ("itl", "Inter-token Latency", "ITL"),
    ("e2el", "End-to-end Latency", "E2EL"),
)
_WIDTH = 50


def _row(label: str, value: Any, digits: int = 2) -> str:
    if value is None:
        text = "-"
    elif isinstance(value, float):
        text = f"{value:.{digits}f}"
    else:
        text = str(value)
    return f"{label:<40}{text:>10}"


def _title(text: str, fill: str = "-") -> str:
    return f" {text} ".center(_WIDTH, fill)


def summary_table(record: dict[str, Any]) -> str:
    """The vLLM-style result block of one benchmark record (latencies in ms)."""
    s, r = record["settings"], record["results"]
    lines = [
        _title("Serving Benchmark Result", "="),
        _row("Backend:", s.get("backend")),
        _row("Workload:", s.get("workload")),
        _row("Successful requests:", r["completed"]),
        _row("Failed requests:", r["failed"]),
    ]
    if r["errors"]:
        lines.append(_row("Errors:", ", ".join(f"{k}={v}" for k, v in r["errors"].items())))
    if r.get("incomplete") or r.get("not_sent"):
        lines.append(_row("Incomplete / not sent:", f"{r['incomplete']} / {r.get('not_sent', 0)}"))
    lines += [
        _row("Benchmark duration (s):", r["duration_s"]),
        _row("Total input tokens:", r["total_input_tokens"]),
        _row("Total generated tokens:", r["total_output_tokens"]),
        _row("Request throughput (req/s):", r["request_throughput"]),
    ]
    if r.get("request_goodput") is not None:
        slo = " ".join(f"{k}<={v:g}ms" for k, v in r["slo_ms"].items())
        lines.append(_row("Goodput objectives:", slo))
        lines.append(_row("Request goodput (req/s):", r["request_goodput"]))
    lines += [
        _row("Input token throughput (tok/s):", r["input_throughput"]),
        _row("Output token throughput (tok/s):", r["output_throughput"]),
        _row("Total token throughput (tok/s):", r["total_token_throughput"]),
    ]
    for key, title, short in _SECTIONS:
        lines.append(_title(title))
        for stat, label in (("mean", "Mean"), ("median", "Median"), ("p90", "P90"), ("p99", "P99")):
            lines.append(_row(f"{label} {short} (ms):", r[f"{stat}_{key}_ms"]))
    by_tag = record.get("by_tag") or {}
    if by_tag:
        lines.append(_title("Per request class"))
        lines.append(
            f"{'class':<12}{'n':>5}{'TTFT p50':>11}{'TPOT p50':>11}{'ITL p99':>10}{'E2EL p50':>11}"
        )
        for tag, t in by_tag.items():
            vals = [t["median_ttft_ms"], t["median_tpot_ms"], t["p99_itl_ms"], t["median_e2el_ms"]]
            cells = "".join(f"{v:>11.1f}" if v is not None else f"{'-':>11}" for v in vals)
            lines.append(f"{tag:<12}{t['completed']:>5}{cells}")
    lines.append("=" * _WIDTH)
    return "\n".join(lines)


def results_dir() -> Path:
    """Where result files go by default: ``$HOUCHU_CACHE/bench`` (``~/.cache/houchu/bench``)."""
    return cache_dir() / "bench"


def save_json(record: dict[str, Any], path: Path) -> Path:
    """Write the record to ``path`` (folders created); returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2))
    return path


def store(record: dict[str, Any], db_url: str | None) -> int | None:
    """Store the record's settings and results with ``houchu.storage.bench_runs``.

    Returns the new row's id, or None when the storage module is not available (it is
    imported lazily; the JSON file is the record then). Database errors propagate.
    """
    try:
        from houchu.storage.bench_runs import save_bench_run
    except ImportError as exc:
        log.warning("results not stored in the database: %s", exc)
        return None
    results = {**record["results"], "by_tag": record.get("by_tag") or {}}
    return save_bench_run(db_url, record["name"], record["settings"], results)
