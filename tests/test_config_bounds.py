"""Configs without bounds (issue 9, item 8): sizes too large for any machine, a host-memory
tier larger than this machine's memory and unset $VARS in a path are one-line ConfigErrors
naming the key; a fuzz of malformed configs raises ConfigError and nothing else."""

from __future__ import annotations

import contextlib
import copy
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier import Hierarchy
from kvtier.config import (
    MAX_BLOCK_SIZE,
    MAX_TIER_BLOCKS,
    MIN_BLOCK_SIZE,
    HierarchyConfig,
    parse_config,
    physical_memory,
)
from kvtier.engine.staging import DEFAULT_STAGING_BYTES
from kvtier.errors import ConfigError, KvtierError
from kvtier_tools.workloads.simulation.chain import chain_tiers_from_config


def cpu_config(**tier: Any) -> dict[str, Any]:
    return {"block_size": 4096, "tiers": [{"name": "c", "medium": "cpu", "capacity": 4, **tier}]}


@pytest.mark.parametrize(
    ("change", "key", "message"),
    [
        ({"block_size": 2**62}, "block_size", "at most 1 GiB"),
        ({"block_size": MAX_BLOCK_SIZE + 1}, "block_size", "at most 1 GiB"),
        ({"block_size": 1}, "block_size", f"at least {MIN_BLOCK_SIZE} bytes"),
        ({"block_size": MIN_BLOCK_SIZE - 1}, "block_size", f"at least {MIN_BLOCK_SIZE} bytes"),
        ({"capacity": 2**63 - 1}, "tiers[0].capacity", "at most 1,099,511,627,776 blocks"),
        ({"capacity": 10**15}, "tiers[0].capacity", "at most 1,099,511,627,776 blocks"),
        ({"capacity": MAX_TIER_BLOCKS + 1}, "tiers[0].capacity", "blocks (2**40)"),
    ],
)
def test_sizes_beyond_any_machine_are_one_line_errors(
    change: dict[str, Any], key: str, message: str
) -> None:
    config = cpu_config()
    if "block_size" in change:
        config.update(change)
    else:
        config["tiers"][0].update(change)
    with pytest.raises(ConfigError) as caught:
        parse_config(config)
    text = str(caught.value)
    assert text.count("\n") == 0, text  # one problem, on one line
    assert text.startswith(f"{key}: ") and message in text


async def test_a_chain_of_the_smallest_blocks_opens_in_memory_of_its_rows(
    tmp_path: Path,
) -> None:
    """Issue 31, item 12.3: the staging arena has staging_bytes // block_size rows (512K at
    the smallest block size); its free list costs 8 bytes a row, not a Python int each
    (block_size 512 took 21.5 MiB of Python objects to open, block_size 1 10 GiB)."""
    config = {
        "block_size": MIN_BLOCK_SIZE,
        "tiers": [
            {"name": "c", "medium": "cpu", "capacity": 8},
            {"name": "d", "medium": "disk", "capacity": 8, "path": str(tmp_path / "d")},
        ],
    }
    rows = DEFAULT_STAGING_BYTES // MIN_BLOCK_SIZE
    tracemalloc.start()
    try:
        async with Hierarchy.from_config(config) as h:
            _, peak = tracemalloc.get_traced_memory()
            assert h.stats().tiers[1].name == "d"
    finally:
        tracemalloc.stop()
    assert peak < 16 * rows + (4 << 20)  # 8 bytes a row, and the chain's own few MiB


def test_a_disk_tier_beyond_a_pebibyte_is_refused() -> None:
    config = {
        "block_size": 1 << 20,
        "tiers": [{"name": "d", "medium": "disk", "capacity": 1 << 31, "path": "/tmp/x"}],
    }
    with pytest.raises(ConfigError, match=r"tiers\[0\]\.capacity: 2048 TiB is more than a tier"):
        parse_config(config)


