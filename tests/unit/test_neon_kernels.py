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

import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from houchu.model import cpu_isa, cpu_kernels

CXX = "aarch64-linux-gnu-g++"
QEMU = "qemu-aarch64"
SYSROOT = Path("/usr/aarch64-linux-gnu")
ROOT = Path(cpu_kernels.__file__).resolve().parents[2]  # the repository root (houchu/)
SOURCE = Path(__file__).parent / "native" / "neon_kernels.cpp"
TORCH_INCLUDE = Path(torch.__file__).parent / "include"


def _missing() -> str | None:
    for tool, package in ((CXX, "g++-aarch64-linux-gnu"), (QEMU, "qemu-user")):
        if shutil.which(tool) is None:
            return f"{tool} not found (apt-get install {package}; .ci/install-cross does it)"
    if not (SYSROOT / "lib").is_dir():
        return f"no aarch64 sysroot at {SYSROOT} (apt-get install g++-aarch64-linux-gnu)"
    return None


needs_cross = pytest.mark.skipif(_missing() is not None, reason=_missing() or "")


def _compile(level: str, out: Path, *extra: str) -> list[str]:
    """The (cross-)compiler command line of ``level``'s build flags (those the real
    extension is built with), the torch headers on the include path."""
    flags = [f for f in cpu_kernels._flags(level) if not f.startswith("-DHOUCHU_LIB")]  # noqa: SLF001
    if "+dotprod" in " ".join(cpu_isa.level(level).cflags):
        flags.append("-DHOUCHU_EXPECT_DOTPROD")
    return [CXX, *flags, "-w", f"-I{ROOT}", f"-I{TORCH_INCLUDE}", *extra, "-o", str(out)]


def _build_and_run(cmd: list[str], exe: Path, runner: list[str]) -> str:
    build = subprocess.run(
        [*cmd, str(SOURCE)], capture_output=True, text=True, cwd=ROOT, timeout=600, check=False
    )
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run(
        [*runner, str(exe)], capture_output=True, text=True, timeout=300, check=False
    )
    print(run.stdout)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert run.stdout.strip().endswith(" 0 failed")
    return run.stdout


@needs_cross
@pytest.mark.parametrize("level", ["neon_dotprod", "neon"])
def test_neon_kernels_match_the_scalar_references(level, tmp_path):
    exe = tmp_path / f"neon_kernels_{level}"
    out = _build_and_run(_compile(level, exe), exe, [QEMU, "-L", str(SYSROOT)])
    assert int(out.split()[-4]) > 100_000  # every check ran


def test_avx2_kernels_match_the_same_references(tmp_path):
    """The same program built natively at the avx2 level: the AVX2 kernels meet the same
    bit-exact GEMV references, so the NEON and AVX2 levels compute the same floats."""
    lv = cpu_isa.level("avx2")
    if not cpu_isa.runs(lv, capped=False):
        pytest.skip(cpu_isa.why_not(lv))
    if shutil.which("g++") is None:
        pytest.skip("no g++ on this host")
    exe = tmp_path / "kernels_avx2"
    cmd = ["g++", *_compile("avx2", exe)[1:]]
    out = _build_and_run(cmd, exe, [])
    assert int(out.split()[-4]) > 50_000


@needs_cross
def test_operator_sources_compile_for_aarch64(tmp_path):
    """Every operator file compiles at the ``neon`` level, as the build compiles them:
    its two unity translation units (``cpu_kernels.write_units``), checked side by side,
    so the NEON branches the program above does not include (the argmax and attention
    operators, the fused decode layers, prefill attention) are checked too."""
    here = Path(cpu_kernels.__file__).parent
    units = cpu_kernels.write_units([here / s for s in cpu_kernels._SOURCES], tmp_path)  # noqa: SLF001
    cmd = _compile("neon", tmp_path / "unused", "-fsyntax-only")
    cmd = [c for c in cmd if c not in ("-o", str(tmp_path / "unused"))]
    cmd.append(f"-I{TORCH_INCLUDE / 'torch' / 'csrc' / 'api' / 'include'}")
    builds = [subprocess.Popen([*cmd, str(u)], stderr=subprocess.PIPE, text=True) for u in units]
    for unit, build in zip(units, builds, strict=True):
        _, err = build.communicate(timeout=600)
        assert build.returncode == 0, f"{unit.name}: {err[-4000:]}"
