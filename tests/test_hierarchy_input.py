"""Bad input to the public `Hierarchy` API (issue 9, items 6 and 9): every bad key, option,
timeout or tensor is one clear `KvtierError` raised before anything changes, a bad key never
costs the good blocks of its batch, and a fuzz of every entry point raises nothing else."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from hierarchy_helpers import BLOCK, blocks_of, chain_config, key
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier import Hierarchy
from kvtier.config import parse_config
from kvtier.errors import InvalidValueError, KeyFormatError, KvtierError
from kvtier.keys import MAX_KEY_BYTES

# --------------------------------------------------------------------------------------------
# Item 6: bad keys lose no good blocks
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [b"", b"x" * (MAX_KEY_BYTES + 1), b"x" * 600])
async def test_a_bad_key_is_refused_before_anything_is_stored(tmp_path: Path, bad: bytes) -> None:
    async with Hierarchy.from_config(chain_config(tmp_path, gpu=None)) as h:
        keys = [key(1), bad, key(2)]
        with pytest.raises(KeyFormatError, match=r"put: keys\[1\] must have 1 to 255 bytes"):
            await h.put(keys, torch.zeros((3, BLOCK), dtype=torch.uint8))
        assert h.lookup([key(1)]) == 0 and h.lookup([key(2)]) == 0
        assert h.stats().calls.put_blocks == 0


async def test_good_blocks_reach_the_disk_whatever_bad_keys_were_tried(tmp_path: Path) -> None:
    config = chain_config(tmp_path, gpu=None, cpu=4, disk=64)
    good = [key(i) for i in range(20)]
    async with Hierarchy.from_config(config) as h:
        for i in range(0, 20, 4):
            part = good[i : i + 4]
            with pytest.raises(KeyFormatError):
                await h.put([*part, b""], torch.zeros((5, BLOCK), dtype=torch.uint8))
            assert await h.put(part, blocks_of(part)) == 4
    async with Hierarchy.from_config(config) as h:  # after a flush to disk and a reopen
        got = await h.get(good)
        assert torch.equal(got.cpu(), blocks_of(good))


# --------------------------------------------------------------------------------------------
# Item 9: every other bad input is one clear KvtierError
# --------------------------------------------------------------------------------------------


async def test_lookup_and_where_check_their_keys(tmp_path: Path) -> None:
    async with Hierarchy.from_config(chain_config(tmp_path, gpu=None, disk=None)) as h:
        with pytest.raises(KeyFormatError, match=r"lookup: keys\[1\]"):
            h.lookup([key(1), b""])
        with pytest.raises(KeyFormatError, match="lookup: keys must be a sequence"):
            h.lookup(key(1))
        with pytest.raises(KeyFormatError, match="where: key must be bytes, got str"):
            h.where("abc")  # type: ignore[arg-type]
        with pytest.raises(KeyFormatError, match="where: key must have 1 to 255 bytes"):
            h.where(b"k" * 300)


async def test_lookup_refuses_duplicate_keys_as_get_does(tmp_path: Path) -> None:
    """Issue 31, item 12.7: `lookup([k, k])` counted 2 (a prefix `get` then refused)."""
    async with Hierarchy.from_config(chain_config(tmp_path, gpu=None, disk=None)) as h:
        await h.put([key(1)], blocks_of([key(1)]))
        with pytest.raises(InvalidValueError, match=r"lookup: duplicate key .* at keys\[1\]"):
            h.lookup([key(1), key(1)])
        with pytest.raises(InvalidValueError, match=r"get: duplicate key .* at keys\[1\]"):
            await h.get([key(1), key(1)])
        assert h.lookup([key(1), key(2)]) == 1


@pytest.mark.parametrize("timeout", [-1, 0, -0.5, math.nan, math.inf, "1", True, [1]])
async def test_a_bad_get_timeout_is_refused(tmp_path: Path, timeout: Any) -> None:
    async with Hierarchy.from_config(chain_config(tmp_path, gpu=None, disk=None)) as h:
        with pytest.raises(InvalidValueError, match="get: timeout_s must be"):
            await h.get([key(1)], timeout_s=timeout)


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("load_timeout_s", -1, "load_timeout_s must be a finite number > 0"),
        ("load_timeout_s", "5", "load_timeout_s must be a number of seconds"),
        ("flush_timeout_s", None, "flush_timeout_s must be a number of seconds"),
        ("flush_timeout_s", math.nan, "flush_timeout_s must be a finite number > 0"),
        ("max_concurrency", "4", "max_concurrency must be an int >= 1"),
        ("max_concurrency", 0, "max_concurrency must be an int >= 1"),
        ("max_pending_cascades", -1, "max_pending_cascades must be an int >= 0"),
        ("max_pending_cascades", 1.5, "max_pending_cascades must be an int >= 0"),
        ("staging_bytes", "1MiB", "staging_bytes must be an int >= 1"),
        ("flush_on_close", "yes", "flush_on_close must be a bool or None"),
        ("tier_options", [1], "tier_options must be a mapping"),
        ("tier_options", {"disk": 3}, r"tier_options\['disk'\] must be a mapping"),
        ("disk_options", "io", "disk_options must be a mapping"),
    ],
)
def test_bad_options_are_one_clear_error(
    tmp_path: Path, option: str, value: Any, message: str
) -> None:
    config = parse_config(chain_config(tmp_path, gpu=None, disk=None))
    with pytest.raises(InvalidValueError, match=message):
        Hierarchy(config, **{option: value})


def test_a_config_that_is_not_one_is_refused() -> None:
    with pytest.raises(InvalidValueError, match="config must be a HierarchyConfig"):
        Hierarchy({"block_size": 4096})  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.int8])
async def test_other_dtypes_are_refused_with_the_view_hint(tmp_path: Path, dtype: Any) -> None:
    async with Hierarchy.from_config(chain_config(tmp_path, gpu=None, disk=None)) as h:
        with pytest.raises(InvalidValueError, match=r"pass blocks\.view\(torch\.uint8\)"):
            await h.put([key(1)], torch.zeros((1, BLOCK), dtype=dtype))


async def test_a_meta_tensor_is_refused(tmp_path: Path) -> None:
    async with Hierarchy.from_config(chain_config(tmp_path, gpu=None, disk=None)) as h:
        with pytest.raises(InvalidValueError, match="meta device"):
            await h.put([key(1)], torch.empty((1, BLOCK), dtype=torch.uint8, device="meta"))


# --------------------------------------------------------------------------------------------
# Fuzz: any input to any entry point works or is a KvtierError, and the hierarchy still works
# --------------------------------------------------------------------------------------------

KEYS = st.one_of(
    st.binary(min_size=0, max_size=300),
    st.integers(),
    st.text(max_size=5),
    st.none(),
    st.just(bytearray(b"abc")),
)
KEY_LISTS = st.one_of(st.lists(KEYS, max_size=5), KEYS, st.tuples(KEYS, KEYS))
TIMEOUTS = st.one_of(
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-5, max_value=5),
    st.text(max_size=3),
    st.booleans(),
)


def tensors(count: int) -> st.SearchStrategy[Any]:
    dtypes = st.sampled_from([torch.uint8, torch.float16, torch.int32, torch.bool])
    shapes = st.sampled_from([(count, BLOCK), (count, BLOCK - 1), (count,), (count + 1, BLOCK)])
    devices = st.sampled_from(["cpu", "meta"])
    real = st.builds(
        lambda dtype, shape, device: torch.zeros(shape, dtype=dtype, device=device),
        dtypes,
        shapes,
        devices,
    )
    return st.one_of(real, st.none(), st.integers(), st.just([[0] * BLOCK] * count))


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
@pytest.mark.slow
async def test_fuzzed_api_input_is_a_kvtier_error_and_harmless(
    tmp_path: Path, data: st.DataObject
) -> None:
    async with Hierarchy.from_config(chain_config(tmp_path, gpu=None, cpu=8, disk=None)) as h:
        for _ in range(4):
            call = data.draw(st.sampled_from(["put", "get", "lookup", "where"]))
            try:
                if call == "put":
                    keys = data.draw(KEY_LISTS)
                    count = len(keys) if isinstance(keys, list | tuple) else 1
                    await h.put(keys, data.draw(tensors(count)))
                elif call == "get":
                    await h.get(data.draw(KEY_LISTS), timeout_s=data.draw(TIMEOUTS))
                elif call == "lookup":
                    h.lookup(data.draw(KEY_LISTS))
                else:
                    h.where(data.draw(KEYS))
            except KvtierError:
                pass
        good = [key(1000), key(1001)]
        assert await h.put(good, blocks_of(good)) in (0, 2)
        assert torch.equal(await h.get(good), blocks_of(good))
