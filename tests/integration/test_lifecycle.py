"""``houchu serve`` starts every actor in its own process and stops them all cleanly."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.server import start_server, stop_server

pytestmark = pytest.mark.slow


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    return [int(x) for x in out.stdout.split()]


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    out = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True)
    return bool(out.stdout.strip()) and not out.stdout.strip().startswith("Z")


def _wait_gone(pids: list[int], timeout_s: float = 10.0) -> list[int]:
    """Pids still alive after ``timeout_s`` (multiprocessing's resource tracker exits a
    moment after the launcher does)."""
    deadline = time.monotonic() + timeout_s
    while (alive := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_clean_shutdown(real_model_path, sig):
    srv = start_server(real_model_path, "--kv-cache-mb", "64")
    kids = _children(srv.proc.pid)
    assert len(kids) >= 4, srv.output()  # runner, scheduler, tokenizer, gateway
    for name in ("runner", "scheduler", "tokenizer", "gateway"):
        assert f"{name} ready" in srv.output()
    assert "pages" in srv.output()
    srv.proc.send_signal(sig)
    assert stop_server(srv) == 0, srv.output()
    assert not _wait_gone(kids), "orphan actor processes"
    (line,) = [x for x in srv.output().splitlines() if "actor sockets in" in x]
    run_dir = Path(line.split("actor sockets in", 1)[1].strip())
    assert run_dir.name.startswith("houchu-") and not run_dir.exists(), "socket files left"


def test_bad_model_path_fails_fast(tmp_path):
    bad = tmp_path / "nope.gguf"
    bad.write_bytes(b"not a gguf file")
    with pytest.raises(RuntimeError, match="did not start"):
        start_server(bad, timeout_s=120)


def test_port_in_use_is_one_clear_line_before_any_actor_starts(real_model_path):
    """A port another program listens on: ``houchu serve`` exits 1 at once (no model is
    loaded) with one line that names the address and the cause, and no traceback."""
    import socket
    import sys

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        cmd = [sys.executable, "-m", "houchu.cli", "serve", "--model", str(real_model_path)]
        t0 = time.monotonic()
        done = subprocess.run(
            [*cmd, "--port", str(port), "--compile", "off"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in out, out
    assert "Traceback" not in out and "ready (pid" not in out, out
    assert time.monotonic() - t0 < 30, out
