"""The run directory of one ``houchu serve``: its actors' ipc:// socket files.

Each run directory (``houchu-XXXXXXXX`` in the temporary folder, mode 0700 as
``tempfile.mkdtemp`` makes it) holds a ``launcher.pid`` file naming the launcher that
owns it. The launcher removes its directory when it stops; a launcher killed with
SIGKILL cannot, so every new launcher first removes the directories whose owner no
longer runs (``sweep_stale``). A directory without the file, or whose owner is alive,
is left alone.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

PREFIX = "houchu-"
PID_FILE = "launcher.pid"


def make_run_dir(root: Path | None = None) -> Path:
    """A fresh run directory under ``root`` (default: the temporary folder) with this
    process's pid in its ``launcher.pid``."""
    path = Path(tempfile.mkdtemp(prefix=PREFIX, dir=root))
    (path / PID_FILE).write_text(f"{os.getpid()}\n")
    return path


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one of another user's counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process
    return True


def sweep_stale(root: Path | None = None) -> list[Path]:
    """Remove the run directories under ``root`` (default: the temporary folder) owned
    by this user whose launcher no longer runs; returns the ones removed."""
    root = Path(root or tempfile.gettempdir())
    removed = []
    for path in root.glob(f"{PREFIX}*"):
        try:
            if not path.is_dir() or path.is_symlink() or path.stat().st_uid != os.getuid():
                continue
            pid = int((path / PID_FILE).read_text().strip())
        except (OSError, ValueError):
            continue  # not a run directory of this version, or not ours
        if pid > 0 and pid != os.getpid() and not _alive(pid):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
