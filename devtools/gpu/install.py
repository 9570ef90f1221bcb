"""The device check's install step (``houchu.devtools.gpu_check``): houchu itself without its
dependencies (pyproject pins torch==2.13.0; the GPU machine's torch must stay), and the
missing packages from a folder of wheels (``houchu.devtools.gpu.wheels``), with no index.

A wheel is installed when its distribution is not installed, or is installed at a version
pyproject's requirement refuses while the wheel's version satisfies it; never a
``DEVICE_PROVIDED`` one (torch, triton, NVIDIA's libraries, ...), never one whose tags
this interpreter does not run (a cp312 wheel on Python 3.13 is reported, not tried). Each
is installed with ``--no-deps``: the folder already holds the resolved dependencies.
Check-only (``--dry-run``): the same plan is reported, nothing is installed.

Where this interpreter's site-packages cannot be written (a venv owned by another user),
the wheels go to ``WORK/site`` instead (``pip install --target``), and that folder is put
first on this process's ``sys.path`` and on every child's ``PYTHONPATH``; houchu itself
is then linked, not installed. A rerun finds ``WORK/site`` and uses it again.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import json
import os
import sys
import sysconfig
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from houchu.devtools.gpu.run import Context, Step
from houchu.devtools.gpu.wheels import (
    CHECK_EXTRAS,
    Requirement,
    canonicalize_name,
    is_device_provided,
    load_pyproject,
    parse_wheel_filename,
)

#: Distribution -> module, where they differ beyond case and "-" / "_".
IMPORT_NAMES = {"pyzmq": "zmq", "pyyaml": "yaml", "flash-attn": "flash_attn"}
#: Reported too: not houchu's requirements, but the GPU levers use them when present.
GPU_MODULES = ("triton", "flash-attn")

IMPORT_SCRIPT = r"""
import importlib, importlib.metadata as md, json, sys
out = {}
for dist, mod in json.loads(sys.argv[1]):
    try:
        importlib.import_module(mod)
        ok, err = True, None
    except Exception as e:
        ok, err = False, f"{type(e).__name__}: {e}"[:300]
    try:
        v = md.version(dist)
    except Exception:
        v = None
    out[dist] = {"module": mod, "imports": ok, "version": v, "error": err}
