"""`LogIndex.apply` (the log store's in-memory index, below the store): a batch of records
applied with array operations leaves the index exactly as applying them one by one in the
order written would (each replaces its slot's record; a block's key leaves any other slot
that held it, one written earlier in the batch too), whether the key was held at the open
(found through the checkpoint's sorted hashes) or written since (the dict)."""

from __future__ import annotations

import gc
import random
from dataclasses import dataclass

import numpy as np
import pytest

from kvtier.keys import OffloadKey
from kvtier.tiers.disk.log_format import TOMBSTONE, record_bytes
from kvtier.tiers.disk.log_index import NO_REGION, LogIndex, Placed, sorted_hashes

pytestmark = pytest.mark.timeout(60)

SLOTS = 48
REGIONS = 4


@dataclass
class Rec:
    key: bytes
    region: int
    offset: int
    length: int
    codec: int
    seq: int
    checksum: int


def apply_one_by_one(model: dict[int, Rec], slot: int, rec: Rec) -> None:
    """The reference: one record applied alone."""
    if rec.codec != TOMBSTONE:
        for other in [s for s, r in model.items() if r.codec != TOMBSTONE and r.key == rec.key]:
            del model[other]
    model[slot] = rec


def restarted(model: dict[int, Rec], pool: list[bytes]) -> LogIndex:
    """An index holding `model` as an open from a checkpoint leaves it (sorted hashes)."""
    index = LogIndex(SLOTS, REGIONS)
    for slot in range(0, SLOTS, 3):
        key = pool[slot % len(pool)]
        if any(r.key == key for r in model.values()):
            continue
        model[slot] = Rec(key, slot % REGIONS, 64 * slot, 100 + slot, 0, 1 + slot, 7 * slot)
    width = 16
    keys = np.zeros((SLOTS, width), dtype=np.uint8)
    arrays = {
        "region": np.full(SLOTS, NO_REGION, dtype=np.int32),
        "offset": np.zeros(SLOTS, dtype=np.uint32),
        "length": np.zeros(SLOTS, dtype=np.uint32),
        "codec": np.zeros(SLOTS, dtype=np.uint8),
        "key_len": np.zeros(SLOTS, dtype=np.uint8),
        "seq": np.zeros(SLOTS, dtype=np.uint64),
        "checksum": np.zeros(SLOTS, dtype=np.uint64),
        "keys": keys,
        "epoch": np.ones(REGIONS, dtype=np.uint64),
        "fill": np.zeros(REGIONS, dtype=np.int64),
    }
    for slot, rec in model.items():
        for name in ("region", "offset", "length", "codec", "seq", "checksum"):
            arrays[name][slot] = getattr(rec, name)
        arrays["key_len"][slot] = len(rec.key)
        keys[slot, : len(rec.key)] = np.frombuffer(rec.key, dtype=np.uint8)
    arrays["hashes"], arrays["hashed_slots"] = sorted_hashes(
        keys, arrays["key_len"], arrays["region"], arrays["codec"]
    )
    index.load(arrays)
    index.rebuild(hashed=True)
    return index


def placed_of(batch: list[tuple[int, Rec]]) -> Placed:
    def column(name: str, dtype: type) -> np.ndarray:
        return np.array([getattr(rec, name) for _, rec in batch], dtype=dtype)

    return Placed(
        keys=[OffloadKey(rec.key) for _, rec in batch],
        slot=np.array([slot for slot, _ in batch], dtype=np.int64),
        region=column("region", np.int64),
        offset=column("offset", np.int64),
        length=column("length", np.int64),
        codec=column("codec", np.int64),
        seq=column("seq", np.uint64),
        checksum=column("checksum", np.uint64),
        moved_from=np.full(len(batch), NO_REGION, dtype=np.int64),
    )


def assert_same(index: LogIndex, model: dict[int, Rec], pool: list[bytes]) -> None:
    for slot in range(SLOTS):
        rec = model.get(slot)
        if rec is None:
            assert int(index.region[slot]) == NO_REGION, slot
            continue
        got = Rec(
            index.keys[slot, : int(index.key_len[slot])].tobytes(),
            int(index.region[slot]),
            int(index.offset[slot]),
            int(index.length[slot]),
            int(index.codec[slot]),
            int(index.seq[slot]),
            int(index.checksum[slot]),
        )
        assert got == rec, slot
    blocks = {s: r for s, r in model.items() if r.codec != TOMBSTONE}
    assert index.blocks == len(blocks) == len(index.held_slots())
    live = np.zeros(REGIONS, dtype=np.int64)
    for rec in model.values():
        live[rec.region] += record_bytes(len(rec.key), rec.length)
    assert index.live.tolist() == live.tolist()
    for key in pool:
        held = [s for s, r in blocks.items() if r.key == key]
        assert index.find(OffloadKey(key)) == (held[0] if held else None), key


@pytest.mark.parametrize("seed", range(6))
def test_a_batch_applies_as_its_records_one_by_one(seed: int) -> None:
    """Random batches over a small pool of keys (so keys move between slots, are written
    twice in one batch, forgotten, and written over in their own slot), some keys longer
    than any before (the rows widen): after every batch the index is the reference's."""
    rng = random.Random(seed)
    pool = [bytes([i]) * (8 if i % 5 else 16) for i in range(1, 40)]
    model: dict[int, Rec] = {}
    index = restarted(model, pool)
    assert_same(index, model, pool)
    seq = 1000
    for step in range(40):
        if step == 20:
            pool.append(b"\x77" * 21)  # wider than the rows: they widen
        batch: list[tuple[int, Rec]] = []
        for _ in range(rng.randint(1, 24)):
            key = rng.choice(pool[-8:] if rng.random() < 0.3 else pool)
            codec = TOMBSTONE if rng.random() < 0.15 else rng.choice((0, 1))
            length = 0 if codec == TOMBSTONE else rng.randint(1, 300)
            rec = Rec(key, rng.randrange(REGIONS), rng.randrange(1 << 20), length, codec, seq, seq)
            batch.append((rng.randrange(SLOTS), rec))
            seq += 1
        index.apply(placed_of(batch))
        for slot, rec in batch:
            apply_one_by_one(model, slot, rec)
        assert_same(index, model, pool)


