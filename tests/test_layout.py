"""The package's layout: the core never imports the tooling, and the subpackages form layers.

The core is the store an engine embeds (specs, policies, tiers, manager, engine, config,
errors, keys, blocks, hierarchy, sync). The tooling (`cli`, `workloads`, `bench`, `testing`)
and the adapters (`integrations`) build on it; the paged-KV allocator is a subpackage of its
own. These tests read the source (every import, at any depth) and import the package in a
fresh interpreter, so a new import that breaks the layering fails here.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import kvtier

PACKAGE = Path(kvtier.__file__).resolve().parent
TOOLING = {"cli", "workloads", "bench", "testing"}
OUTSIDE_CORE = TOOLING | {"integrations", "allocator"}


def _unit(module: str) -> str:
    """The top-level part of kvtier a module belongs to ("kvtier" for the root itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "kvtier"


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, *, module_level_only: bool) -> list[str]:
    """The kvtier modules `path` imports (under TYPE_CHECKING excluded: never run)."""
    tree = ast.parse(path.read_text(), str(path))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(inner) for inner in ast.walk(node))
        if module_level_only and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            skipped.update(id(inner) for inner in ast.walk(node) if inner is not node)
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return [name for name in found if name == "kvtier" or name.startswith("kvtier.")]


def _edges(*, module_level_only: bool) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        source = _unit(_module_of(path))
        for target in _imports(path, module_level_only=module_level_only):
            if _unit(target) != source:
                edges[source].add(_unit(target))
    return edges


def test_the_core_imports_no_tooling_anywhere() -> None:
    offences = []
    for path in PACKAGE.rglob("*.py"):
        if _unit(_module_of(path)) in OUTSIDE_CORE:
            continue
        for target in _imports(path, module_level_only=False):
            if _unit(target) in OUTSIDE_CORE:
                offences.append(f"{path.relative_to(PACKAGE.parent)} imports {target}")
    assert offences == []


def test_workloads_and_benchmarks_do_not_reach_up_into_the_command_line() -> None:
    edges = _edges(module_level_only=False)
    assert "cli" not in edges["workloads"]
    assert "cli" not in edges["bench"]
    assert "cli" not in edges["allocator"] and "workloads" not in edges["allocator"]


def test_the_subpackages_import_each_other_without_cycles() -> None:
    """Module-level imports between subpackages form a DAG (a plugin registry's lookup inside
    a function, config -> tiers.registry, is the one lazy edge back)."""
    edges = _edges(module_level_only=True)
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                cycle = [*path[path.index(target) :], target] if target in path else [node, target]
                raise AssertionError(f"import cycle: {' -> '.join(cycle)}")
            if target not in state:
                visit(target, [*path, target])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])


def test_import_kvtier_loads_only_the_core() -> None:
    program = (
        "import sys, kvtier, kvtier.hierarchy, kvtier.sync, kvtier.config\n"
        "from kvtier import Hierarchy, SyncHierarchy, TorchPool, DiskStore\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=True
    )
    loaded = done.stdout.split()
    assert "kvtier.hierarchy" in loaded  # the program did import the core
    tooling = [
        name
        for name in loaded
        if name.startswith("kvtier.") and _unit(name) in OUTSIDE_CORE
    ]
    assert tooling == []
    assert not {"click", "rich", "matplotlib", "prometheus_client"} & set(loaded)


def test_the_allocator_is_not_exported_from_the_root() -> None:
    for name in ("BlockAllocator", "PrefixCachingBlockAllocator", "NaiveBlockAllocator", "Block"):
        assert not hasattr(kvtier, name), name
        assert name not in kvtier.__all__
    from kvtier.allocator import PrefixCachingBlockAllocator

    assert PrefixCachingBlockAllocator.__module__.startswith("kvtier.allocator")
