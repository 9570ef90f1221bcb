"""A benchmark stopped with SIGTERM stops the servers it started (no orphan left)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

pytestmark = pytest.mark.slow

CHILD = textwrap.dedent(
    """
    import sys, time
    from houchu.bench.servers import ManagedServer, free_port
    port = free_port()
    cmd = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    s = ManagedServer("dummy", cmd, port, f"http://127.0.0.1:{port}/")
    s.start(timeout_s=60)
    print(s.proc.pid, flush=True)
    time.sleep(120)
    """
)


def test_sigterm_stops_started_servers() -> None:
    bench = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
    )
    try:
        server_pid = int(bench.stdout.readline())
        assert psutil.pid_exists(server_pid)
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(30) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 30
        while psutil.pid_exists(server_pid) and time.monotonic() < deadline:
            if psutil.Process(server_pid).status() == psutil.STATUS_ZOMBIE:
                break
            time.sleep(0.1)
        gone = not psutil.pid_exists(server_pid)
        assert gone or psutil.Process(server_pid).status() == psutil.STATUS_ZOMBIE
    finally:
        bench.kill()
        bench.wait()
