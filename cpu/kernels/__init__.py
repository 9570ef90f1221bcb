"""houchu's C++ CPU kernels, built per instruction-set level on first use and cached.

The ``*.cpp`` files beside this module register operators in one library per ISA level
(``torch.ops.houchu_cpu_<level>.*``, e.g. ``houchu_cpu_avx2``; ``ops()`` is the level this
process uses): fused RMSNorm, residual add + RMSNorm, RoPE and SiLU·mul
(``norm_rope.cpp``), paged decode attention (``attention.cpp``), causal prefill attention
(``prefill_attention.cpp``), int4/int8 GEMV (``gemv.cpp``), W8A8's quantization and
epilogue (``quant.cpp``), greedy sampling's argmax (``argmax.cpp``), and all the decoder
layers of a decode step, with the LM head, in one call (``decode_layers.cpp``, reusing the
others' kernels from the ``*.h`` headers). They remove what dominates an eager CPU decode
step at small batch sizes: hundreds of small torch ops per step, each a few microseconds
of dispatch, and the KV-page gather before attention.

The level (``houchu.cpu.isa``: ``avx512_bf16``, ``avx512``, ``avx2``, ``neon``, or ``generic``:
torch's ops only) is detected from the CPU at startup or forced with ``--cpu-isa`` /
``$HOUCHU_CPU_ISA``. ``load()`` compiles that level's build once per machine with
``torch.utils.cpp_extension`` (g++ with the level's own target flags, not
``-march=native``, and ninja, as two unity translation units; about 20 s on 2 cores) into
``~/.cache/houchu/cpu_kernels/<level>-<key>``, where the key hashes the level, the
sources (their paths and contents), the flags and the torch version, and loads the shared
library into the process. Later processes only load it. A build is loaded only on a CPU
that runs its level, so a cache shared between machines never hands a CPU code it cannot
execute. Where no compiler is found, the build fails, or the level is ``generic``,
``load()`` raises ``CpuKernelsUnavailable`` with the reason and callers fall back to the
torch kernels.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import re
import shutil
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from houchu import env as env_vars
from houchu.cpu import isa
from houchu.cpu.kernels.fakes import register_fakes

# torch.utils.cpp_extension is imported here, by the thread that imports houchu's model
# code (before any thread of houchu's starts: the runner actor imports it on its main
# thread), never first on the kernel-build thread (``load_in_background``). It imports
# setuptools, whose first import in a process runs ``_distutils_hack``'s override: a finder
# inserted at ``sys.meta_path[0]`` and removed again. The import system iterates that live
# list (until gh-130094: Python 3.14, backported to 3.13), so an import running meanwhile
# on another thread skips the finder after the one it was asking (the path finder) and a
# module that exists is "not found": a runner loading its GGUF while the kernel thread
# started failed so, with "No module named 'houchu.cli.fetch'"
# (``tests/integration/test_import_threads.py``).
try:
    from torch.utils import cpp_extension
except ImportError as _e:  # no setuptools: no builds here, torch's kernels serve
    cpp_extension = None
    _NO_CPP_EXTENSION = f"torch.utils.cpp_extension does not import ({_e})"

# The sources are compiled as two unity translation units, one per core of a 2-core
# machine: each unit parses the torch headers once (6 s of g++ per unit), where seven
# units spent 44 of the build's 82 CPU seconds there; the two units' own code is about
# 19 s each, so a first build takes about 20 s on 2 cores instead of 46 s.
_UNITS = (
    ("decode_layers.cpp", "gemv.cpp"),
    ("attention.cpp", "norm_rope.cpp", "prefill_attention.cpp", "quant.cpp", "argmax.cpp"),
)
_SOURCES = tuple(name for unit in _UNITS for name in unit)
_HEADERS = (
    "library.h",
    "vec.h",
    "simd.h",
    "neon.h",
    "argmax.h",
    "gemv.h",
    "gemv_a8.h",
    "gemv_a8_zmm.h",
    "gemm_a8.h",
    "gemv_a16.h",
    "norm_rope.h",
    "attention.h",
    "decode_layers.h",
)
# hidden visibility: each level's library binds its own copies of the shared inline
# kernels, so two levels loaded in one process (the tests load every level) never mix
_CFLAGS = [
    "-O3",
    "-fopenmp",
    "-fno-math-errno",
    "-std=c++17",
    "-fvisibility=hidden",
    "-fvisibility-inlines-hidden",
]


class CpuKernelsUnavailable(RuntimeError):
    """The C++ CPU kernels cannot be built or loaded here (the message says why)."""


def cache_dir() -> Path:
    """Where built kernels are kept (``$HOUCHU_KERNEL_CACHE`` or
    ``~/.cache/houchu/cpu_kernels``)."""
    return env_vars.kernel_cache() or Path.home() / ".cache" / "houchu" / "cpu_kernels"


def build_key(level: str, sources: list[Path]) -> str:
    """The cache folder's name of ``level``'s build of ``sources``: ``<level>-<hash>``,
    the hash over the level, the sources' paths and contents, the compiler flags and the
    torch version."""
    h = hashlib.sha256()
    h.update(level.encode())
    for p in sources:
        # the path too: the build folder's build.ninja names the sources by absolute
        # path, so two checkouts sharing one key would rebuild each other's build
        h.update(str(p.resolve()).encode())
        h.update(p.read_bytes())
    h.update(" ".join(_flags(level)).encode())
    h.update(repr(_UNITS).encode())
    h.update(torch.__version__.encode())
    return f"{level}-{h.hexdigest()[:16]}"


_BUILD_NAME = re.compile(r"^[a-z0-9_]+-[0-9a-f]{16}$")  # build_key's names
STALE_BUILD_S = 14 * 86400  # a build unused this long is removed (seconds)


def prune_stale_builds(keep: Path, max_age_s: float = STALE_BUILD_S) -> list[Path]:
    """Remove the kernel builds in ``cache_dir()`` that no process loaded for
    ``max_age_s`` seconds (a load touches its folder), so that upgrades and edits do not
    pile up builds of about 3 MB each. ``keep`` and any build whose lock another process
    holds (building) stay. Returns the folders removed; errors are ignored (another
    process may prune the same folder)."""
    removed = []
    now = time.time()
    for d in cache_dir().glob("*-*"):
        if not _BUILD_NAME.match(d.name) or d == keep or not d.is_dir():
            continue
        if now - d.stat().st_mtime < max_age_s:
            continue
        try:
            with open(d / "houchu.lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                shutil.rmtree(d)
            removed.append(d)
        except OSError:
            continue
    return removed


def _flags(level: str) -> list[str]:
    return [*_CFLAGS, *isa.level(level).cflags, f"-DHOUCHU_LIB=houchu_cpu_{level}"]


_active: str | None = None  # the level this process uses, once chosen
_loaded: bool = False  # whether the active level's kernels are loaded


def active_level() -> str:
    """The ISA level this process uses (``select``'s choice; chosen with
    ``isa.choose()`` on first call when nothing was selected)."""
    global _active
    if _active is None:
        _active = isa.choose()
    return _active


def select(level: str | None) -> str:
    """Use ``level`` (None or "auto": ``$HOUCHU_CPU_ISA`` or the best this CPU runs) for
    this process's kernels from now on; returns the level chosen. Already-built models
    keep working (every level shares the packed weight layouts).

    Raises:
        ValueError: an unknown level or one this CPU cannot run.
    """
    global _active, _loaded
    _active = isa.choose(None if level == "auto" else level)
    _loaded = _active in _built_levels
    return _active


def ops(level: str | None = None):  # noqa: ANN201 (a torch.ops namespace)
    """The operator namespace of ``level`` (default: the active one):
    ``torch.ops.houchu_cpu_<level>``. Load it first (``load``)."""
    # torch.ops keeps each namespace as an attribute once made, so this is a plain
    # lookup; a dict of our own filled here would be a side effect that torch.compile
    # guards on (empty at the first compile, filled after: every piece compiled twice)
    return getattr(torch.ops, f"houchu_cpu_{level or _active or active_level()}")


def load(verbose: bool = False, level: str | None = None) -> float:
    """Build (first time on this machine) and load ``level``'s kernels (default: the
    active level) into this process.

    Returns:
        seconds it took (build and load; a cached build loads in well under a second).
    Raises:
        CpuKernelsUnavailable: the level is ``generic``, this CPU cannot run it, not
            Linux, no C++ compiler or ninja, or the build failed (the compiler's last
            lines are in the message).
    """
    global _loaded
    name = level or active_level()
    if name in _failed:  # tried once in this process: the same answer, not another build
        raise CpuKernelsUnavailable(_failed[name])
    try:
        t = _load_once(name, verbose)
    except CpuKernelsUnavailable as e:
        _failed[name] = str(e)
        raise
    if name == active_level():
        _loaded = True
    return t


_built_levels: set[str] = set()
_failed: dict[str, str] = {}


def is_loaded() -> bool:
    """Whether the active level's kernels are loaded in this process (never builds)."""
    return _loaded


