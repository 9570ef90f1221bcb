"""Instruction-set levels of houchu's C++ CPU kernels, and which of them this CPU runs.

Each level is one build of the same sources with its own compiler target flags (not
``-march=native``), so a build runs on every CPU that has the level's features, and the
level is picked at run time from the CPU's feature flags (``/proc/cpuinfo``), as
llama.cpp's per-ISA CPU backends and PyTorch's ``CPU_CAPABILITY`` dispatch do:

| level | x86-64 / aarch64 features it needs | compiler target |
|---|---|---|
| ``avx512_bf16`` | AVX-512 F/BW/VL/DQ/CD + AVX512-BF16 + AVX512-VNNI | x86-64-v4 + bf16, vnni |
| ``avx512`` | AVX-512 F/BW/VL/DQ/CD | x86-64-v4 |
| ``avx2_vnni`` | ``avx2``'s + AVX-VNNI (int8 dot products without AVX-512) | x86-64-v3 + avxvnni |
| ``avx2`` | AVX2, FMA, F16C, BMI1/2, LZCNT, MOVBE | x86-64-v3 |
| ``neon_dotprod`` | aarch64 NEON (``asimd``) + int8 dot products (``asimddp``: SDOT) | armv8.2-a+dotprod |
| ``neon`` | aarch64 NEON (``asimd``; every aarch64 CPU) | armv8-a |
| ``generic`` | none: houchu's C++ kernels are not used, torch's vectorized ops serve | — |

On aarch64 ``/proc/cpuinfo`` lists the features on its ``Features`` line (``fp asimd
... asimddp ...``); the two NEON levels run the AVX2 level's arithmetic in 4-lane NEON
vectors (``cpu_kernels/neon.h``), the W4A8 kernels with SDOT (``vdotq_s32``) at
``neon_dotprod`` and widening multiplies (``vmull_s8``) at ``neon``.

``--cpu-isa`` (or ``HOUCHU_CPU_ISA``) forces a level; a level the CPU cannot run is an
error, never a crash in an illegal instruction.
"""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path

from houchu import env as env_vars


@dataclass(frozen=True)
class Level:
    """One instruction-set level.

    Attributes:
        name: the level's name (``--cpu-isa`` takes it).
        arch: ``platform.machine()`` values it exists on.
        needs: CPU feature flags (as ``/proc/cpuinfo`` spells them) it needs.
        cflags: compiler target flags of its build.
        kernels: whether houchu has C++ kernels of its own at this level (``generic``:
            none, torch's ops serve).
    """

    name: str
    arch: tuple[str, ...]
    needs: frozenset[str]
    cflags: tuple[str, ...]
    kernels: bool = True


