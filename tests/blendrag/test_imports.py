"""Import directions: every import in src/ (module level or not, TYPE_CHECKING included) goes
where the package map allows, and the packages form no cycle.

The map is docs/architecture.md's ("Package map"); keep both in step.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

CORE = {
    # unit: the units it may import (besides itself)
    "blendrag.checks": set(),
    "blendrag.config": {"blendrag.checks"},
    "blendrag.prompt": set(),
    "blendrag.spec": {"blendrag.config", "blendrag.model", "blendrag.store", "blendrag.engine"},
    "blendrag.kv": set(),
    "blendrag.model": set(),
    "blendrag.store": {"blendrag.kv", "blendrag.checks"},
    "blendrag.ingest": {"blendrag.config", "blendrag.prompt", "blendrag.store"},
    "blendrag.engine": {"blendrag.checks", "blendrag.config", "blendrag.prompt", "blendrag.kv",
                        "blendrag.model", "blendrag.store",
                        "blendrag.ingest"},
    "blendrag.eval": {"blendrag.config", "blendrag.prompt", "blendrag.engine"},
    "blendrag.calibration": {"blendrag.checks", "blendrag.config", "blendrag.prompt", "blendrag.kv",
                             "blendrag.store", "blendrag.engine", "blendrag.eval",
                             "blendrag.integration"},
    "blendrag.serving": {"blendrag.checks", "blendrag.config", "blendrag.prompt",
                         "blendrag.engine"},
    # store: the text index is signed and sealed with the store's keys
    "blendrag.integration": {"blendrag.spec", "blendrag.config", "blendrag.prompt", "blendrag.kv",
                             "blendrag.model", "blendrag.store", "blendrag.engine",
                             "blendrag.ingest", "blendrag.serving"},
    "blendrag.distributed": {"blendrag.spec", "blendrag.checks", "blendrag.config",
                             "blendrag.prompt", "blendrag.model", "blendrag.store",
                             "blendrag.ingest", "blendrag.engine", "blendrag.integration",
                             "blendrag.serving"},
    "blendrag.langchain": {"blendrag.spec", "blendrag.store", "blendrag.config", "blendrag.engine",
                           "blendrag.ingest", "blendrag.integration", "blendrag.serving"},
    "blendrag.llamaindex": {"blendrag.spec", "blendrag.store", "blendrag.config",
                            "blendrag.engine", "blendrag.ingest", "blendrag.integration",
                            "blendrag.distributed", "blendrag.serving"},
    "blendrag.cli": {"blendrag.spec", "blendrag.config", "blendrag.prompt", "blendrag.kv",
                     "blendrag.model", "blendrag.store", "blendrag.ingest", "blendrag.engine",
                     "blendrag.integration", "blendrag.eval", "blendrag.distributed",
                     "blendrag.calibration"},
    "blendrag": {"blendrag.config", "blendrag.engine", "blendrag.kv", "blendrag.prompt",
                 "blendrag.store", "blendrag.calibration", "blendrag.spec"},
}
ALLOWED = {
    **CORE,
    "blendrag_demo": set(CORE),
    "blendrag_bench": {*CORE, "blendrag_demo", "blendrag_servers"},
    "blendrag_servers": set(),
}
# Finer rule inside one edge: the engine uses a store through its protocol, and RAM as the default.
# the protocol, the RAM default, layer-wise reads (what a store hands the layer loop) and the
# calibration records kept beside the entries
ENGINE_STORE_MODULES = {"blendrag.store", "blendrag.store.protocol", "blendrag.store.ram",
                        "blendrag.store.layered", "blendrag.store.calibration",
                        "blendrag.store.names"}  # names: which namespaces a tenant may take


def unit(module: str) -> str | None:
    """The package-map unit of a dotted module name; None outside blendrag's packages."""
    top, _, rest = module.partition(".")
    if top in ("blendrag_bench", "blendrag_demo", "blendrag_servers"):
        return top
    if top != "blendrag":
        return None
    return "blendrag" if not rest else "blendrag." + rest.split(".")[0]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> set[str]:
    """Dotted names ``path`` imports (``from a import b`` gives a and a.b: b may be a module)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def edges() -> dict[tuple[str, str], set[tuple[str, str]]]:
    """(from unit, to unit) -> {(module, imported name)} over every source file."""
    out: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for path in SRC.rglob("*.py"):
        here = module_name(path)
        src_unit = unit(here)
        for name in imports(path):
            dst_unit = unit(name)
            if dst_unit is None or dst_unit == src_unit:
                continue
            out.setdefault((src_unit, dst_unit), set()).add((here, name))
    return out


EDGES = edges()


def test_every_package_is_on_the_map():
    units = {unit(module_name(p)) for p in SRC.rglob("*.py")}
    assert units <= set(ALLOWED), (
        f"add {sorted(units - set(ALLOWED))} to the map (here and in the docs)"
    )


@pytest.mark.parametrize("source", sorted(ALLOWED))
def test_imports_follow_the_map(source):
    bad = {dst: sorted(where) for (src, dst),
           where in EDGES.items() if src == source and dst not in ALLOWED[source]}
    assert not bad, f"{source} may not import {sorted(bad)}: {bad}"


def test_the_core_never_imports_the_demo_or_the_benchmarks():
    bad = [
        (src, dst)
        for src, dst in EDGES
        if src in CORE and dst in ("blendrag_demo", "blendrag_bench")
    ]
    assert not bad


def test_the_engine_reaches_the_store_only_through_its_protocol_and_the_ram_default():
    used = {name for module, name in EDGES.get(("blendrag.engine", "blendrag.store"), set())}
    assert used <= ENGINE_STORE_MODULES | {
        f"{m}.{n}" for m in ENGINE_STORE_MODULES
        for n in ("KVStore", "MemoryKVStore", "LayeredEntry", "MemoryLayeredEntry",
                  "LayerReadError", "CalibrationBook", "CalibrationRecord",
                  "StoreStats", "TierCounters", "check_tenant_namespace",
                  "LayeredEntryWrapper")
    }


def assert_acyclic(graph: dict[str, set[str]]) -> None:
    """AssertionError naming the first import cycle of ``graph`` (node -> what it imports)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*path, node, nxt]))
            if nxt not in state:
                visit(nxt, [*path, node])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])


