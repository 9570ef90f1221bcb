"""No thread of a houchu process can make an import on another thread fail.

Python's import system asks the finders of ``sys.meta_path`` in turn, iterating the live
list (``importlib._bootstrap._find_spec``, until gh-130094 made it iterate a copy: Python
3.14, backported to 3.13). The first ``import setuptools`` of a process
(``torch.utils.cpp_extension`` imports it) runs ``_distutils_hack``'s override: ``with
shim(): import distutils``, a finder inserted at ``sys.meta_path[0]`` and removed again. A
removal while another thread is between two finders shifts the list under it, and that
thread skips the finder after the one it was asking: the path finder. The editable
install's finder (last) still finds ``houchu`` and its direct subpackages, but not a module
below them, which is then "not found". A runner loading a GGUF on one thread while its C++
kernels loaded on another (``cpu_kernels.load_in_background``, whose thread imported
``cpp_extension`` first) failed so with ``ModuleNotFoundError: No module named
'houchu.model.fetch'``, imported lazily by ``model/gguf/index.py``."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import houchu

pytestmark = pytest.mark.slow

REPO = Path(houchu.__file__).resolve().parent

# A fresh interpreter (setuptools not yet imported) that starts a runner as the runner
# actor does, with sys.meta_path replaced by a list that records every removal and the
# thread that made it. Insertions are harmless (a finder asked twice, none skipped).
CHILD = r"""
import json, sys, threading
from houchu.devtools.gguf_writers import write_llama_gguf
from houchu.runner.model_runner import ModelRunner
from houchu.devtools.tiny_models import make_tiny_llama
from tests.support.runner_options import exact

folder = sys.argv[1]
gguf = write_llama_gguf(make_tiny_llama(folder + "/hf"), folder + "/m.gguf", qtype="Q4_0")


class Watched(list):
    removals = []

    def _note(self, op):
        Watched.removals.append(f"{op} on thread {threading.current_thread().name}")

    def remove(self, x):
        self._note("remove")
        super().remove(x)

    def pop(self, *a):
        self._note("pop")
        return super().pop(*a)

    def __delitem__(self, i):
        self._note("del")
        super().__delitem__(i)

    def __setitem__(self, i, v):
        self._note("setitem")
        super().__setitem__(i, v)

    def clear(self):
        self._note("clear")
        super().clear()


setuptools_first = "setuptools" in sys.modules  # with the model code, on this thread
sys.meta_path = Watched(sys.meta_path)
runner = ModelRunner(str(gguf), exact(quantization="int4", page_size=4, num_pages=16), quiet=True)
print("RESULT " + json.dumps({
    "removals": Watched.removals,
    "kernels": runner.cpu_isa,
    "setuptools_first": setuptools_first,
}))
"""


@pytest.mark.timeout(900)  # a first build of the level's C++ kernels takes minutes
def test_a_runner_start_removes_no_finder_while_its_threads_import(tmp_path):
    """A runner's start (the GGUF loaded on one thread, the C++ kernels built or loaded
    on another) removes no finder from ``sys.meta_path``: setuptools is imported with
    houchu's model code, before those threads start."""
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("no setuptools here: nothing inserts and removes a finder")
    env = dict(os.environ, HOUCHU_CACHE=str(tmp_path / "cache"))
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=850,
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stdout[-3000:] + out.stderr[-3000:]
    got = json.loads(lines[-1][len("RESULT ") :])
    assert got["removals"] == [], got
    assert got["setuptools_first"], got


# Below ``cli/`` (the command) and ``bench/`` (the tools, which fetch the default model):
# the layers an actor process runs. They never import ``houchu.cli`` (the cache folder
# is ``houchu.paths``'), so no actor imports the command line to find a folder.
BELOW_CLI = (
    "actors",
    "api",
    "dashboard",
    "cache_tiers",
    "model",
    "options",
    "scheduler",
    "speculative",
    "storage",
    "text",
    "transport",
    "cluster",
)


def _imports(path: Path) -> set[str]:
    """The modules ``path`` imports, at any depth (lazy imports inside functions too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_no_layer_below_the_command_line_imports_it():
    """Only ``cli/`` and ``bench/`` import ``houchu.cli``: the layers below find the cache
    folder in ``houchu.paths``, at module top."""
    found = [
        f"{p.relative_to(REPO)}: {m}"
        for folder in BELOW_CLI
        for p in sorted((REPO / folder).rglob("*.py"))
        for m in sorted(_imports(p))
        if m == "houchu.cli" or m.startswith("houchu.cli.")
    ]
    assert found == []
    assert (REPO / "paths.py").is_file()
