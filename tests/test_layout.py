"""The package's layout: the core never imports the tooling, and the subpackages form layers.

The core is the store an engine embeds (specs, policies, tiers, manager, engine, chain,
embed, metrics, config, errors, keys, blocks, checks, hierarchy, sync). Inside it, the rooms
point one way: the transfer engine imports nothing that drives or embeds it, the metrics
never import the hierarchy, the chain never imports what a serving engine embeds, no
`_private` name crosses a package, and no kvtier module takes part in an import cycle.
The tooling (`cli`: the operator's commands, `testing`: the conformance suites) and the
adapters (`integrations`) build on it; the paged-KV allocator is a subpackage of its own. The
workloads, benchmarks and their commands are another distribution, kvtier-tools (package
`kvtier_tools`, tools/), which kvtier never imports. These tests read the source
(every import, at any depth) and import the package in a fresh interpreter, so a new import
that breaks the layering fails here.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

import kvtier

PACKAGE = Path(kvtier.__file__).resolve().parent
TOOLING = {"cli", "testing"}
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


@functools.cache
def _tree(path: Path) -> ast.Module:
    """The parsed source of `path`, parsed once for all the rules (they read every module)."""
    return ast.parse(path.read_text(), str(path))


@functools.cache
def _imports(path: Path, *, module_level_only: bool) -> list[str]:
    """The kvtier modules `path` imports (under TYPE_CHECKING excluded: never run)."""
    tree = _tree(path)
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


def test_the_allocator_does_not_reach_up_into_the_command_line() -> None:
    edges = _edges(module_level_only=False)
    assert "cli" not in edges["allocator"]


TOOLS = Path(__file__).resolve().parent.parent / "tools" / "kvtier_tools"


def _every_import(path: Path) -> list[str]:
    """Every module `path` imports, at any depth, TYPE_CHECKING blocks included (the product's
    wheel has no kvtier_tools, so not even its type checking may name it)."""
    found: list[str] = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return found


def test_kvtier_never_imports_the_tools() -> None:
    """The product (kvtier) imports nothing of kvtier-tools, anywhere: the tools' commands join
    `kvtier` through the `kvtier.commands` entry points, and the wheel is the product alone."""
    offences = [
        f"{path.relative_to(PACKAGE.parent)} imports {target}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for target in _every_import(path)
        if target == "kvtier_tools" or target.startswith("kvtier_tools.")
    ]
    assert offences == []
    assert not {"bench", "workloads"} & {entry.name for entry in PACKAGE.iterdir()}


def test_workloads_and_benchmarks_do_not_reach_up_into_the_command_line() -> None:
    """kvtier_tools' workloads and benchmarks are driven by its commands, never the reverse."""
    offences = [
        f"{path.relative_to(TOOLS.parent)} imports {target}"
        for room in ("workloads", "bench")
        for path in sorted((TOOLS / room).rglob("*.py"))
        for target in _every_import(path)
        if target.split(".")[:2] in (["kvtier_tools", "cli"], ["kvtier", "cli"])
    ]
    assert offences == []


def test_the_subpackages_import_each_other_without_cycles() -> None:
    """Module-level imports between subpackages form a DAG (the tier registry reaches tier
    packages only by name, through importlib)."""
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
        name for name in loaded if name.startswith("kvtier.") and _unit(name) in OUTSIDE_CORE
    ]
    assert tooling == []
    assert not {"click", "rich", "matplotlib", "prometheus_client"} & set(loaded)


def test_the_allocator_is_not_exported_from_the_root() -> None:
    for name in ("BlockAllocator", "PrefixCachingBlockAllocator", "NaiveBlockAllocator", "Block"):
        assert not hasattr(kvtier, name), name
        assert name not in kvtier.__all__
    from kvtier.allocator import PrefixCachingBlockAllocator

    assert PrefixCachingBlockAllocator.__module__.startswith("kvtier.allocator")


# -- the rooms of the core: who may import whom ----------------------------------------------

CORE_ABOVE_THE_ENGINE = ("kvtier.hierarchy", "kvtier.sync", "kvtier.chain", "kvtier.embed")
"""What drives the transfer engine or embeds it: the engine never imports any of it."""


def _modules() -> dict[str, Path]:
    """Every kvtier module, by dotted name (a package by its `__init__`)."""
    return {_module_of(path): path for path in PACKAGE.rglob("*.py")}


def _in(module: str, package: str) -> bool:
    """Whether `module` is `package` or inside it."""
    return module == package or module.startswith(package + ".")


