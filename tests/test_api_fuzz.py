"""A fuzz of the public `Hierarchy` API (issue 9, "a fuzz test ... of API input"): generated
garbage for the arguments of every public method and of the constructors either works or
raises a `KvtierError` subclass, never another exception class; a call that raised changed
nothing; and the hierarchy stays usable afterwards.

tests/test_hierarchy_input.py fuzzes put/get/lookup/where on a cpu-only chain; here the chain
has a disk tier (so demotions and flushes to a store that checks its keys run), every method
is called, and a model of what the successful puts stored is checked byte for byte at the
end: a garbage call must neither lose nor change a stored block."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hierarchy_helpers import BLOCK, blocks_of, chain_config, key
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kvtier import Hierarchy
from kvtier.config import parse_config
from kvtier.errors import KvtierError
from kvtier.keys import MAX_KEY_BYTES

FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

GOOD_KEYS = [key(i) for i in range(24)]
"""The well-formed keys the fuzz draws from (few, so calls overlap)."""

BAD_KEYS = st.one_of(
    st.just(b""),
    st.binary(min_size=MAX_KEY_BYTES + 1, max_size=MAX_KEY_BYTES + 400),
    st.builds(bytearray, st.binary(min_size=1, max_size=8)),
    st.builds(memoryview, st.binary(min_size=1, max_size=8)),
    st.text(max_size=6),
    st.integers(),
    st.floats(allow_nan=True),
    st.none(),
    st.tuples(st.binary(max_size=4)),
    st.just(np.zeros(3, dtype=np.uint8)),
)
KEYS = st.one_of(st.sampled_from(GOOD_KEYS), st.binary(min_size=1, max_size=40), BAD_KEYS)
KEY_LISTS = st.one_of(
    st.lists(st.sampled_from(GOOD_KEYS), min_size=0, max_size=6, unique=True),
    st.lists(KEYS, max_size=6),
    st.lists(KEYS, max_size=3).map(tuple),
    KEYS,
    st.sets(st.sampled_from(GOOD_KEYS), max_size=3),
    st.just(iter(GOOD_KEYS[:2])),
)
TIMEOUTS = st.one_of(
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=0.5, max_value=5.0),
    st.integers(min_value=-3, max_value=3),
    st.sampled_from([2**2000, -(2**2000), np.float32(1.0), np.int64(-1), True, "1", [1]]),
)
DEVICES = ["cpu", "meta"] + (["cuda"] if torch.cuda.is_available() else [])


def tensors(rows: int) -> st.SearchStrategy[Any]:
    """Block tensors for `rows` keys: mostly wrong (dtype, shape, device, layout), sometimes
    right, filled with one drawn byte value so a stored block can be checked."""
    dtypes = st.sampled_from(
        [torch.uint8, torch.uint8, torch.float16, torch.bfloat16, torch.int8, torch.bool]
    )
    shapes = st.sampled_from(
        [(rows, BLOCK), (rows, BLOCK), (rows, BLOCK - 1), (rows * BLOCK,), (rows + 1, BLOCK)]
    )
    layouts = st.sampled_from(["contiguous", "contiguous", "strided", "expanded"])

    def build(
        dtype: torch.dtype, shape: tuple[int, ...], device: str, layout: str, fill: int
    ) -> torch.Tensor:
        if layout == "strided" and len(shape) == 2:
            base = torch.zeros((shape[0], 2 * shape[1]), dtype=dtype, device=device)
            return base[:, ::2]
        if layout == "expanded" and len(shape) == 2:
            return torch.zeros((1, shape[1]), dtype=dtype, device=device).expand(*shape)
        if device == "meta":
            return torch.empty(shape, dtype=dtype, device=device)
        return torch.full(shape, fill % 2 if dtype is torch.bool else fill, device=device).to(dtype)

    real = st.builds(build, dtypes, shapes, st.sampled_from(DEVICES), layouts, st.integers(0, 127))
    other = st.sampled_from(
        [None, 3, b"\0" * BLOCK, np.zeros((rows, BLOCK), dtype=np.uint8), [[0] * 4] * rows]
    )
    return st.one_of(real, real, other)


def rows_of(blocks: torch.Tensor) -> list[bytes]:
    return [bytes(row) for row in blocks.cpu().numpy()]


async def call_one(h: Hierarchy, data: st.DataObject, stored: dict[bytes, bytes]) -> None:
    """One drawn call with drawn arguments. A put that returned updates `stored` (the model:
    key -> the bytes the chain must serve); any call that raises must raise a KvtierError."""
    call = data.draw(
        st.sampled_from(
            ["put", "put", "get", "lookup", "where", "flush", "drain", "stats", "take_events"]
        ),
        label="call",
    )
    if call == "put":
        await put_one(h, data, stored)
    elif call == "get":
        await get_one(h, data, stored)
    elif call == "lookup":
        keys = data.draw(KEY_LISTS, label="keys")
        try:
            count = h.lookup(keys)
        except KvtierError:
            return
        assert 0 <= count <= len(keys)
    elif call == "where":
        k = data.draw(KEYS, label="key")
        try:
            found = h.where(k)
        except KvtierError:
            return
        assert (found is None) == (k not in stored)
    elif call == "flush":
        try:
            await h.flush(data.draw(TIMEOUTS, label="timeout_s"))
        except KvtierError:
            return
    elif call == "drain":
        await h.drain()
    elif call == "stats":
        assert h.stats().calls.put_blocks >= len(stored)
    else:
        h.take_events()


async def put_one(h: Hierarchy, data: st.DataObject, stored: dict[bytes, bytes]) -> None:
    """A put of drawn keys and blocks; when it returns, what it stored joins `stored`."""
    # Half the puts are well formed (or have one bad part), so the model fills up.
    mode = data.draw(
        st.sampled_from(["good", "good", "bad keys", "bad blocks", "garbage"]), label="mode"
    )
    good_keys = st.lists(st.sampled_from(GOOD_KEYS), min_size=1, max_size=6, unique=True)
    keys = data.draw(good_keys if mode in ("good", "bad blocks") else KEY_LISTS, label="keys")
    rows = len(keys) if isinstance(keys, list | tuple) else 1
    if mode in ("good", "bad keys"):
        fills = data.draw(st.lists(st.integers(0, 255), min_size=rows, max_size=rows))
        blocks = torch.tensor(fills, dtype=torch.uint8)[:, None].repeat(1, BLOCK)
    else:
        blocks = data.draw(tensors(rows), label="blocks")
    try:
        await h.put(keys, blocks)
    except KvtierError as error:
        event(f"put raised {type(error).__name__}")
        return
    event("put returned")
    # It returned, so the input was well formed: what it stored is now in the model.
    for k, row in zip(keys, rows_of(blocks), strict=True):
        stored.setdefault(k, row)


async def get_one(h: Hierarchy, data: st.DataObject, stored: dict[bytes, bytes]) -> None:
    """A get of drawn keys with a drawn timeout: what it serves is what `stored` holds."""
    keys = data.draw(KEY_LISTS, label="keys")
    try:
        got = await h.get(keys, timeout_s=data.draw(TIMEOUTS, label="timeout_s"))
    except KvtierError:
        return
    assert got.dtype == torch.uint8 and got.shape[1:] == (BLOCK,)
    for k, row in zip(keys, rows_of(got), strict=False):
        assert row == stored[k], "get served bytes that no put stored under this key"


@FUZZ
@given(data=st.data())
@pytest.mark.slow
async def test_garbage_calls_raise_kvtier_errors_and_lose_nothing(
    tmp_path: Path, data: st.DataObject
) -> None:
    # The chain holds every key the fuzz can store (24 < 64), so nothing is evicted for
    # good: every block a put stored must still be served, with its bytes.
    config = chain_config(Path(tempfile.mkdtemp(dir=tmp_path)), gpu=None, cpu=8, disk=64)
    stored: dict[bytes, bytes] = {}
    async with Hierarchy.from_config(config, load_timeout_s=10.0) as h:
        for _ in range(data.draw(st.integers(1, 8), label="calls")):
            await call_one(h, data, stored)
        await h.drain()
        h.check()
        keys = list(stored)
        got = await h.get(keys)
        assert rows_of(got) == [stored[k] for k in keys]
        # ... and a put that raised stored none of its keys.
        assert [k for k in GOOD_KEYS if k not in stored and h.where(k) is not None] == []
        fresh = [k for k in GOOD_KEYS if k not in stored][:2]
        assert await h.put(fresh, blocks_of(fresh)) == len(fresh)
        assert torch.equal(await h.get(fresh), blocks_of(fresh))


GARBAGE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=1 << 22),
    st.sampled_from([2**70, -(2**70), 10**400, np.int64(2), np.float64(0.5)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
    st.lists(st.integers(0, 3), max_size=2),
)
OPTION_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "load_timeout_s": st.one_of(GARBAGE, st.floats(0.5, 10.0)),
    "flush_timeout_s": st.one_of(GARBAGE, st.floats(0.5, 10.0)),
    "max_concurrency": st.one_of(GARBAGE, st.integers(1, 16)),
    "max_pending_cascades": st.one_of(GARBAGE, st.integers(0, 128)),
    "staging_bytes": st.one_of(GARBAGE, st.integers(1, 1 << 24)),
    "flush_on_close": st.one_of(GARBAGE, st.none(), st.booleans()),
    "tier_options": st.one_of(
        GARBAGE,
        st.dictionaries(
            st.one_of(st.sampled_from(["disk", "cpu", "gpu", "nvme"]), st.integers()),
            st.one_of(
                GARBAGE,
                st.dictionaries(
                    st.sampled_from(["max_workers", "io", "fsync", "bogus", "direct_io", 3]),
                    st.one_of(st.integers(1, 4), st.booleans(), st.text(max_size=3), st.none()),
                    max_size=2,
                ),
            ),
            max_size=2,
        ),
    ),
    "disk_options": st.one_of(
        GARBAGE,
        st.dictionaries(
            st.sampled_from(["max_workers", "fsync", "bogus", "model_id"]),
            st.one_of(st.integers(1, 4), st.booleans(), st.text(max_size=3)),
            max_size=2,
        ),
    ),
    "not_an_option": GARBAGE,
}


@FUZZ
@given(data=st.data())
async def test_garbage_options_raise_kvtier_errors_and_the_rest_works(
    tmp_path: Path, data: st.DataObject
) -> None:
    names = data.draw(st.sets(st.sampled_from(sorted(OPTION_VALUES)), max_size=3), label="names")
    options = {name: data.draw(OPTION_VALUES[name], label=name) for name in sorted(names)}
    config = chain_config(Path(tempfile.mkdtemp(dir=tmp_path)), gpu=None, cpu=8, disk=16)
    given_as = data.draw(st.sampled_from(["dict", "parsed", "toml"]), label="config as")
    try:
        if given_as == "dict":
            h = Hierarchy.from_config(config, **options)
        elif given_as == "parsed":
            h = Hierarchy(parse_config(config), **options)
        else:
            toml = tmp_path / "kvtier.toml"
            disk = config["tiers"][1]["path"]
            toml.write_text(
                f"block_size = {BLOCK}\n"
                '[[tiers]]\nname = "cpu"\nmedium = "cpu"\ncapacity = 8\n'
                f'[[tiers]]\nname = "disk"\nmedium = "disk"\ncapacity = 16\npath = "{disk}"\n'
            )
            h = Hierarchy.from_toml(toml, **options)
        await h.open()
    except KvtierError as error:
        event(f"raised {type(error).__name__}")
        return
    except TypeError as error:  # only Python's own check of a direct call's signature
        assert given_as == "parsed" and "not_an_option" in options, error
        return
    event("opened")
    try:
        keys = GOOD_KEYS[:3]
        assert await h.put(keys, blocks_of(keys)) == 3
        assert torch.equal(await h.get(keys, timeout_s=5.0), blocks_of(keys))
        assert {tier.name for tier in h.tiers} | set(h.disabled_tiers) == {"cpu", "disk"}
    finally:
        await h.close()
    assert h.closed


@settings(max_examples=80, deadline=None)
@given(
    config=st.one_of(
        st.none(),
        st.integers(),
        st.floats(),
        st.binary(max_size=8),
        st.lists(st.integers(), max_size=2),
        st.dictionaries(
            st.sampled_from(["block_size", "tiers", "strict", "write_policy", "model_id", "x"]),
            st.one_of(
                st.integers(-5, 1 << 40),
                st.text(max_size=5),
                st.booleans(),
                st.lists(st.dictionaries(st.text(max_size=6), st.integers(), max_size=3)),
            ),
            max_size=4,
        ),
    )
)
def test_garbage_configs_are_kvtier_errors(config: Any) -> None:
    try:
        h = Hierarchy.from_config(config)
    except KvtierError:
        return
    # A dict that happened to be valid: the hierarchy is the one it describes.
    assert isinstance(config, dict) and h.block_size == parse_config(config).block_size
    assert not h.closed
