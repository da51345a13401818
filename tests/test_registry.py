"""Tests of kvtier.tiers.registry: the declarations of the built-in tiers, a tier added by a
module of its own (config, opener, one `register_tier` call), and what reads the
declarations (chain rules, `kvtier check`, the replay's disk directories, bookkeeping)."""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, Literal

import pytest
from click.testing import CliRunner
from pydantic import Field, field_validator

from kvtier.cli import main
from kvtier.config import parse_config
from kvtier.errors import ConfigError, InvalidValueError
from kvtier.keys import key_from_int
from kvtier.manager.backend import SlotPoolBackend
from kvtier.manager.tier import make_tier_manager
from kvtier.specs import Medium, SlotLoadStoreSpec, slot_spec_type
from kvtier.tiers.disk import DiskStore
from kvtier.tiers.disk.kind import DiskTierConfig
from kvtier.tiers.pool.kind import CPUTierConfig, GPUTierConfig
from kvtier.tiers.pool.storage import TorchPool
from kvtier.tiers.registry import (
    ENTRY_POINT_GROUP,
    BaseTierConfig,
    TierAccess,
    TierContext,
    TierKind,
    open_storage,
    register_tier,
    registered_media,
    tier_kind,
    unregister_tier,
)
from kvtier.tiers.storage import BlockStorage

# ------------------------------------------------------------------------------------------
# A tier of our own: the whole of what a new tier's module holds
# ------------------------------------------------------------------------------------------


class ShelfTierConfig(BaseTierConfig):
    """A persistent tier on a (pretend) shelf of tapes."""

    medium: Literal["shelf"]
    path: Path = Path("/nonexistent/shelf")
    reel: str = "A"
    rewind_s: int = Field(default=1, ge=0)

    @field_validator("path", mode="before")
    @classmethod
    def _as_path(cls, value: object) -> object:
        return Path(value) if isinstance(value, str) else value


OPENED: list[tuple[ShelfTierConfig, TierContext]] = []


class ShelfPool(TorchPool):
    """A host pool reached through its reads and writes, as a shelf's tapes would be (the
    access the shelf kind declares)."""

    access: ClassVar[TierAccess] = TierAccess.HOST_BUFFERS


async def open_shelf_tier(config: ShelfTierConfig, context: TierContext) -> BlockStorage:
    """Records what it was given; the bytes go to a host pool (enough for a test)."""
    OPENED.append((config, context))
    return ShelfPool(config.num_blocks, context.block_size, "cpu")


async def open_nothing(config: ShelfTierConfig, context: TierContext) -> object:
    return "not a storage"


def shelf_kind(**changes: Any) -> TierKind:
    declared: dict[str, Any] = {
        "volatile": False,
        "access": TierAccess.HOST_BUFFERS,
        "opener": "test_registry:open_shelf_tier",
    }
    declared.update(changes)
    return TierKind("shelf", ShelfTierConfig, **declared)


@pytest.fixture
def shelf() -> Iterator[TierKind]:
    """The shelf tier, registered for one test."""
    kind = shelf_kind()
    register_tier(kind)
    try:
        yield kind
    finally:
        unregister_tier("shelf")


def chain(*tiers: dict[str, Any]) -> dict[str, Any]:
    return {"block_size": 4096, "tiers": [copy.deepcopy(tier) for tier in tiers]}


CPU = {"name": "c", "medium": "cpu", "capacity": 4}
SHELF = {"name": "s", "medium": "shelf", "capacity": 8}


