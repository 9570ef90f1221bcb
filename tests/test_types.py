"""mypy finds no error in the packages that do not need torch (issue 46).

The packages and the strictness are ``[tool.mypy]`` in ``pyproject.toml``. The repository
root is the package ``houchu`` (whatever the clone's folder is called), and the editable
install's import hook is invisible to mypy, so mypy runs in a temporary folder that holds
only a link named ``houchu`` to the root. Its cache is the root's ``.mypy_cache/``: 6-12 s
from cold on a 2-core machine, about a second after.

To run the same check by hand, from the repository root::

    d=$(mktemp -d) && ln -s "$PWD" "$d/houchu" && (cd "$d" && "$OLDPWD/.venv/bin/python" \
        -m mypy --config-file "$OLDPWD/pyproject.toml" --cache-dir "$OLDPWD/.mypy_cache")
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_finds_no_errors(tmp_path: Path) -> None:
    (tmp_path / "houchu").symlink_to(ROOT, target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if k not in ("MYPYPATH", "MYPY_CACHE_DIR")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(ROOT / ".mypy_cache"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"mypy found errors:\n{proc.stdout}{proc.stderr}"
