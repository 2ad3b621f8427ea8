"""No two files of the package import each other, directly or round a longer loop: every
import counts, whether at the top, inside a function or for types only (a reader follows each
the same way). Packages' ``__init__.py`` files, which gather names for users, are left out."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGES = ("blendrag", "blendrag_bench", "blendrag_demo")


def _modules() -> dict[str, Path]:
    """Dotted name -> file, for every module file (not ``__init__.py``) of the packages."""
    found = {}
    for package in PACKAGES:
        for path in (SRC / package).rglob("*.py"):
            if path.name != "__init__.py":
                found[".".join(path.relative_to(SRC).with_suffix("").parts)] = path
    return found


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's module files that ``path`` imports (``from a.b import c`` is ``a.b.c``
    when that is a module file, else ``a.b``)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules
                    else node.module for a in node.names}
    return {name for name in out if name in modules}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_files_of_the_package_import_each_other():
    modules = _modules()
    graph = {name: _imports(path, modules) for name, path in modules.items()}
    assert sum(map(len, graph.values())) > 200  # the imports were read
    assert _circles(graph) == []


def test_the_check_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []
