"""houchu's C++ CPU kernels, built on first use and cached.

The ``*.cpp`` files beside this module register operators in the ``houchu_cpu`` library
(``torch.ops.houchu_cpu.*``): fused RMSNorm, residual add + RMSNorm, RoPE and SiLU·mul
(``norm_rope.cpp``), paged decode attention (``attention.cpp``), causal prefill attention
(``prefill_attention.cpp``), int4/int8 GEMV
(``gemv.cpp``), W8A8's quantization and epilogue (``quant.cpp``), greedy sampling's
argmax (``argmax.cpp``), and all the decoder layers of a decode step, with the LM head,
in one call (``decode_layers.cpp``, reusing the others' kernels
from the ``*.h`` headers). They remove what dominates an eager CPU decode step at small
batch sizes: hundreds of small torch ops per step, each a few microseconds of dispatch,
and the KV-page gather before attention.

``load()`` compiles them once per machine with ``torch.utils.cpp_extension`` (g++ with
``-O3 -march=native`` and ninja; about 30 s on 2 cores) into
``~/.cache/houchu/cpu_kernels/<key>``, where the key hashes the sources (their paths and
contents), the torch version and this CPU's feature flags, and loads the shared library
into the process. Later processes only load it. Where no compiler is found, or the build fails,
``load()`` raises ``CpuKernelsUnavailable`` with the reason and callers fall back to the
torch kernels.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import torch

_SOURCES = (
    "norm_rope.cpp",
    "attention.cpp",
    "quant.cpp",
    "gemv.cpp",
    "decode_layers.cpp",
    "argmax.cpp",
    "prefill_attention.cpp",
)
_HEADERS = ("vec.h", "gemv.h", "norm_rope.h", "attention.h", "decode_layers.h")
_CFLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-std=c++17"]


class CpuKernelsUnavailable(RuntimeError):
    """The C++ CPU kernels cannot be built or loaded here (the message says why)."""


def cache_dir() -> Path:
    """Where built kernels are kept (``$HOUCHU_KERNEL_CACHE`` or
    ``~/.cache/houchu/cpu_kernels``)."""
    env = os.environ.get("HOUCHU_KERNEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "houchu" / "cpu_kernels"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def _key(sources: list[Path]) -> str:
    h = hashlib.sha256()
    for p in sources:
        # the path too: the build folder's build.ninja names the sources by absolute
        # path, so two checkouts sharing one key would rebuild each other's build
        h.update(str(p.resolve()).encode())
        h.update(p.read_bytes())
    h.update(" ".join(_CFLAGS).encode())
    h.update(torch.__version__.encode())
    h.update(_cpu_flags().encode())
    return h.hexdigest()[:16]


def load(verbose: bool = False) -> float:
    """Build (first time on this machine) and load the kernels into this process.

    Returns:
        seconds it took (build and load; a cached build loads in well under a second).
    Raises:
        CpuKernelsUnavailable: not Linux/x86-64 or arm64, no C++ compiler or ninja, or
            the build failed (the compiler's last lines are in the message).
    """
    return _load_once(verbose)


_loaded = False


def is_loaded() -> bool:
    """Whether ``load()`` has succeeded in this process (never builds)."""
    return _loaded


@functools.cache
def _load_once(verbose: bool) -> float:
    global _loaded
    if sys.platform != "linux":
        raise CpuKernelsUnavailable(f"built only on Linux, not {sys.platform}")
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        raise CpuKernelsUnavailable(f"no C++ compiler ({cxx!r} not on PATH)")
    from torch.utils import cpp_extension

    if not cpp_extension.is_ninja_available():
        raise CpuKernelsUnavailable("ninja is not installed (pip install ninja)")
    here = Path(__file__).parent
    sources = [here / s for s in _SOURCES]
    key = _key(sources + [here / h for h in _HEADERS])
    build = cache_dir() / key
    build.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    # one builder at a time per machine; the kernel drops this lock if its holder dies,
    # unlike cpp_extension's own lock file, which a killed build leaves behind
    with open(build / "houchu.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        (build / "lock").unlink(missing_ok=True)
        if not any(build.glob("*.so")):
            print(f"houchu: building the C++ CPU kernels in {build} (once)", file=sys.stderr)
        _build(cpp_extension, key, sources, build, verbose)
    _register_fakes()
    _loaded = True
    return time.perf_counter() - t0


def _build(cpp_extension, key: str, sources: list[Path], build: Path, verbose: bool) -> None:  # noqa: ANN001
    try:
        cpp_extension.load(
            name=f"houchu_cpu_{key}",
            sources=[str(s) for s in sources],
            extra_cflags=_CFLAGS,
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


def _register_fakes() -> None:
    """Shape-only versions of the operators, so ``torch.compile`` can trace through them
    (they run as opaque calls inside a compiled graph)."""
    lib = "houchu_cpu::"
    reg = torch.library.register_fake

    reg(lib + "rms_norm")(lambda x, w, eps: x.new_empty(x.shape))
    reg(lib + "add_rms_norm")(lambda x, d, w, eps: (x.new_empty(x.shape), x.new_empty(x.shape)))
    reg(lib + "rope")(lambda q, k, cos, sin: (q.new_empty(q.shape), k.new_empty(k.shape)))
    reg(lib + "silu_mul")(lambda g: g.new_empty(g.shape[0], g.shape[1] // 2))
    reg(lib + "paged_decode_attention")(lambda q, *rest: q.new_empty(q.shape))
    reg(lib + "prefill_attention")(lambda q, k, v, start, scale: q.new_empty(q.shape))
    reg(lib + "int4_gemv")(lambda x, packed, g, n: x.new_empty(x.shape[0], n))
    reg(lib + "int8_gemv")(lambda x, packed, n: x.new_empty(x.shape[0], n))
    reg(lib + "decode_layers")(_decode_layers_fake)
    reg(lib + "argmax_rows")(lambda x: x.new_empty(x.shape[0], dtype=torch.int64))
    reg(lib + "col_absmax")(lambda x: x.new_empty(x.shape[1], dtype=torch.float32))
    reg(lib + "quantize_rows_int8")(
        lambda x, cols: (
            x.new_empty(x.shape, dtype=torch.int8),
            x.new_empty(x.shape[0], 1, dtype=torch.float32),
            x.new_empty(x.shape[0], cols.shape[0]),
        )
    )
    reg(lib + "int8_epilogue")(
        lambda acc, xs, ws, outliers, w, cols, silu_mul=False: acc.new_empty(
            acc.shape[0], acc.shape[1] // 2 if silu_mul else acc.shape[1], dtype=outliers.dtype
        )
    )


def _decode_layers_fake(  # noqa: PLR0913 (the operator's schema)
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    norms: list[torch.Tensor],
    eps: float,
    linears: list[torch.Tensor],
    group_sizes: list[int],
    out_features: list[int],
    act_dtype: torch.dtype,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    pages: torch.Tensor,
    lens: torch.Tensor,
    scale: float,
    final_norm: torch.Tensor | None = None,
    lm_head: torch.Tensor | None = None,
    head_group_size: int = 0,
    vocab_size: int = 0,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    if lm_head is None:
        return x.new_empty(x.shape)
    return x.new_empty(x.shape[0], vocab_size, dtype=torch.float32)


@functools.cache
def unavailable_reason() -> str | None:
    """None if the kernels load here (building them if needed), else why not; never
    raises, and tries only once per process."""
    try:
        load()
    except CpuKernelsUnavailable as e:
        return str(e)
    return None


def available() -> bool:
    """Whether the kernels load here (see ``unavailable_reason``)."""
    return unavailable_reason() is None