def problems_of(data: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    return caught.value.problems


# ------------------------------------------------------------------------------------------
# Built-in kinds
# ------------------------------------------------------------------------------------------


def test_the_built_in_kinds_declare_what_they_are() -> None:
    assert registered_media()[:3] == ["gpu", "cpu", "disk"]
    gpu, cpu, disk = (tier_kind(medium) for medium in ("gpu", "cpu", "disk"))
    assert (gpu.config_class, cpu.config_class, disk.config_class) == (
        GPUTierConfig,
        CPUTierConfig,
        DiskTierConfig,
    )
    assert (gpu.volatile, cpu.volatile, disk.volatile) == (True, True, False)
    assert (gpu.access, cpu.access, disk.access) == (
        TierAccess.TENSOR,
        TierAccess.TENSOR,
        TierAccess.HOST_BUFFERS,
    )
    assert (gpu.auto_enable, cpu.auto_enable, disk.auto_enable) == (True, False, False)
    assert not any(kind.owns_index for kind in (gpu, cpu, disk))
    assert tier_kind(Medium.DISK) is disk


def test_a_tier_config_knows_its_kind() -> None:
    config = parse_config(chain(CPU, {"name": "d", "medium": "disk", "capacity": 4}))
    assert [tier.kind.medium for tier in config.tiers] == ["cpu", "disk"]
    assert [tier.kind.volatile for tier in config.tiers] == [True, False]


def test_an_unknown_medium_names_the_registered_ones() -> None:
    with pytest.raises(InvalidValueError) as caught:
        tier_kind("tape")
    assert str(caught.value) == (
        "unknown tier medium 'tape'; registered media: "
        + ", ".join(f'"{medium}"' for medium in registered_media())
    )
    assert '"gpu", "cpu", "disk"' in str(caught.value)


def test_validating_a_config_imports_no_opener() -> None:
    # The openers' modules import torch, a client library or a storage library (the disk
    # store's lmdb and zstandard); a config must validate without any of them.
    code = (
        "import sys; from kvtier.config import load_default_config; "
        "config = load_default_config(); "
        "assert 'disk' in [tier.medium for tier in config.tiers]; "
        "import kvtier.tiers.registry; "
        "print(sorted(m for m in ('torch', 'redis', 'lmdb', 'zstandard', "
        "'kvtier.tiers.pool.storage', 'kvtier.tiers.disk.store', 'kvtier.tiers.redis.storage', "
        "'kvtier.tiers.sharedfs.storage') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def run_python(code: str, *, path: list[Path] | None = None) -> str:
    """What `code` prints in a fresh interpreter (with `path` first on its sys.path)."""
    env = dict(os.environ)
    if path:
        env["PYTHONPATH"] = os.pathsep.join([*map(str, path), env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_the_built_in_kinds_come_first_whichever_module_is_imported_first() -> None:
    # A tier package's kind module imported before the registry is used registers nothing by
    # itself: the registry loads the built-in list, in its order, on first use.
    code = (
        "import kvtier.tiers.sharedfs.kind, kvtier.tiers.disk.kind; "
        "from kvtier.tiers.registry import registered_media; print(registered_media())"
    )
    assert run_python(code) == "['gpu', 'cpu', 'disk', 'redis', 'shared-fs']"


def test_an_installed_plugin_is_registered_by_its_entry_point(tmp_path: Path) -> None:
    """A package that names its TierKind in the `kvtier.tiers` entry-point group needs no
    import: its medium validates (after the built-ins) and opens."""
    dist = tmp_path / "memkv_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: memkv-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nmemkv = memory_kv_tier:KIND\n")
    code = (
        "import asyncio, sys\n"
        "from kvtier.config import parse_config\n"
        "from kvtier.tiers.registry import TierContext, open_storage, registered_media\n"
        "config = parse_config({'block_size': 4096, 'tiers': [\n"
        "    {'name': 'm', 'medium': 'memkv', 'capacity': 4, 'latency_ms': 2}]})\n"
        "storage = asyncio.run(open_storage(config.tiers[0], TierContext(block_size=4096)))\n"
        "print(registered_media()[-1], config.tiers[0].latency_ms, type(storage).__name__)\n"
    )
    examples = Path(__file__).resolve().parent.parent / "examples"
    assert run_python(code, path=[tmp_path, examples]) == "memkv 2.0 MemoryKVStorage"


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("json:dumps", "is not a TierKind, got <function dumps"),
        ("no_such_module:KIND", "cannot be loaded: No module named 'no_such_module'"),
    ],
)
def test_a_plugin_that_is_not_a_kind_is_named(tmp_path: Path, value: str, why: str) -> None:
    dist = tmp_path / "broken_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nbroken = {value}\n")
    code = (
        "from kvtier.errors import InvalidValueError\n"
        "from kvtier.tiers.registry import registered_media\n"
        "for attempt in range(2):\n"
        "    try:\n"
        "        registered_media()\n"
        "    except InvalidValueError as error:\n"
        "        print(error)\n"
    )
    lines = run_python(code, path=[tmp_path]).splitlines()
    assert len(lines) == 2 and lines[0] == lines[1]  # asked again, it fails the same way
    named = f"the tier plug-in broken = {value!r} (entry-point group {ENTRY_POINT_GROUP})"
    assert lines[0].startswith(f"{named} {why}")


