"""Tests of kvtier.config: loading the shipped configs, defaults, and the error report."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

import kvtier.config as config_module
from kvtier.config import (
    HierarchyConfig,
    default_cache_dir,
    default_config_path,
    load_config,
    load_default_config,
    parse_config,
    parse_size,
)
from kvtier.config_fields import show_value
from kvtier.errors import ConfigError, InvalidValueError
from kvtier.specs.base import Medium
from kvtier.tiers.disk.kind import DiskTierConfig
from kvtier.tiers.pool.kind import CPUTierConfig, GPUTierConfig

CONFIGS = Path(__file__).resolve().parent.parent / "configs"

MINIMAL: dict[str, Any] = {
    "block_size": "256KiB",
    "tiers": [
        {"name": "gpu", "medium": "gpu", "capacity": 8},
        {"name": "cpu", "medium": "cpu", "capacity": 16},
        {"name": "disk", "medium": "disk", "capacity": 32},
    ],
}


def minimal(**top: Any) -> dict[str, Any]:
    """A valid three-tier config dict (a fresh copy), with top-level keys replaced."""
    data = copy.deepcopy(MINIMAL)
    data.update(top)
    return data


def problems_of(data: Any) -> list[str]:
    """The problem lines parse_config reports for `data` (it must fail)."""
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    return caught.value.problems


def the_problem(data: Any, path: str) -> str:
    """The one problem line about `path` (a key path such as "tiers[1].capacity")."""
    lines = [line for line in problems_of(data) if line.startswith(f"{path}: ")]
    assert len(lines) == 1, lines
    return lines[0]


# ------------------------------------------------------------------------------------------
# Shipped configs
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["default.toml", "three-tier.toml", "cpu-only.toml"])
def test_each_shipped_config_loads(name: str) -> None:
    config = load_config(CONFIGS / name)
    assert isinstance(config, HierarchyConfig)
    assert config.tiers
    assert all(tier.num_blocks >= 1 for tier in config.tiers)


def test_default_config_path_exists_and_is_the_repo_default() -> None:
    path = default_config_path()
    assert path.is_file()
    assert path.name == "default.toml"
    assert path.read_bytes() == (CONFIGS / "default.toml").read_bytes()


def test_default_config_path_prefers_the_packaged_copy(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # An installed wheel has the configs inside the package: kvtier/configs/default.toml.
    packaged = tmp_path / "configs" / "default.toml"
    packaged.parent.mkdir()
    packaged.write_bytes((CONFIGS / "default.toml").read_bytes())
    monkeypatch.setattr(config_module.importlib.resources, "files", lambda package: tmp_path)
    assert default_config_path() == packaged


def test_default_config_is_gpu_auto_then_cpu_then_disk() -> None:
    config = load_default_config()
    assert [tier.medium for tier in config.tiers] == [Medium.GPU, Medium.CPU, Medium.DISK]
    gpu, cpu, disk = config.tiers
    assert isinstance(gpu, GPUTierConfig)
    assert gpu.enabled == "auto"
    assert isinstance(cpu, CPUTierConfig)
    assert cpu.pin_memory is True
    assert isinstance(disk, DiskTierConfig)
    assert disk.compression == "none"
    assert config.block_size == 256 * 1024
    assert gpu.num_blocks == 4096  # 1 GiB of 256 KiB blocks


def test_three_tier_example_uses_block_counts_and_zstd() -> None:
    config = load_config(CONFIGS / "three-tier.toml")
    assert [tier.num_blocks for tier in config.tiers] == [512, 4096, 32768]
    assert [tier.capacity for tier in config.tiers] == [512, 4096, 32768]
    disk = config.tiers[2]
    assert isinstance(disk, DiskTierConfig)
    assert disk.compression == "zstd"


def test_cpu_only_example_has_one_cpu_tier() -> None:
    config = load_config(CONFIGS / "cpu-only.toml")
    assert len(config.tiers) == 1
    assert config.tiers[0].medium == Medium.CPU
    assert config.tiers[0].num_blocks == 4 * 1024**3 // (256 * 1024)
    assert config.active_tiers(cuda_available=False) == config.tiers


# ------------------------------------------------------------------------------------------
# Values, defaults, immutability
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("block_size", "capacity", "blocks"),
    [
        ("256KiB", "1GiB", 4096),
        (4096, "1MiB", 256),
        ("1000", "1MB", 1000),
        ("3KiB", "10KiB", 3),  # rounded down to whole blocks
        ("1GiB", 7, 7),  # an int is a block count, whatever the block size
        ("4KiB", "1.5MiB", 384),
    ],
)
def test_capacity_converts_to_blocks(
    block_size: str | int, capacity: str | int, blocks: int
) -> None:
    data = {
        "block_size": block_size,
        "tiers": [{"name": "t", "medium": "cpu", "capacity": capacity}],
    }
    config = parse_config(data)
    assert config.block_size == parse_size(block_size)
    assert config.tiers[0].num_blocks == blocks
    assert config.tiers[0].capacity == capacity  # kept as written


def test_defaults_are_filled(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    config = parse_config(minimal())
    assert config.model_id == ""
    assert config.write_policy == "write-back"
    gpu, cpu, disk = config.tiers
    assert all(tier.policy == "lru" for tier in config.tiers)
    assert all(tier.enabled is True for tier in config.tiers)
    assert isinstance(gpu, GPUTierConfig)
    assert gpu.device == "cuda"
    assert isinstance(cpu, CPUTierConfig)
    assert cpu.pin_memory is True
    assert isinstance(disk, DiskTierConfig)
    assert disk.path == tmp_path / "kvtier"
    assert disk.compression == "none"
    assert disk.zstd_level == 3
    assert disk.direct_io == "auto"
    assert disk.fsync is True


def test_all_keys_are_read() -> None:
    data = {
        "block_size": 1024,
        "model_id": "m",
        "write_policy": "write-through",
        "tiers": [
            {"name": "g", "medium": "gpu", "capacity": 1, "policy": "arc", "device": "cuda:1"},
            {"name": "c", "medium": "cpu", "capacity": 1, "enabled": False, "pin_memory": False},
            {
                "name": "d",
                "medium": "disk",
                "capacity": 1,
                "path": "/var/kv",
                "compression": "zstd",
                "zstd_level": 19,
                "direct_io": False,
                "fsync": False,
            },
        ],
    }
    config = parse_config(data)
    assert (config.model_id, config.write_policy) == ("m", "write-through")
    gpu, cpu, disk = config.tiers
    assert isinstance(gpu, GPUTierConfig)
    assert (gpu.policy, gpu.device) == ("arc", "cuda:1")
    assert isinstance(cpu, CPUTierConfig)
    assert (cpu.enabled, cpu.pin_memory) == (False, False)
    assert isinstance(disk, DiskTierConfig)
    assert disk.path == Path("/var/kv")
    assert (disk.compression, disk.zstd_level, disk.direct_io, disk.fsync) == (
        "zstd",
        19,
        False,
        False,
    )


def test_config_objects_are_frozen() -> None:
    config = parse_config(minimal())
    with pytest.raises(ValidationError):
        config.block_size = 1
    with pytest.raises(ValidationError):
        config.tiers[0].name = "other"
    assert isinstance(config.tiers, tuple)


def test_disk_path_expands_home_and_variables(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("KVTIER_TEST_DIR", "blocks")
    data = minimal()
    data["tiers"][2]["path"] = "~/kv/$KVTIER_TEST_DIR"
    disk = parse_config(data).tiers[2]
    assert isinstance(disk, DiskTierConfig)
    assert disk.path == tmp_path / "kv" / "blocks"


def test_default_cache_dir_honours_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "kvtier"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / ".cache" / "kvtier"


def test_active_tiers_follow_cuda_availability() -> None:
    data = minimal()
    data["tiers"][0]["enabled"] = "auto"
    data["tiers"][2]["enabled"] = False
    config = parse_config(data)
    assert [tier.name for tier in config.active_tiers(cuda_available=True)] == ["gpu", "cpu"]
    assert [tier.name for tier in config.active_tiers(cuda_available=False)] == ["cpu"]


def test_active_tiers_detects_cuda_only_when_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    data = minimal()
    data["tiers"][0]["enabled"] = "auto"
    config = parse_config(data)
    monkeypatch.setattr(config_module, "_cuda_available", lambda: True)
    assert [tier.name for tier in config.active_tiers()] == ["gpu", "cpu", "disk"]
    monkeypatch.setattr(config_module, "_cuda_available", lambda: False)
    assert [tier.name for tier in config.active_tiers()] == ["cpu", "disk"]

    def must_not_be_called() -> bool:
        raise AssertionError("CUDA detection without an 'auto' tier")

    monkeypatch.setattr(config_module, "_cuda_available", must_not_be_called)
    plain = parse_config(minimal())
    assert len(plain.active_tiers()) == 3


def test_describe_renders_one_line_per_tier() -> None:
    config = load_config(CONFIGS / "default.toml")
    text = config.describe()
    lines = text.splitlines()
    assert len(lines) == 1 + len(config.tiers)
    assert "256 KiB" in lines[0]
    for line, tier in zip(lines[1:], config.tiers, strict=True):
        assert tier.name in line
        assert f"{tier.num_blocks} blocks" in line
        assert tier.policy in line
    assert "1 GiB" in lines[1]
    assert 'enabled="auto"' in lines[1]
    assert "pin_memory=true" in lines[2]
    assert str(config) == text


def test_a_tier_line_shows_only_what_is_set_or_not_a_default() -> None:
    """A redis tier has twenty settings, most unset: its line names the ones the config
    gives or that differ from their defaults, never `=None`, and no secret."""
    data = {
        "block_size": "64KiB",
        "model_id": "m",
        "tiers": [
            {"name": "cpu", "medium": "cpu", "capacity": 8},
            {
                "name": "fleet",
                "medium": "redis",
                "capacity": 100,
                "url": "redis://10.0.0.5:6379/0",
                "password_env": "REDIS_PASSWORD",
                "timeout_ms": 500,  # given, though the default: shown
                "ttl_s": 3600,
            },
        ],
    }
    line = parse_config(data).describe().splitlines()[2]
    options = line.split("lru", 1)[1].split()
    assert options == [
        'url="redis://10.0.0.5:6379/0"',
        'password_env="REDIS_PASSWORD"',
        "timeout_ms=500",
        "ttl_s=3600",
    ]
    assert "None" not in line and len(line) < 160, line
    # A disk tier's path is computed where the config loads: shown although not given.
    disk = parse_config(minimal()).describe().splitlines()[3]
    default_path = DiskTierConfig(name="d", medium=Medium.DISK, capacity=1).path
    assert disk.split("lru", 1)[1].split() == [f"path={show_value(default_path)}"]


def test_hierarchy_built_in_code_checks_the_same_rules() -> None:
    tier = CPUTierConfig(name="c", medium=Medium.CPU, capacity=10)
    assert tier.num_blocks == 10
    assert HierarchyConfig(block_size=1024, tiers=(tier,)).tiers[0].num_blocks == 10
    with pytest.raises(ValidationError, match="tier names must be unique"):
        HierarchyConfig(block_size=1024, tiers=(tier, tier))
    with pytest.raises(ValidationError, match="block_size of a whole config"):
        CPUTierConfig(name="c", medium=Medium.CPU, capacity="1GiB")


# ------------------------------------------------------------------------------------------
# Error report
# ------------------------------------------------------------------------------------------


def test_bad_capacity_string() -> None:
    data = minimal()
    data["tiers"][1]["capacity"] = "lots"
    assert the_problem(data, "tiers[1].capacity") == (
        'tiers[1].capacity: expected a block count or a size like "8GiB", got "lots"'
    )


def test_unknown_tier_key() -> None:
    data = minimal()
    data["tiers"][0]["colour"] = "red"
    line = the_problem(data, "tiers[0].colour")
    assert line.startswith("tiers[0].colour: unknown key")
    assert "device" in line  # names the keys a gpu tier takes


def test_unknown_policy_lists_valid_ones() -> None:
    data = minimal()
    data["tiers"][2]["policy"] = "mru"
    assert the_problem(data, "tiers[2].policy") == (
        'tiers[2].policy: unknown cache policy "mru"; valid policies: arc, auto, lct, lru, s3fifo'
    )


def test_missing_block_size() -> None:
    data = minimal()
    del data["block_size"]
    assert problems_of(data) == ["block_size: required key is missing"]


def test_unknown_medium() -> None:
    data = minimal()
    data["tiers"][1]["medium"] = "tape"
    assert the_problem(data, "tiers[1].medium") == (
        'tiers[1].medium: expected one of "gpu", "cpu", "disk", "redis", "shared-fs", got "tape"'
    )


def test_missing_medium() -> None:
    data = minimal()
    del data["tiers"][1]["medium"]
    assert the_problem(data, "tiers[1].medium") == "tiers[1].medium: required key is missing"


def test_duplicate_names() -> None:
    data = minimal()
    data["tiers"][0]["name"] = "cpu"
    data["tiers"][1]["name"] = "cpu"
    data["tiers"][2]["name"] = "cpu"
    assert problems_of(data) == [
        'tiers: tier names must be unique; "cpu" appears at tiers[0], tiers[1] and tiers[2]'
    ]
    data["tiers"][1]["name"] = "middle"
    assert problems_of(data) == [
        'tiers: tier names must be unique; "cpu" appears at tiers[0] and tiers[2]'
    ]


def test_unknown_top_level_key() -> None:
    line = the_problem(minimal(colour="red"), "colour")
    assert line.startswith("colour: unknown key")
    assert "block_size" in line


def test_key_of_another_medium_is_unknown() -> None:
    data = minimal()
    data["tiers"][1]["path"] = "/tmp/kv"
    data["tiers"][2]["pin_memory"] = True
    line = the_problem(data, "tiers[1].path")
    assert line.startswith("tiers[1].path: unknown key")
    assert "disk" in line
    assert the_problem(data, "tiers[2].pin_memory").startswith("tiers[2].pin_memory: unknown key")


def test_many_problems_are_reported_together() -> None:
    data = minimal(write_policy="sometimes", colour=1)
    del data["block_size"]
    data["tiers"][0]["capacity"] = "lots"
    data["tiers"][1]["medium"] = "tape"
    data["tiers"][2]["policy"] = "mru"
    data["tiers"].append({"name": "gpu", "medium": "cpu", "capacity": 1})  # cpu below disk
    with pytest.raises(ConfigError) as caught:
        parse_config(data, source="mine.toml")
    problems = caught.value.problems
    prefixes = [
        "block_size: ",
        "write_policy: ",
        "colour: ",
        "tiers[0].capacity: ",
        "tiers[1].medium: ",
        "tiers[2].policy: ",
        "tiers: tier names must be unique",
        "tiers[3].medium: a volatile cpu tier cannot be below the persistent disk tier tiers[2]",
    ]
    for prefix in prefixes:
        assert any(line.startswith(prefix) for line in problems), (prefix, problems)
    assert len(problems) == len(prefixes)
    message = str(caught.value)
    assert message.startswith(f"mine.toml: {len(prefixes)} problems:")
    assert caught.value.source == "mine.toml"


def test_literal_and_type_errors_show_the_value() -> None:
    data = minimal(write_policy="sometimes", model_id=5)
    data["tiers"][0]["enabled"] = "yes"
    data["tiers"][2]["compression"] = "lz4"
    data["tiers"][2]["fsync"] = 1
    data["tiers"][2]["zstd_level"] = 40
    problems = problems_of(data)
    assert (
        'write_policy: expected one of "write-back", "write-through", got "sometimes"' in problems
    )
    assert "model_id: expected a string, got 5" in problems
    assert 'tiers[0].enabled: expected true, false or "auto", got "yes"' in problems
    assert 'tiers[2].compression: expected one of "none", "zstd", got "lz4"' in problems
    assert "tiers[2].fsync: expected true or false, got 1" in problems
    assert "tiers[2].zstd_level: must be at most 22, got 40" in problems
    assert not any("pydantic" in line or "Input should" in line for line in problems)


@pytest.mark.parametrize(
    ("tiers", "expected"),
    [
        (
            [("a", "disk"), ("b", "cpu")],
            "tiers[1].medium: a volatile cpu tier cannot be below the persistent disk tier "
            "tiers[0] (it would lose on a restart what that tier demoted to it); "
            'put volatile tiers above persistent ones, got "cpu"',
        ),
        (
            [("a", "gpu"), ("b", "disk"), ("c", "gpu")],
            "tiers[2].medium: a volatile gpu tier cannot be below the persistent disk tier "
            "tiers[1] (it would lose on a restart what that tier demoted to it); "
            'put volatile tiers above persistent ones, got "gpu"',
        ),
    ],
)
def test_volatile_tier_below_a_persistent_one(tiers: list[tuple[str, str]], expected: str) -> None:
    data = minimal(tiers=[{"name": n, "medium": m, "capacity": 1} for n, m in tiers])
    assert problems_of(data) == [expected]


def test_each_volatile_tier_below_a_persistent_one_is_reported() -> None:
    media = ["disk", "cpu", "disk", "gpu"]
    data = minimal(
        tiers=[{"name": f"t{i}", "medium": m, "capacity": 1} for i, m in enumerate(media)]
    )
    problems = problems_of(data)
    assert [line.split(" (")[0] for line in problems] == [
        "tiers[1].medium: a volatile cpu tier cannot be below the persistent disk tier tiers[0]",
        "tiers[3].medium: a volatile gpu tier cannot be below the persistent disk tier tiers[2]",
    ]


@pytest.mark.parametrize(
    "media",
    [
        ["gpu", "gpu", "cpu", "cpu", "disk", "disk"],
        ["cpu", "gpu"],  # the config's order is the chain's: no medium rank any more
        ["cpu", "gpu", "cpu", "disk"],
        ["disk", "disk"],
    ],
)
def test_any_order_of_volatile_tiers_above_persistent_ones_is_valid(media: list[str]) -> None:
    data = minimal(
        tiers=[{"name": f"t{i}", "medium": m, "capacity": 1} for i, m in enumerate(media)]
    )
    assert [tier.medium for tier in parse_config(data).tiers] == media


def test_zero_tiers() -> None:
    assert problems_of(minimal(tiers=[])) == ["tiers: expected 1 to 8 tiers, got 0"]


def test_too_many_tiers() -> None:
    tiers = [{"name": f"t{i}", "medium": "cpu", "capacity": 1} for i in range(9)]
    assert problems_of(minimal(tiers=tiers)) == ["tiers: expected 1 to 8 tiers, got 9"]


def test_missing_tiers() -> None:
    data = minimal()
    del data["tiers"]
    assert problems_of(data) == ["tiers: required key is missing"]


def test_capacity_smaller_than_one_block() -> None:
    data = minimal()
    data["tiers"][1]["capacity"] = "100KiB"
    line = the_problem(data, "tiers[1].capacity")
    assert line == 'tiers[1].capacity: must hold at least one block of 256 KiB, got "100KiB"'


@pytest.mark.parametrize("capacity", [0, -3, "4096", 1.5, True, "8XB"])
def test_bad_capacity_values(capacity: Any) -> None:
    data = minimal()
    data["tiers"][0]["capacity"] = capacity
    line = the_problem(data, "tiers[0].capacity")
    assert line.endswith(f"got {show_value(capacity)}")


def test_auto_is_only_for_gpu_tiers() -> None:
    data = minimal()
    data["tiers"][1]["enabled"] = "auto"
    line = the_problem(data, "tiers[1].enabled")
    assert "only allowed on a gpu tier" in line


def test_watermarks_default_to_demoting_from_98_down_to_95_percent() -> None:
    config = parse_config(minimal())
    assert [(t.high_watermark, t.low_watermark) for t in config.tiers] == [(0.98, 0.95)] * 3
    assert "watermark" not in config.describe()  # defaults are not shown


def test_watermarks_are_read_and_shown_when_set() -> None:
    data = minimal()
    data["tiers"][1].update(high_watermark=1, low_watermark=0.5)
    config = parse_config(data)
    cpu = config.tiers[1]
    assert (cpu.high_watermark, cpu.low_watermark) == (1.0, 0.5)
    assert isinstance(cpu.high_watermark, float)
    line = config.describe().splitlines()[2]
    assert line.endswith("high_watermark=1.0 low_watermark=0.5")  # pin_memory: its default


@pytest.mark.parametrize(
    ("watermarks", "expected"),
    [
        (
            {"high_watermark": 0.9},
            "tiers[0].low_watermark: must be below high_watermark (0.9), got 0.95",
        ),
        (
            {"high_watermark": 0.8, "low_watermark": 0.8},
            "tiers[0].low_watermark: must be below high_watermark (0.8), got 0.8",
        ),
        (
            {"high_watermark": 1.5},
            "tiers[0].high_watermark: must be a fraction above 0 and at most 1, got 1.5",
        ),
        (
            {"low_watermark": 0},
            "tiers[0].low_watermark: must be a fraction above 0 and at most 1, got 0",
        ),
        ({"low_watermark": "half"}, 'tiers[0].low_watermark: expected a number, got "half"'),
        ({"high_watermark": True}, "tiers[0].high_watermark: expected a number, got true"),
    ],
)
def test_bad_watermarks(watermarks: dict[str, Any], expected: str) -> None:
    data = minimal()
    data["tiers"][0].update(watermarks)
    assert problems_of(data) == [expected]


def test_at_least_one_tier_enabled() -> None:
    data = minimal()
    for tier in data["tiers"]:
        tier["enabled"] = False
    assert problems_of(data) == [
        "tiers: at least one tier must be enabled; every tier has enabled = false"
    ]


@pytest.mark.parametrize("name", ["", "has space", "dot.ted", "ü"])
def test_bad_tier_names(name: str) -> None:
    data = minimal()
    data["tiers"][0]["name"] = name
    assert the_problem(data, "tiers[0].name").startswith("tiers[0].name: expected a non-empty name")


def test_bad_device() -> None:
    data = minimal()
    data["tiers"][0]["device"] = "tpu"
    assert the_problem(data, "tiers[0].device") == (
        'tiers[0].device: expected "cuda", "cuda:N" or "cpu", got "tpu"'
    )


def test_tier_that_is_not_a_table() -> None:
    data = minimal()
    data["tiers"][1] = "cpu"
    assert the_problem(data, "tiers[1]") == 'tiers[1]: expected a table, got "cpu"'


def test_config_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="block_size"):
        parse_config({"tiers": MINIMAL["tiers"]})


# ------------------------------------------------------------------------------------------
# parse_size
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "size"),
    [
        (1, 1),
        (4096, 4096),
        ("4096", 4096),
        ("4096B", 4096),
        ("8GiB", 8 * 1024**3),
        ("512 KiB", 512 * 1024),
        ("64KB", 64_000),
        ("1.5GiB", 3 * 1024**3 // 2),
        ("2mib", 2 * 1024**2),
        ("1TB", 10**12),
        ("1tib", 1024**4),
        ("3MB", 3_000_000),
        (" 7 ", 7),
        ("0.5KiB", 512),
    ],
)
def test_parse_size_valid(value: int | str, size: int) -> None:
    assert parse_size(value) == size


@pytest.mark.parametrize(
    "value",
    [0, -1, "0", "0KiB", "", "lots", "-5", "1.5", "0.1KiB", "8 XB", "KiB", "1e3", True, 1.5, None],
)
def test_parse_size_invalid(value: Any) -> None:
    with pytest.raises(InvalidValueError, match="got"):
        parse_size(value)


# ------------------------------------------------------------------------------------------
# Files
# ------------------------------------------------------------------------------------------


def test_load_config_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "kv.toml"
    path.write_text(
        'block_size = "1MiB"\n[[tiers]]\nname = "c"\nmedium = "cpu"\ncapacity = "1GiB"\n',
        encoding="utf-8",
    )
    config = load_config(str(path))
    assert config.tiers[0].num_blocks == 1024


def test_missing_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(path) in str(caught.value)
    assert "not found" in str(caught.value)
    assert caught.value.source == str(path)


def test_toml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text('block_size = "1MiB"\n\n[[tiers]\nname = "c"\n', encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: invalid TOML")
    assert "line 3" in message


def test_validation_errors_from_a_file_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(
        'block_size = "1MiB"\n[[tiers]]\nname = "c"\nmedium = "cpu"\ncapacity = "lots"\n',
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == (
        f'{path}: tiers[0].capacity: expected a block count or a size like "8GiB", got "lots"'
    )
