"""Every ``HOUCHU_*`` environment variable houchu reads, in one place: its name, type,
default and meaning.

At the bottom of the import order (the standard library only). Each variable is read
when its function is called, never at import: tests and child processes set them per
process (a tensor-parallel rank reads its own, a benchmark child gets its level), so a
value read once at import would be stale. An empty value counts as unset.
"""

from __future__ import annotations

import os
from pathlib import Path

#: ``houchu``'s cache directory (path; default ``~/.cache/houchu``): models, GGUF
#: indexes, tokenizers, the database, the SSD KV tier, benchmark results.
CACHE = "HOUCHU_CACHE"
#: The API key clients must send (string; default: none, no key). ``--api-key`` wins.
API_KEY = "HOUCHU_API_KEY"
#: The CPU kernels' ISA level under ``--cpu-isa auto`` (a level name; default: the best
#: this CPU runs).
CPU_ISA = "HOUCHU_CPU_ISA"
#: The highest ISA level to build and pick (a level name; default: no cap).
CPU_ISA_MAX = "HOUCHU_CPU_ISA_MAX"
#: Where built C++ CPU kernels are kept (path; default ``~/.cache/houchu/cpu_kernels``).
KERNEL_CACHE = "HOUCHU_KERNEL_CACHE"
#: The runner's decision cache file (path; default ``decisions.json`` in the cache).
DECISION_CACHE = "HOUCHU_DECISION_CACHE"
#: "1": no decision cache, every start measures (flag; default: cache on).
NO_DECISION_CACHE = "HOUCHU_NO_DECISION_CACHE"
#: Set: allow more CPU tensor-parallel ranks than cores (flag; default: refused).
TP_OVERSUBSCRIBE = "HOUCHU_TP_OVERSUBSCRIBE"
#: Seconds a tensor-parallel collective may take (float; default the group's
#: ``TIMEOUT_S``).
TP_TIMEOUT_S = "HOUCHU_TP_TIMEOUT_S"
#: The ISA level a runner-benchmark child process measures (set by the parent; a level
#: name; default: unset, the parent process).
RUNNER_BENCH_LEVEL = "HOUCHU_RUNNER_BENCH_LEVEL"
#: Set: the lever sweep keeps an existing database instead of starting a fresh one
#: (flag; default: a fresh database).
LEVERS_KEEP_DB = "HOUCHU_LEVERS_KEEP_DB"


def _get(name: str) -> str | None:
    """The variable's value, None when unset or empty."""
    return os.environ.get(name) or None


def cache_dir() -> Path:
    """houchu's cache directory: ``$HOUCHU_CACHE`` or ``~/.cache/houchu`` (a path)."""
    return Path(os.environ.get(CACHE, Path.home() / ".cache" / "houchu"))


def api_key() -> str | None:
    """``$HOUCHU_API_KEY``, or None."""
    return _get(API_KEY)


def cpu_isa() -> str | None:
    """``$HOUCHU_CPU_ISA``: the ISA level asked for under ``--cpu-isa auto``, or None."""
    return _get(CPU_ISA)


def cpu_isa_max() -> str | None:
    """``$HOUCHU_CPU_ISA_MAX``: the highest ISA level allowed, or None (no cap)."""
    return _get(CPU_ISA_MAX)


def kernel_cache() -> Path | None:
    """``$HOUCHU_KERNEL_CACHE``: where built CPU kernels go, or None (the default)."""
    value = _get(KERNEL_CACHE)
    return Path(value) if value else None


def decision_cache() -> str | None:
    """``$HOUCHU_DECISION_CACHE``: the decision cache file (a path; ending in "/": a
    folder for it), or None (the default)."""
    return _get(DECISION_CACHE)


def decision_cache_enabled() -> bool:
    """False when ``$HOUCHU_NO_DECISION_CACHE`` is "1"."""
    return os.environ.get(NO_DECISION_CACHE) != "1"


def tp_oversubscribe() -> bool:
    """``$HOUCHU_TP_OVERSUBSCRIBE`` is set: more CPU ranks than cores are allowed."""
    return _get(TP_OVERSUBSCRIBE) is not None


def tp_timeout_s() -> float | None:
    """``$HOUCHU_TP_TIMEOUT_S`` in seconds, or None (the default applies).

    Raises:
        ValueError: not a number.
    """
    value = _get(TP_TIMEOUT_S)
    return float(value) if value else None


def runner_bench_level() -> str | None:
    """``$HOUCHU_RUNNER_BENCH_LEVEL``: the level this benchmark child measures, or None."""
    return _get(RUNNER_BENCH_LEVEL)


def levers_keep_db() -> bool:
    """``$HOUCHU_LEVERS_KEEP_DB`` is set: keep the lever sweep's existing database."""
    return _get(LEVERS_KEEP_DB) is not None
