"""A floor on the size of a background refill (`min_refill`, `kvtier.tiers.refill`): a tier
above a disk store demotes at least that many blocks per refill (so the disk is handed large
writes, not a few MB each), at most 1/8 of the tier; 0 plans exactly what the watermarks alone
plan; a bad value is one error naming the key."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hierarchy_helpers import blocks_of, chain_config, key
from test_refill_merge import Recorder
from test_tiered_manager import k

from kvtier import Hierarchy
from kvtier.config import HierarchyConfig, parse_config
from kvtier.errors import ConfigError, InvalidValueError
from kvtier.manager import JobKind, TieredManager, TransferJob, make_tier_manager
from kvtier.manager.planner import reserve_slots
from kvtier.tiers.refill import DEFAULT_MIN_REFILL, refill_floors
from kvtier_tools.workloads.replay import replay_config

MARKS = (0.95, 0.98)  # the config's defaults (low, high)


# -- the reserve's target ----------------------------------------------------------------------


def test_the_floor_raises_a_refills_target_above_its_trigger() -> None:
    # The replay's cpu tier: 8,192 blocks of 16 KiB; its watermarks refill 164 -> 410 free.
    assert reserve_slots(8192, MARKS) == (164, 410)
    assert reserve_slots(8192, MARKS, 0) == (164, 410)  # off: the watermarks alone
    assert reserve_slots(8192, MARKS, 512) == (164, 164 + 512)  # 8 MiB of 16 KiB blocks
    assert reserve_slots(8192, MARKS, 100) == (164, 410)  # below the watermarks' gap: unchanged
    # At 256 KiB blocks 8 MiB is 32 blocks: the real config's refills are unchanged.
    assert reserve_slots(8192, MARKS, 32) == (164, 410)


def test_the_floor_takes_at_most_an_eighth_of_a_small_tier() -> None:
    assert reserve_slots(150, MARKS, 2048) == (3, 150 // 8)
    assert reserve_slots(8192, MARKS, 4096) == (164, 1024)
    assert reserve_slots(8, MARKS, 2048) == (1, 1)  # an eighth of 8 is the trigger itself
    assert reserve_slots(100, (0.5, 1.0), 2048) == (0, 0)  # no reserve: no refill to floor


# -- the planner -------------------------------------------------------------------------------


def cpu_over_disk(floor: int | None, cpu: int = 256) -> TieredManager:
    tiers = [
        make_tier_manager(cpu, 64, "cpu", "lru", name="cpu"),
        make_tier_manager(4096, 64, "disk", "lru", name="disk"),
    ]
    floors = None if floor is None else [floor, 0]
    return TieredManager(tiers, watermarks=[MARKS, None], min_refills=floors)


def background_copies(model: Recorder) -> list[int]:
    """Blocks each background refill copied into the disk tier, in order."""
    return [
        len(step)
        for job in model.jobs
        if job.kind is JobKind.DEMOTE and job.background
        for step in job.steps
        if (step.src, step.dst) == (0, 1)
    ]


def random_puts(
    model: Recorder, puts: int, seed: int, after_put: Callable[[], None] | None = None
) -> Recorder:
    """Puts of 1 to 5 blocks, now and then of a block stored before (held somewhere), each
    followed by `after_put` (if any) and by running every job planned, the byte model
    checking every slot. `model`, returned."""
    rng = random.Random(seed)
    next_key = 0
    for _ in range(puts):
        keys = [k(next_key + j) for j in range(rng.randint(1, 5))]
        next_key += len(keys)
        if next_key > 20 and rng.random() < 0.2:
            keys[0] = k(rng.randrange(next_key - 20))
        model.put(keys)
        if after_put is not None:
            after_put()
        model.drain()
        model.verify()
    return model


def run_puts(floor: int | None, cpu: int = 256, puts: int = 300, seed: int = 3) -> Recorder:
    """`random_puts` on a cpu tier of `cpu` blocks over a disk tier."""
    return random_puts(Recorder(cpu_over_disk(floor, cpu)), puts, seed)


def test_every_background_refill_copies_at_least_the_floor() -> None:
    # 256 blocks: the watermarks refill 6 -> 13 free slots, a copy of 7 to 13 blocks.
    plain = background_copies(run_puts(0))
    assert plain and max(plain) <= 13
    floored = background_copies(run_puts(20))
    assert floored and min(floored) >= 20  # trigger 6 + 20 = 26: at least 20 freed
    assert sum(floored) >= sum(plain) - 26  # the same stream, in fewer, larger copies
    assert len(floored) < len(plain)


def test_a_floor_larger_than_an_eighth_of_the_tier_is_capped() -> None:
    model = run_puts(2048)
    copies = background_copies(model)
    # target min(6 + 2048, 256 // 8) = 32: each refill frees 27 to 32 blocks, never more.
    assert copies and min(copies) >= 27 and max(copies) <= 32
    assert model.manager.top.num_free <= 32


def plans(model: Recorder) -> list[tuple[JobKind, bool, list[tuple[int, int, tuple[Any, ...]]]]]:
    return [(job.kind, job.background, steps_of(job)) for job in model.jobs]


def steps_of(job: TransferJob) -> list[tuple[int, int, tuple[Any, ...]]]:
    return [(s.src, s.dst, (s.keys, s.src_ids.tolist(), s.dst_ids.tolist())) for s in job.steps]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_floor_of_zero_plans_exactly_what_no_floor_plans(seed: int) -> None:
    without = run_puts(None, seed=seed)
    zero = run_puts(0, seed=seed)
    assert plans(zero) == plans(without)  # the same jobs, blocks and slots, in the same order
    assert zero.contents() == without.contents()
    assert plans(run_puts(20, seed=seed)) != plans(without)  # (the floor does change them)


def test_a_grown_reserve_keeps_its_floor() -> None:
    # Puts of 24 blocks grow the reserve (`reserve_for`: trigger 24, target 48, at most
    # 512 // 8 = 64); the floor of 30 then aims for 24 + 30 = 54 free slots.
    model = Recorder(cpu_over_disk(30, cpu=512))
    for i in range(60):
        model.put([k(24 * i + j) for j in range(24)])
        model.drain()
        model.verify()
    assert model.manager.planner._reserves[0] == (24, 54)
    assert min(background_copies(model)[2:]) >= 30


@pytest.mark.parametrize("bad", [[1], [1, -1], [1.5, 0], [True, 0], "ab"])
def test_min_refills_must_be_one_int_of_zero_or_more_per_tier(bad: object) -> None:
    tiers = [make_tier_manager(n, 64, "cpu", "lru", name=f"t{n}") for n in (8, 16)]
    with pytest.raises(InvalidValueError, match="min_refills"):
        TieredManager(tiers, watermarks=[MARKS, None], min_refills=bad)  # type: ignore[arg-type]


# -- a chain over a real disk store ------------------------------------------------------------


async def background_demotion_sizes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **cpu_keys: object
) -> list[int]:
    """Puts of 2 new blocks at a time into a cpu tier of 256 blocks over a disk tier; the
    blocks each background refill copied to the disk, in order."""
    tmp_path.mkdir(exist_ok=True)
    config = chain_config(tmp_path, gpu=None, cpu=256, disk=4096)
    config["tiers"][0].update(cpu_keys)
    sizes: list[int] = []
    async with Hierarchy.from_config(config, flush_on_close=False) as h:
        ledger = h.chain.manager.ledger
        emit = ledger.emit

        def spy(job: TransferJob, *, queue: bool = True) -> TransferJob | None:
            if job.kind is JobKind.DEMOTE and job.background:
                sizes.extend(len(s) for s in job.steps if (s.src, s.dst) == (0, 1))
            return emit(job, queue=queue)

        monkeypatch.setattr(ledger, "emit", spy)
        for first in range(0, 1200, 2):
            ks = [key(first), key(first + 1)]
            assert await h.put(ks, blocks_of(ks)) == 2
            await h.drain()
        assert h.stats().calls.put_demotion_waits == 0  # no put evicted on its own path
        assert h.lookup([key(0), key(1)]) == 2  # the first blocks are on the disk
    return sizes


async def test_a_cpu_tier_over_a_disk_demotes_at_least_its_floor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 4 KiB blocks: "64KiB" is 16 blocks; the watermarks alone refill 6 -> 13 (<= 13 each).
    sizes = await background_demotion_sizes(tmp_path / "a", monkeypatch, min_refill="64KiB")
    assert sizes and min(sizes) >= 16
    off = await background_demotion_sizes(tmp_path / "b", monkeypatch, min_refill=0)
    assert off and max(off) <= 13


async def test_by_default_a_tier_over_a_disk_has_the_floor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "auto" over a disk: 8 MiB (2,048 blocks of 4 KiB), capped at 256 // 8 = 32: each
    # refill frees 32 less the 0 to 5 slots free when it starts.
    sizes = await background_demotion_sizes(tmp_path, monkeypatch)
    assert sizes and min(sizes) >= 32 - 5


# -- the config --------------------------------------------------------------------------------


def chain(cpu: dict[str, Any] | None = None, *, gpu: bool = False) -> HierarchyConfig:
    tiers: list[dict[str, Any]] = []
    if gpu:
        tiers.append({"name": "gpu", "medium": "gpu", "capacity": 64, "device": "cpu"})
    tiers.append({"name": "cpu", "medium": "cpu", "capacity": "64MiB", **(cpu or {})})
    tiers.append({"name": "disk", "medium": "disk", "capacity": 4096, "path": "/tmp/x"})
    return parse_config({"block_size": "16KiB", "tiers": tiers})


def test_auto_is_eight_mib_over_a_disk_tier_and_nothing_elsewhere() -> None:
    config = chain(gpu=True)
    assert DEFAULT_MIN_REFILL == 8 << 20
    # gpu over cpu: 0; cpu over disk: 8 MiB of 16 KiB blocks; the bottom keeps no reserve.
    assert refill_floors(config.tiers, config.block_size) == [0, 512, 0]
    # The tier below is the next one opened: a gpu tier directly over the disk gets it.
    assert refill_floors([config.tiers[0], config.tiers[2]], config.block_size) == [512, 0]


@pytest.mark.parametrize(
    ("value", "blocks"),
    [(0, 0), ("1MiB", 64), (1 << 20, 64), ("1000KB", 62), ("64MiB", 4096), ("auto", 512)],
)
def test_an_explicit_min_refill_overrides_auto(value: object, blocks: int) -> None:
    # In blocks of 16 KiB, rounded up (1,000,000 bytes: 61.04 blocks, so 62).
    config = chain({"min_refill": value})
    assert refill_floors(config.tiers, config.block_size)[0] == blocks


def test_describe_shows_a_min_refill_that_is_not_the_default() -> None:
    assert "min_refill" not in chain().describe()
    assert 'min_refill="16MiB"' in chain({"min_refill": "16MiB"}).describe()
    assert "min_refill=0" in chain({"min_refill": 0}).describe()


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (-1, "at least 1 byte"),
        ("lots", "a size like"),
        (True, "a size like"),
        (1.5, "a size like"),
        ("8 furlongs", "unknown size unit"),
        ("65MiB", "more than the tier holds (64 MiB)"),
    ],
)
def test_a_bad_min_refill_is_one_error_naming_the_key(value: object, says: str) -> None:
    with pytest.raises(ConfigError) as raised:
        chain({"min_refill": value})
    assert len(raised.value.problems) == 1, raised.value.problems
    message = raised.value.problems[0]
    assert "min_refill" in message and says in message, message


def test_a_replay_at_smaller_blocks_keeps_a_floor_within_its_tier() -> None:
    # 4,096 blocks of 16 KiB (64 MiB), a floor of 48 MiB: at 4 KiB blocks the tier holds
    # 16 MiB, so the replayed floor is the whole tier (then capped at 1/8 of it, 512).
    config = chain({"min_refill": "48MiB"})
    replayed = replay_config(config, 4096, None)
    assert replayed.tiers[0].num_blocks == 4096
    assert replayed.tiers[0].min_refill == 16 << 20
    assert refill_floors(replayed.tiers, 4096)[0] == 4096
    # "auto" stays "auto": 8 MiB at the replayed size.
    assert refill_floors(replay_config(chain(), 4096, None).tiers, 4096)[0] == 2048
