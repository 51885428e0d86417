"""The shape of gate's import graph: no cycle, the command layer on top, the worker on its own.

The graph is read from the source with ``ast`` (nothing is imported), so an import inside a function
or under ``if TYPE_CHECKING:`` counts as much as one at the top of a module: a cycle through a lazy
import is still a cycle in the design, only one that fails later.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "gate"
COMMAND_LAYER = ("gate.cli", "gate.commands")

# The worker runs inside each engine's environment (a venv or container with vllm and torch), where
# the orchestrator's dependencies (yaml, httpx, docker, jinja2) need not be installed. It may use the
# seam's contract (gate.contract: the request it is handed, the evidence and engine record it writes),
# file writing (gate.files), CPU lists for vLLM's rank binding (gate.cpu_list, shared with the docker runner's
# cpuset), host facts (gate.host: the GATE_* variables it reads, its parallel ranks; standard library
# only) and what those import (gate.errors), and nothing else of gate.
WORKER_MAY_IMPORT = ("gate.worker", "gate.contract", "gate.files", "gate.errors", "gate.cpu_list",
                     "gate.host")  # fmt: skip


def module_name(path: Path, package_dir: Path) -> str:
    parts = path.relative_to(package_dir.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules(package_dir: Path) -> dict[str, Path]:
    return {module_name(p, package_dir): p for p in sorted(package_dir.rglob("*.py"))}


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _existing(name: str, modules: dict[str, Path]) -> str | None:
    """``name`` or its nearest enclosing module that exists (``gate.x.attr`` -> ``gate.x``)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _base_of_relative(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    package = module if is_package else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules ``module`` imports anywhere in its source (``from p import m``: p.m if a module)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _base_of_relative(module, path.name == "__init__.py", node)
            else:
                base = node.module or ""
            names += [f"{base}.{alias.name}" for alias in node.names]
    found = {_existing(name, modules) for name in names}
    return {name for name in found if name is not None and name != module}


def import_graph(package_dir: Path = PACKAGE_DIR) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports."""
    modules = package_modules(package_dir)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path ``[a, b, ..., a]``, or None: a depth-first search for an edge back into its path."""
    finished: set[str] = set()
    for root in sorted(graph):
        if root in finished:
            continue
        path = [root]
        unvisited = [iter(sorted(graph[root]))]
        while path:
            child = next(unvisited[-1], None)
            if child is None:
                finished.add(path.pop())
                unvisited.pop()
            elif child in path:
                return [*path[path.index(child) :], child]
            elif child not in finished:
                path.append(child)
                unvisited.append(iter(sorted(graph[child])))
    return None


def test_the_import_graph_has_no_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def _in_command_layer(module: str) -> bool:
    return any(_within(module, layer) for layer in COMMAND_LAYER)


def test_only_the_command_layer_imports_the_command_layer():
    # `python -m gate` runs gate/__main__.py, the entry point's other door.
    library = {
        m: i for m, i in import_graph().items() if not _in_command_layer(m) and m != "gate.__main__"
    }
    offenders = {m: sorted(filter(_in_command_layer, i)) for m, i in library.items()}
    offenders = {m: layer for m, layer in offenders.items() if layer}
    assert not offenders, f"the library imports the command layer: {offenders}"


def test_the_worker_imports_only_what_the_engine_environment_has():
    graph = import_graph()
    reached: set[str] = set()
    frontier = [m for m in graph if _within(m, "gate.worker")]
    while frontier:  # transitively: an allowed module importing more would bring it along
        module = frontier.pop()
        for imported in graph[module] - reached:
            reached.add(imported)
            frontier.append(imported)
    outside = sorted(m for m in reached if not any(_within(m, a) for a in WORKER_MAY_IMPORT))
    assert not outside, f"the worker reaches {outside}"


def test_the_graph_sees_lazy_relative_and_from_imports(tmp_path):
    # The checks above are only as good as the parser: pin what it must see, on a package of its own.
    sources = {
        "__init__.py": "",
        "a.py": "import os\nfrom pkg import b\n",  # `from package import module`
        "b.py": "def f():\n    from pkg.sub.c import name\n",  # inside a function, an attribute
        "sub/__init__.py": "from . import c\n",  # relative, from a package's __init__
        "sub/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import x\n",
        "d.py": "import pkg.sub.c as c\nfrom pkg.nothing import y\n",  # not a module: the package
    }
    package = tmp_path / "pkg"
    for name, text in sources.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    graph = import_graph(package)
    assert graph == {
        "pkg": set(),
        "pkg.a": {"pkg.b"},
        "pkg.b": {"pkg.sub.c"},
        "pkg.sub": {"pkg.sub.c"},
        "pkg.sub.c": {"pkg.a"},
        "pkg.d": {"pkg.sub.c", "pkg"},
    }
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
