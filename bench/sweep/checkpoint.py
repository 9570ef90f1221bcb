"""A lever sweep's record while it runs: written after every server, and resumed.

The record a sweep writes after each server has the final record's format (settings,
facts, runs, the answers drawn from the runs so far) and a ``sweep`` block that says
whether the sweep ran to its end and which cells are measured and missing
(``houchu.bench.sweep.schedule.sweep_state``). ``--resume FILE`` continues such a record
when the command's plan and this machine are the ones it was measured with
(:func:`check_resumable`). SIGINT and SIGTERM stop a sweep the same way
(:func:`interrupt_on_signals`): the running server is stopped, the record written.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import shlex
import signal
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from houchu.bench.model.limits import Limits
from houchu.bench.sweep.answers import analyze
from houchu.bench.sweep.plan import SweepPlan
from houchu.bench.sweep.records import SweepResult
from houchu.bench.sweep.schedule import sweep_state

#: The settings that define what a sweep measures: a resumed sweep must have the same.
PLAN_KEYS = (
    "model",
    "serve_args",
    "workload",
    "levers",
    "pairs",
    "load_kind",
    "loads",
    "repeats",
    "defaults",
    "draft_model",
)
#: The settings that name the machine a sweep was measured on.
MACHINE_KEYS = ("cpu_model", "cpu_flags", "cpu_count", "device", "gpu")


class SweepInterrupted(KeyboardInterrupt):
    """A sweep stopped by a signal (SIGINT or SIGTERM); ``signum`` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def interrupt_on_signals() -> Iterator[None]:
    """Within: the first SIGINT or SIGTERM raises :class:`SweepInterrupted` where the
    sweep is (its ``finally`` blocks stop the running server), and later ones are
    ignored until the block ends, so the clean-up and the record's write finish. The
    handlers before are restored on the way out. Outside the main thread: no change."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def handler(signum: int, frame: object) -> None:
        for s in old:
            signal.signal(s, signal.SIG_IGN)
        raise SweepInterrupted(signum)

    for s in old:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def cpu_identity() -> dict[str, Any]:
    """The CPU a sweep runs on, as its record stores it: model name, the flags houchu's
    figures depend on, and the core count."""
    from houchu.cpu import isa as cpu_isa

    return {
        "cpu_model": cpu_isa.cpu_model(),
        "cpu_flags": " ".join(sorted(cpu_isa.isa_flags())),
        "cpu_count": os.cpu_count(),
    }


def gpu_name(device: str) -> str | None:
    """The GPU's name where the model runs on CUDA, else None."""
    if device != "cuda":
        return None
    import torch

    return torch.cuda.get_device_name(0)


def workload_settings(spec: Any) -> dict[str, Any]:
    """The workload as a record stores it: its shape, the request settings, the seed
    and run limit (the same seed gives the same requests), and for a replay the SHA-256
    of the replayed file (its path may be a temporary one).

    Args:
        spec: the sweep's :class:`houchu.bench.core.BenchSpec`.
    """
    keep = ("api", "warmup", "temperature", "ignore_eos", "extra_body", "seed", "max_duration_s")
    out = {**spec.workload.settings(), **{k: v for k, v in spec.settings().items() if k in keep}}
    path = spec.workload.replay_path
    if spec.workload.kind == "replay" and path:
        out["replay_sha256"] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return out


def _first_difference(key: str, old: Any, new: Any) -> str | None:
    """``key`` (or ``key.sub``) where ``old`` and ``new`` differ, with both values."""
    if isinstance(old, dict) and isinstance(new, dict):
        for k in sorted(set(old) | set(new)):
            if k == "replay_path" and "replay_sha256" in old:
                continue  # a replay is compared by its content
            if (d := _first_difference(f"{key}.{k}", old.get(k), new.get(k))) is not None:
                return d
        return None
    return None if old == new else f"{key} {old!r} there, {new!r} here"