@functools.cache
def _load_once(level: str, verbose: bool) -> float:
    lv = isa.level(level)
    if not lv.kernels:
        raise CpuKernelsUnavailable(f"CPU ISA level {level}: torch's kernels only")
    if not isa.runs(lv):
        raise CpuKernelsUnavailable(isa.why_not(lv))
    if sys.platform != "linux":
        raise CpuKernelsUnavailable(f"built only on Linux, not {sys.platform}")
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        raise CpuKernelsUnavailable(f"no C++ compiler ({cxx!r} not on PATH)")
    if cpp_extension is None:
        raise CpuKernelsUnavailable(_NO_CPP_EXTENSION)
    if not cpp_extension.is_ninja_available():
        raise CpuKernelsUnavailable("ninja is not installed (pip install ninja)")
    here = Path(__file__).parent
    sources = [here / s for s in _SOURCES]
    key = build_key(level, sources + [here / h for h in _HEADERS])
    build = cache_dir() / key
    t0 = time.perf_counter()
    try:
        build.mkdir(parents=True, exist_ok=True)
        lock = open(build / "houchu.lock", "w")  # noqa: SIM115 (held across the build)
    except OSError as e:  # a read-only or shared cache folder, or a file in its way
        _load_read_only(build, e)
    else:
        # one builder at a time per machine; the kernel drops this lock if its holder
        # dies, unlike cpp_extension's own lock file, which a killed build leaves behind
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            (build / "lock").unlink(missing_ok=True)
            if not any(build.glob("*.so")):
                print(
                    f"houchu: building the {level} C++ CPU kernels in {build} (once)",
                    file=sys.stderr,
                )
            _build(cpp_extension, key, level, sources, build, verbose)
        os.utime(build)  # marks the build as in use, for prune_stale_builds
        prune_stale_builds(keep=build)
    register_fakes(level)
    _built_levels.add(level)
    return time.perf_counter() - t0


