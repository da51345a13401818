"""No path copies a block hinted "never" down the chain: not a flush (on close or asked
for), not a background demotion keeping a tier's reserve, not a write-through cascade.
Each is counted (`hint_not_cascaded` for cascades and flushes, `hint_dropped` for
demotions), and the blocks left behind on purpose are not reported as left by a flush."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hierarchy_helpers import BLOCK, blocks_of, key

from kvtier import Hierarchy
from kvtier.hints import ReuseHint

NEVER = ReuseHint("never")


def three_tiers(tmp_path: Path, write_policy: str = "write-back") -> dict[str, Any]:
    """cpu0 (4 blocks) -> cpu1 (4) -> disk (16), LRU, no reserves: nothing moves unasked."""
    tiers: list[dict[str, Any]] = [
        {"name": "cpu0", "medium": "cpu", "capacity": 4, "high_watermark": 1.0},
        {"name": "cpu1", "medium": "cpu", "capacity": 4, "high_watermark": 1.0},
        {"name": "disk", "medium": "disk", "capacity": 16, "path": str(tmp_path / "disk")},
    ]
    return {"block_size": BLOCK, "write_policy": write_policy, "tiers": tiers}


async def test_a_flush_does_not_copy_never_blocks_down(tmp_path: Path) -> None:
    async with Hierarchy.from_config(three_tiers(tmp_path), flush_on_close=False) as h:
        kept, never = [key(0), key(1)], [key(2), key(3)]
        assert await h.put(kept, blocks_of(kept)) == 2
        assert await h.put(never, blocks_of(never), hint=NEVER) == 2
        await h.drain()
        assert await h.flush() == 2  # the unhinted ones only
        assert [h.where(k) for k in kept + never] == ["cpu0"] * 4
        bottom = h.manager.tiers[-1]
        assert [bottom.has(k) for k in kept + never] == [True, True, False, False]
        assert h.stats().chain.hint_not_cascaded == 2
        assert h.last_flush is not None and h.last_flush.left == 0  # left there on purpose
        h.check()


async def test_the_flush_on_close_does_not_copy_never_blocks_down(tmp_path: Path) -> None:
    config = three_tiers(tmp_path)
    kept, never = [key(0)], [key(1)]
    async with Hierarchy.from_config(config, flush_on_close=True) as h:
        assert await h.put(kept, blocks_of(kept)) == 1
        assert await h.put(never, blocks_of(never), hint=NEVER) == 1
    async with Hierarchy.from_config(config, flush_on_close=False) as h:
        assert [h.where(k) for k in kept + never] == ["disk", None]


async def test_a_flush_from_a_middle_tier_honours_its_hint(tmp_path: Path) -> None:
    """An unhinted block demoted to cpu1 is flushed from there; a block hinted "never" in
    cpu1 after its demotion is not."""
    config = three_tiers(tmp_path)
    config["tiers"][1]["capacity"] = 8  # room for the flush's copies: nothing evicted there
    async with Hierarchy.from_config(config, flush_on_close=False) as h:
        ks = [key(i) for i in range(6)]
        for k in ks:
            assert await h.put([k], blocks_of([k])) == 1
            await h.drain()
        assert [h.where(k) for k in ks[:2]] == ["cpu1", "cpu1"]
        h.hint([ks[1]], reuse="never")
        assert await h.flush() == 5
        bottom = h.manager.tiers[-1]
        assert bottom.has(ks[1]) is False and bottom.has(ks[0]) is True
        assert h.where(ks[1]) == "cpu1"  # still there, not copied down
        chain = h.stats().chain
        assert (chain.hint_not_cascaded, chain.hint_dropped) == (1, 0)
        h.check()


@pytest.mark.parametrize("write_policy", ["write-back", "write-through"])
async def test_a_reserve_refill_drops_never_blocks(tmp_path: Path, write_policy: str) -> None:
    """A tier keeping a reserve evicts in the background (`ChainPlanner._plan_reserves`): a
    "never" victim is dropped there too, not demoted."""
    config = three_tiers(tmp_path, write_policy)
    config["tiers"][0].update(high_watermark=0.75, low_watermark=0.5)
    async with Hierarchy.from_config(config, flush_on_close=False) as h:
        never = [key(0)]
        assert await h.put(never, blocks_of(never), hint=NEVER) == 1
        await h.drain()
        for i in range(1, 5):
            assert await h.put([key(i)], blocks_of([key(i)])) == 1
            await h.drain()
        assert h.where(key(0)) is None  # evicted first, and dropped, not demoted
        chain = h.stats().chain
        assert chain.hint_dropped == 1 and chain.reserve_evicted >= 1
        h.check()