def _typing_only(tree: ast.AST) -> set[int]:
    """Ids of the nodes under `if TYPE_CHECKING:` (never run)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(inner) for inner in ast.walk(node))
    return skipped


def _imported_names(path: Path, *, typing_too: bool = False) -> list[tuple[str, str | None]]:
    """(module, name) of every kvtier import in `path`, at any depth, function-level
    included and TYPE_CHECKING excluded unless `typing_too`: `from kvtier.a import b` gives
    ("kvtier.a", "b"), `import kvtier.a` gives ("kvtier.a", None)."""
    tree = _tree(path)
    skipped = set() if typing_too else _typing_only(tree)
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.extend((node.module, alias.name) for alias in node.names)
        elif isinstance(node, ast.Import):
            found.extend((alias.name, None) for alias in node.names)
    return [(module, name) for module, name in found if _in(module, "kvtier")]


@functools.cache
def _module_edges(*, typing_too: bool = False) -> dict[str, set[str]]:
    """Module -> the kvtier modules it imports (at any depth, TYPE_CHECKING excluded unless
    `typing_too`). An import names the module it reads: `from kvtier.a import b` is
    kvtier.a.b when that is a module, else kvtier.a (the package's `__init__`)."""
    modules = _modules()
    edges: dict[str, set[str]] = {module: set() for module in modules}
    for module, path in modules.items():
        for imported, name in _imported_names(path, typing_too=typing_too):
            target = f"{imported}.{name}" if f"{imported}.{name}" in modules else imported
            if target in modules and target != module:
                edges[module].add(target)
    return edges


def _offences(importers: str, forbidden: tuple[str, ...], *, typing_too: bool = False) -> list[str]:
    """`importer imports target` for each module of package `importers` importing one of
    `forbidden` (packages or modules), at any depth (TYPE_CHECKING too with `typing_too`)."""
    return [
        f"{module} imports {target}"
        for module, targets in _module_edges(typing_too=typing_too).items()
        if _in(module, importers)
        for target in sorted(targets)
        if any(_in(target, room) for room in forbidden)
    ]


def test_the_transfer_engine_imports_nothing_that_drives_or_embeds_it() -> None:
    assert _offences("kvtier.engine", CORE_ABOVE_THE_ENGINE) == []


def test_the_metrics_never_import_the_hierarchy() -> None:
    """The collector reads a `StatsSource` (`kvtier.metrics.catalog`), so the hierarchy
    imports the metrics and never the reverse."""
    assert _offences("kvtier.metrics", ("kvtier.hierarchy", "kvtier.sync")) == []


def test_the_chain_never_imports_what_a_serving_engine_embeds() -> None:
    assert _offences("kvtier.chain", ("kvtier.embed", "kvtier.hierarchy", "kvtier.sync")) == []


def test_only_the_hierarchy_imports_the_fleet_and_only_in_a_function() -> None:
    """The chain emits plain event objects (`kvtier.manager.events`); `kvtier.fleet` (the
    publisher, which needs the events extra) imports them, never the reverse. Of the core,
    only the hierarchy starts a publisher, imported when `[events]` is on (the tooling's
    `kvtier fleet index` runs the fleet's index, imported when it runs)."""
    importers = sorted(
        module
        for module, targets in _module_edges().items()
        if not _in(module, "kvtier.fleet")
        and _unit(module) not in TOOLING
        and any(_in(t, "kvtier.fleet") for t in targets)
    )
    assert importers == ["kvtier.hierarchy"]
    cli_level = _imports(PACKAGE / "cli" / "commands" / "fleet.py", module_level_only=True)
    assert not any(_in(target, "kvtier.fleet") for target in cli_level)
    module_level = _imports(PACKAGE / "hierarchy.py", module_level_only=True)
    assert not any(_in(target, "kvtier.fleet") for target in module_level)


def test_the_fleet_never_imports_what_runs_the_chain() -> None:
    running = ("kvtier.hierarchy", "kvtier.sync", "kvtier.chain", "kvtier.engine", "kvtier.embed")
    assert _offences("kvtier.fleet", running, typing_too=True) == []


def test_no_private_name_is_imported_across_packages() -> None:
    """`_name` is private to its package: a module imports one only from inside the package
    directory it lives in (make what is shared public, in its home module)."""
    offences = []
    for module, path in _modules().items():
        home = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for imported, name in _imported_names(path):
            private = name is not None and name.startswith("_") and not name.startswith("__")
            if private and not _in(imported, home):
                offences.append(f"{module} imports {name} from {imported}")
    assert offences == []


@pytest.mark.parametrize("typing_too", [False, True], ids=["run-time", "with-type-only"])
def test_kvtier_modules_import_each_other_without_cycles_at_any_depth(typing_too: bool) -> None:
    """No import cycle between kvtier modules, function-level imports included (an import
    inside a function is a cycle put off, not removed), nor once the TYPE_CHECKING imports
    are counted too (a cycle of types is two modules that cannot be understood apart)."""
    edges = _module_edges(typing_too=typing_too)
    cycles = []
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                cycles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert cycles == []


TIER_DECLARATIONS = {"owns_index", "access", "volatile", "shared", "auto_enable", "opener"}
"""What a `TierKind` declares about its tiers (`kvtier.tiers.registry`)."""

RUNNING_CORE = ("kvtier.hierarchy", "kvtier.sync", "kvtier.chain", "kvtier.engine")
RUNNING_CORE += ("kvtier.manager", "kvtier.embed", "kvtier.metrics")


def test_only_the_chain_assembly_reads_the_tiers_declarations() -> None:
    """Of the running core, `kvtier.chain.assembly` alone reads a tier's kind
    (`tier.kind.owns_index`, `.access`, ...): the rest is told what it needs."""
    offences = []
    for module, path in _modules().items():
        if module == "kvtier.chain.assembly" or not any(_in(module, p) for p in RUNNING_CORE):
            continue
        for node in ast.walk(_tree(path)):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in TIER_DECLARATIONS
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "kind"
            ):
                offences.append(f"{module}:{node.lineno} reads .kind.{node.attr}")
    assert offences == []