def check_resumable(path: Path, old: dict[str, Any], settings: dict[str, Any]) -> None:
    """Refuse to resume the record ``old`` (read from ``path``) with a sweep whose
    settings are ``settings`` unless the plan and the machine are the same and a cell
    is left to measure.

    Raises:
        ValueError: one line saying what differs, or that nothing is left to measure.
    """
    s = old.get("settings") or {}
    if s.get("backend") != "houchu levers" or "runs" not in old:
        raise ValueError(f"cannot resume {path}: not a houchu levers record")
    state = old.get("sweep") or {"complete": True, "missing": []}
    if state["complete"] and not state["missing"]:
        raise ValueError(
            f"cannot resume {path}: the sweep is complete (--reanalyze {path} answers again)"
        )
    for key in PLAN_KEYS:
        if (d := _first_difference(key, s.get(key), settings.get(key))) is not None:
            raise ValueError(f"cannot resume {path}: another plan ({d}); give the same options")
    for key in MACHINE_KEYS:
        if (d := _first_difference(key, s.get(key), settings.get(key))) is not None:
            raise ValueError(f"cannot resume {path}: measured on another machine ({d})")


def read_record(path: Path) -> dict[str, Any]:
    """A stored sweep record.

    Raises:
        ValueError: the file cannot be read or is not JSON.
    """
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None


def resume_command(argv: list[str] | None, path: Path) -> str:
    """The command that resumes the sweep ``argv`` (``houchu`` arguments, ``levers``
    first) from the record at ``path``: the same options, ``--resume PATH`` instead of
    any earlier one; a generic hint when ``argv`` is not known."""
    if not argv:
        return f"houchu levers --resume {shlex.quote(str(path))} with the sweep's options"
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == "--resume":
            skip = True
        elif not a.startswith("--resume=") and a != "--dry-run":
            out.append(a)
    return shlex.join(["houchu", *out, "--resume", str(path)])


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


@dataclass
class RecordContext:
    """What a sweep's record holds besides its measurements.

    Attributes:
        name: the sweep's name.
        settings: the record's ``settings`` (plan, workload, machine).
        native: the CPU's native matmul formats (for the roofline).
        target_load: the load the recommendation is judged at.
        objective: the metric "fastest" is judged by (``output_throughput`` ...).
        load_start: the load average when the sweep first started.
        lim: the machine's limits measured so far (None: not yet).
        date: when the sweep first started (ISO, UTC).
        earlier_parts: the ``sweep.parts`` of the sessions before this one.
        session_date: when this session started.
    """

    name: str
    settings: dict[str, Any]
    native: frozenset[str]
    target_load: float
    objective: str
    load_start: list[float]
    lim: Limits | None = None
    date: str = field(default_factory=_now)
    earlier_parts: list[dict[str, Any]] = field(default_factory=list)
    session_date: str = field(default_factory=_now)

    def resuming(self, old: dict[str, Any]) -> None:
        """Continue the record ``old``: its name, first date, load average at the
        start, limits and sessions."""
        from houchu.bench.sweep.reanalyze import record_limits

        self.name, self.date = old["name"], old.get("date", self.date)
        self.load_start = list(old.get("load_average", {}).get("start", self.load_start))
        self.lim = record_limits(old)
        parts = (old.get("sweep") or {}).get("parts")
        self.earlier_parts = parts or [
            {"date": self.date, "seconds": old.get("seconds", 0.0), "servers": None}
        ]

    def record(
        self,
        plan: SweepPlan,
        result: SweepResult,
        quality: dict[str, dict[str, Any]],
        complete: bool,
        servers: int,
    ) -> dict[str, Any]:
        """The record of ``result`` (the runs in sweep order): ``complete`` once every
        server of the plan ran; ``servers``: started in this session."""
        answers = analyze(
            plan,
            result.runs,
            result.facts,
            self.lim,
            self.native,
            quality,
            self.target_load,
            self.objective,
        )
        earlier = sum(p.get("seconds") or 0.0 for p in self.earlier_parts)
        part = {"date": self.session_date, "seconds": result.seconds - earlier, "servers": servers}
        lim = self.lim
        return {
            "name": self.name,
            "date": self.date,
            "settings": self.settings,
            "limits": lim.line(self.native) if lim else None,
            "limits_values": asdict(lim) if lim else None,
            "load_average": {"start": self.load_start, "end": list(os.getloadavg())},
            "seconds": result.seconds,
            "sweep": sweep_state(plan, result.runs, complete, [*self.earlier_parts, part]),
            "facts": {k: asdict(v) for k, v in result.facts.items()},
            "failures": result.failures,
            "answers": answers,
            "runs": [r.to_json() for r in result.runs],
        }
