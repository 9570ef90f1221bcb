"""The layout holds: layers, no import cycles, no runtime reads of tests/, one owner per constant.

Every runtime module (each ``.py`` file of the package outside ``tests/``) is parsed with
``ast``, never imported, so this test needs neither torch nor a compiler and runs in about a
second. It reads every import, at module level and inside functions alike, and checks:

- **layers**: the layer order is the fenced ``layers`` block of ``docs/architecture.md``
  (section "Layer order"), lowest layer first, one layer a line, each a set of module
  prefixes. A module belongs to the layer of its most specific (longest) prefix. An import
  may point to its own layer or a lower one, never up. Every import counts here, those under
  ``if TYPE_CHECKING:`` too: an annotation names a type of the layer it comes from, and a
  lower layer that names an upper layer's type depends on it all the same.
- **cycles**: no two modules import each other, directly or through others (each strongly
  connected component of the import graph is reported). Imports under
  ``if TYPE_CHECKING:`` are left out of this check: they never run, so they cannot make an
  import cycle, and naming a type of a module that imports you is not a cycle at run time.
- **tests/**: no installed module names a path with a ``tests`` component (an installed wheel
  has no ``tests/``). ``devtools/`` (fixtures, the GPU check) is houchu's code too, held to
  the layers, cycles and constants, but it is not installed and may read ``tests/``.
- **installed**: ``pyproject.toml`` installs every package of the tree but ``devtools``,
  which no installed module imports (it is the top layer).
- **constants**: an UPPER_CASE name is assigned at module level in one module only; the
  others import it (``from owner import NAME`` is an import, not a second definition).
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "houchu"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
# Folders of the repository that hold no runtime module of the package.
NOT_RUNTIME = {"tests", "docs", "build", "dist"}
# The developer tools: part of the tree (and of these checks), not of the installed package.
NOT_INSTALLED = f"{PACKAGE}.devtools"
CONSTANT_NAME = re.compile(r"^[A-Z][A-Z0-9]*(_[A-Z0-9]+)+$|^[A-Z][A-Z0-9]{2,}$")


@dataclass
class Module:
    """One runtime module: its dotted name, its file, its parsed tree."""

    name: str
    path: Path
    tree: ast.Module
    is_package: bool
    # (target module, line, under TYPE_CHECKING)
    imports: list[tuple[str, int, bool]] = field(default_factory=list)


def _module_name(path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts = parts[:-1]
    return ".".join([PACKAGE, *parts]), is_package


def _runtime_files() -> list[Path]:
    files = []
    for top in sorted(ROOT.iterdir()):
        if top.name in NOT_RUNTIME or top.name.startswith(".") or top.name.endswith(".egg-info"):
            continue
        if top.suffix == ".py":
            files.append(top)
        elif top.is_dir():
            files.extend(p for p in sorted(top.rglob("*.py")) if "__pycache__" not in p.parts)
    return files


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    if isinstance(test, ast.Attribute):
        return test.attr == "TYPE_CHECKING"
    return False


def _walk_imports(node: ast.AST, type_checking: bool = False):
    """Yields (import node, under TYPE_CHECKING) for every import below ``node``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, type_checking
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for stmt in child.body:
                yield from _walk_imports(ast.Module(body=[stmt], type_ignores=[]), True)
            for stmt in child.orelse:
                yield from _walk_imports(ast.Module(body=[stmt], type_ignores=[]), type_checking)
        else:
            yield from _walk_imports(child, type_checking)