def test_a_key_written_twice_in_one_batch_lives_only_in_its_newest_slot() -> None:
    index = LogIndex(8, 2)
    first = Rec(b"k" * 8, 0, 0, 10, 0, 1, 1)
    second = Rec(b"k" * 8, 1, 0, 10, 0, 2, 2)
    index.apply(placed_of([(3, first), (5, second)]))
    assert int(index.region[3]) == NO_REGION and int(index.region[5]) == 1
    assert index.find(OffloadKey(b"k" * 8)) == 5 and index.blocks == 1
    assert index.live.tolist() == [0, record_bytes(8, 10)]


def index_state(index: LogIndex) -> tuple[object, ...]:
    """Everything a reader or a later batch sees of `index`."""
    arrays = tuple(getattr(index, name).tobytes() for name in (*LogIndex.ARRAYS, "keys", "live"))
    return (*arrays, index.blocks, dict(index.written))


@pytest.mark.parametrize("seed", range(4))
def test_a_plan_changes_nothing_and_its_commit_applies_the_batch(seed: int) -> None:
    """`plan` (the lane's look-ups made while a group's writes and sync run) leaves the index
    as it was, so a group whose sync fails (its plan dropped) was never visible; `commit`
    then applies the batch exactly as `apply` would, also when another batch was applied
    or a slot dropped between the plan and its commit (the plan is stale: planned again)."""
    rng = random.Random(seed)
    pool = [bytes([i]) * (8 if i % 5 else 16) for i in range(1, 30)]
    model: dict[int, Rec] = {}
    index = restarted(model, pool)
    seq = 1000

    def batch_of(size: int) -> list[tuple[int, Rec]]:
        nonlocal seq
        batch = []
        for _ in range(size):
            key = rng.choice(pool)
            codec = TOMBSTONE if rng.random() < 0.15 else 0
            length = 0 if codec == TOMBSTONE else rng.randint(1, 300)
            rec = Rec(key, rng.randrange(REGIONS), rng.randrange(1 << 20), length, codec, seq, seq)
            batch.append((rng.randrange(SLOTS), rec))
            seq += 1
        return batch

    for step in range(30):
        batch = batch_of(rng.randint(1, 16))
        placed = placed_of(batch)
        checksums = placed.checksum.copy()
        placed.checksum[:] = 0  # as the lane plans: the checksums come once written
        before = index_state(index)
        plan = index.plan(placed)
        assert index_state(index) == before
        if step % 3 == 1:  # dropped, as after a failed sync: the index is as it was
            continue
        if step % 3 == 2:  # another change first: the plan is stale
            if rng.random() < 0.5:
                between = batch_of(rng.randint(1, 8))
                index.apply(placed_of(between))
                for slot, rec in between:
                    apply_one_by_one(model, slot, rec)
            else:
                slot = rng.choice(sorted(model))
                index.drop([slot])
                del model[slot]
        placed.checksum[:] = checksums
        index.commit(plan)
        for slot, rec in batch:
            apply_one_by_one(model, slot, rec)
        assert_same(index, model, pool)


def test_adopt_forgets_the_unmoved_keys_and_makes_no_object_a_key() -> None:
    """After a checkpoint, `adopt` drops from the dict the keys the snapshot held that have
    not moved since (the hashes find them), keeps those written since, and every key is
    found where it is; over 6,000 keys it sets off no collection of the garbage collector
    (a tuple a key did, ~60 at this threshold: a full pass took ~20 ms on a lane)."""
    slots, regions = 6000, 4
    index = LogIndex(slots, regions)

    def rec(i: int, slot: int) -> tuple[int, Rec]:
        key = b"key-%06d" % i
        return slot, Rec(key, slot % regions, 64 * slot, 100, 0, 1 + i, 7 * i)

    index.apply(placed_of([rec(i, i) for i in range(slots)]))
    arrays, written = index.snapshot()
    assert len(written) == slots
    moved = [rec(slots + i, i) for i in range(0, slots, 7)]  # new keys over every 7th slot
    index.apply(placed_of(moved))
    hashes, hashed = sorted_hashes(
        arrays["keys"], arrays["key_len"], arrays["region"], arrays["codec"]
    )
    collections: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "stop":
            collections.append(info["generation"])

    threshold = gc.get_threshold()
    gc.collect()
    gc.set_threshold(100, 10, 10)
    gc.callbacks.append(count)
    try:
        index.adopt(hashes, hashed, int(arrays["keys"].shape[1]), written)
    finally:
        gc.callbacks.remove(count)
        gc.set_threshold(*threshold)
    assert collections == []
    assert set(index.written) == {OffloadKey(r.key) for _, r in moved}
    for i in range(slots):
        key = OffloadKey(b"key-%06d" % i)
        assert index.find(key) == (None if i % 7 == 0 else i), i
    for slot, r in moved:
        assert index.find(OffloadKey(r.key)) == slot
