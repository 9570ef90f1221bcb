"""houchu's aarch64 NEON kernels (the ``neon`` and ``neon_dotprod`` levels), tested on any
host: ``native/neon_kernels.cpp`` is cross-compiled with each level's own flags
(``cpu_kernels``' build flags plus ``cpu_isa``'s target) and run under qemu's user-mode
emulator, where it checks every NEON kernel against a scalar reference on random inputs
(int4 / int8 / W4A8 GEMV bit for bit against the AVX2 kernels' float32 steps; attention,
RMSNorm, RoPE, SiLU, exp, bfloat16 rounding and argmax). Built natively at the avx2
level, the same program holds the AVX2 kernels to the same bit-exact references.

Needs Debian's ``g++-aarch64-linux-gnu`` and ``qemu-user`` (``.ci/install-cross`` installs
them); skipped with the reason where either is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

from houchu.cpu import isa as cpu_isa
from houchu.cpu import kernels as cpu_kernels

pytestmark = pytest.mark.slow

CXX = "aarch64-linux-gnu-g++"
QEMU = "qemu-aarch64"
SYSROOT = Path("/usr/aarch64-linux-gnu")
ROOT = Path(cpu_kernels.__file__).resolve().parents[2]  # the repository root (houchu/)
SOURCE = Path(__file__).parent / "native" / "neon_kernels.cpp"
TORCH_INCLUDE = Path(torch.__file__).parent / "include"
NEON_LEVELS = ["neon_dotprod", "neon"]


def _missing() -> str | None:
    for tool, package in ((CXX, "g++-aarch64-linux-gnu"), (QEMU, "qemu-user")):
        if shutil.which(tool) is None:
            return f"{tool} not found (apt-get install {package}; .ci/install-cross does it)"
    if not (SYSROOT / "lib").is_dir():
        return f"no aarch64 sysroot at {SYSROOT} (apt-get install g++-aarch64-linux-gnu)"
    return None


needs_cross = pytest.mark.skipif(_missing() is not None, reason=_missing() or "")


def _avx2_missing() -> str | None:
    lv = cpu_isa.level("avx2")
    if not cpu_isa.runs(lv, capped=False):
        return cpu_isa.why_not(lv)
    if shutil.which("g++") is None:
        return "no g++ on this host"
    return None


def _compile(level: str, out: Path, *extra: str) -> list[str]:
    """The (cross-)compiler command line of ``level``'s build flags (those the real
    extension is built with), the torch headers on the include path."""
    flags = [f for f in cpu_kernels._flags(level) if not f.startswith("-DHOUCHU_LIB")]  # noqa: SLF001
    flags.append("-DHOUCHU_NO_LIBTORCH")  # (the program links no libtorch)
    if "+dotprod" in " ".join(cpu_isa.level(level).cflags):
        flags.append("-DHOUCHU_EXPECT_DOTPROD")
    return [CXX, *flags, "-w", f"-I{ROOT}", f"-I{TORCH_INCLUDE}", *extra, "-o", str(out)]


Ran = tuple[subprocess.CompletedProcess, subprocess.CompletedProcess | None]


def _build_and_run(cmd: list[str], exe: Path, runner: list[str]) -> Ran:
    """Build ``SOURCE`` with ``cmd`` and, if that succeeded, run the program."""
    build = subprocess.run(
        [*cmd, str(SOURCE)], capture_output=True, text=True, cwd=ROOT, timeout=600, check=False
    )
    if build.returncode != 0:
        return build, None
    run = subprocess.run(
        [*runner, str(exe)], capture_output=True, text=True, timeout=300, check=False
    )
    return build, run


def _checked(ran: Ran) -> str:
    """The output of a build and a run of ``SOURCE``, asserted to pass every check."""
    build, run = ran
    assert build.returncode == 0, build.stderr[-4000:]
    assert run is not None
    print(run.stdout)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert run.stdout.strip().endswith(" 0 failed")
    return run.stdout


def _unit_checks(tmp: Path) -> list[Callable[[], subprocess.CompletedProcess]]:
    """The ``neon``-level syntax checks of the build's unity translation units, written
    into ``tmp``."""
    here = Path(cpu_kernels.__file__).parent
    units = cpu_kernels.write_units([here / s for s in cpu_kernels._SOURCES], tmp)  # noqa: SLF001
    cmd = _compile("neon", tmp / "unused", "-fsyntax-only")
    cmd = [c for c in cmd if c not in ("-o", str(tmp / "unused"))]
    cmd.append(f"-I{TORCH_INCLUDE / 'torch' / 'csrc' / 'api' / 'include'}")
    return [
        partial(subprocess.run, [*cmd, str(u)], stderr=subprocess.PIPE, text=True, timeout=600)
        for u in units
    ]


class Builds:
    """The compiler (and program) runs of this module's tests, each test's keyed by its
    name, on a pool of as many threads as this process has cores (a thread only waits
    for its process): ``start`` queues a test's runs, ``results`` waits for them
    (queuing them first if they are not)."""

    def __init__(self, work: dict[str, list[Callable[[], Any]]]) -> None:
        self._work = work
        self._pool = ThreadPoolExecutor(max_workers=len(os.sched_getaffinity(0)))
        self._started: dict[str, list[Future]] = {}

    def start(self, test: str) -> None:
        if test not in self._started:
            self._started[test] = [self._pool.submit(fn) for fn in self._work[test]]

    def results(self, test: str) -> list[Any]:
        self.start(test)
        return [f.result() for f in self._started[test]]

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="module")
def builds(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Builds]:
    """The builds of this module's tests, shared so that they run side by side: each is
    an independent compiler process (11-14 s of one core: ``-O3`` over the torch
    headers; the units' syntax checks 5 s each), so when the first test needs one,
    those of every test of this module that the session runs and that is not skipped
    start together, as many at a time as the host has cores, in the order the tests
    run. Each test still checks its own builds and runs (``Builds.results`` of its
    name), with the same commands, sources and flags as when it built them itself."""
    tmp = tmp_path_factory.mktemp("native")
    neon_test = test_neon_kernels_match_the_scalar_references.__name__
    avx2_test = test_avx2_kernels_match_the_same_references.__name__
    work: dict[str, list[Callable[[], Any]]] = {}
    missing: dict[str, str | None] = {}
    for level in NEON_LEVELS:
        exe, name = tmp / f"neon_kernels_{level}", f"{neon_test}[{level}]"
        work[name] = [
            partial(_build_and_run, _compile(level, exe), exe, [QEMU, "-L", str(SYSROOT)])
        ]
        missing[name] = _missing()
    exe = tmp / "kernels_avx2"
    work[avx2_test] = [partial(_build_and_run, ["g++", *_compile("avx2", exe)[1:]], exe, [])]
    missing[avx2_test] = _avx2_missing()
    units_test = test_operator_sources_compile_for_aarch64.__name__
    work[units_test] = _unit_checks(tmp)
    missing[units_test] = _missing()
    out = Builds(work)
    try:
        for item in request.session.items:  # in the order they run
            if item.path == request.path and item.name in work and missing[item.name] is None:
                out.start(item.name)
        yield out
    finally:
        out.close()


@needs_cross
@pytest.mark.parametrize("level", NEON_LEVELS)
def test_neon_kernels_match_the_scalar_references(level, builds, request):
    (ran,) = builds.results(request.node.name)
    out = _checked(ran)
    assert int(out.split()[-4]) > 100_000  # every check ran


def test_avx2_kernels_match_the_same_references(builds, request):
    """The same program built natively at the avx2 level: the AVX2 kernels meet the same
    bit-exact GEMV references, so the NEON and AVX2 levels compute the same floats."""
    why = _avx2_missing()
    if why is not None:
        pytest.skip(why)
    (ran,) = builds.results(request.node.name)
    out = _checked(ran)
    assert int(out.split()[-4]) > 50_000


@needs_cross
def test_operator_sources_compile_for_aarch64(builds, request):
    """Every operator file compiles at the ``neon`` level, as the build compiles them:
    its two unity translation units (``cpu_kernels.write_units``), checked side by side,
    so the NEON branches the program above does not include (the argmax and attention
    operators, the fused decode layers, prefill attention) are checked too."""
    for build in builds.results(request.node.name):
        assert build.returncode == 0, f"{Path(build.args[-1]).name}: {build.stderr[-4000:]}"
