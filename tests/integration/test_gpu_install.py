"""The device check's install step where the interpreter's site-packages cannot be written
(``houchu.devtools.gpu.install``): the target folder it picks, and a real ``pip install
--target`` of a wheel built here, seen by this process and by the children it starts."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from houchu.devtools.gpu import install as gpu_install
from houchu.devtools.gpu.run import Context, Step

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]  # the repository


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(folder: Path, dist: str, version: str, body: str) -> Path:
    """A pure-Python wheel of one module ``dist`` holding ``body``: ``folder/DIST-VERSION-
    py3-none-any.whl``."""
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{dist}.py": body.encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    lines = [_record_line(n, d) for n, d in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(lines) + "\n").encode()
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return path


def test_the_target_is_the_work_folder_where_site_packages_cannot_be_written(tmp_path):
    assert gpu_install.site_writable(tmp_path)
    assert gpu_install.install_target(tmp_path, tmp_path / "work") is None
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    for purelib in (blocked / "site-packages", tmp_path / "missing"):
        assert not gpu_install.site_writable(purelib)
        assert gpu_install.install_target(purelib, tmp_path / "work") == tmp_path / "work" / "site"


@pytest.mark.timeout(180)
def test_wheels_go_to_the_target_and_on_every_path(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # use_site edits this process's path
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    build_wheel(wheels, "houchu_target_probe", "1.0", "ANSWER = 42\n")
    ctx = Context(tmp_path / "out", 120, REPO, echo=None)
    ctx.wheels, ctx.work = wheels, tmp_path / "work"
    ctx.env.pop("PYTHONPATH", None)
    step = Step("install")
    site = tmp_path / "work" / "site"
    where = gpu_install.install_wheels(ctx, step, ["houchu_target_probe==1.0"], site)
    ctx.close()
    assert where == str(site), ctx.log_path.read_text()[-2000:]
    assert (site / "houchu_target_probe.py").exists()
    assert "--target" in step.commands[-1]["cmd"] and step.commands[-1]["rc"] == 0
    assert sys.path[0] == str(site) and ctx.env["PYTHONPATH"].split(":")[0] == str(site)
    import houchu_target_probe  # noqa: PLC0415 (importable only after the install)

    assert houchu_target_probe.ANSWER == 42
    child = [sys.executable, "-c", "import houchu_target_probe as m; print(m.ANSWER)"]
    out = subprocess.run(child, env=ctx.env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "42", out.stderr
    gpu_install.use_site(ctx, site)  # a second time changes nothing
    assert ctx.env["PYTHONPATH"].count(str(site)) == 1 and sys.path.count(str(site)) == 1
    sys.modules.pop("houchu_target_probe", None)
