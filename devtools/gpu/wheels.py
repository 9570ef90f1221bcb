"""Prepare, on a machine with a package registry, the folder a GPU machine without one
installs houchu's missing packages from (``python -m houchu.devtools.gpu_check --wheels DIR``).

    python -m houchu.devtools.gpu.wheels DIR [--python-version 3.12] [--print-command]

The list is pyproject.toml's ``dependencies`` (and the ``test`` extra's pytest plugins the
check's tests need), their version specifiers kept, minus what the GPU machine already has
(``DEVICE_PROVIDED``: torch, triton, aiohttp, uvloop, transformers, safetensors and their
own dependencies, numpy among them). One ``pip download`` of binary wheels for CPython
``--python-version`` on manylinux x86-64 (``PLATFORMS``: llguidance>=1.9 ships only
``manylinux_2_31`` wheels) resolves and fetches them and their dependencies; the wheels
of ``DEVICE_PROVIDED`` packages that pip fetched as dependencies are then removed (numpy's
alone is 16 MB of the 64 MiB the device tool carries). When the default model is fetched
here, its skeleton (``houchu.devtools.gpu.model``, 1.7 MiB) is written beside the wheels, so
that the check can serve a stand-in of the same shapes there.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

try:  # pip vendors packaging; a bare interpreter may lack the package itself
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name, parse_wheel_filename
except ImportError:  # pragma: no cover
    from pip._vendor.packaging.markers import default_environment  # type: ignore[no-redef]
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]
    from pip._vendor.packaging.utils import (  # type: ignore[no-redef]
        canonicalize_name,
        parse_wheel_filename,
    )

#: the repository's pyproject.toml (this file is devtools/gpu/wheels.py)
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
#: Wheel platforms asked for (x86-64 glibc): pip matches each tag exactly.
PLATFORMS = (
    "manylinux2014_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_31_x86_64",
)
#: On the GPU machine already (its image: torch with CUDA, triton, aiohttp, uvloop,
#: transformers, safetensors), with the dependencies those pull in: never downloaded,
#: and never installed by the check (pip must not touch the device's torch).
DEVICE_PROVIDED = frozenset(
    canonicalize_name(n)
    for n in (
        "torch",
        "triton",
        "aiohttp",
        "uvloop",
        "transformers",
        "safetensors",
        # torch's
        "numpy",
        "jinja2",
        "markupsafe",
        "filelock",
        "fsspec",
        "networkx",
        "sympy",
        "mpmath",
        "typing-extensions",
        "setuptools",
        # transformers'
        "tokenizers",
        "huggingface-hub",
        "hf-xet",
        "pyyaml",
        "regex",
        "tqdm",
        "packaging",
        # aiohttp's
        "aiohappyeyeballs",
        "aiosignal",
        "attrs",
        "frozenlist",
        "multidict",
        "propcache",
        "yarl",
        "idna",
    )
)
#: The ``test`` extra's packages that the check's pytest runs need.
CHECK_EXTRAS = ("pytest", "pytest-asyncio", "pytest-timeout")


def is_device_provided(name: str) -> bool:
    """Whether distribution ``name`` is the GPU machine's own (``DEVICE_PROVIDED``, or
    NVIDIA's CUDA libraries ``nvidia-*``)."""
    n = canonicalize_name(name)
    return n in DEVICE_PROVIDED or n.startswith("nvidia-")


def load_pyproject(path: Path | None = None) -> dict:
    """pyproject.toml (``path``, default the repository's) as a dict."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    return tomllib.loads((path or PYPROJECT).read_text())


def target_environment(python_version: str) -> dict[str, str]:
    """PEP 508 marker values of the GPU machine: Linux x86-64, CPython ``python_version``
    ("3.12")."""
    env = dict(default_environment())
    env.update(
        python_version=python_version,
        python_full_version=f"{python_version}.0",
        sys_platform="linux",
        platform_system="Linux",
        platform_machine="x86_64",
        os_name="posix",
        implementation_name="cpython",
        platform_python_implementation="CPython",
    )
    return env


def needed_requirements(pyproject: dict, python_version: str = "3.12") -> list[Requirement]:
    """The requirements the wheels folder must satisfy: ``project.dependencies`` and the
    ``CHECK_EXTRAS`` of the ``test`` extra whose markers hold on the GPU machine, minus
    the ``DEVICE_PROVIDED`` ones; specifiers kept, markers dropped (evaluated), in
    pyproject's order."""
    env = target_environment(python_version)
    project = pyproject["project"]
    test = project.get("optional-dependencies", {}).get("test", [])
    extras = [r for r in test if canonicalize_name(Requirement(r).name) in CHECK_EXTRAS]
    out: list[Requirement] = []
    for text in [*project["dependencies"], *extras]:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        if is_device_provided(req.name):
            continue
        req.marker = None
        out.append(req)
    return out