_X86 = ("x86_64", "AMD64")
_ARM = ("aarch64", "arm64")
_V3 = frozenset({"avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "abm", "movbe"})
_V4 = _V3 | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"}

#: Best first: ``best()`` picks the first one the CPU runs.
LEVELS: tuple[Level, ...] = (
    Level(
        "avx512_bf16",
        _X86,
        _V4 | {"avx512_bf16", "avx512_vnni"},
        ("-march=x86-64-v4", "-mavx512bf16", "-mavx512vnni"),
    ),
    Level("avx512", _X86, _V4, ("-march=x86-64-v4",)),
    Level("avx2_vnni", _X86, _V3 | {"avx_vnni"}, ("-march=x86-64-v3", "-mavxvnni")),
    Level("avx2", _X86, _V3, ("-march=x86-64-v3",)),
    Level("neon_dotprod", _ARM, frozenset({"asimd", "asimddp"}), ("-march=armv8.2-a+dotprod",)),
    Level("neon", _ARM, frozenset({"asimd"}), ("-march=armv8-a",)),
    Level("generic", (), frozenset(), (), kernels=False),
)
NAMES = tuple(lv.name for lv in LEVELS)


def level(name: str) -> Level:
    """The level called ``name`` (any case).

    Raises:
        ValueError: no such level (the message lists them).
    """
    for lv in LEVELS:
        if lv.name == name.lower():  # "AVX2" as torch's own variables spell it
            return lv
    raise ValueError(f"unknown CPU ISA level {name!r} (one of {', '.join(NAMES)})")


def _cpuinfo_field(keys: tuple[str, ...], cpuinfo: str | None) -> str | None:
    """The value of the first line of ``/proc/cpuinfo`` (or of the ``cpuinfo`` text
    given) whose key is one of ``keys``; None where there is none."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in keys:
            return value.strip()
    return None


def cpu_features(cpuinfo: str | None = None) -> frozenset[str]:
    """This CPU's feature flags: the ``flags`` (x86) or ``Features`` (arm) line of
    ``/proc/cpuinfo`` (or of the ``cpuinfo`` text given), empty where there is none."""
    return frozenset((_cpuinfo_field(("flags", "Features"), cpuinfo) or "").split())


def cpu_model(cpuinfo: str | None = None) -> str:
    """This CPU's model name: the ``model name`` line of ``/proc/cpuinfo`` (or of the
    ``cpuinfo`` text given; arm: ``Hardware`` or ``CPU part``), else the platform's
    processor and machine names."""
    name = _cpuinfo_field(("model name", "Hardware", "CPU part"), cpuinfo)
    return name or platform.processor() or platform.machine()


def runs(
    lv: Level,
    features: frozenset[str] | None = None,
    machine: str | None = None,
    capped: bool = True,
) -> bool:
    """Whether a CPU with ``features`` (default: this one's) on ``machine`` (default:
    this one) can run level ``lv``'s build. ``$HOUCHU_CPU_ISA_MAX`` caps the levels
    (e.g. ``avx2``: this CPU is treated as one without AVX-512, as a cluster of mixed
    CPUs or a test of the AVX2 machines' suite wants)."""
    if not lv.kernels:
        return True
    cap = env_vars.cpu_isa_max() if capped else None
    if cap and NAMES.index(lv.name) < NAMES.index(_cap_level(cap).name):
        return False
    machine = machine if machine is not None else platform.machine()
    features = features if features is not None else cpu_features()
    return machine in lv.arch and lv.needs <= features


def x86_kernels(name: str) -> bool:
    """Whether level ``name`` is one of houchu's x86 kernel builds (AVX2 to AVX-512),
    whose kernels have SIMD forms the NEON levels and ``generic`` lack."""
    lv = level(name)
    return lv.kernels and "x86_64" in lv.arch


def _cap_level(cap: str) -> Level:
    """``$HOUCHU_CPU_ISA_MAX``'s level.

    Raises:
        ValueError: not a level (the message names the variable and the levels).
    """
    try:
        lv = level(cap)
    except ValueError as e:
        raise ValueError(f"HOUCHU_CPU_ISA_MAX: {e}") from None
    if lv.kernels and platform.machine() not in lv.arch:
        raise ValueError(
            f"HOUCHU_CPU_ISA_MAX: {lv.name} is a level of {'/'.join(lv.arch)}, this CPU is "
            f"{platform.machine()}"
        )
    return lv


def usable(features: frozenset[str] | None = None, machine: str | None = None) -> list[str]:
    """The levels this CPU runs, best first (``generic`` always last)."""
    return [lv.name for lv in LEVELS if runs(lv, features, machine)]


def why_not(lv: Level, features: frozenset[str] | None = None) -> str:
    """Why this CPU cannot run ``lv`` (for skip reasons and errors)."""
    cap = env_vars.cpu_isa_max()
    if cap and NAMES.index(lv.name) < NAMES.index(_cap_level(cap).name):
        return f"{lv.name} is above HOUCHU_CPU_ISA_MAX={cap}"
    if platform.machine() not in lv.arch:
        return f"{lv.name} is a level of {'/'.join(lv.arch)}, this CPU is {platform.machine()}"
    missing = sorted(lv.needs - (features if features is not None else cpu_features()))
    return f"this CPU lacks {' '.join(missing)} (needed by {lv.name})"


def choose(requested: str | None = None) -> str:
    """The level this process uses: ``requested``, else (None or "auto")
    ``$HOUCHU_CPU_ISA``, else the best this CPU runs.

    Raises:
        ValueError: an unknown level, or one this CPU cannot run.
    """
    name = requested if requested not in (None, "auto") else None
    source = "--cpu-isa"
    if name is None and env_vars.cpu_isa():
        name, source = env_vars.cpu_isa(), env_vars.CPU_ISA
    if name is None or name == "auto":
        return usable()[0]
    try:
        lv = level(name)
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None
    if not runs(lv):
        raise ValueError(f"{source} {name}: {why_not(lv)}")
    return lv.name


#: Environment that keeps torch's own CPU kernels (ATen's dispatch, oneDNN, MKL) at or
#: below a level, so that on a bigger CPU a forced level measures what a CPU of that
#: level would run. Read when torch loads: set it in a fresh process.
_TORCH_ENV = {
    "avx2": {
        "ATEN_CPU_CAPABILITY": "avx2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    },
    "avx2_vnni": {
        "ATEN_CPU_CAPABILITY": "avx2",
        "ONEDNN_MAX_CPU_ISA": "AVX2_VNNI",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    },
    "avx512": {
        "ATEN_CPU_CAPABILITY": "avx512",
        "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
        "MKL_ENABLE_INSTRUCTIONS": "AVX512",
    },
}


def torch_env(name: str) -> dict[str, str]:
    """Environment variables that hold torch's own kernels to level ``name`` (none for
    the best levels and ``generic``, which use what torch picks on this CPU)."""
    return dict(_TORCH_ENV.get(name, {}))


_BF16 = frozenset({"avx512_bf16", "amx_bf16"})  # features that compute bf16 natively
_INT8 = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})  # int8 dot products


def native_units(name: str, features: frozenset[str] | None = None) -> frozenset[str]:
    """The matmul number formats torch's kernels compute natively at level ``name`` on
    this CPU: ``fp32`` always; ``bf16`` with AVX512-BF16 or AMX; ``int8`` with
    AVX512-VNNI, AVX-VNNI or AMX. A level forced below the CPU's best (with
    ``torch_env``, or capped by ``$HOUCHU_CPU_ISA_MAX``) keeps only the units its own
    features give (``avx2_vnni``: int8; ``avx2``, ``avx512``: none beyond fp32)."""
    f = features if features is not None else cpu_features()
    if name not in ("generic", _best_uncapped(f)):
        f = level(name).needs  # torch is held to the level: its features only
    units = {"fp32"}
    if f & _BF16:
        units.add("bf16")
    if f & _INT8:
        units.add("int8")
    return frozenset(units)


def torch_env_for(name: str, features: frozenset[str] | None = None) -> dict[str, str]:
    """``torch_env(name)`` where ``name`` is below this CPU's best level, else nothing
    (torch then picks for this CPU as it would anyway)."""
    return {} if name in ("generic", _best_uncapped(features)) else torch_env(name)


def _best_uncapped(features: frozenset[str] | None) -> str:
    """The CPU's best level, ignoring ``$HOUCHU_CPU_ISA_MAX``."""
    return next(lv.name for lv in LEVELS if runs(lv, features, capped=False))


_REPORTED = re.compile(r"^(avx2|avx512\w*|fma|avx_vnni|amx\w*|asimd|asimddp)$")


def isa_flags(features: frozenset[str] | None = None) -> frozenset[str]:
    """The CPU flags houchu's figures depend on (AVX2, FMA, AVX-512*, AVX-VNNI, AMX*;
    NEON / dotprod on arm), for reports beside every figure."""
    f = features if features is not None else cpu_features()
    return frozenset(x for x in f if _REPORTED.match(x))


def forced_below_best(name: str) -> bool:
    """Whether level ``name`` (with kernels) is below this CPU's best level (ignoring
    ``$HOUCHU_CPU_ISA_MAX``) while torch's own kernels are not held to it
    (``torch_env``): a level forced for a test or a comparison."""
    if not level(name).kernels or name == _best_uncapped(None):
        return False
    return any(os.environ.get(k) != v for k, v in torch_env(name).items())