def _load_read_only(build: Path, error: OSError) -> None:
    """Load the finished build in ``build`` as it is, where the cache cannot be written.

    Raises:
        CpuKernelsUnavailable: no finished build there (the message names the folder
            and ``$HOUCHU_KERNEL_CACHE``).
    """
    libs = sorted(build.glob("*.so")) if build.is_dir() else []
    if not libs:
        raise CpuKernelsUnavailable(
            f"the kernel cache {build} cannot be written ({error.strerror or error}) and "
            "holds no finished build: set HOUCHU_KERNEL_CACHE to a writable folder"
        ) from error
    try:
        torch.ops.load_library(str(libs[0]))
    except (OSError, RuntimeError) as e:
        raise CpuKernelsUnavailable(f"loading the read-only build {libs[0]} failed: {e}") from e


def load_in_background(level: str | None = None, every_s: float = 10.0) -> Future[str | None]:
    """Start ``load(level)`` on a thread of its own (the build is compiler processes, so
    the caller's work goes on meanwhile); a build prints how long it has run every
    ``every_s`` seconds. The future's result is ``unavailable_reason``'s (never raises).
    """
    name = level or active_level()
    done = threading.Event()

    def work() -> str | None:
        try:
            return unavailable_reason(name)
        finally:
            done.set()

    if isa.level(name).kernels and not is_built(name):
        t0 = time.perf_counter()

        def progress() -> None:
            while not done.wait(every_s):
                took = time.perf_counter() - t0
                print(f"houchu: building the {name} C++ CPU kernels: {took:.0f} s", file=sys.stderr)

        threading.Thread(target=progress, name="houchu-kernel-build-progress", daemon=True).start()
    pool = ThreadPoolExecutor(1, thread_name_prefix="houchu-kernel-build")
    future = pool.submit(work)
    pool.shutdown(wait=False)
    return future