def download_command(
    reqs: list[Requirement], dest: str | Path, python_version: str = "3.12"
) -> list[str]:
    """The ``pip download`` argv fetching binary wheels of ``reqs`` and their
    dependencies for CPython ``python_version`` on manylinux x86-64 into ``dest``."""
    cmd = [sys.executable, "-m", "pip", "download", "--only-binary=:all:"]
    cmd += ["--python-version", python_version, "--implementation", "cp"]
    for plat in PLATFORMS:
        cmd += ["--platform", plat]
    return [*cmd, "-d", str(dest), *(str(r) for r in reqs)]


def wheel_versions(folder: str | Path) -> dict[str, str]:
    """Canonical distribution name -> version of each wheel in ``folder``."""
    out = {}
    for whl in sorted(Path(folder).glob("*.whl")):
        name, version, _build, _tags = parse_wheel_filename(whl.name)
        out[canonicalize_name(name)] = str(version)
    return out


def unmet(reqs: list[Requirement], versions: dict[str, str]) -> list[str]:
    """The requirements of ``reqs`` that no wheel of ``versions`` satisfies, as text."""
    bad = []
    for r in reqs:
        have = versions.get(canonicalize_name(r.name))
        if have is None or not r.specifier.contains(have, prereleases=True):
            bad.append(f"{r} (folder: {have or 'none'})")
    return bad


def prune_device_provided(folder: str | Path) -> list[str]:
    """Delete the wheels of ``DEVICE_PROVIDED`` packages from ``folder``; returns their
    file names."""
    gone = []
    for whl in sorted(Path(folder).glob("*.whl")):
        if is_device_provided(parse_wheel_filename(whl.name)[0]):
            whl.unlink()
            gone.append(whl.name)
    return gone


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m houchu.devtools.gpu.wheels", description=__doc__)
    p.add_argument("dir", type=Path, help="the wheels folder (created)")
    p.add_argument("--python-version", default="3.12", help="the GPU machine's Python (X.Y)")
    p.add_argument("--print-command", action="store_true", help="print the pip command and stop")
    p.add_argument("--no-skeleton", action="store_true", help="no default-model skeleton")
    args = p.parse_args(argv)
    reqs = needed_requirements(load_pyproject(), args.python_version)
    cmd = download_command(reqs, args.dir, args.python_version)
    shown = " ".join(a if " " not in a and "<" not in a and ">" not in a else repr(a) for a in cmd)
    print(f"houchu gpu_wheels: {shown}", flush=True)
    if args.print_command:
        return 0
    if subprocess.run(cmd, check=False).returncode != 0:
        print("houchu gpu_wheels: pip download failed", file=sys.stderr)
        return 1
    for name in prune_device_provided(args.dir):
        print(f"houchu gpu_wheels: left out (the GPU machine has it): {name}")
    bad = unmet(reqs, wheel_versions(args.dir))
    if bad:
        print(f"houchu gpu_wheels: not satisfied: {'; '.join(bad)}", file=sys.stderr)
        return 1
    if not args.no_skeleton:
        from houchu.devtools.gpu.model import write_skeleton
        from houchu.model.fetch import fetch_default_model

        meta = write_skeleton(fetch_default_model(quiet=True), args.dir)
        print(f"houchu gpu_wheels: the default model's skeleton: {meta}")
    size = sum(f.stat().st_size for f in args.dir.iterdir() if f.is_file())
    print(f"houchu gpu_wheels: {args.dir}: {size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
