"""Session hints through a chain cpu -> disk (real bytes, write-back): a block's session rank
travels with it when it is demoted or promoted, so the disk tier orders sessions as the cpu
tier does, and session hints do not make the chain worse than no hints (issue 34 item 5:
without the rank that travels, the disk tier evicted the blocks of the sessions heard of
last first, the likeliest to come back)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hierarchy_helpers import BLOCK, blocks_of, key

from kvtier import Hierarchy
from kvtier.manager.chain_tier import ChainTier

pytestmark = pytest.mark.timeout(120)

CPU, DISK = 0, 1


def cpu_disk(tmp_path: Path, cpu: int = 2, disk: int = 2) -> dict[str, Any]:
    """cpu0 -> disk, LRU, no reserves: exact placement."""
    tiers: list[dict[str, Any]] = [
        {"name": "cpu0", "medium": "cpu", "capacity": cpu, "high_watermark": 1.0},
        {"name": "disk", "medium": "disk", "capacity": disk, "path": str(tmp_path / "disk")},
    ]
    tiers[1]["high_watermark"] = 1.0
    return {"block_size": BLOCK, "write_policy": "write-back", "tiers": tiers}


async def put(h: Hierarchy, i: int, session: str) -> None:
    await h.put([key(i)], blocks_of([key(i)]), session=session)
    await h.drain()


async def test_a_demoted_block_keeps_its_session_rank(tmp_path: Path) -> None:
    async with Hierarchy.from_config(cpu_disk(tmp_path)) as h:
        tiers: tuple[ChainTier, ...] = tuple(h.manager.tiers)
        for i, session in enumerate("abcd"):  # one block a session; a and b go down
            await put(h, i, session)
        assert [h.where(key(i)) for i in range(4)] == ["disk", "disk", "cpu0", "cpu0"]
        # ranked below as they were above: a (idle longest) lowest
        rank_a, rank_b = tiers[DISK].rank_of(key(0)), tiers[DISK].rank_of(key(1))
        assert rank_a is not None and rank_b is not None and rank_a < rank_b
        await put(h, 0, "a")  # a's next request: a is the most recently active session
        await put(h, 4, "e")  # c goes down; the full disk evicts idle b, not active a
        assert [h.where(key(i)) for i in range(5)] == ["disk", None, "disk", "cpu0", "cpu0"]
        h.check()


async def test_a_promoted_block_is_ranked_above_as_below(tmp_path: Path) -> None:
    async with Hierarchy.from_config(cpu_disk(tmp_path)) as h:
        tiers: tuple[ChainTier, ...] = tuple(h.manager.tiers)
        for i, session in enumerate("abc"):
            await put(h, i, session)
        assert h.where(key(0)) == "disk"
        below = tiers[DISK].rank_of(key(0))
        assert (await h.get([key(0)])).shape[0] == 1  # promoted back to the cpu tier
        await h.drain()
        assert tiers[CPU].has(key(0)) is True
        assert tiers[CPU].rank_of(key(0)) == below is not None
        h.check()


# Five agent sessions taking turns, each request re-reading its session's prefix and adding
# one block (session s's blocks are 10 s, 10 s + 1, ...): more than the chain holds.
TURNS = (0, 1, 2, 0, 3, 1, 0, 4, 2, 0, 1, 3, 4, 0, 2)


async def replay_turns(tmp_path: Path, sessions: bool) -> int:
    """Serve TURNS as `kvtier replay` does (lookup, get the leading hits, put the rest);
    with `sessions`, every put names its session and one more put names the hits. Returns
    the blocks hit."""
    tmp_path.mkdir()
    async with Hierarchy.from_config(cpu_disk(tmp_path, cpu=2, disk=4)) as h:
        length: dict[int, int] = {}
        hits = 0
        for s in TURNS:
            length[s] = length.get(s, 0) + 1
            keys = [key(10 * s + i) for i in range(length[s])]
            got = 0
            if found := h.lookup(keys):
                got = int((await h.get(keys[:found])).shape[0])
            await h.drain()
            hits += got
            session = f"s{s}" if sessions else None
            if got and session is not None:
                await h.put(keys[:got], blocks_of(keys[:got]), session=session)
            await h.put(keys[got:], blocks_of(keys[got:]), session=session)
            await h.drain()
        h.check()
        return hits


async def test_session_hints_do_not_make_a_cpu_disk_chain_worse(tmp_path: Path) -> None:
    without = await replay_turns(tmp_path / "plain", sessions=False)
    hinted = await replay_turns(tmp_path / "sessions", sessions=True)
    # 5 and 5 with ranks that travel; the hinted run hit 3 when the disk tier held its
    # demoted blocks unranked (evicting the sessions heard of last first)
    assert without > 0
    assert hinted >= without, (hinted, without)


async def test_a_sessions_end_reaches_every_tier_holding_its_blocks(tmp_path: Path) -> None:
    async with Hierarchy.from_config(cpu_disk(tmp_path, cpu=2, disk=4)) as h:
        tiers: tuple[ChainTier, ...] = tuple(h.manager.tiers)
        for i in range(3):  # a's three blocks: its tail then (1) goes down, the head stays
            await put(h, i, "a")
        assert [h.where(key(i)) for i in range(3)] == ["cpu0", "disk", "cpu0"]
        h.end_session("a")
        held = [tiers[DISK].hint_of(key(1)), tiers[CPU].hint_of(key(0))]
        assert [None if hint is None else hint.reuse for hint in held] == ["never", "never"]
        assert tiers[DISK].rank_of(key(1)) is None  # unranked everywhere: it has no session
        h.check()
