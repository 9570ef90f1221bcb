"""ISA levels of the C++ CPU kernels (``houchu.cpu.isa``, ``houchu.cpu.kernels``):
detection from the CPU's flags, the forced level, and a kernel cache keyed by level that
never hands a CPU a build it cannot run."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from houchu.cpu import isa as cpu_isa
from houchu.cpu import kernels as cpu_kernels

V3 = "fpu sse2 avx avx2 fma f16c bmi1 bmi2 abm movbe"
AVX512 = V3 + " avx512f avx512bw avx512vl avx512dq avx512cd"
CPUINFO = "processor\t: 0\nflags\t\t: {}\n\nprocessor\t: 1\nflags\t\t: {}\n"


@pytest.fixture(autouse=True)
def _no_cap(monkeypatch):
    monkeypatch.delenv("HOUCHU_CPU_ISA_MAX", raising=False)  # the CPU as it is
    monkeypatch.delenv("HOUCHU_CPU_ISA", raising=False)
    # the process's level as it was: one chosen here, uncapped (``load`` asks for it),
    # would outlive the test, and a capped run's later tests could not select it back
    monkeypatch.setattr(cpu_kernels, "_active", cpu_kernels._active)  # noqa: SLF001
    monkeypatch.setattr(cpu_kernels, "_loaded", cpu_kernels._loaded)  # noqa: SLF001


def features(flags: str) -> frozenset[str]:
    return cpu_isa.cpu_features(CPUINFO.format(flags, flags))


def test_levels_follow_the_cpu_flags():
    x86 = "x86_64"
    assert cpu_isa.usable(features(V3), x86) == ["avx2", "generic"]
    assert cpu_isa.usable(features(AVX512), x86) == ["avx512", "avx2", "generic"]
    bf16 = features(AVX512 + " avx512_bf16 avx512_vnni")
    assert cpu_isa.usable(bf16, x86) == ["avx512_bf16", "avx512", "avx2", "generic"]
    laptop = features(V3 + " avx_vnni")  # AVX-VNNI without AVX-512 (Alder Lake and later)
    assert cpu_isa.usable(laptop, x86) == ["avx2_vnni", "avx2", "generic"]
    assert "-mavxvnni" in cpu_isa.level("avx2_vnni").cflags
    assert cpu_isa.usable(features("fpu sse2 sse4_2"), x86) == ["generic"]
    assert cpu_isa.usable(features(AVX512), "aarch64") == ["generic"]  # x86 flags on arm
    arm = cpu_isa.cpu_features("processor\t: 0\nFeatures\t: fp asimd asimddp\n")
    assert arm == {"fp", "asimd", "asimddp"}
    assert cpu_isa.usable(arm, "aarch64") == ["neon_dotprod", "neon", "generic"]
    a72 = cpu_isa.cpu_features("processor\t: 0\nFeatures\t: fp asimd evtstrm crc32\n")
    assert cpu_isa.usable(a72, "aarch64") == ["neon", "generic"]  # no dotprod (Cortex-A72)
    assert cpu_isa.usable(arm, "x86_64") == ["generic"]
    assert cpu_isa.usable(features(AVX512), "x86_64")[0] == "avx512"  # never a NEON level
    assert "+dotprod" in cpu_isa.level("neon_dotprod").cflags[0]
    # NEON has no tiled prefill kernel: its prefill runs on torch's SDPA (attention_cpu)
    assert not cpu_kernels.tiled_prefill("neon") and cpu_kernels.tiled_prefill("avx2")
    assert cpu_isa.isa_flags(bf16) == {
        "avx2",
        "fma",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512dq",
        "avx512cd",
        "avx512_bf16",
        "avx512_vnni",
    }


def test_forced_level(monkeypatch):
    v3 = features(V3)
    monkeypatch.setattr(cpu_isa, "cpu_features", lambda cpuinfo=None: v3)
    monkeypatch.setattr(cpu_isa.platform, "machine", lambda: "x86_64")
    assert cpu_isa.choose() == "avx2"
    assert cpu_isa.choose("generic") == "generic"
    monkeypatch.setenv("HOUCHU_CPU_ISA", "generic")
    assert cpu_isa.choose() == "generic" and cpu_isa.choose("auto") == "generic"
    with pytest.raises(ValueError, match="lacks avx512bw avx512cd avx512dq avx512f avx512vl"):
        cpu_isa.choose("avx512")
    with pytest.raises(ValueError, match="unknown CPU ISA level 'sse9'"):
        cpu_isa.choose("sse9")


def test_cache_key_names_the_level():
    here = Path(cpu_kernels.__file__).parent
    srcs = [here / "gemv.cpp", here / "gemv.h"]
    names = ("avx512_bf16", "avx512", "avx2", "neon_dotprod", "neon")
    keys = {lv: cpu_kernels.build_key(lv, srcs) for lv in names}
    assert len(set(keys.values())) == 5
    for lv, key in keys.items():
        assert key.startswith(f"{lv}-")
    # the level's own target flags are in its build, never -march=native
    assert "-march=x86-64-v3" in cpu_kernels._flags("avx2")  # noqa: SLF001
    assert not any("native" in f for lv in keys for f in cpu_kernels._flags(lv))  # noqa: SLF001


def test_the_unity_units_hold_every_source_once(tmp_path):
    """Each source is in exactly one unity unit, and a unit includes its sources by
    absolute path (so compiler messages name the real files)."""
    names = [n for unit in cpu_kernels._UNITS for n in unit]  # noqa: SLF001
    assert sorted(names) == sorted(cpu_kernels._SOURCES)  # noqa: SLF001
    here = Path(cpu_kernels.__file__).parent
    units = cpu_kernels.write_units([here / s for s in cpu_kernels._SOURCES], tmp_path)  # noqa: SLF001
    assert [u.name for u in units] == ["unit0.cpp", "unit1.cpp"]
    text = "".join(u.read_text() for u in units)
    for n in names:
        assert text.count(f'#include "{(here / n).resolve()}"') == 1
    stamp = units[0].stat().st_mtime_ns
    cpu_kernels.write_units([here / s for s in cpu_kernels._SOURCES], tmp_path)  # noqa: SLF001
    assert units[0].stat().st_mtime_ns == stamp  # unchanged text: not rewritten


def test_a_cached_build_is_not_loaded_on_a_cpu_without_its_level(monkeypatch, tmp_path):
    """Even with the level's build in the (shared) cache folder, a CPU that lacks the
    level gets CpuKernelsUnavailable, not the library."""
    monkeypatch.setenv("HOUCHU_KERNEL_CACHE", str(tmp_path))
    here = Path(cpu_kernels.__file__).parent
    srcs = [here / s for s in cpu_kernels._SOURCES] + [here / h for h in cpu_kernels._HEADERS]  # noqa: SLF001
    key = cpu_kernels.build_key("avx512", srcs)
    (tmp_path / key).mkdir()
    (tmp_path / key / f"houchu_cpu_{key}.so").write_bytes(b"not for this CPU")
    assert cpu_kernels.is_built("avx512")
    v3 = features(V3)
    monkeypatch.setattr(cpu_isa, "cpu_features", lambda cpuinfo=None: v3)
    monkeypatch.setattr(cpu_kernels, "_failed", {})
    cpu_kernels._load_once.cache_clear()  # noqa: SLF001
    with pytest.raises(cpu_kernels.CpuKernelsUnavailable, match="lacks .*avx512f"):
        cpu_kernels.load(level="avx512")
    cpu_kernels._load_once.cache_clear()  # noqa: SLF001
    monkeypatch.undo()


def test_an_arm_cpu_without_dotprod_never_loads_the_dotprod_build(monkeypatch):
    a72 = cpu_isa.cpu_features("processor\t: 0\nFeatures\t: fp asimd evtstrm crc32\n")
    monkeypatch.setattr(cpu_isa, "cpu_features", lambda cpuinfo=None: a72)
    monkeypatch.setattr(cpu_isa.platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(cpu_kernels, "_failed", {})
    cpu_kernels._load_once.cache_clear()  # noqa: SLF001
    assert cpu_isa.choose() == "neon"
    with pytest.raises(cpu_kernels.CpuKernelsUnavailable, match="lacks asimddp"):
        cpu_kernels.load(level="neon_dotprod")
    cpu_kernels._load_once.cache_clear()  # noqa: SLF001
    monkeypatch.undo()


def test_generic_level_has_no_cpp_kernels():
    assert (
        cpu_kernels.unavailable_reason("generic") == "CPU ISA level generic: torch's kernels only"
    )


def test_levels_can_be_capped(monkeypatch):
    bf16 = features(AVX512 + " avx512_bf16 avx512_vnni")
    monkeypatch.setenv("HOUCHU_CPU_ISA_MAX", "avx2")
    assert cpu_isa.usable(bf16, "x86_64") == ["avx2", "generic"]
    assert "above HOUCHU_CPU_ISA_MAX=avx2" in cpu_isa.why_not(cpu_isa.level("avx512"), bf16)


def test_stale_builds_are_pruned_and_recent_or_locked_ones_kept(monkeypatch, tmp_path):
    """A build no process loaded for two weeks is removed; the build in use, a recent
    one, one another process holds locked, and anything not named like a build stay."""
    import fcntl
    import os
    import time

    monkeypatch.setenv("HOUCHU_KERNEL_CACHE", str(tmp_path))
    old = time.time() - cpu_kernels.STALE_BUILD_S - 60
    names = {
        n: tmp_path / n
        for n in ("avx2-" + "a" * 16, "avx2-" + "b" * 16, "avx512-" + "c" * 16, "avx2-" + "d" * 16)
    }
    for d in names.values():
        d.mkdir()
        (d / "x.so").write_bytes(b"")
    other = tmp_path / "grammar_tokenizers"
    other.mkdir()
    stale, keep, recent, locked = names.values()
    for d in (stale, keep, locked, other):
        os.utime(d, (old, old))
    with open(locked / "houchu.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        # flock locks are per open file description: a second open in this process
        # conflicts as another process's would
        removed = cpu_kernels.prune_stale_builds(keep=keep)
    assert removed == [stale]
    assert not stale.exists()
    assert keep.exists() and recent.exists() and locked.exists() and other.exists()


def test_a_cache_path_that_cannot_be_written_falls_back_with_the_reason(monkeypatch, tmp_path):
    """HOUCHU_KERNEL_CACHE on a file (as on a read-only folder with no build): the level
    is unavailable with a reason naming the folder and the variable, not an OSError
    (the server then runs torch's kernels and says why)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("HOUCHU_KERNEL_CACHE", str(blocker))
    monkeypatch.setattr(cpu_kernels, "_failed", {})
    cpu_kernels._load_once.cache_clear()  # noqa: SLF001
    level = cpu_isa.usable()[0]
    if level == "generic":
        pytest.skip("no C++ kernel level runs here")
    why = cpu_kernels.unavailable_reason(level)
    assert why is not None and "cannot be written" in why and "HOUCHU_KERNEL_CACHE" in why
    cpu_kernels._load_once.cache_clear()  # noqa: SLF001
    monkeypatch.undo()


def test_a_read_only_cache_with_a_finished_build_is_loaded_as_it_is(monkeypatch):
    """The cache cannot be written (a read-only shared home), but holds this level's
    build: it loads without the lock or a rebuild."""
    level = cpu_isa.usable()[0]
    if level == "generic" or cpu_kernels.unavailable_reason(level) is not None:
        pytest.skip("no C++ kernel level builds here")

    def read_only(*args, **kwargs):  # noqa: ANN002, ANN003
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(Path, "mkdir", read_only)
    monkeypatch.setattr(cpu_kernels, "_failed", {})
    cpu_kernels._load_once.cache_clear()  # noqa: SLF001
    assert cpu_kernels.unavailable_reason(level) is None
    cpu_kernels._load_once.cache_clear()  # noqa: SLF001
    monkeypatch.undo()


def test_a_bad_isa_cap_names_its_variable(monkeypatch):
    monkeypatch.setenv("HOUCHU_CPU_ISA_MAX", "bogus")
    with pytest.raises(ValueError, match="HOUCHU_CPU_ISA_MAX: unknown CPU ISA level 'bogus'"):
        cpu_isa.runs(cpu_isa.level("avx2"))


def test_a_cap_of_another_architecture_is_refused(monkeypatch):
    """``HOUCHU_CPU_ISA_MAX=neon`` on x86 (or ``avx2`` on arm) would leave only
    ``generic``: an error naming the variable, not a silent torch-only start."""
    other = "neon" if platform.machine() in ("x86_64", "AMD64") else "avx2"
    monkeypatch.setenv("HOUCHU_CPU_ISA_MAX", other)
    with pytest.raises(ValueError, match=f"HOUCHU_CPU_ISA_MAX: {other} is a level of"):
        cpu_isa.usable()


def test_level_names_are_taken_in_any_case(monkeypatch):
    monkeypatch.delenv("HOUCHU_CPU_ISA_MAX", raising=False)
    assert cpu_isa.level("AVX2").name == "avx2"
    monkeypatch.setenv("HOUCHU_CPU_ISA", "GENERIC")
    assert cpu_isa.choose() == "generic"  # the level's own name, lower case