# -- the tiers: the running core reaches them through the registry only ---------------------

TIERS = PACKAGE / "tiers"
TIER_PACKAGES = tuple(
    sorted(f"kvtier.tiers.{path.parent.name}" for path in TIERS.glob("*/kind.py"))
)
"""One package per tier (each declares its kind in `kind.py`): pool, disk, redis, sharedfs."""

SHARED_PARTS = tuple(
    sorted(
        f"kvtier.tiers.{path.name}"
        for path in TIERS.iterdir()
        if path.is_dir() and (path / "__init__.py").exists() and not (path / "kind.py").exists()
    )
)
"""Packages of parts some tiers share (`shared/`: the shared tiers' values and keys)."""


def test_the_tier_packages_are_found() -> None:
    assert TIER_PACKAGES == (
        "kvtier.tiers.disk",
        "kvtier.tiers.pool",
        "kvtier.tiers.redis",
        "kvtier.tiers.sharedfs",
    )
    assert SHARED_PARTS == ("kvtier.tiers.shared",)


@pytest.mark.parametrize("room", [*RUNNING_CORE, "kvtier.config", "kvtier.checks"])
def test_the_running_core_imports_no_tier_package(room: str) -> None:
    """The chain, the transfer engine, the bookkeeping and what drives them know a tier by
    what `BlockStorage` (or `KeyedStorage`) and its kind declare; the registry opens it by
    name. Type-only imports count: naming `DiskStore` in a signature is knowing the disk
    tier. (The package root's lazy `kvtier.DiskStore` and `kvtier.TorchPool` are exports for
    users, not a room.)"""
    assert _offences(room, TIER_PACKAGES + SHARED_PARTS, typing_too=True) == []


@pytest.mark.parametrize("package", TIER_PACKAGES)
def test_a_tier_package_imports_no_other_tier_package(package: str) -> None:
    """What two tiers share lives beside them (`tiers/codec.py`, `tiers/trusted.py`,
    `tiers/shared/`), so a tier can be removed, or read, alone."""
    others = tuple(other for other in TIER_PACKAGES if other != package)
    assert _offences(package, others, typing_too=True) == []


@pytest.mark.parametrize("package", SHARED_PARTS)
def test_the_shared_parts_import_no_tier_package(package: str) -> None:
    assert _offences(package, TIER_PACKAGES, typing_too=True) == []


MAX_MODULE_LINES = 600
"""A module longer than this does more than one job: split it."""

LONG_MODULES = {
    "kvtier/manager/tier.py": "TierManager, one module of the compiled core: not split yet",
    "kvtier/policies/lct.py": "the LCT policy, its solver and the core's properties",
    "kvtier/policies/_arc_core.py": "ARC's lists: one Cython class, which cannot span modules",
    "kvtier/policies/_lct_core.py": "lct's state: one Cython class, which cannot span modules",
    "kvtier/policies/_s3fifo_core.py": "S3-FIFO's queues: one Cython class, on keys or ids",
    "tools/kvtier_tools/bench/datapath.py": "a benchmark (tooling): not split yet",
    "tools/kvtier_tools/bench/writepath.py": "a benchmark (tooling): not split yet",
    "tools/kvtier_tools/bench/bookkeeping.py": "a benchmark (tooling): not split yet",
    "tools/kvtier_tools/workloads/replay.py": "the trace replay (tooling): not split yet",
}
"""The modules allowed past MAX_MODULE_LINES for now, each with why; the test fails once
one of them is short enough, so the list only shrinks."""


def test_no_module_is_longer_than_the_limit() -> None:
    root = PACKAGE.parent
    lengths = {
        str(path.relative_to(root)): len(path.read_text().splitlines())
        for package in (PACKAGE, root / "tools" / "kvtier_tools")
        for path in package.rglob("*.py")
    }
    too_long = {
        name: lines
        for name, lines in sorted(lengths.items())
        if lines > MAX_MODULE_LINES and name not in LONG_MODULES
    }
    assert too_long == {}
    short_enough = [name for name in LONG_MODULES if lengths.get(name, 0) <= MAX_MODULE_LINES]
    assert short_enough == []


def test_the_disk_stores_facade_stays_small() -> None:
    """`DiskStore` hands every call to a part of its own (issue 31): its module stays under
    500 lines, so a new job goes into a part, not the facade."""
    lines = (PACKAGE / "tiers" / "disk" / "store.py").read_text().splitlines()
    assert len(lines) < 500, len(lines)
