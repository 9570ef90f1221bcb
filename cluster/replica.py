"""One replica's process: ``python -m houchu.cluster.replica`` runs the ordinary
launcher (``houchu.actors.launcher``) on the configuration it reads as JSON on stdin.

``ReplicaProcess`` starts it in a session of its own, so that the replica's launcher
and every actor process it starts form one process group: a replica whose launcher dies
is cleaned up whole (``kill_group``) before it is started again on the same port.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO

from houchu.cluster.plan import ReplicaPlan
from houchu.options.serve_config import ServeConfig

#: prctl option: the signal a process gets when its parent dies (linux/prctl.h)
PR_SET_PDEATHSIG = 1


def relay_output(index: int, stream: IO[bytes], out: IO[str]) -> None:
    """Copy replica ``index``'s output lines to ``out``, ``houchu:`` written as
    ``houchu[replica N]:`` (so that ``houchu: serving`` is the router's line only) and an
    actor's ``houchu NAME:`` (``houchu runner: ...``) as ``houchu[replica N] NAME:``;
    returns at the end of ``stream``."""
    tag = f"houchu[replica {index}]"
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace")
        if line.startswith(("houchu:", "houchu ")):
            line = tag + line[len("houchu") :]
        out.write(line)
        out.flush()


def child_setup(cores: tuple[int, ...] | None = None) -> Callable[[], None]:
    """What a child of the cluster launcher runs before exec: pin it to ``cores`` (when
    given), and on Linux ask for SIGTERM when the cluster launcher dies
    (``PR_SET_PDEATHSIG``), so that a killed launcher leaves no replica behind."""

    def setup() -> None:
        if cores is not None:
            os.sched_setaffinity(0, cores)
        if sys.platform.startswith("linux"):
            ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)

    return setup


def spawn_replica(plan: ReplicaPlan) -> subprocess.Popen:
    """Start replica ``plan`` in a new session, pinned to ``plan.cores`` when set (the
    actors it starts inherit the pinning); its output is relayed to stdout
    (``relay_output``) by a daemon thread.

    Raises:
        OSError: it cannot be started.
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", "houchu.cluster.replica"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=child_setup(plan.cores),
    )
    assert proc.stdin is not None
    try:
        proc.stdin.write(plan.config.to_json())
        proc.stdin.close()
    except BrokenPipeError:  # it died at once; the launcher sees the exit code
        pass
    assert proc.stdout is not None
    threading.Thread(
        target=relay_output, args=(plan.index, proc.stdout, sys.stdout), daemon=True
    ).start()
    return proc


@dataclass
class ReplicaProcess:
    """One replica's current process and what the cluster launcher knows of it.

    ``state``: "starting" (spawned, /health not yet 200), "ready", "restarting" (dead,
    a restart is due) or "failed" (its restart budget is spent); ``restarts``: times
    it was started again; ``started_at``: monotonic seconds.
    """

    plan: ReplicaPlan
    proc: subprocess.Popen | None = None
    state: str = "starting"
    restarts: int = 0
    started_at: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def start(self) -> None:
        """Start (or start again) the replica's process."""
        self.proc = spawn_replica(self.plan)
        self.state, self.started_at = "starting", time.monotonic()

    def exited(self) -> bool:
        """True when its launcher process has exited."""
        return self.proc is not None and self.proc.poll() is not None

    def kill_group(self) -> None:
        """SIGKILL every process left in its group (its actors, after a launcher died)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    async def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM its launcher (which stops its actors), wait up to ``grace_s``
        seconds, then kill what is left of the group."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while self.proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        self.kill_group()
        if self.proc.poll() is None:
            self.proc.wait(2.0)


def main() -> int:
    """Run one replica's launcher on the configuration on stdin; its exit code."""
    from houchu.actors.launcher import Launcher
    from houchu.actors.runtime import install_uvloop

    config = ServeConfig.from_json(sys.stdin.buffer.read())
    install_uvloop()
    return asyncio.run(Launcher(config).serve())


if __name__ == "__main__":
    sys.exit(main())