@pytest.mark.skipif(physical_memory() is None, reason="the platform does not say its memory")
def test_a_cpu_tier_larger_than_this_machine_is_refused() -> None:
    memory = physical_memory()
    assert memory is not None
    blocks = memory // 4096 + 1
    with pytest.raises(ConfigError, match=r"tiers\[0\]\.capacity: .* of host memory, but this"):
        parse_config(cpu_config(capacity=blocks))
    parse_config(cpu_config(capacity=blocks // 4))  # a quarter of it is fine


def test_an_unset_variable_in_a_disk_path_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("KVTIER_NOT_SET", raising=False)
    monkeypatch.setenv("KVTIER_SET", str(tmp_path))
    for path in ("$KVTIER_NOT_SET/kv", "${KVTIER_NOT_SET}/kv", "$KVTIER_SET/$KVTIER_NOT_SET"):
        config = {
            "block_size": 4096,
            "tiers": [{"name": "d", "medium": "disk", "capacity": 4, "path": path}],
        }
        with pytest.raises(ConfigError, match=r"tiers\[0\]\.path: \$KVTIER_NOT_SET is not set"):
            parse_config(config)
    config["tiers"][0]["path"] = "$KVTIER_SET/kv"
    assert parse_config(config).tiers[0].path == tmp_path / "kv"  # type: ignore[attr-defined]


# --------------------------------------------------------------------------------------------
# Fuzz
# --------------------------------------------------------------------------------------------

VALUES = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, 4096, 2**40, 2**63 - 1, 2**64]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=12),
    st.sampled_from(["8GiB", "0.5KiB", "1e3", "4096", "auto", "lru", "arc", "cpu", "disk", "-1"]),
    st.none(),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
TIER_KEYS = [
    "name",
    "medium",
    "capacity",
    "policy",
    "enabled",
    "high_watermark",
    "low_watermark",
    "device",
    "pin_memory",
    "path",
    "compression",
    "zstd_level",
    "direct_io",
    "fsync",
]


@st.composite
def tiers(draw: st.DrawFn) -> dict[str, Any]:
    tier: dict[str, Any] = {
        "name": draw(st.sampled_from(["a", "b", "c", "bad name"])),
        "medium": draw(st.sampled_from(["gpu", "cpu", "disk", "tape", 3])),
        "capacity": draw(VALUES),
    }
    for key in draw(st.lists(st.sampled_from(TIER_KEYS), max_size=4, unique=True)):
        tier[key] = draw(VALUES)
    if draw(st.booleans()):
        tier[draw(st.text(min_size=1, max_size=5))] = draw(VALUES)
    return tier


@st.composite
def configs(draw: st.DrawFn) -> dict[str, Any]:
    config: dict[str, Any] = {
        "block_size": draw(VALUES),
        "tiers": draw(st.lists(tiers(), min_size=0, max_size=4)),
    }
    for key in draw(
        st.lists(st.sampled_from(["model_id", "write_policy", "strict", "extra"]), unique=True)
    ):
        config[key] = draw(VALUES)
    return config


@settings(max_examples=400, deadline=None)
@given(configs())
@pytest.mark.slow
def test_a_malformed_config_is_a_config_error_and_nothing_else(config: dict[str, Any]) -> None:
    try:
        parsed = parse_config(config)
    except ConfigError as error:
        assert str(error), "a config error says what is wrong"
        return
    assert isinstance(parsed, HierarchyConfig)
    # What parses can be planned by the simulator without a raw error (a bookkeeping that
    # would not fit this machine's memory is a KvtierError too).
    with contextlib.suppress(KvtierError):
        chain_tiers_from_config(parsed)


VALID = {
    "block_size": "16KiB",
    "model_id": "m",
    "write_policy": "write-back",
    "strict": False,
    "tiers": [
        {"name": "g", "medium": "gpu", "capacity": 8, "enabled": "auto", "device": "cpu"},
        {"name": "c", "medium": "cpu", "capacity": "1MiB", "pin_memory": False},
        {"name": "d", "medium": "disk", "capacity": 4096, "path": "/tmp/kvtier-fuzz"},
    ],
}


@st.composite
def near_valid_configs(draw: st.DrawFn) -> dict[str, Any]:
    """A valid config with one or two values replaced: every key's validation is reached."""
    config = copy.deepcopy(VALID)
    for _ in range(draw(st.integers(1, 2))):
        where = draw(st.sampled_from(["top", 0, 1, 2]))
        if where == "top":
            config[draw(st.sampled_from(["block_size", "model_id", "write_policy", "strict"]))] = (
                draw(VALUES)
            )
        else:
            config["tiers"][where][draw(st.sampled_from(TIER_KEYS))] = draw(VALUES)
    return config


@settings(max_examples=400, deadline=None)
@given(near_valid_configs())
def test_a_nearly_valid_config_parses_or_is_one_config_error(config: dict[str, Any]) -> None:
    test_a_malformed_config_is_a_config_error_and_nothing_else.hypothesis.inner_test(config)  # type: ignore[attr-defined]