def _resolve(module: Module, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.name.split(".")
    if not module.is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


@functools.cache
def load_modules() -> dict[str, Module]:
    """Parses every runtime module and its imports of the package's own modules."""
    modules: dict[str, Module] = {}
    for path in _runtime_files():
        name, is_package = _module_name(path)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        modules[name] = Module(name, path, tree, is_package)
    for module in modules.values():
        for node, type_checking in _walk_imports(module.tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = _resolve(module, node)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in modules else base)
            resolved = []
            for target in targets:
                if target != PACKAGE and not target.startswith(PACKAGE + "."):
                    continue
                # the most specific module that exists (``import houchu.x.y`` names x.y)
                while target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target != module.name and target not in resolved:
                    resolved.append(target)  # ``from m import a, b``: one import of m
            module.imports.extend((t, node.lineno, type_checking) for t in resolved)
    return modules


def read_layers() -> list[list[str]]:
    """The layer order of docs/architecture.md: lowest first, each a list of prefixes."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    section = text.split("## Layer order", 1)
    assert len(section) == 2, f"{ARCHITECTURE} has no '## Layer order' section"
    block = re.search(r"```layers\n(.*?)```", section[1], re.S)
    assert block, "the 'Layer order' section of docs/architecture.md has no ```layers block"
    layers = []
    for line in block.group(1).splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            layers.append(line.split())
    return layers


def layer_of(name: str, layers: list[list[str]]) -> tuple[int, str] | None:
    """The layer (index, prefix) of module ``name``: the most specific prefix wins."""
    best: tuple[int, str] | None = None
    for index, prefixes in enumerate(layers):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and (
                best is None or len(prefix) > len(best[1])
            ):
                best = (index, prefix)
    return best


def upward_imports(modules: dict[str, Module], layers: list[list[str]]) -> list[str]:
    """Every import that points up the layer order, and every module in no layer."""
    problems = []
    for module in modules.values():
        own = layer_of(module.name, layers)
        if own is None:
            problems.append(f"{module.name}: in no layer of docs/architecture.md")
            continue
        for target, line, _ in module.imports:
            theirs = layer_of(target, layers)
            if theirs is not None and theirs[0] > own[0]:
                problems.append(
                    f"{module.path.relative_to(ROOT)}:{line}: {module.name} (layer {own[0]}, "
                    f"{own[1]}) imports {target} (layer {theirs[0]}, {theirs[1]})"
                )
    return problems


def import_cycles(modules: dict[str, Module]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    graph = {
        name: sorted({t for t, _, tc in m.imports if not tc and t in modules})
        for name, m in modules.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            recurse = False
            for j in range(i, len(graph[node])):
                nxt = graph[node][j]
                if nxt not in index:
                    work.append((node, j + 1))
                    work.append((nxt, 0))
                    recurse = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if recurse:
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return sorted(components)


def _docstrings(tree: ast.Module) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                ids.add(id(value))
    return ids


def _in(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def installed_packages() -> set[str]:
    """The packages ``pyproject.toml`` installs (``[tool.setuptools] packages``)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return set(config["tool"]["setuptools"]["packages"])


def reads_of_tests(modules: dict[str, Module]) -> list[str]:
    """String literals (not docstrings) that name a path with a ``tests`` component."""
    problems = []
    for module in modules.values():
        if _in(module.name, NOT_INSTALLED):
            continue
        docstrings = _docstrings(module.tree)
        for node in ast.walk(module.tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            if id(node) in docstrings or " " in node.value.strip():
                continue
            parts = re.split(r"[/\\]", node.value)
            if "tests" in parts:
                problems.append(
                    f"{module.path.relative_to(ROOT)}:{node.lineno}: {module.name} names "
                    f"{node.value!r}, a path into tests/ (an installed package has none)"
                )
    return problems


def _module_level_names(body: list[ast.stmt]):
    for stmt in body:
        if isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                for node in ast.walk(target):
                    if isinstance(node, ast.Name):
                        yield node.id, stmt.lineno
        elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)) and isinstance(stmt.target, ast.Name):
            if not (isinstance(stmt, ast.AnnAssign) and stmt.value is None):
                yield stmt.target.id, stmt.lineno
        elif isinstance(stmt, (ast.If, ast.Try, ast.With)):
            for part in ("body", "orelse", "finalbody"):
                yield from _module_level_names(getattr(stmt, part, []))
            for handler in getattr(stmt, "handlers", []):
                yield from _module_level_names(handler.body)


def duplicate_constants(modules: dict[str, Module]) -> list[str]:
    """UPPER_CASE names assigned at module level in more than one module."""
    owners: dict[str, list[str]] = defaultdict(list)
    for module in modules.values():
        seen = set()
        for name, line in _module_level_names(module.tree.body):
            if CONSTANT_NAME.match(name) and name not in seen:
                seen.add(name)
                owners[name].append(f"{module.path.relative_to(ROOT)}:{line}")
    return [
        f"{name} is defined in {len(places)} modules: {', '.join(places)}"
        for name, places in sorted(owners.items())
        if len(places) > 1
    ]


def _report(title: str, problems: list[str]) -> str:
    return f"{len(problems)} {title}:\n  " + "\n  ".join(problems)


def test_imports_follow_the_layer_order():
    problems = upward_imports(load_modules(), read_layers())
    assert not problems, _report(
        "imports that point up the layer order of docs/architecture.md (move the code to "
        "its layer, or the shared part down)",
        problems,
    )


def test_layers_name_existing_modules():
    modules = load_modules()
    unused = [
        prefix
        for prefixes in read_layers()
        for prefix in prefixes
        if not any(n == prefix or n.startswith(prefix + ".") for n in modules)
    ]
    assert not unused, _report("layer prefixes that name no module", unused)


def test_no_import_cycles():
    cycles = import_cycles(load_modules())
    assert not cycles, _report(
        "import cycles (strongly connected components; a factory or registry goes apart "
        "from the base class it builds)",
        [" <-> ".join(c) for c in cycles],
    )


def test_runtime_code_does_not_read_tests():
    problems = reads_of_tests(load_modules())
    assert not problems, _report("runtime reads of tests/", problems)


def test_each_constant_has_one_owner():
    problems = duplicate_constants(load_modules())
    assert not problems, _report(
        "UPPER_CASE constants defined in several modules (keep one, import it elsewhere)",
        problems,
    )


def test_every_package_but_the_developer_tools_is_installed():
    packages = {m.name for m in load_modules().values() if m.is_package}
    installed = installed_packages()
    assert installed == {p for p in packages if not _in(p, NOT_INSTALLED)}, (
        f"pyproject.toml's packages miss {sorted(packages - installed - {NOT_INSTALLED})} "
        f"or name {sorted(installed - packages)}; {NOT_INSTALLED} must not be installed"
    )
    assert read_layers()[-1] == [NOT_INSTALLED], "the developer tools are the top layer"
