"""The device check's plumbing (``houchu.devtools.gpu_check``): its steps' records, the one
log every command and its output go to, and commands run under a timeout each.

Standard library only: the check runs it before houchu's dependencies are installed.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO


@dataclass
class CmdResult:
    """One command: its argv, exit status (None: killed at its timeout), seconds it ran,
    and its output (stdout and stderr together)."""

    cmd: list[str]
    rc: int | None
    duration_s: float
    timed_out: bool
    output: str

    def record(self) -> dict[str, Any]:
        """The JSON record (the output stays in the log)."""
        return {
            "cmd": shlex.join(self.cmd),
            "rc": self.rc,
            "duration_s": round(self.duration_s, 2),
            "timed_out": self.timed_out,
        }


@dataclass
class Step:
    """One step's record: ``status`` is "ok", "failed" or "skipped" (``reason`` says why
    it failed or was skipped); ``duration_s`` in seconds; ``results``: its parsed numbers."""

    name: str
    status: str = "ok"
    reason: str = ""
    duration_s: float = 0.0
    commands: list[dict[str, Any]] = field(default_factory=list)
    results: dict[str, Any] = field(default_factory=dict)

    def fail(self, reason: str) -> None:
        """Mark the step failed (the first reason is kept, later ones appended)."""
        self.status = "failed"
        self.reason = f"{self.reason}; {reason}" if self.reason else reason

    def skip(self, reason: str) -> None:
        """Mark the step skipped, saying why."""
        self.status, self.reason = "skipped", reason

    def record(self) -> dict[str, Any]:
        """The JSON record."""
        return asdict(self) | {"duration_s": round(self.duration_s, 2)}


class Context:
    """What the steps share: the output folder and its log, the deadline of the whole
    check, the interpreter and environment children run with, and the folders given.

    Args:
        outdir: where ``gpu_check.log`` and ``gpu_check.json`` go (created).
        deadline_s: seconds from now the whole check must end in.
        repo: the repository root (the package ``houchu``).
        echo: where each logged line is also written (None: nowhere).
    """

    def __init__(
        self, outdir: Path, deadline_s: float, repo: Path, echo: TextIO | None = sys.stdout
    ) -> None:
        self.outdir = outdir
        outdir.mkdir(parents=True, exist_ok=True)
        self.log_path = outdir / "gpu_check.log"
        self._log = open(self.log_path, "w", encoding="utf-8")  # noqa: SIM115 (closed in close)
        self._lock = threading.Lock()
        self.echo = echo
        self.t0 = time.monotonic()
        self.deadline = self.t0 + deadline_s
        self.repo = repo
        self.python = sys.executable
        self.env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.dry_run = False
        self.wheels: Path | None = None
        self.work = outdir / "work"
        self.facts: dict[str, Any] = {}
        self.model: dict[str, Any] = {}
        self.steps: dict[str, Step] = {}

    def remaining(self) -> float:
        """Seconds left before the check's deadline."""
        return self.deadline - time.monotonic()

    def log(self, text: str) -> None:
        """Append ``text`` (one or more lines) to the log, and echo it."""
        line = text if text.endswith("\n") else text + "\n"
        with self._lock:
            self._log.write(line)
            self._log.flush()
            if self.echo is not None:
                self.echo.write(line)
                self.echo.flush()

    def close(self) -> None:
        """Close the log."""
        self._log.close()

    def cuda(self) -> bool:
        """Whether the GPU steps run on a GPU: the machine step found a CUDA GPU torch
        can use, and this is no dry run."""
        found = bool(self.facts.get("cuda_available")) and self.facts.get("gpu_count", 0) > 0
        return found and not self.dry_run

    def why_no_gpu(self) -> str:
        """Why the GPU steps do not run on a GPU here, in words."""
        if self.dry_run:
            return "dry run: no GPU used"
        if "torch_error" in self.facts:
            return f"torch does not import: {self.facts['torch_error']}"
        build = self.facts.get("torch_cuda")
        return f"no CUDA GPU (torch {self.facts.get('torch')}, CUDA {build or 'none'})"

    def run(
        self, cmd: list[str], timeout_s: float, cwd: Path | None = None, step: Step | None = None
    ) -> CmdResult:
        """Run ``cmd`` in a process group of its own (cwd: the repository), its output
        streamed into the log; past ``timeout_s`` seconds the group is killed. The result
        is appended to ``step``'s commands."""
        proc = self.spawn(cmd, cwd)
        lines: list[str] = []
        reader = threading.Thread(target=self.pump, args=(proc, lines), daemon=True)
        reader.start()
        t0 = time.monotonic()
        timed_out = False
        try:
            proc.wait(timeout=max(timeout_s, 1.0))
        except subprocess.TimeoutExpired:
            timed_out = True
            self.log(f"[gpu_check] timed out after {timeout_s:.0f} s: {shlex.join(cmd)}")
            stop_group(proc, grace_s=5.0)
        reader.join(timeout=5)
        res = CmdResult(
            cmd, None if timed_out else proc.returncode, time.monotonic() - t0, timed_out, ""
        )
        res.output = "".join(lines)
        self.log(f"[gpu_check] exit {res.rc} after {res.duration_s:.1f} s")
        if step is not None:
            step.commands.append(res.record())
        return res

    def spawn(self, cmd: list[str], cwd: Path | None = None) -> subprocess.Popen:
        """Start ``cmd`` (logged) in a new process group, stdout and stderr piped together."""
        self.log(f"$ {shlex.join(cmd)}")
        return subprocess.Popen(
            cmd,
            cwd=cwd or self.repo,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            start_new_session=True,
        )

    def pump(
        self,
        proc: subprocess.Popen,
        lines: list[str],
        ready: tuple[str, threading.Event] | None = None,
    ) -> None:
        """Copy ``proc``'s output into ``lines`` and the log until it closes; set
        ``ready``'s event at the first line holding its text."""
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            self.log(f"  | {line.rstrip()}")
            if ready is not None and ready[0] in line:
                ready[1].set()


def stop_group(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM ``proc`` (the leader of its process group), then SIGKILL the whole group
    after ``grace_s`` seconds, or at once once the leader is gone."""
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def free_port(lo: int = 18000, hi: int = 18999, span: int = 4) -> int:
    """A port P in [lo, hi - span] such that P .. P + span - 1 bind on 127.0.0.1 now.

    Raises:
        RuntimeError: none found in 200 tries.
    """
    import random

    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(lo, hi - span)
        ok = True
        for p in range(port, port + span):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return port
    raise RuntimeError(f"no {span} consecutive free ports in {lo}-{hi}")
