"""Start and stop a ``houchu serve`` for a benchmark run."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(model: str | Path, *flags: str) -> Iterator[str]:
    """Run ``houchu serve --model MODEL FLAGS`` on a free port; yields its WebSocket URL.

    Raises:
        RuntimeError: the server exited before it was ready.
    """
    port = free_port()
    cmd = [sys.executable, "-m", "houchu.cli", "serve", "--model", str(model), "--port", str(port)]
    proc = subprocess.Popen(
        [*cmd, *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    try:
        for line in proc.stdout:
            if "houchu: serving" in line:
                break
        else:
            raise RuntimeError("houchu serve exited before it was ready")
        # keep reading its output, or a full pipe would block the server
        threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
        yield f"ws://127.0.0.1:{port}/ws"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