# The modules that decide for every tier: none of them may name a medium (each tier's package
# declares its own; `BUILTIN_TIERS` lists the packages).
MEDIUM_FREE = [
    "kvtier/checks.py",
    "kvtier/config.py",
    "kvtier/config_fields.py",
    "kvtier/hierarchy.py",
    "kvtier/sync.py",
    "kvtier/embed",
    "kvtier/metrics",
    "kvtier/tiers/registry.py",
    "kvtier/tiers/storage.py",
    "kvtier/tiers/keyed.py",
    "kvtier/chain",
    "kvtier/engine",
    "kvtier/manager",
]


def _names_of_media(path: Path, media: set[str]) -> list[str]:
    """Where `path` names one of `media`: a string constant that is not a docstring nor a
    torch device's type, or a `Medium.<member>`."""
    tree = ast.parse(path.read_text(), str(path))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            skipped.add(id(body[0].value))  # a docstring
        if isinstance(node, ast.Compare) and any(
            isinstance(side, ast.Attribute) and side.attr == "type"
            for side in [node.left, *node.comparators]
        ):
            skipped.update(id(side) for side in node.comparators)  # device.type != "cpu"
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("device"):
            skipped.update(id(argument) for argument in node.args)  # torch.device("cpu")
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in media and id(node) not in skipped:
            found.append(f"{path}:{node.lineno}: {node.value!r}")
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "Medium"
        ):
            found.append(f"{path}:{node.lineno}: Medium.{node.attr}")
    return found


def test_no_module_that_serves_every_tier_names_a_medium() -> None:
    root = Path(__file__).resolve().parent.parent
    media = set(registered_media())
    found = []
    for name in MEDIUM_FREE:
        place = root / name
        for path in sorted(place.rglob("*.py")) if place.is_dir() else [place]:
            found.extend(_names_of_media(path, media))
    assert found == []


# ------------------------------------------------------------------------------------------
# Registering a tier
# ------------------------------------------------------------------------------------------


def test_a_registered_medium_validates_with_its_own_model(shelf: TierKind) -> None:
    data = chain(CPU, {**SHELF, "reel": "B", "rewind_s": 3, "path": "/tmp/shelf"})
    config = parse_config(data)
    tier = config.tiers[1]
    assert isinstance(tier, ShelfTierConfig)
    assert (tier.reel, tier.rewind_s, tier.path, tier.num_blocks) == (
        "B",
        3,
        Path("/tmp/shelf"),
        8,
    )
    assert tier.kind is shelf
    assert "shelf" in config.describe().splitlines()[2]
    assert config.model_dump(mode="json")["tiers"][1]["reel"] == "B"  # its own keys dump


def test_a_registered_medium_has_its_own_error_messages(shelf: TierKind) -> None:
    data = chain(CPU, {**SHELF, "reel": 5, "rewind_s": -1, "colour": "red", "capacity": "lots"})
    data["tiers"][0]["reel"] = "C"
    problems = problems_of(data)
    assert problems == [
        "tiers[0].reel: unknown key for a cpu tier "
        '("reel" is an option of a shelf tier); a cpu tier takes: name, medium, capacity, '
        "policy, admission, enabled, high_watermark, low_watermark, min_refill, pin_memory",
        'tiers[1].capacity: expected a block count or a size like "8GiB", got "lots"',
        "tiers[1].reel: expected a string, got 5",
        "tiers[1].rewind_s: must be at least 0, got -1",
        "tiers[1].colour: unknown key; a shelf tier takes: name, medium, capacity, policy, "
        "admission, enabled, high_watermark, low_watermark, min_refill, path, reel, rewind_s",
    ]


def test_an_unknown_medium_lists_the_registered_ones_in_a_config(shelf: TierKind) -> None:
    data = chain(CPU, {**SHELF, "medium": "tape"})
    assert problems_of(data) == [
        'tiers[1].medium: expected one of "gpu", "cpu", "disk", "redis", "shared-fs", "shelf", '
        'got "tape"'
    ]


