"""The interpreter's switch interval held while a chain that asks for one is open
(`switch_interval_ms`, `kvtier.chain.switch_interval`): lowered only, the lowest lease's,
put back at the last close unless changed outside kvtier meanwhile; a bad value is a
one-line ConfigError naming the key; "keep" leaves the interpreter's. Never how fast a
thread gets the GIL (docs/BENCHMARKS.md measures that: `kvtier_tools.bench.gil_load`)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvtier import Hierarchy
from kvtier.chain import switch_interval
from kvtier.config import parse_config
from kvtier.config_fields import DEFAULT_SWITCH_INTERVAL_MS
from kvtier.errors import ConfigError, KvtierError

pytestmark = pytest.mark.timeout(120)

DEFAULT = 0.005


@pytest.fixture(autouse=True)
def interpreter_default() -> Iterator[None]:
    """Each test starts at 5 ms with no lease, and the interpreter's is put back after."""
    saved = sys.getswitchinterval()
    sys.setswitchinterval(DEFAULT)
    try:
        yield
        assert switch_interval.held() is None  # every lease released
    finally:
        sys.setswitchinterval(saved)


def config(**top: Any) -> dict[str, Any]:
    return {
        "block_size": 4096,
        "tiers": [{"name": "c", "medium": "cpu", "capacity": 8}],
        **top,
    }


@pytest.mark.parametrize("value", [0.5, 1, 0.01, 100])
def test_a_number_of_ms_is_taken(value: float) -> None:
    parsed = parse_config(config(switch_interval_ms=value))
    assert parsed.switch_interval_ms == float(value)
    assert f"switch_interval {float(value):g} ms" in parsed.describe()


def test_left_out_it_is_the_default_and_described() -> None:
    parsed = parse_config(config())
    assert parsed.switch_interval_ms == DEFAULT_SWITCH_INTERVAL_MS == 0.25
    assert "switch_interval 0.25 ms" in parsed.describe()


def test_keep_is_taken_and_described() -> None:
    parsed = parse_config(config(switch_interval_ms="keep"))
    assert parsed.switch_interval_ms == "keep"
    assert "switch_interval keep" in parsed.describe()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0.5ms", 'expected a number of ms like 0.25, or "keep", got "0.5ms"'),
        ("Keep", 'expected a number of ms like 0.25, or "keep", got "Keep"'),
        (True, 'expected a number of ms like 0.25, or "keep", got true'),
        (0, "expected 0.01 to 100.0 ms, got 0"),
        (0.001, "expected 0.01 to 100.0 ms, got 0.001"),
        (1000, "expected 0.01 to 100.0 ms, got 1000"),
        (-1, "expected 0.01 to 100.0 ms, got -1"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_key(value: object, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(config(switch_interval_ms=value))
    text = str(caught.value)
    assert text == f"switch_interval_ms: {message}", text  # the value shown once


def test_a_lease_lowers_it_and_its_release_puts_it_back() -> None:
    release = switch_interval.acquire(0.0005)
    assert sys.getswitchinterval() == pytest.approx(0.0005)
    assert switch_interval.held() == 0.0005
    release()
    assert sys.getswitchinterval() == pytest.approx(DEFAULT)
    release()  # a second release does nothing
    assert sys.getswitchinterval() == pytest.approx(DEFAULT)


@pytest.mark.parametrize("first_out", [0, 1])
def test_the_lowest_lease_holds_until_the_last_is_released(first_out: int) -> None:
    releases = [switch_interval.acquire(0.001), switch_interval.acquire(0.0002)]
    assert sys.getswitchinterval() == pytest.approx(0.0002)
    releases.pop(first_out)()
    left = 0.0002 if first_out == 0 else 0.001
    assert sys.getswitchinterval() == pytest.approx(left)
    assert switch_interval.held() == left
    releases.pop()()
    assert sys.getswitchinterval() == pytest.approx(DEFAULT)


def test_a_lower_interval_the_process_set_is_never_raised() -> None:
    sys.setswitchinterval(0.0001)
    release = switch_interval.acquire(0.0005)
    assert sys.getswitchinterval() == pytest.approx(0.0001)
    release()
    assert sys.getswitchinterval() == pytest.approx(0.0001)


def test_an_interval_changed_outside_kvtier_meanwhile_stands() -> None:
    first = switch_interval.acquire(0.0005)
    sys.setswitchinterval(0.003)  # the embedding process changes its mind
    second = switch_interval.acquire(0.0002)  # not lowered again: the process decided
    assert sys.getswitchinterval() == pytest.approx(0.003)
    first()
    second()
    assert sys.getswitchinterval() == pytest.approx(0.003)  # not put back to 5 ms either
    again = switch_interval.acquire(0.0005)  # with no lease left, kvtier manages it afresh
    assert sys.getswitchinterval() == pytest.approx(0.0005)
    again()
    assert sys.getswitchinterval() == pytest.approx(0.003)


async def test_a_hierarchy_holds_it_from_open_to_close() -> None:
    hierarchy = Hierarchy.from_config(parse_config(config(switch_interval_ms=0.5)))
    assert sys.getswitchinterval() == pytest.approx(DEFAULT)
    async with hierarchy:
        assert sys.getswitchinterval() == pytest.approx(0.0005)
        keeping = Hierarchy.from_config(parse_config(config(switch_interval_ms="keep")))
        async with keeping:  # asks for nothing
            assert sys.getswitchinterval() == pytest.approx(0.0005)
        assert sys.getswitchinterval() == pytest.approx(0.0005)
        async with Hierarchy.from_config(parse_config(config())):  # the default, lower
            assert sys.getswitchinterval() == pytest.approx(0.00025)
        assert sys.getswitchinterval() == pytest.approx(0.0005)
    assert sys.getswitchinterval() == pytest.approx(DEFAULT)


async def test_keep_leaves_the_interpreters() -> None:
    async with Hierarchy.from_config(parse_config(config(switch_interval_ms="keep"))):
        assert sys.getswitchinterval() == pytest.approx(DEFAULT)
        assert switch_interval.held() is None


async def test_a_failed_open_holds_nothing(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    bad = config(switch_interval_ms=0.5)
    bad["tiers"].append(
        {"name": "d", "medium": "disk", "capacity": 8, "path": str(tmp_path / "file" / "d")}
    )
    with pytest.raises(KvtierError):
        await Hierarchy.from_config(parse_config(bad)).open()
    assert sys.getswitchinterval() == pytest.approx(DEFAULT)
