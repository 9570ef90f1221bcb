"""A real ``houchu serve`` in its own processes, on a free port: start, stop, its output."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

#: Ports a test server may take: below Linux's ephemeral range (32768-60999), where an
#: outgoing connection can take a port between the check and the server's bind.
PORT_RANGE = (20000, 32000)
#: Consecutive ports checked free from each server's port up: ``--data-parallel-size N``
#: serves on P .. P + N + 2 (router, replicas, dashboard, router metrics).
PORT_SPAN = 8


def free_port(span: int = PORT_SPAN) -> int:
    """A port P of ``PORT_RANGE`` such that P .. P + span - 1 are free on 127.0.0.1 now.

    Raises:
        RuntimeError: no such run of ports found in 200 tries.
    """
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(PORT_RANGE[0], PORT_RANGE[1] - span)
        if all(_bindable(port + i) for i in range(span)):
            return port
    raise RuntimeError(f"no {span} consecutive free ports in {PORT_RANGE}")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@dataclass
class Server:
    """A running ``houchu serve``: its base URL, process and captured output lines."""

    url: str
    port: int
    proc: subprocess.Popen
    lines: list[str] = field(default_factory=list)

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    def output(self) -> str:
        return "".join(self.lines)


def _compile_flag(extra: tuple[str, ...], compile: bool) -> list[str]:
    """``--compile off`` unless compiling was asked for (here or in ``extra``)."""
    if compile or any(a.startswith("--compile") for a in extra):
        return []
    return ["--compile", "off"]


def _db_flag(extra: tuple[str, ...]) -> list[str]:
    """``--db-url`` of the test session's database (``$HOUCHU_TEST_DB_URL``, set by
    ``_session_db``) unless ``extra`` names one or turns telemetry off: a test server never
    writes to (or migrates) the user's database, which another houchu version may own."""
    url = os.environ.get("HOUCHU_TEST_DB_URL")
    if url is None or any(a.startswith(("--db-url", "--disable-telemetry")) for a in extra):
        return []
    return ["--db-url", url]


def _quant_flag(extra: tuple[str, ...], exact: bool) -> list[str]:
    """``--quantization none`` (the exact path) unless ``extra`` picks a quantization."""
    if not exact or any(a.startswith("--quantization") for a in extra):
        return []
    return ["--quantization", "none"]


def _dtype_flag(extra: tuple[str, ...], exact: bool) -> list[str]:
    """``--dtype float32`` on the exact path unless ``extra`` names a dtype: the exact
    path is float32 on every device (``--dtype auto`` is bfloat16 on CUDA, which cannot
    match transformers' float32 token for token; on the CPU auto is float32 already)."""
    if not exact or any(a.startswith("--dtype") for a in extra):
        return []
    return ["--dtype", "float32"]


def start_server(
    model: Path,
    *extra: str,
    timeout_s: float = 300.0,
    compile: bool = False,
    exact: bool = True,
) -> Server:
    """Start ``houchu serve`` and wait until it prints that it is serving.

    ``compile=False`` adds ``--compile off``: compiling the decode step at start-up
    costs tens of seconds on 2 cores, and the golden tests check the plain (eager) path
    against transformers; compiled vs eager is checked in ``test_compiled_api.py``.
    ``exact=True`` adds ``--quantization none`` (serve's default, auto, keeps a Q4 GGUF's
    weights int4, which agrees with transformers' dequantized weights on top-1 but not
    bit for bit) and ``--dtype float32`` (``_dtype_flag``: on CUDA auto is bfloat16)
    unless ``extra`` names them; the default path is checked in ``test_compiled_api.py``.

    Raises:
        RuntimeError: it exited or did not become ready within ``timeout_s`` seconds.
    """
    port = free_port()
    cmd = [sys.executable, "-m", "houchu.cli", "serve", "--model", str(model), "--port", str(port)]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [
            *cmd,
            *extra,
            *_compile_flag(extra, compile),
            *_quant_flag(extra, exact),
            *_dtype_flag(extra, exact),
            *_db_flag(extra),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    server = Server(f"http://127.0.0.1:{port}", port, proc)
    ready = threading.Event()

    def pump() -> None:
        for line in proc.stdout:
            server.lines.append(line)
            sys.stderr.write(f"[server] {line}")
            if "houchu: serving" in line:
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while not ready.wait(0.2):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"houchu serve did not start:\n{server.output()}")
    return server


def stop_server(server: Server, timeout_s: float = 30.0) -> int:
    """SIGTERM the launcher and wait; returns its exit code."""
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
    try:
        return server.proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        raise
