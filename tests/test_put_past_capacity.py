"""A put of more blocks than the whole chain holds (issue 31, item 9): it keeps the first
blocks the chain can hold, a prefix that lookups reach, and refuses the rest at once,
counted and logged; it never churns the rest through the chain (which would leave only a
tail no lookup reaches, after minutes of demotions for a large put)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from hierarchy_helpers import blocks_of, chain_config, key

from kvtier import Hierarchy

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    ("write_policy", "held"), [("write-back", 4 + 8 + 32), ("write-through", 32)]
)
async def test_a_put_past_the_chain_keeps_its_prefix_and_refuses_the_rest(
    tmp_path: Path, write_policy: str, held: int, caplog: pytest.LogCaptureFixture
) -> None:
    config = chain_config(tmp_path, write_policy=write_policy, reserve=False)
    keys = [key(i) for i in range(10 * held)]
    async with Hierarchy.from_config(config) as h:
        with caplog.at_level(logging.WARNING, logger="kvtier.chain"):
            stored = await h.put(keys, blocks_of(keys))
        await h.drain()
        assert stored == held
        calls = h.stats().calls
        assert (calls.put_blocks, calls.put_stored, calls.put_refused) == (
            10 * held,
            held,
            9 * held,
        )
        assert f"more than the whole chain holds ({held})" in caplog.text
        assert h.lookup(keys) == held  # the head is there: the put was not its own victim
        assert all(h.where(k) is None for k in keys[held:])
        # (a get of the whole full chain would evict its own tail to promote its head)
        out = await h.get(keys[:1], timeout_s=60)
        assert torch.equal(out.cpu(), blocks_of(keys[:1]))


async def test_a_partial_last_block_past_the_chain_is_counted_as_partial(
    tmp_path: Path,
) -> None:
    config = chain_config(tmp_path, gpu=None, cpu=4, disk=None, reserve=False)
    keys = [key(i) for i in range(10)]
    async with Hierarchy.from_config(config) as h:
        assert await h.put(keys, blocks_of(keys), partial_last=True) == 4
        calls = h.stats().calls
        assert (calls.put_stored, calls.put_refused, calls.put_partial) == (4, 5, 1)
        assert h.lookup(keys) == 4


async def test_a_put_that_fits_the_chain_is_stored_whole(tmp_path: Path) -> None:
    config = chain_config(tmp_path, gpu=None, cpu=4, disk=16, reserve=False)
    keys = [key(i) for i in range(20)]
    async with Hierarchy.from_config(config) as h:
        assert await h.put(keys, blocks_of(keys)) == 20
        await h.drain()
        assert h.stats().calls.put_refused == 0
        assert h.lookup(keys) == 20
