"""Run directories (``houchu.actors.run_dirs``): a launcher killed outright leaves its
socket directory behind, and the next launcher removes it, never a live one's."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from houchu.actors.run_dirs import PID_FILE, make_run_dir, sweep_stale

pytestmark = pytest.mark.slow


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_the_directories_of_dead_launchers_are_removed_and_no_other(tmp_path):
    mine = make_run_dir(tmp_path)  # this process: alive
    assert (mine / PID_FILE).read_text().strip() == str(os.getpid())
    assert oct(mine.stat().st_mode & 0o777) == "0o700"
    dead = make_run_dir(tmp_path)
    (dead / PID_FILE).write_text(f"{_dead_pid()}\n")
    (dead / "runner.sock").touch()
    alive = make_run_dir(tmp_path)
    (alive / PID_FILE).write_text("1\n")  # init: always running
    legacy = tmp_path / "houchu-legacy"  # no pid file: not known to be ours to remove
    legacy.mkdir()
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / PID_FILE).write_text(f"{_dead_pid()}\n")
    assert sweep_stale(tmp_path) == [dead]
    assert not dead.exists()
    assert mine.exists() and alive.exists() and legacy.exists() and other.exists()
