"""Bad input to the public `Hierarchy` API (issue 9, items 6 and 9): the inputs that
tests/test_hierarchy_input.py does not cover and that raised a raw TypeError, OverflowError
or nothing at all. Each is one clear `KvtierError` raised before anything changes."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hierarchy_helpers import BLOCK, blocks_of, chain_config, key

from kvtier import Hierarchy
from kvtier.config import parse_config, physical_memory
from kvtier.errors import DiskTierError, InvalidValueError, KeyFormatError, ManagerClosedError

# --------------------------------------------------------------------------------------------
# Keys: checked for the whole call before any part of it runs
# --------------------------------------------------------------------------------------------


async def test_a_bad_last_key_of_a_batch_larger_than_the_top_tier_stores_nothing(
    tmp_path: Path,
) -> None:
    # A put of more blocks than the top tier holds is stored in parts; the bad key is in
    # the last part, so a per-part check would have stored (and demoted) the first parts.
    async with Hierarchy.from_config(chain_config(tmp_path, gpu=None, cpu=8, disk=64)) as h:
        keys = [key(i) for i in range(30)]
        with pytest.raises(KeyFormatError, match=r"put: keys\[30\] must have 1 to 255 bytes"):
            await h.put([*keys, b"k" * 600], torch.zeros((31, BLOCK), dtype=torch.uint8))
        await h.drain()
        assert h.lookup(keys) == 0
        assert h.take_events() == []
        assert h.stats().calls.put_blocks == 0


async def test_a_get_with_a_bad_key_promotes_and_counts_nothing(tmp_path: Path) -> None:
    config = chain_config(tmp_path, gpu=None, cpu=8, disk=64)
    keys = [key(i) for i in range(4)]
    async with Hierarchy.from_config(config) as h:
        assert await h.put(keys, blocks_of(keys)) == 4
    async with Hierarchy.from_config(config) as h:  # now only on disk
        assert h.where(keys[0]) == "disk"
        with pytest.raises(KeyFormatError, match=r"get: keys\[2\] must be bytes, got str 'x'"):
            await h.get([keys[0], keys[1], "x"])
        await h.drain()
        assert [h.where(k) for k in keys] == ["disk"] * 4  # nothing was promoted
        assert h.stats().calls.get_blocks == 0
        assert torch.equal(await h.get(keys), blocks_of(keys))


# --------------------------------------------------------------------------------------------
# Timeouts and counts: any real number is taken, never an OverflowError
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "timeout",
    [
        pytest.param(2**2000, id="2**2000"),
        pytest.param(-(2**2000), id="-2**2000"),
        math.inf,
        0.0,
        -1e-9,
        "1",
        None,
    ],
)
async def test_a_bad_flush_timeout_is_refused(tmp_path: Path, timeout: Any) -> None:
    async with Hierarchy.from_config(chain_config(tmp_path, gpu=None, disk=16)) as h:
        if timeout is None:  # None is "no deadline", not an error
            assert await h.flush(timeout_s=timeout) == 0
            return
        with pytest.raises(InvalidValueError, match="flush: timeout_s must be"):
            await h.flush(timeout_s=timeout)


async def test_a_huge_int_get_timeout_is_an_error_with_a_short_message(tmp_path: Path) -> None:
    async with Hierarchy.from_config(chain_config(tmp_path, gpu=None, disk=None)) as h:
        with pytest.raises(InvalidValueError, match="finite number > 0") as caught:
            await h.get([key(1)], timeout_s=2**2000)
        assert len(str(caught.value)) < 200


async def test_numpy_numbers_are_numbers(tmp_path: Path) -> None:
    config = parse_config(chain_config(tmp_path, gpu=None, disk=None))
    h = Hierarchy(
        config,
        load_timeout_s=np.float32(2.0),
        max_concurrency=np.int64(2),
        staging_bytes=np.uint32(1 << 20),
    )
    assert h.load_timeout_s == 2.0
    async with h:
        keys = [key(1)]
        assert await h.put(keys, blocks_of(keys)) == 1
        assert torch.equal(await h.get(keys, timeout_s=np.float64(1.5)), blocks_of(keys))


def test_staging_bytes_beyond_the_machines_memory_is_refused(tmp_path: Path) -> None:
    config = parse_config(chain_config(tmp_path, gpu=None, disk=None))
    too_much = (physical_memory() or 1 << 50) + 1
    with pytest.raises(InvalidValueError, match="staging_bytes must be at most"):
        Hierarchy(config, staging_bytes=too_much)
    with pytest.raises(InvalidValueError, match="staging_bytes must be at most"):
        Hierarchy(config, staging_bytes=2**70)  # was an OverflowError at open


# --------------------------------------------------------------------------------------------
# Options and configs
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tier_options": {"nvme": {}}}, "'nvme' is not a tier medium; registered media: gpu"),
        ({"tier_options": {3: {}}}, "3 is not a tier medium"),
        ({"tier_options": {"disk": {1: 2}}}, "option names must be identifiers, got 1"),
        ({"disk_options": {"max workers": 2}}, "option names must be identifiers"),
    ],
)
def test_bad_tier_options_are_refused_at_once(
    tmp_path: Path, options: dict[str, Any], message: str
) -> None:
    config = parse_config(chain_config(tmp_path, gpu=None, disk=16))
    with pytest.raises(InvalidValueError, match=message):
        Hierarchy(config, **options)


@pytest.mark.parametrize("config", [None, 3, b"kvtier.toml", [1], 1.5])
def test_from_config_refuses_what_is_not_a_config(config: Any) -> None:
    with pytest.raises(InvalidValueError, match=r"Hierarchy\.from_config takes a HierarchyConfig"):
        Hierarchy.from_config(config)


@pytest.mark.parametrize("path", [None, 3, b"kvtier.toml", {"block_size": 4096}])
def test_from_toml_refuses_what_is_not_a_path(path: Any) -> None:
    with pytest.raises(InvalidValueError, match=r"Hierarchy\.from_toml takes a file path"):
        Hierarchy.from_toml(path)


def test_an_unknown_option_is_named_with_the_valid_ones(tmp_path: Path) -> None:
    config = chain_config(tmp_path, gpu=None, disk=None)
    with pytest.raises(InvalidValueError, match=r"unknown option load_timeout; the options are"):
        Hierarchy.from_config(config, load_timeout=1.0)
    toml = tmp_path / "kvtier.toml"
    toml.write_text('block_size = 4096\n[[tiers]]\nname = "cpu"\nmedium = "cpu"\ncapacity = 8\n')
    with pytest.raises(InvalidValueError, match="from_toml: unknown option staging"):
        Hierarchy.from_toml(toml, staging=1)
    assert Hierarchy.from_toml(toml, load_timeout_s=1.0).load_timeout_s == 1.0


# --------------------------------------------------------------------------------------------
# Tensors: each wrong shape, size or layout is named
# --------------------------------------------------------------------------------------------


def strided(count: int) -> torch.Tensor:
    return torch.zeros((count, 2 * BLOCK), dtype=torch.uint8)[:, ::2]


def expanded(count: int) -> torch.Tensor:
    return torch.zeros((1, BLOCK), dtype=torch.uint8).expand(count, BLOCK)


def transposed(count: int) -> torch.Tensor:
    return torch.zeros((BLOCK, count), dtype=torch.uint8).t()


def too_narrow(count: int) -> torch.Tensor:
    return torch.zeros((count, BLOCK // 2), dtype=torch.uint8)


def flat(count: int) -> torch.Tensor:
    return torch.zeros((count * BLOCK,), dtype=torch.uint8)


def too_few(count: int) -> torch.Tensor:
    return torch.zeros((count - 1, BLOCK), dtype=torch.uint8)


def numpy_rows(count: int) -> Any:
    return np.zeros((count, BLOCK), dtype=np.uint8)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (strided, "must be a contiguous tensor"),
        (expanded, "must be a contiguous tensor"),
        (transposed, "must be a contiguous tensor"),
        (too_narrow, rf"shape \[n, {BLOCK}\] \(block_size\), got \[3, {BLOCK // 2}\]"),
        (flat, rf"shape \[n, {BLOCK}\] \(block_size\), got \[{3 * BLOCK}\]"),
        (too_few, "3 keys but 2 blocks"),
        (numpy_rows, "must be a torch.Tensor, got ndarray"),
    ],
)
async def test_a_bad_block_tensor_is_named_and_stores_nothing(
    tmp_path: Path, make: Callable[[int], Any], message: str
) -> None:
    async with Hierarchy.from_config(chain_config(tmp_path, gpu=None, disk=None)) as h:
        keys = [key(i) for i in range(3)]
        with pytest.raises(InvalidValueError, match=message):
            await h.put(keys, make(3))
        assert h.lookup(keys) == 0
        assert await h.put(keys, blocks_of(keys).contiguous()) == 3


# --------------------------------------------------------------------------------------------
# A hierarchy not open: every call is a ManagerClosedError
# --------------------------------------------------------------------------------------------

CALLS: dict[str, Callable[[Hierarchy], Awaitable[Any] | Any]] = {
    "put": lambda h: h.put([key(1)], blocks_of([key(1)])),
    "get": lambda h: h.get([key(1)]),
    "lookup": lambda h: h.lookup([key(1)]),
    "where": lambda h: h.where(key(1)),
    "stats": lambda h: h.stats(),
    "take_events": lambda h: h.take_events(),
    "flush": lambda h: h.flush(),
    "drain": lambda h: h.drain(),
    "check": lambda h: h.check(),
    "open": lambda h: h.open(),
}


@pytest.mark.parametrize(
    ("call", "when"),
    [
        (call, when)
        for call in sorted(CALLS)
        for when in ("before open", "after close", "after a failed open")
        if (call, when) != ("open", "before open")  # opening a new hierarchy works
    ],
)
async def test_a_call_on_a_hierarchy_that_is_not_open_is_a_closed_error(
    tmp_path: Path, call: str, when: str
) -> None:
    config = chain_config(tmp_path, gpu=None, cpu=8, disk=16)
    if when == "after a failed open":
        (tmp_path / "disk").write_text("not a directory")
        config["strict"] = True
    h = Hierarchy.from_config(config)
    if when == "after close":
        await h.open()
        await h.close()
    elif when == "after a failed open":
        with pytest.raises(DiskTierError, match="not a directory"):
            await h.open()
    with pytest.raises(ManagerClosedError):
        result = CALLS[call](h)
        if isinstance(result, Awaitable):
            await result
