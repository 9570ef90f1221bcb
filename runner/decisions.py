"""Startup measurements kept between runs, beside the C++ kernel builds
(``~/.cache/houchu/cpu_kernels/decisions.json``): the measured decode paths
(``houchu.runner.autotune``) and the compiled-step verdict (``houchu.runner.accel``). Each
entry's key names everything its answer depends on (the model file's path, size and
modification time, its format, the CPU, the ISA level and kernel build, the threads,
torch's version), so a changed model, CPU, kernel build or thread budget measures anew;
a second start reads the answer. The thread governor's settled counts are kept here too
(``houchu.cpu.threads``).
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

import torch

from houchu import env as env_vars
from houchu.cpu import kernels as cpu_kernels

DECISIONS_VERSION = 5  # of the measurements' code: a change that alters answers bumps it
# the variables that hold torch's own CPU kernels (ATen, oneDNN, MKL) to an ISA level: the
# dense and torch paths' times depend on them
TORCH_ISA_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
FILE_NAME = "decisions.json"
MAX_ENTRIES = 200  # per kind: one per model, format and CPU level tried on this machine


@functools.cache
def cpu_name() -> str:
    """The CPU's model name and the CPUs this process may use, e.g. "AMD EPYC x2" (a
    cache folder shared by machines of one ISA level keeps their answers apart)."""
    name = platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "Hardware", "CPU part")):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    usable = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    return f"{name} x{len(usable) if usable else os.cpu_count()}"


def model_key(model_path: str | Path, *parts: object) -> str:
    """A cache key: the model file's resolved path, size and mtime, the CPU
    (``cpu_name``), the active ISA level and its kernel build's key (sources, flags),
    the measurements' ``DECISIONS_VERSION``, torch's thread count and version, the variables that
    cap torch's ISA (``TORCH_ISA_ENV``), then ``parts``."""
    p = Path(model_path).resolve()
    st = p.stat()
    head = [str(p), st.st_size, int(st.st_mtime), cpu_name()]
    level = cpu_kernels.active_level()
    build = cpu_kernels.current_build_key(level)  # the kernels' sources and flags
    tail = [level, build, DECISIONS_VERSION, torch.get_num_threads(), torch.__version__]
    tail += [os.environ.get(v, "") for v in TORCH_ISA_ENV]  # torch's own kernels' level
    return "|".join(str(x) for x in (*head, *tail, *parts))


_WARNED: set[Path] = set()  # caches whose "not written" warning was printed


class DecisionCache:
    """A small JSON file of measured answers, read and written under a file lock
    (``$HOUCHU_NO_DECISION_CACHE=1`` turns it off: every start measures).

    Args:
        path: the file (default: ``$HOUCHU_DECISION_CACHE``, else ``decisions.json`` in
            ``cpu_kernels.cache_dir()``).
    """

    def __init__(self, path: Path | None = None) -> None:
        given = env_vars.decision_cache()
        self.path = path or (Path(given) if given else cpu_kernels.cache_dir() / FILE_NAME)
        folder = bool(given) and path is None and given.endswith(("/", os.sep))  # "dir/"
        if folder or self.path.is_dir():  # a folder given: the file in it
            self.path = self.path / FILE_NAME
        self.enabled = env_vars.decision_cache_enabled()

    def get(self, kind: str, key: str) -> Any | None:
        """The stored answer of ``kind`` for ``key``, or None."""
        if not self.enabled:
            return None
        return self._read().get(kind, {}).get(key)

    def put(self, kind: str, key: str, value: Any) -> bool:
        """Store ``value`` (JSON-able); whether it was stored. An unwritable cache is
        skipped with a warning on stderr, once per file (the next start measures again)."""
        if not self.enabled:
            return False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path.with_suffix(".lock"), "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                data = self._read()
                entries = data.setdefault(kind, {})
                entries.pop(key, None)
                entries[key] = value  # newest last; the oldest go beyond MAX_ENTRIES
                for old in list(entries)[: max(0, len(entries) - MAX_ENTRIES)]:
                    del entries[old]
                tmp = self.path.with_suffix(".tmp")
                tmp.write_text(json.dumps(data))
                tmp.replace(self.path)
            return True
        except OSError as exc:
            if self.path not in _WARNED:  # once per file and process
                _WARNED.add(self.path)
                file = next((a for a in self.path.parents if a.exists() and not a.is_dir()), None)
                why = f"{file} is a file, not a folder" if file else str(exc)
                print(
                    f"houchu: decision cache {self.path} not written ({why}); "
                    "the next start measures again",
                    file=sys.stderr,
                )
            return False

    def _read(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}