def current_build_key(level: str | None = None) -> str:
    """The cache folder name ``level``'s build (default: the active one) has with the
    sources as they are now ("" for ``generic``)."""
    name = level or active_level()
    if not isa.level(name).kernels:
        return ""
    here = Path(__file__).parent
    return build_key(name, [here / s for s in _SOURCES] + [here / h for h in _HEADERS])


def is_built(level: str | None = None) -> bool:
    """Whether ``level``'s build (default: the active level) is in the cache already,
    so ``load`` would only load it (never builds)."""
    name = level or active_level()
    if not isa.level(name).kernels:
        return False
    return any((cache_dir() / current_build_key(name)).glob("*.so"))


def write_units(sources: list[Path], build: Path) -> list[Path]:
    """Write ``_UNITS``' unity translation units into ``build`` (``unit<i>.cpp``, each
    ``#include``-ing its sources by absolute path, so compiler messages name the real
    files); rewritten only when their text changes, so ninja does not rebuild a built
    unit. Returns their paths."""
    by_name = {s.name: s for s in sources}
    units = []
    for i, names in enumerate(_UNITS):
        text = "".join(f'#include "{by_name[n].resolve()}"\n' for n in names)
        unit = build / f"unit{i}.cpp"
        if not unit.exists() or unit.read_text() != text:
            unit.write_text(text)
        units.append(unit)
    return units


def _build(
    cpp_extension, key: str, level: str, sources: list[Path], build: Path, verbose: bool
) -> None:  # noqa: ANN001
    try:
        cpp_extension.load(
            name=f"houchu_cpu_{key.replace('-', '_')}",
            sources=[str(u) for u in write_units(sources, build)],
            extra_cflags=_flags(level),
            extra_ldflags=["-fopenmp"],
            build_directory=str(build),
            is_python_module=False,
            verbose=verbose,
        )
    except (RuntimeError, OSError, ImportError) as e:
        lines = str(e).strip().splitlines()
        errors = [x for x in lines if "error" in x.lower()] or lines
        tail = "\n".join(errors[-4:])
        raise CpuKernelsUnavailable(f"building the C++ CPU kernels failed: {tail}") from e


def unavailable_reason(level: str | None = None) -> str | None:
    """None if ``level``'s kernels (default: the active level's) load here, building
    them if needed, else why not; never raises, and tries only once per level."""
    try:
        load(level=level)
    except CpuKernelsUnavailable as e:
        return str(e)
    return None


#: Levels whose prefill_attention has no tiled SIMD path (it would run its scalar
#: reference loop): the NEON levels, whose prefill runs on torch's SDPA instead.
_NO_TILED_PREFILL = frozenset({"neon_dotprod", "neon"})


def tiled_prefill(level: str | None = None) -> bool:
    """Whether ``prefill_attention`` has a tiled SIMD path at ``level`` (default: the
    active one): AVX-512 and AVX2, not yet NEON."""
    return (level or active_level()) not in _NO_TILED_PREFILL


def available(level: str | None = None) -> bool:
    """Whether ``level``'s kernels load here (see ``unavailable_reason``)."""
    return unavailable_reason(level) is None


def int8_int16_acts(dtype: torch.dtype, level: str | None = None) -> bool:
    """Whether ``int8_gemv`` at ``level`` (default: the active one) quantizes activations
    of ``dtype`` to int16 per 64 inputs and sums in integers (``gemv_a16.h``): at every
    x86 level, for float32 and bfloat16 alike; elsewhere the activations are used as
    they are."""
    return isa.x86_kernels(level or active_level()) and dtype in (torch.float32, torch.bfloat16)