def test_an_unregistered_medium_is_unknown_again() -> None:
    register_tier(shelf_kind())
    assert parse_config(chain(SHELF)).tiers[0].medium == "shelf"
    assert unregister_tier("shelf").medium == "shelf"
    assert "shelf" not in registered_media()
    assert problems_of(chain(SHELF)) == [
        'tiers[0].medium: expected one of "gpu", "cpu", "disk", "redis", "shared-fs", got "shelf"'
    ]


def test_a_medium_is_registered_once_unless_replaced(shelf: TierKind) -> None:
    with pytest.raises(InvalidValueError, match=r"'shelf' is already registered.*replace=True"):
        register_tier(shelf_kind(volatile=True))
    assert tier_kind("shelf") is shelf
    volatile = shelf_kind(volatile=True)
    register_tier(volatile, replace=True)
    assert tier_kind("shelf") is volatile
    with pytest.raises(InvalidValueError, match="'gpu' is already registered"):
        register_tier(tier_kind("gpu"))


@pytest.mark.parametrize(
    ("medium", "config_class", "changes", "match"),
    [
        ("Shelf", ShelfTierConfig, {}, "lower-case letters"),
        ("tape", ShelfTierConfig, {}, r'ShelfTierConfig.medium must be declared Literal\["tape"\]'),
        ("shelf", dict, {}, "config_class must be a BaseTierConfig subclass"),
        ("shelf", ShelfTierConfig, {"opener": "test_registry.open_shelf_tier"}, "import path"),
        ("shelf", ShelfTierConfig, {"access": "client"}, "access must be a TierAccess"),
        ("shelf", ShelfTierConfig, {"options_keyword": "shelf options"}, "an identifier"),
    ],
)
def test_a_kind_that_contradicts_itself_is_refused(
    medium: str, config_class: Any, changes: dict[str, Any], match: str
) -> None:
    declared: dict[str, Any] = {
        "volatile": False,
        "access": TierAccess.CLIENT,
        "opener": "test_registry:open_shelf_tier",
        **changes,
    }
    with pytest.raises(InvalidValueError, match=match):
        TierKind(medium, config_class, **declared)


def test_auto_follows_the_kinds_declaration() -> None:
    register_tier(shelf_kind())
    try:
        assert problems_of(chain({**SHELF, "enabled": "auto"})) == [
            'tiers[0].enabled: "auto" (enabled when CUDA is available) is only allowed on a '
            'gpu tier, got "auto"'
        ]
        register_tier(shelf_kind(auto_enable=True), replace=True)
        config = parse_config(chain(CPU, {**SHELF, "enabled": "auto"}))
        assert config.tiers[1].enabled == "auto"
        assert [tier.name for tier in config.active_tiers(cuda_available=False)] == ["c"]
        assert "gpu or shelf tier" in problems_of(chain({**CPU, "enabled": "auto"}))[0]
    finally:
        unregister_tier("shelf")


# ------------------------------------------------------------------------------------------
# The order rule reads the declarations
# ------------------------------------------------------------------------------------------


def test_a_volatile_tier_below_a_registered_persistent_one_is_refused(shelf: TierKind) -> None:
    [line] = problems_of(chain(SHELF, CPU))
    assert line.startswith(
        "tiers[1].medium: a volatile cpu tier cannot be below the persistent shelf tier tiers[0]"
    )
    assert line.endswith('got "cpu"')
    assert len(parse_config(chain(CPU, SHELF)).tiers) == 2


def test_a_volatile_registered_tier_may_be_anywhere_above_persistent_ones() -> None:
    register_tier(shelf_kind(volatile=True))
    try:
        gpu = {"name": "g", "medium": "gpu", "capacity": 2}
        disk = {"name": "d", "medium": "disk", "capacity": 2}
        config = parse_config(chain(SHELF, gpu, CPU, disk))
        assert [tier.medium for tier in config.tiers] == ["shelf", "gpu", "cpu", "disk"]
        [line] = problems_of(chain(disk, SHELF))
        assert line.startswith("tiers[1].medium: a volatile shelf tier cannot be below")
    finally:
        unregister_tier("shelf")


# ------------------------------------------------------------------------------------------
# open_storage
# ------------------------------------------------------------------------------------------


