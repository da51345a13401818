"""Reuse hints honoured through a three-tier chain (cpu -> cpu -> disk, real bytes), written
back and written through: a "likely" block with a TTL is kept in every tier it reaches while
unhinted blocks pass through, an "unlikely" one is demoted keeping its hint and goes first
in each tier, and a "never" block never reaches the bottom tier (with write-through it is
not even cascaded there)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from hierarchy_helpers import BLOCK, blocks_of, key

from kvtier import Hierarchy
from kvtier.hints import ReuseHint
from kvtier.manager.chain_tier import ChainTier

LIKELY = ReuseHint("likely", ttl_s=600.0)  # far longer than the test: it never expires here
TOP, MIDDLE, BOTTOM = 0, 1, 2


def small_chain(tmp_path: Path, write_policy: str) -> dict[str, Any]:
    """cpu0 (2 blocks) -> cpu1 (2) -> disk (4), LRU, no reserves: exact placement."""
    tiers: list[dict[str, Any]] = [
        {"name": "cpu0", "medium": "cpu", "capacity": 2},
        {"name": "cpu1", "medium": "cpu", "capacity": 2},
        {"name": "disk", "medium": "disk", "capacity": 4, "path": str(tmp_path / "disk")},
    ]
    for tier in tiers:
        tier["high_watermark"] = 1.0
    return {"block_size": BLOCK, "write_policy": write_policy, "tiers": tiers}


class Run:
    """Puts one block at a time and waits for its demotions and cascades to land."""

    def __init__(self, h: Hierarchy) -> None:
        self.h = h
        self.tiers: tuple[ChainTier, ...] = tuple(h.manager.tiers)

    async def put(self, i: int, hint: ReuseHint | None = None) -> None:
        assert await self.h.put([key(i)], blocks_of([key(i)]), hint=hint) == 1
        await self.h.drain()

    def held(self, tier: int, i: int) -> bool:
        return self.tiers[tier].has(key(i)) is True

    def hint(self, tier: int, i: int) -> str | None:
        held = self.tiers[tier].hint_of(key(i))
        return None if held is None else held.reuse

    def where(self, *ids: int) -> list[str | None]:
        return [self.h.where(key(i)) for i in ids]

    async def read_back(self, *ids: int) -> None:
        for i in ids:
            out = await self.h.get([key(i)])
            assert out.shape[0] == 1 and torch.equal(out.cpu(), blocks_of([key(i)]))


@pytest.mark.parametrize("write_policy", ["write-back", "write-through"])
async def test_likely_is_kept_in_every_tier_it_reaches(tmp_path: Path, write_policy: str) -> None:
    async with Hierarchy.from_config(small_chain(tmp_path, write_policy)) as h:
        run = Run(h)
        await run.put(0)
        await run.put(1)
        for i in (2, 3, 4):  # the top holds two: all likely, the oldest must go down
            await run.put(i, LIKELY)
        assert run.where(4, 3) == ["cpu0", "cpu0"] and run.hint(MIDDLE, 2) == "likely"
        await run.put(5)  # cpu1 is all likely too: 2 goes on to the disk, still likely
        await run.put(6)
        assert run.where(2, 3, 4) == ["disk", "cpu1", "cpu0"]
        assert run.hint(BOTTOM, 2) == "likely" and run.hint(MIDDLE, 3) == "likely"
        for i in range(7, 14):  # seven unhinted blocks pass through every tier
            await run.put(i)
            assert run.where(2, 3, 4) == ["disk", "cpu1", "cpu0"], i
        assert run.where(0, 1, 5, 6, 7, 8) == [None] * 6  # older and newer unhinted: gone
        await run.read_back(2, 3, 4)
        h.check()


async def test_unlikely_is_demoted_with_its_hint_and_goes_first(tmp_path: Path) -> None:
    async with Hierarchy.from_config(small_chain(tmp_path, "write-back")) as h:
        run = Run(h)
        for i in range(6):
            await run.put(i)
        assert run.where(0, 1, 2, 3, 4, 5) == ["disk"] * 2 + ["cpu1"] * 2 + ["cpu0"] * 2
        await run.put(6, ReuseHint("unlikely"))  # 4 -> cpu1, 2 -> disk
        await run.put(7)  # the top holds 5 and 6: 6 goes first, though 5 is older
        assert run.where(5, 6) == ["cpu0", "cpu1"] and run.hint(MIDDLE, 6) == "unlikely"
        await run.put(8)  # 5 -> cpu1, which holds 4 and 6: 6 goes first, though 4 is older
        assert run.where(4, 6) == ["cpu1", "disk"] and run.hint(BOTTOM, 6) == "unlikely"
        await run.put(9)  # 7 -> cpu1, 4 -> the full disk: 6 goes, not its oldest, 1
        assert run.where(6, 1) == [None, "disk"]
        assert h.stats().chain.hint_dropped == 0  # "unlikely" is evicted, not dropped above
        h.check()


@pytest.mark.parametrize("write_policy", ["write-back", "write-through"])
async def test_never_never_reaches_the_bottom_tier(tmp_path: Path, write_policy: str) -> None:
    async with Hierarchy.from_config(small_chain(tmp_path, write_policy)) as h:
        run = Run(h)
        for i in range(4):
            await run.put(i)
        await run.put(4, ReuseHint("never"))  # hinted as it is stored
        assert not run.held(MIDDLE, 4) and not run.held(BOTTOM, 4)
        # with write-through, the unhinted block stored before it was cascaded
        assert run.held(BOTTOM, 3) is (write_policy == "write-through")
        for i in range(5, 9):
            await run.put(i)
            assert not run.held(MIDDLE, 4) and not run.held(BOTTOM, 4), i
        assert run.where(4) == [None]
        chain = h.stats().chain
        assert chain.hint_dropped == 1  # evicted from the top: dropped, not demoted
        if write_policy == "write-through":
            assert chain.hint_not_cascaded == 1
        else:
            assert chain.hint_not_cascaded == 0
        await run.read_back(5, 6, 7, 8)
        h.check()


async def test_a_write_through_copy_holds_the_hint_of_its_source(tmp_path: Path) -> None:
    async with Hierarchy.from_config(small_chain(tmp_path, "write-through")) as h:
        run = Run(h)
        await run.put(0, LIKELY)
        await run.put(1, ReuseHint("unlikely"))
        for tier in (TOP, MIDDLE, BOTTOM):
            assert (run.hint(tier, 0), run.hint(tier, 1)) == ("likely", "unlikely"), tier
        assert h.stats().chain.cascaded == 4