print("IMPORTS " + json.dumps(out))
"""

HOUCHU_PATH = (
    "import houchu, os; print('HOUCHU ' + os.path.realpath(os.path.dirname(houchu.__file__)))"
)


def import_name(dist: str) -> str:
    """The module distribution ``dist`` is imported as."""
    n = canonicalize_name(dist)
    return IMPORT_NAMES.get(n, n.replace("-", "_"))


def current_requirements(pyproject: dict) -> list[Requirement]:
    """houchu's requirements that hold on this interpreter (markers evaluated here),
    then the ``CHECK_EXTRAS`` of the test extra."""
    project = pyproject["project"]
    test = project.get("optional-dependencies", {}).get("test", [])
    extras = [r for r in test if canonicalize_name(Requirement(r).name) in CHECK_EXTRAS]
    reqs = [Requirement(t) for t in [*project["dependencies"], *extras]]
    return [r for r in reqs if r.marker is None or r.marker.evaluate()]


def installed_version(dist: str) -> str | None:
    """The installed version of ``dist`` seen by this interpreter, or None."""
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


@dataclass
class WheelPlan:
    """What a wheels folder gives this interpreter: ``install`` (name, version, file),
    ``present`` (name, installed version: kept), ``incompatible`` (file, why),
    ``refused`` (files of packages the GPU machine has: never installed)."""

    install: list[tuple[str, str, str]] = field(default_factory=list)
    present: list[tuple[str, str]] = field(default_factory=list)
    incompatible: list[tuple[str, str]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


def plan_wheels(folder: Path, reqs: list[Requirement]) -> WheelPlan:
    """Which wheels of ``folder`` to install here (see the module docstring)."""
    try:
        from packaging.tags import sys_tags
    except ImportError:  # pragma: no cover
        from pip._vendor.packaging.tags import sys_tags  # type: ignore[no-redef]
    here = set(sys_tags())
    wanted = {canonicalize_name(r.name): r for r in reqs}
    plan = WheelPlan()
    for whl in sorted(folder.glob("*.whl")):
        name, version, _build, tags = parse_wheel_filename(whl.name)
        if is_device_provided(name):
            plan.refused.append(whl.name)
            continue
        if not tags & here:
            why = f"built for {', '.join(sorted(str(t) for t in tags)[:2])}, not this interpreter"
            plan.incompatible.append((whl.name, why))
            continue
        have = installed_version(name)
        req = wanted.get(canonicalize_name(name))
        outdated = have is not None and req is not None and not req.specifier.contains(have, True)
        if have is None or (outdated and req.specifier.contains(str(version), True)):
            plan.install.append((str(name), str(version), whl.name))
        else:
            plan.present.append((str(name), have))
    return plan


def import_report(ctx: Context, dists: list[str], step: Step) -> dict[str, dict]:
    """Import each distribution's module in a fresh interpreter: ``{dist: {module,
    imports, version, error}}``."""
    pairs = json.dumps([[d, import_name(d)] for d in dists])
    res = ctx.run([ctx.python, "-c", IMPORT_SCRIPT, pairs], 120, cwd=ctx.work, step=step)
    for line in res.output.splitlines():
        if line.startswith("IMPORTS "):
            return json.loads(line[len("IMPORTS ") :])
    return {}


def houchu_resolves_here(ctx: Context, step: Step) -> bool:
    """Whether a fresh interpreter (with the children's environment) imports houchu
    from this repository."""
    res = ctx.run([ctx.python, "-c", HOUCHU_PATH], 60, cwd=ctx.work, step=step)
    for line in res.output.splitlines():
        if line.startswith("HOUCHU "):
            return Path(line[len("HOUCHU ") :].strip()) == ctx.repo.resolve()
    return False


def link_houchu(ctx: Context) -> Path:
    """Make ``houchu`` importable from this repository without installing it: a folder
    holding a link ``houchu`` -> the repository, put first on the children's PYTHONPATH.
    Returns the folder."""
    pkg = ctx.work / "pkg"
    pkg.mkdir(parents=True, exist_ok=True)
    link = pkg / "houchu"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(ctx.repo.resolve(), target_is_directory=True)
    old = ctx.env.get("PYTHONPATH")
    ctx.env["PYTHONPATH"] = f"{pkg}{os.pathsep}{old}" if old else str(pkg)
    return pkg


def site_writable(folder: Path) -> bool:
    """Whether this process can create files in ``folder`` (tried, not inferred from the
    mode bits: a non-root user, a read-only mount, a folder that is missing)."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def install_target(purelib: Path, work: Path) -> Path | None:
    """Where the wheels go: None (this interpreter's ``purelib``, the ordinary install)
    when ``purelib`` can be written, else ``work / "site"`` (for ``pip --target``)."""
    return None if site_writable(purelib) else work / "site"


def use_site(ctx: Context, site: Path) -> None:
    """Put ``site`` (a ``pip --target`` folder) first on this process's ``sys.path`` and
    on the children's ``PYTHONPATH`` (once)."""
    entry = str(site)
    if entry not in sys.path:
        sys.path.insert(0, entry)
        importlib.invalidate_caches()
    old = ctx.env.get("PYTHONPATH")
    if entry not in (old or "").split(os.pathsep):
        ctx.env["PYTHONPATH"] = f"{entry}{os.pathsep}{old}" if old else entry


def install_wheels(ctx: Context, step: Step, names: list[str], site: Path | None) -> str:
    """``pip install --no-index --no-deps`` of ``names`` (``NAME==VERSION``) from
    ``ctx.wheels``: into this interpreter when ``site`` is None, retried into
    ``ctx.work / "site"`` if that fails; with ``site``, into it (``--target``, which then
    goes on the paths: ``use_site``). Returns where they went ("venv" or the folder),
    or "" when pip failed."""
    assert ctx.wheels is not None
    cmd = [ctx.python, "-m", "pip", "install", "--no-index", "--no-deps"]
    cmd += ["--find-links", str(ctx.wheels)]
    if site is None:
        if ctx.run([*cmd, *names], 180, step=step).rc == 0:
            return "venv"
        site = ctx.work / "site"
        ctx.log(f"[gpu_check] install into the venv failed; trying --target {site}")
    site.mkdir(parents=True, exist_ok=True)
    if ctx.run([*cmd, "--upgrade", "--target", str(site), *names], 180, step=step).rc != 0:
        return ""
    use_site(ctx, site)
    return str(site)


def install_step(ctx: Context, step: Step, install: bool) -> None:
    """houchu from this repository (editable, no dependencies, no build isolation, no
    index), then the wheels ``plan_wheels`` picks from ``ctx.wheels``; with ``install``
    False only the plan and the imports are reported. Either way the children import
    houchu from this repository afterwards (a PYTHONPATH link where the install failed
    or was not made). ``step.results``: ``wheels`` (the plan), ``modules`` (per
    distribution: imports, version, error), ``missing`` (the ones that do not import),
    ``houchu`` (how it is imported), ``target`` (where the wheels went: "venv" or the
    ``--target`` folder, ``install_target``)."""
    pip = [ctx.python, "-m", "pip"]
    reqs = current_requirements(load_pyproject(ctx.repo / "pyproject.toml"))
    site = install_target(Path(sysconfig.get_paths()["purelib"]), ctx.work)
    if site is not None and site.is_dir():  # a rerun: what the first run installed there
        use_site(ctx, site)
    if site is not None and install:
        step.results["houchu_install"] = "site-packages not writable; linked on PYTHONPATH"
    elif install and not houchu_resolves_here(ctx, step):
        cmd = [*pip, "install", "--no-deps", "--no-build-isolation", "--no-index", "-e", "."]
        if ctx.run(cmd, 120, step=step).rc != 0:
            step.results["houchu_install"] = "pip install -e failed; linked on PYTHONPATH"
    plan = plan_wheels(ctx.wheels, reqs) if ctx.wheels is not None else WheelPlan()
    step.results["wheels"] = {
        "folder": str(ctx.wheels) if ctx.wheels else None,
        "install": [f"{n}=={v}" for n, v, _ in plan.install],
        "present": [f"{n} {v}" for n, v in plan.present],
        "incompatible": [f"{f}: {why}" for f, why in plan.incompatible],
        "refused": plan.refused,
    }
    if install and plan.install:
        names = [f"{n}=={v}" for n, v, _ in plan.install]
        step.results["target"] = install_wheels(ctx, step, names, site)
        if not step.results["target"]:
            step.fail("pip install from the wheels folder failed")
        check = ctx.run([*pip, "check"], 60, step=step)
        ours = {canonicalize_name(n) for n, _, _ in plan.install}
        step.results["pip_check"] = [
            line
            for line in check.output.splitlines()
            if line.split(" ", 1)[0] and canonicalize_name(line.split(" ", 1)[0]) in ours
        ]
    if not houchu_resolves_here(ctx, step):
        step.results["houchu"] = f"linked: PYTHONPATH={link_houchu(ctx)}"
    else:
        step.results["houchu"] = "installed from this repository"
    dists = list(dict.fromkeys([*(r.name for r in reqs), *GPU_MODULES]))
    report = import_report(ctx, dists, step)
    step.results["modules"] = report
    missing = [d for d in dists if d not in GPU_MODULES and not report.get(d, {}).get("imports")]
    step.results["missing"] = missing
    if not install:  # what the planned wheels would bring is not missing
        planned = {canonicalize_name(n) for n, _, _ in plan.install}
        missing = [d for d in missing if canonicalize_name(d) not in planned]
    for d in dists:
        r = report.get(d, {})
        state = f"{r.get('version')}" if r.get("imports") else f"MISSING ({r.get('error')})"
        ctx.log(f"[gpu_check] {d:20} {state}")
    if missing:
        verb = "would still miss" if not install else "misses"
        step.fail(f"this interpreter {verb}: {', '.join(missing)}")
    if not install and plan.install:
        names = ", ".join(f"{n}=={v}" for n, v, _ in plan.install)
        step.results["note"] = f"check only: would install {names}"