async def test_open_storage_of_a_cpu_tier_is_a_host_pool() -> None:
    tier = parse_config(chain({**CPU, "pin_memory": False})).tiers[0]
    storage = await open_storage(tier, TierContext(block_size=4096))
    try:
        assert isinstance(storage, TorchPool)
        assert storage.device.type == "cpu"
        assert (storage.num_blocks, storage.block_size, storage.pinned) == (4, 4096, False)
    finally:
        await storage.aclose()


@pytest.mark.parametrize("layout", [None, "log", "slots"])
async def test_open_storage_of_a_disk_tier_is_a_disk_store(
    tmp_path: Path, layout: str | None
) -> None:
    from kvtier.tiers.disk.log_store import LogStore

    disk = {"name": "d", "medium": "disk", "capacity": 4, "path": str(tmp_path)}
    if layout is not None:
        disk["layout"] = layout
    tier = parse_config(chain(disk)).tiers[0]
    context = TierContext(block_size=4096, model_id="m", options={"max_workers": 1})
    storage = await open_storage(tier, context)
    try:
        assert isinstance(storage, DiskStore if layout == "slots" else LogStore)
        assert (storage.num_blocks, storage.block_size, storage.persistent) == (4, 4096, True)
        assert any(tmp_path.iterdir())  # its files are under the tier's path
    finally:
        await storage.aclose()


async def test_open_storage_calls_the_registered_opener(shelf: TierKind) -> None:
    OPENED.clear()
    tier = parse_config(chain(SHELF)).tiers[0]
    context = TierContext(block_size=4096, model_id="m", options={"speed": "fast"})
    storage = await open_storage(tier, context)
    try:
        assert [(tier, context)] == OPENED
        assert isinstance(storage, TorchPool)
    finally:
        await storage.aclose()


async def test_open_storage_refuses_what_is_not_a_storage() -> None:
    register_tier(shelf_kind(opener="test_registry:open_nothing"))
    try:
        tier = parse_config(chain(SHELF)).tiers[0]
        with pytest.raises(InvalidValueError, match="returned str, not a BlockStorage"):
            await open_storage(tier, TierContext(block_size=4096))
        register_tier(shelf_kind(opener="test_registry:no_such_opener"), replace=True)
        with pytest.raises(InvalidValueError, match="has no function no_such_opener"):
            await open_storage(tier, TierContext(block_size=4096))
        register_tier(shelf_kind(opener="no_such_module:open"), replace=True)
        with pytest.raises(ImportError, match="no_such_module"):
            await open_storage(tier, TierContext(block_size=4096))
    finally:
        unregister_tier("shelf")


CLOSED: list[BlockStorage] = []


class ClosingShelfPool(ShelfPool):
    """A shelf pool that records that it was closed."""

    async def aclose(self) -> None:
        CLOSED.append(self)
        await super().aclose()


async def open_closing_shelf(config: ShelfTierConfig, context: TierContext) -> BlockStorage:
    return ClosingShelfPool(config.num_blocks, context.block_size, "cpu")


@pytest.mark.parametrize("declared", [TierAccess.TENSOR, TierAccess.CLIENT])
async def test_open_storage_refuses_a_storage_that_is_reached_otherwise(
    declared: TierAccess,
) -> None:
    """The engine routes a tier's bytes by its kind's `access`: a storage that declares
    another one is closed and refused, naming the tier."""
    register_tier(shelf_kind(access=declared, opener="test_registry:open_closing_shelf"))
    CLOSED.clear()
    try:
        tier = parse_config(chain(SHELF)).tiers[0]
        with pytest.raises(InvalidValueError) as caught:
            await open_storage(tier, TierContext(block_size=4096))
        assert str(caught.value) == (
            f"tier 's': the shelf kind declares access {declared.value!r}, but its opener "
            "test_registry:open_closing_shelf returned a ClosingShelfPool, whose access is "
            "'host-buffers'"
        )
        assert len(CLOSED) == 1
        register_tier(shelf_kind(opener="test_registry:open_closing_shelf"), replace=True)
        storage = await open_storage(tier, TierContext(block_size=4096))
        await storage.aclose()  # the access it declares: opened
    finally:
        unregister_tier("shelf")


def test_every_built_in_kind_opens_a_storage_of_its_declared_access() -> None:
    for medium in ("gpu", "cpu", "disk", "redis", "shared-fs"):
        kind = tier_kind(medium)
        module_name, _, function_name = kind.opener.partition(":")
        opener = getattr(importlib.import_module(module_name), function_name)
        storage_class = inspect.signature(opener, eval_str=True).return_annotation
        assert issubclass(storage_class, BlockStorage), medium
        assert storage_class.access is kind.access, medium