def test_no_cycle_between_packages():
    graph: dict[str, set[str]] = {}
    for src, dst in EDGES:
        graph.setdefault(src, set()).add(dst)
    assert_acyclic(graph)


def test_no_cycle_between_benchmark_modules():
    """blendrag_bench module by module (lazy imports included): a reader follows each benchmark
    down, never round."""
    bench = SRC / "blendrag_bench"
    modules = {module_name(p): p for p in bench.rglob("*.py")}
    assert_acyclic({m: {n for n in imports(p) if n in modules and n != m}
                    for m, p in modules.items()})


FACADE = {"blendrag.engine", "blendrag.engine.engine"}  # the package's face and its module


def test_nothing_below_the_engine_facade_imports_it():
    """Only the facade (engine/engine.py, re-exported by engine/__init__.py) holds the engine:
    no other module of blendrag/engine/ imports it, nor the package whose face it is."""
    engine_dir = SRC / "blendrag" / "engine"
    bad = {}
    for path in engine_dir.rglob("*.py"):
        here = module_name(path)
        if here in FACADE:
            continue
        hits = sorted(n for n in imports(path)
                      if n in FACADE or n.startswith("blendrag.engine.engine"))
        if hits:
            bad[here] = hits
    assert not bad, f"modules below the facade import it: {bad}"


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_definitions(tree: ast.AST) -> set[str]:
    """Private names a module defines: top-level and class-level names, methods, and attributes
    it assigns on ``self``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for t in ast.walk(target):
                    if isinstance(t, ast.Name):
                        names.add(t.id)
                    elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) \
                            and t.value.id == "self":
                        names.add(t.attr)
    return {n for n in names if _private(n)}


def test_no_module_uses_another_modules_private_names():
    """``from m import _x`` and ``obj._x`` where ``_x`` is private to another blendrag module
    (tests may; the code may not: a private name is the module's to change)."""
    trees = {module_name(p): ast.parse(p.read_text(), str(p)) for p in SRC.rglob("*.py")}
    own = {m: private_definitions(t) for m, t in trees.items()}
    everyone = set().union(*own.values())
    bad = []
    for module, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and unit(node.module):
                bad += [f"{module}: from {node.module} import {a.name}" for a in node.names
                        if _private(a.name)]
            elif (isinstance(node, ast.Attribute) and _private(node.attr)
                  and node.attr in everyone - own[module]
                  and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
                bad.append(f"{module}:{node.lineno}: .{node.attr}")
    assert not bad, "private names used outside their module: " + "; ".join(bad)


def test_core_tests_never_import_the_demo_or_the_benchmarks():
    """tests/blendrag/ tests the core alone: only the benchmarks' and the demo's own tests import
    them."""
    core_tests = Path(__file__).resolve().parent
    bad = {str(p.relative_to(core_tests)): sorted(n for n in imports(p)
                                                  if unit(n) in ("blendrag_bench", "blendrag_demo"))
           for p in core_tests.rglob("*.py")}
    assert not {k: v for k, v in bad.items() if v}


def test_the_configs_the_docs_show_are_exported():
    import blendrag
    from blendrag.engine.request.warmup import WarmupConfig
    from blendrag.engine.selection.controller import LoadingConfig

    assert blendrag.LoadingConfig is LoadingConfig and blendrag.WarmupConfig is WarmupConfig
    assert {"LoadingConfig", "WarmupConfig"} <= set(blendrag.__all__)
