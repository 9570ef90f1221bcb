"""A lever sweep's answers as rich terminal tables, and as a JSON file."""

from __future__ import annotations

import json
import os
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from houchu.bench.sweep.analysis import MAX_TOLERANCE

_SI = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def amount(value: float, unit: str) -> str:
    """``3.2 GFLOP``, ``12 MiB``, ``1.5k tokens``: an amount in its unit, scaled."""
    if unit == "bytes":
        for scale, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
            if abs(value) >= scale:
                return f"{value / scale:.3g} {name}"
        return f"{value:.0f} B"
    if unit in ("seconds", "s"):
        return f"{value:.3g} s"
    label = {"flops": "FLOP"}.get(unit, unit.replace("_", " "))
    for scale, prefix in _SI:
        if abs(value) >= scale:
            return f"{value / scale:.3g}{prefix} {label}"
    return f"{value:.3g} {label}"


def _ledger_text(ledger: dict[str, float], kind: str) -> str:
    parts = [amount(v, k.split(" ", 1)[1]) for k, v in ledger.items() if k.startswith(kind) and v]
    return ", ".join(parts) or "-"


def _noisy(point: dict) -> str:
    """`` (noisy)`` after a gain whose cells' repeats spread more than a verdict allows
    (``sweep_analysis.MAX_TOLERANCE``, as the composition's ``noisy``)."""
    tol = point.get("tolerance")
    return " (noisy)" if tol is not None and tol > MAX_TOLERANCE else ""


def _gain(g: float | None) -> str:
    return "-" if g is None else f"{g:.2f}x"


def _binding(b: dict[str, Any] | None) -> str:
    if not b:
        return "-"
    return (
        f"{b['kind']} {100 * b['compute_frac']:.0f}%/{100 * b['bandwidth_frac']:.0f}% "
        f"{b['step_ms']:.1f}ms"
    )


def _spent(lv: dict[str, Any], at: dict[str, Any]) -> str:
    parts = [_ledger_text(at["ledger"], "spent")] if at["ledger"] else []
    st = lv["spent_static"]
    if st:
        if st["weight_bytes_per_step"]:
            parts.append(f"weights {amount(st['weight_bytes_per_step'], 'bytes')}/step")
        if st["kv_pool_tokens"]:
            parts.append(f"KV pool {st['kv_pool_tokens']:+.0f} tokens")
        parts.append(f"startup {st['startup_s']:+.1f} s")
    acc = lv.get("accuracy")
    if acc:
        if "error" in acc:
            parts.append(f"accuracy not measured: {acc['error']}")
        else:
            parts.append(f"top-1 {acc['top1']:.3f}, |Δlogp| {acc['mean_abs_dlogp']:.4f}")
    return "; ".join(p for p in parts if p and p != "-") or "-"


def lever_table(answers: dict[str, Any], unit: str) -> Table:
    """One row per lever: the four questions at the target load, gains at every load."""
    target = answers["target_load"]
    t = Table(
        title=f"Levers: the four questions (at {unit}={target:g} unless a load is named)",
        caption="binding: the constraint of the step time, its ideal time at the matmul peak "
        "/ at the memory bandwidth as % of the measured step, and the mean step; gains: "
        "above 1x the lever helped (throughput on/off; TTFT, TPOT off/on); (noisy): the "
        "repeats of the lever's or its reference's runs spread too much to read the gain",
    )
    for col in ("lever", "targets", "binding: baseline → on", "saved", "spent"):
        t.add_column(col, overflow="fold")
    t.add_column("throughput gain by load")
    t.add_column("TTFT / TPOT gain")
    t.add_column("break-even")
    for lv in answers["levers"]:
        at = next((p for p in lv["loads"] if p["load"] == target), lv["loads"][-1])
        curve = " ".join(
            f"{unit}={p['load']:g}:{_gain(p['gain']['throughput'])}{_noisy(p)}" for p in lv["loads"]
        )
        t.add_row(
            lv["lever"]
            + (f" (vs {lv['against']})" if lv.get("against", "baseline") != "baseline" else ""),
            lv["bottleneck"],
            f"{_binding(at['binding_baseline'])} → {_binding(at['binding_on'])}",
            _ledger_text(at["ledger"], "saved"),
            _spent(lv, at),
            curve,
            f"{_gain(at['gain']['ttft'])} / {_gain(at['gain']['tpot'])}",
            lv["break_even"]["text"],
        )
    return t


def matrix_table(answers: dict[str, Any], unit: str) -> Table:
    """The composition of each measured pair at the target load."""
    t = Table(title=f"Composition at {unit}={answers['target_load']:g}: pair vs product of singles")
    for col in ("pair", "gain a", "gain b", "gain a+b", "a+b / (a×b)", "verdict"):
        t.add_column(col)
    for p in answers["matrix"]:
        t.add_row(
            f"{p['a']} + {p['b']}",
            _gain(p["gain_a"]),
            _gain(p["gain_b"]),
            _gain(p["gain_ab"]),
            f"{p['ratio']:.2f} (±{p['tolerance']:.2f})",
            p["verdict"],
        )
    return t


def not_applicable_table(answers: dict[str, Any]) -> Table:
    """Levers and pairs not measured here, with the reason."""
    t = Table(title="Not measured on this machine")
    t.add_column("lever or pair")
    t.add_column("why", overflow="fold")
    for name, why in {**answers["not_applicable"], **answers["pairs_not_measured"]}.items():
        t.add_row(name, why)
    return t


def recommendation_text(answers: dict[str, Any], record: dict[str, Any]) -> str:
    """The ``houchu serve`` command of the fastest configuration, and what to expect."""
    rec = answers["recommendation"]
    if rec is None:
        return "No recommendation: nothing was measured at the target load."
    m = rec["metrics"]
    serve = ["houchu", "serve", "--model", record["settings"]["model"]]
    serve += [*record["settings"]["serve_args"], *rec["flags"]]

    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    gain = "" if rec["gain"] is None else f", {rec['gain']:.2f}x the baseline's {rec['metric']}"
    text = (
        f"Recommended at load {rec['load']:g} ({rec['config']}{gain}):\n"
        f"  {shell_lines(serve)}\n"
        f"  expected: TTFT {num(m['median_ttft_ms'], '.1f')} ms, TPOT "
        f"{num(m['median_tpot_ms'], '.1f')} ms, {num(m['output_throughput'], '.1f')} output tok/s"
    )
    d = rec.get("against_defaults")
    if d is not None and rec["config"] != "defaults":
        text += f"\n  against houchu's defaults (no lever flags): {d:.2f}x their {rec['metric']}"
        tol = rec.get("defaults_tolerance")
        if tol is not None and abs(d - 1.0) <= tol:
            text += (
                f", within the repeats' spread (±{100 * tol:.0f}%): no clear gain over the defaults"
            )
    elif rec["config"] == "defaults":
        text += "\n  houchu's defaults were the fastest measured: no lever flag to add"
    return text


def shell_lines(args: list[str], width: int = 88) -> str:
    """``args`` as a shell command broken into lines of at most ``width`` characters
    with a backslash at each break (a flag stays with its value), so that it can be
    copied whole from any terminal."""
    words, i = [], 0
    while i < len(args):  # a flag and its value as one word
        flag_value = (
            args[i].startswith("--") and i + 1 < len(args) and not args[i + 1].startswith("--")
        )
        n = 2 if flag_value else 1
        words.append(shlex.join(args[i : i + n]))
        i += n
    lines, cur = [], ""
    for w in words:
        if cur and len(cur) + 1 + len(w) > width:
            lines.append(cur)
            cur = w
        else:
            cur = f"{cur} {w}" if cur else w
    return " \\\n      ".join([*lines, cur])


def noise_text(record: dict[str, Any]) -> str:
    """How noisy the machine was."""
    n, s = record["answers"]["noise"], record["settings"]
    spread = (
        f"repeats' throughput spread (max-min)/median: median {100 * n['median_spread']:.1f}%, "
        f"max {100 * n['max_spread']:.1f}%"
        if n["median_spread"] is not None
        else "no cell measured more than once: no spread (--repeats 3 measures it)"
    )
    la = record["load_average"]
    return (
        f"Noise: load average {la['start'][0]:.2f} at the start, {la['end'][0]:.2f} at the end "
        f"(1 min; {s['cpu_count']} cores); {spread}"
    )


def missing_text(record: dict[str, Any]) -> str:
    """The cells a record lacks (a partial sweep's, or a failed configuration's) and
    that its answers are drawn without them; "" when every cell is measured."""
    state = record.get("sweep") or {}
    missing = state.get("missing") or []
    if not missing:
        return ""
    unit = "c" if record["settings"]["load_kind"] == "concurrency" else "r"
    by_config: dict[str, list[str]] = {}
    for m in missing:
        by_config.setdefault(m["config"], []).append(f"{unit}={m['load']:g} #{m['repeat'] + 1}")
    head = "Partial sweep" if not state.get("complete", True) else "Sweep"
    n = len(missing) + len(state.get("measured") or [])
    cells = "; ".join(f"{c}: {', '.join(xs)}" for c, xs in by_config.items())
    return (
        f"{head}: {len(missing)} of {n} cells not measured (the answers use the cells "
        f"measured; gains over a missing cell show as -): {cells}"
    )


def print_report(record: dict[str, Any], console: Console | None = None) -> None:
    """Every table of the sweep, then the recommendation and the noise."""
    c = console or Console(width=None if sys.stdout.isatty() else 200)
    answers = record["answers"]
    unit = "c" if record["settings"]["load_kind"] == "concurrency" else "r"
    s = record["settings"]
    c.print(
        f"houchu levers: {s['model']}, workload {s['workload']['workload']}, loads "
        f"{', '.join(f'{unit}={x:g}' for x in s['loads'])}, {s['repeats']} repeat(s); "
        f"CPU flags: {s['cpu_flags']}; limits: {record['limits'] or '-'}"
    )
    c.print(lever_table(answers, unit))
    if answers["matrix"]:
        c.print(matrix_table(answers, unit))
    if answers["not_applicable"] or answers["pairs_not_measured"]:
        c.print(not_applicable_table(answers))
    for name, why in record["failures"].items():
        c.print(f"[red]{name}: {why}[/red]")
    if text := missing_text(record):
        c.print(f"[yellow]{text}[/yellow]", highlight=False)
    c.print(recommendation_text(answers, record), soft_wrap=True, highlight=False)
    c.print(noise_text(record))


def save_record(record: dict[str, Any], path: Path) -> Path:
    """Write the sweep's record as JSON (folders created) atomically: to a temporary
    file beside ``path``, then renamed over it, so ``path`` always holds a whole record
    (the previous one if this write is interrupted); returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=2, default=str)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