async def test_open_storage_needs_the_kinds_config_class() -> None:
    class Impostor(BaseTierConfig):
        medium: Literal["cpu"]

    with pytest.raises(InvalidValueError, match="configured by CPUTierConfig, got Impostor"):
        await open_storage(Impostor(name="x", medium="cpu", capacity=1), TierContext(4096))


# ------------------------------------------------------------------------------------------
# Bookkeeping carries any medium
# ------------------------------------------------------------------------------------------


def test_a_backend_of_a_registered_medium_uses_a_slot_spec_of_its_own() -> None:
    backend = SlotPoolBackend(4, 64, "shelf")
    assert backend.medium == "shelf"
    _, spec = backend.allocate_with_spec([key_from_int(0), key_from_int(1)])
    assert isinstance(spec, SlotLoadStoreSpec)
    assert type(spec) is slot_spec_type("shelf")
    assert spec.medium() == "shelf"
    assert spec.block_ids.tolist() == [0, 1]
    other = slot_spec_type("tape").from_valid_ids([0, 1])
    assert spec != other  # two media's slots are never the same place
    assert "'shelf'" in repr(backend)
    assert SlotPoolBackend(2, 64, "gpu").medium is Medium.GPU  # built-in names stay members


def test_a_tier_manager_reports_its_medium_in_events_and_stats() -> None:
    manager = make_tier_manager(4, 64, "shelf")
    keys = [key_from_int(7)]
    manager.prepare_store(keys)
    manager.complete_store(keys)
    [event] = manager.take_events()
    assert (event.medium, event.removed) == ("shelf", False)
    assert manager.stats().medium == "shelf"
    assert manager.name == "shelf"


@pytest.mark.parametrize("medium", ["", 5])
def test_a_backend_needs_a_medium_name(medium: Any) -> None:
    with pytest.raises(InvalidValueError, match="medium must be a non-empty string"):
        SlotPoolBackend(2, 64, medium)


# ------------------------------------------------------------------------------------------
# Commands read the declarations
# ------------------------------------------------------------------------------------------


def test_check_skips_volatile_tiers_and_says_it_cannot_read_another_store(
    shelf: TierKind, tmp_path: Path
) -> None:
    path = tmp_path / "chain.toml"
    path.write_text(
        'block_size = 4096\n[[tiers]]\nname = "c"\nmedium = "cpu"\ncapacity = 4\n'
        '[[tiers]]\nname = "s"\nmedium = "shelf"\ncapacity = 4\n'
    )
    result = CliRunner().invoke(main, ["check", "--config", str(path)])
    assert result.exit_code == 4, result.output
    assert "shelf tier 's':" in result.stdout
    assert "cannot check: a shelf tier is not a kvtier disk store" in result.stdout
    assert "'c'" not in result.stdout


def test_replay_prepares_the_directory_of_every_persistent_tier(
    shelf: TierKind, tmp_path: Path
) -> None:
    from kvtier_tools.workloads.replay import prepare_disk_dirs

    store = tmp_path / "shelf"
    (store / "kvtier-old").mkdir(parents=True)
    config = parse_config(chain(CPU, {**SHELF, "path": str(store)}))
    assert prepare_disk_dirs(config) == [store]
    assert not any(store.iterdir())  # emptied of the earlier run's store


def test_a_kinds_options_keyword_feeds_its_opener() -> None:
    """The disk kind declares `disk_options`: what the hierarchy merges over its
    `tier_options`; a keyword no kind declares is refused, naming it."""
    from kvtier.checks import check_tier_options
    from kvtier.tiers.registry import options_keywords

    keywords = options_keywords()
    assert keywords == {"disk_options": "disk"}
    merged = check_tier_options(
        {"disk": {"max_workers": 2, "fsync": True}},
        {"disk_options": {"max_workers": 8}},
        registered_media(),
        keywords,
    )
    assert merged == {"disk": {"max_workers": 8, "fsync": True}}
    with pytest.raises(InvalidValueError, match="tape_options: no registered tier medium"):
        check_tier_options(None, {"tape_options": {"x": 1}}, registered_media(), keywords)
