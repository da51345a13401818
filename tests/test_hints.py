"""Reuse hints end to end: the hint type, the tier bookkeeping (deadlines, hints handed to
a demotion), and a three-tier chain (cpu -> cpu -> disk) with real bytes."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hierarchy_helpers import BLOCK, blocks_of, key

import kvtier.chain.store as chain_store
from kvtier import Hierarchy, SyncHierarchy
from kvtier.errors import InvalidValueError
from kvtier.hints import HeldHint, ReuseHint
from kvtier.manager.tier import TierManager, make_tier_manager

# -- the hint type ---------------------------------------------------------------------------


def test_reuse_hint_validates_and_names_the_bad_value() -> None:
    assert ReuseHint("likely", 2).ttl_s == 2.0
    assert ReuseHint.of("never") == ReuseHint("never", None)
    with pytest.raises(InvalidValueError, match=r"reuse must be one of .*got 'maybe'"):
        ReuseHint("maybe")  # type: ignore[arg-type]
    assert ReuseHint("likely", 7 * 24 * 3600).ttl_s == 604800.0  # a week: the longest
    for ttl in (0, -1.0, float("inf"), float("nan"), True, "5", 604800.5, 1e12):
        with pytest.raises(InvalidValueError, match="ttl_s must be a positive number"):
            ReuseHint("likely", ttl)  # type: ignore[arg-type]


# -- one tier's bookkeeping ------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_tier_withdraws_a_hint_at_its_deadline_and_hands_evicted_hints_on() -> None:
    tier = make_tier_manager(4, BLOCK, "cpu")
    tier.clock = clock = Clock()
    keys = [key(i) for i in range(4)]
    out = tier.prepare_store(keys)
    assert out is not None
    tier.complete_store(keys)
    likely = HeldHint("likely", expires_at=110.0)
    tier.hint([keys[0]], likely)
    tier.hint([key(99)], HeldHint("never"))  # not held: ignored
    assert tier.hint_of(keys[0]) is likely and tier.hint_of(key(99)) is None
    out = tier.prepare_store([key(4)])
    assert out is not None and out.evicted_keys == [keys[1]]  # the likely block is kept
    tier.complete_store([key(4)])
    assert tier.take_evicted_hints() == {}
    clock.now = 111.0  # the deadline passed: the LRU block goes again
    tier.hint([keys[2]], HeldHint("unlikely"))
    out = tier.prepare_store([key(5)])
    assert out is not None and out.evicted_keys == [keys[2]]
    assert tier.take_evicted_hints() == {keys[2]: HeldHint("unlikely")}
    tier.complete_store([key(5)])
    out = tier.prepare_store([key(6)])
    assert out is not None and out.evicted_keys == [keys[0]]
    assert tier.hint_of(keys[0]) is None
    tier.check()


def test_a_hit_withdraws_never_in_the_bookkeeping_too() -> None:
    tier = make_tier_manager(2, BLOCK, "cpu")
    keys = [key(0), key(1)]
    tier.prepare_store(keys)
    tier.complete_store(keys)
    tier.hint(keys, HeldHint("never"))
    tier.touch([keys[0]])
    assert tier.hint_of(keys[0]) is None and tier.hint_of(keys[1]) == HeldHint("never")


# -- a three-tier chain, real bytes ----------------------------------------------------------


def three_tiers(tmp_path: Path, policy: str = "lru") -> dict[str, Any]:
    """cpu0 (4 blocks) -> cpu1 (4) -> disk (8), no reserves: exact placement."""
    tiers: list[dict[str, Any]] = [
        {"name": "cpu0", "medium": "cpu", "capacity": 4, "policy": policy},
        {"name": "cpu1", "medium": "cpu", "capacity": 4, "policy": policy},
        {"name": "disk", "medium": "disk", "capacity": 8, "policy": policy},
    ]
    tiers[2]["path"] = str(tmp_path / "disk")
    for tier in tiers:
        tier["high_watermark"] = 1.0
    return {"block_size": BLOCK, "write_policy": "write-back", "tiers": tiers}


async def put_one(h: Hierarchy, i: int, hint: Any = None) -> None:
    assert await h.put([key(i)], blocks_of([key(i)]), hint=hint) == 1
    await h.drain()  # demotions land: placement is exact


def where(h: Hierarchy, *ids: int) -> list[str | None]:
    return [h.where(key(i)) for i in ids]


async def read_back(h: Hierarchy, i: int) -> None:
    out = await h.get([key(i)])
    assert out.shape[0] == 1 and torch.equal(out.cpu(), blocks_of([key(i)]))


@pytest.mark.parametrize("policy", ["lru", "arc", "s3fifo", "lct", "auto"])
async def test_never_is_dropped_at_the_top_not_demoted(tmp_path: Path, policy: str) -> None:
    async with Hierarchy.from_config(three_tiers(tmp_path, policy)) as h:
        for i in range(3):
            await put_one(h, i)
        await put_one(h, 10, hint="never")
        await read_back(h, 10)  # a read of the put itself is fine, and withdraws "never"
        h.hint([key(10)], "never")  # the conversation closed
        await put_one(h, 4)
        assert where(h, 10) == [None]  # first out, and not copied down
        assert where(h, 0, 1, 2, 4) == ["cpu0"] * 4
        assert h.stats().chain.hint_dropped == 1
        h.check()


async def test_hints_travel_down_and_are_honoured_on_disk(tmp_path: Path) -> None:
    async with Hierarchy.from_config(three_tiers(tmp_path)) as h:
        for i in range(16):
            await put_one(h, i)
        assert where(h, 0, 7, 8, 11, 12, 15) == ["disk", "disk", "cpu1", "cpu1", "cpu0", "cpu0"]
        # a hint on a block already on disk: it goes first there
        h.hint([key(6)], "never")
        await put_one(h, 16)  # 12 -> cpu1, 8 -> disk, which evicts 6 (not its oldest, 0)
        assert where(h, 6, 0, 8) == [None, "disk", "disk"]
        # "unlikely" at the top: evicted first, carried to cpu1, first out there, then on disk
        h.hint([key(15)], "unlikely")
        await put_one(h, 17)  # top holds 13 14 15 16: 15 goes, not 13; 9 -> disk, 0 out
        assert where(h, 15, 13, 9, 0) == ["cpu1", "cpu0", "disk", None]
        await put_one(h, 18)  # 13 -> cpu1, which evicts 15 (not its oldest, 10) to disk
        assert where(h, 15, 10, 1) == ["disk", "cpu1", None]
        await put_one(h, 19)  # 14 -> cpu1, 10 -> disk, which evicts 15 (not its oldest, 2)
        assert where(h, 15, 10, 2) == [None, "disk", "disk"]
        assert h.stats().chain.hint_dropped == 1  # 6, the one "never" block
        for i in range(20):
            if h.where(key(i)) is not None:
                await read_back(h, i)
        h.check()


async def test_likely_is_kept_until_its_ttl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()  # the hints' clock, moved by the test (not by how busy the machine is)
    chain_time = SimpleNamespace(monotonic=clock, perf_counter=time.perf_counter)
    monkeypatch.setattr(chain_store, "time", chain_time)  # where put turns a TTL into a deadline
    async with Hierarchy.from_config(three_tiers(tmp_path)) as h:
        for tier in h.manager.tiers:
            assert isinstance(tier, TierManager)
            tier.clock = clock
        await put_one(h, 0, hint=ReuseHint("likely", ttl_s=0.2))
        for i in range(1, 4):
            await put_one(h, i)
        await put_one(h, 4)  # the oldest, 0, is likely: 1 goes instead
        assert where(h, 0, 1) == ["cpu0", "cpu1"]
        clock.now += 0.3
        await put_one(h, 5)  # the hint expired: the oldest goes
        assert where(h, 0) == ["cpu1"]
        await read_back(h, 0)


async def test_bad_hints_are_refused_naming_the_argument(tmp_path: Path) -> None:
    async with Hierarchy.from_config(three_tiers(tmp_path)) as h:
        keys = [key(1)]
        with pytest.raises(InvalidValueError, match="put: hint: reuse must be one of"):
            await h.put(keys, blocks_of(keys), hint="soon")  # type: ignore[arg-type]
        assert h.where(key(1)) is None  # refused before anything changed
        with pytest.raises(InvalidValueError, match="hint: reuse must be one of"):
            h.hint(keys, "sometimes")  # type: ignore[arg-type]
        with pytest.raises(InvalidValueError, match="hint: ttl_s must be a positive"):
            h.hint(keys, "likely", ttl_s=-1)
        with pytest.raises(InvalidValueError, match=r"a week\).*got 1000000000000.0"):
            h.hint(keys, "likely", ttl_s=1e12)  # a huge TTL: milliseconds given as seconds


def test_sync_hierarchy_has_the_hint_verbs(tmp_path: Path) -> None:
    with SyncHierarchy(three_tiers(tmp_path)) as h:
        for i in range(4):
            h.put([key(i)], blocks_of([key(i)]), hint="never" if i == 2 else None)
        h.hint([key(0)], "never")
        h.put([key(4)], blocks_of([key(4)]))
        h.put([key(5)], blocks_of([key(5)]))
        assert [h.where(key(i)) for i in range(6)] == [None, "cpu0", None, "cpu0", "cpu0", "cpu0"]
        assert h.stats().chain.hint_dropped == 2
