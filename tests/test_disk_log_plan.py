"""The log's compiled bookkeeping (`_plan_core.pyx`) against its numpy paths. The index's
look-ups for a batch (`LogIndex._plan_new_arrays`): two indexes fed the same random
batches (new records over a small pool of keys, so keys move between slots, are written
twice in one batch and written over in their own slot; forgets; moved records; keys longer
than any before; keys held at the open found through sorted hashes with colliding entries;
plans gone stale before their commit) plan the same, field by field, and end in the same
state after every step (the compiled commit, log_commit.py, against its numpy path too). And
the lane's `fit_run` (`_fit_run_arrays`) places the same runs, and a part's header pages
(`pack_group_into`) are `pack_group`'s bytes."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kvtier.keys import OffloadKey
from kvtier.tiers.disk import log_commit, log_format, log_group, log_index
from kvtier.tiers.disk.log_format import PAGE, TOMBSTONE
from kvtier.tiers.disk.log_group import Part
from kvtier.tiers.disk.log_index import NO_REGION, LogIndex, Placed, sorted_hashes

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        log_index._compiled_plan is None
        or log_group._compiled_fit_run is None
        or log_commit._compiled_apply is None,
        reason="the compiled core is not built or selected",
    ),
]

SLOTS = 64
REGIONS = 4


def opened(pool: list[bytes], rng: random.Random, compiled: bool) -> LogIndex:
    """An index as an open from a checkpoint leaves it: some of `pool` held, found through
    sorted hashes, with colliding entries (another slot under a held key's hash) mixed in."""
    index = LogIndex(SLOTS, REGIONS)
    if not compiled:
        index.compiled_plan = index.compiled_commit = None
    width = 16
    arrays = {name: np.zeros_like(getattr(index, name)) for name in LogIndex.ARRAYS}
    arrays["region"][:] = NO_REGION
    arrays["keys"] = np.zeros((SLOTS, width), dtype=np.uint8)
    arrays["epoch"] = np.ones(REGIONS, dtype=np.uint64)
    arrays["fill"] = np.zeros(REGIONS, dtype=np.int64)
    for slot, key in zip(range(0, SLOTS, 2), pool, strict=False):
        arrays["region"][slot] = slot % REGIONS
        arrays["length"][slot] = 100 + slot
        arrays["codec"][slot] = TOMBSTONE if slot % 10 == 4 else 0
        arrays["seq"][slot] = 1 + slot
        arrays["key_len"][slot] = len(key)
        arrays["keys"][slot, : len(key)] = np.frombuffer(key, dtype=np.uint8)
    hashes, slots = sorted_hashes(
        arrays["keys"], arrays["key_len"], arrays["region"], arrays["codec"]
    )
    collide = np.array(sorted(rng.sample(range(hashes.size), hashes.size // 3)), np.int64)
    other = np.array([rng.randrange(SLOTS) for _ in collide], np.int32)
    at = np.concatenate([np.arange(hashes.size), collide])  # a wrong slot before some
    order = np.lexsort((np.r_[np.ones(hashes.size), np.zeros(collide.size)], at))
    arrays["hashes"] = np.concatenate([hashes, hashes[collide]])[order]
    arrays["hashed_slots"] = np.concatenate([slots, other])[order].astype(np.int32)
    index.load(arrays)
    index.rebuild(hashed=True)
    return index


def batch_of(rng: random.Random, pool: list[bytes], index: LogIndex, seq: int, size: int) -> Placed:
    """New records over `pool` (forgets among them) and moves of records `index` holds."""
    rows = []
    for i in range(size):
        held = np.flatnonzero(index.region != NO_REGION)
        if held.size and rng.random() < 0.15:  # a move: the same record, another place
            slot = int(rng.choice(held.tolist()))
            key = index.keys[slot, : int(index.key_len[slot])].tobytes()
            row = (key, slot, int(index.codec[slot]), int(index.seq[slot]), int(index.region[slot]))
        else:
            codec = TOMBSTONE if rng.random() < 0.15 else rng.choice((0, 1))
            row = (rng.choice(pool), rng.randrange(SLOTS), codec, seq + i, NO_REGION)
        rows.append(row)
    count = len(rows)
    return Placed(
        keys=[OffloadKey(row[0]) for row in rows],
        slot=np.array([row[1] for row in rows], np.int64),
        region=np.array([rng.randrange(REGIONS) for _ in rows], np.int64),
        offset=np.array([rng.randrange(1 << 20) for _ in rows], np.int64),
        length=np.array([0 if row[2] == TOMBSTONE else rng.randint(1, 300) for row in rows]),
        codec=np.array([row[2] for row in rows], np.int64),
        seq=np.array([row[3] for row in rows], np.uint64),
        checksum=np.arange(count, dtype=np.uint64),
        moved_from=np.array([row[4] for row in rows], np.int64),
    )


def state(index: LogIndex) -> tuple[object, ...]:
    arrays = tuple(getattr(index, name).tobytes() for name in (*LogIndex.ARRAYS, "keys", "live"))
    return (*arrays, index.blocks, index.version, dict(index.written))


def assert_same_plan(got: log_index.Plan, want: log_index.Plan) -> None:
    assert got.version == want.version
    assert got.moved.tolist() == want.moved.tolist() and got.new.tolist() == want.new.tolist()
    if want.new_records is None:
        assert got.new_records is None
        return
    new, ref = got.new_records, want.new_records
    assert new is not None
    for name in ("chosen", "target", "clear", "rows", "lengths", "key_sizes"):
        a, b = getattr(new, name), getattr(ref, name)
        assert a.dtype == b.dtype and a.shape == b.shape and a.tolist() == b.tolist(), name
    assert (new.width, new.held, new.written) == (ref.width, ref.held, ref.written)
    assert list(new.written) == list(ref.written)


@pytest.mark.parametrize("seed", range(8))
def test_the_compiled_plan_is_the_numpy_plan(seed: int) -> None:
    rng = random.Random(seed)
    pool = [bytes([i]) * (8 if i % 5 else 16) for i in range(1, 40)]
    fast, pure = opened(pool, random.Random(seed), True), opened(pool, random.Random(seed), False)
    assert fast.compiled_plan is not None and pure.compiled_plan is None
    assert fast.compiled_commit is not None and pure.compiled_commit is None
    seq = 1000
    stale: list[tuple[log_index.Plan, log_index.Plan]] = []
    for step in range(60):
        if step == 30:
            pool.append(b"\x77" * 21)  # wider than the rows: they widen
        size = rng.choice((1, 2, rng.randint(1, 40), 200))
        placed = batch_of(rng, pool[-8:] if rng.random() < 0.3 else pool, pure, seq, size)
        seq += size
        plans = fast.plan(placed), pure.plan(placed)
        assert_same_plan(*plans)
        if step % 4 == 3:
            stale.append(plans)  # committed later, after other batches: planned again
        else:
            fast.commit(plans[0])
            pure.commit(plans[1])
        if stale and step % 4 == 1:
            old_fast, old_pure = stale.pop(0)
            fast.commit(old_fast)
            pure.commit(old_pure)
        assert state(fast) == state(pure), step
        for key in pool:
            assert fast.find(OffloadKey(key)) == pure.find(OffloadKey(key))


@pytest.mark.parametrize("seed", range(4))
def test_the_compiled_fit_run_is_the_numpy_one(seed: int) -> None:
    """`fit_run`'s compiled loop against its numpy path: runs of whole pages, of other
    lengths (empty ones too) and mixed, into parts at any fill of regions of any size."""
    rng = random.Random(seed)
    for _ in range(400):
        part = Part(0, PAGE * rng.randrange(64), 1, False)
        for _ in range(rng.randrange(4)):
            part.keys.append(OffloadKey(b"k" * rng.randint(1, 40)))
        part.key_bytes = sum(map(len, part.keys))
        part.end = rng.randrange(1 << 20)
        count = rng.randint(1, 300)
        kind = rng.random()
        if kind < 0.4:
            lengths = [PAGE * rng.randint(1, 64) for _ in range(count)]
        elif kind < 0.8:
            lengths = [rng.choice((0, rng.randrange(1, 1 << 18))) for _ in range(count)]
        else:
            lengths = [rng.choice((PAGE, 100, 0)) for _ in range(count)]
        key_lens = np.array([rng.randint(1, 40) for _ in range(count)], np.int64)
        region = rng.choice((1 << 20, 4 << 20, 16 << 20, 64 << 20))
        array = np.array(lengths, np.int64)
        with_c = log_group.fit_run(part, key_lens, array, region)
        log_group_fit = log_group._compiled_fit_run
        try:
            log_group._compiled_fit_run = None
            numpy_path = log_group.fit_run(part, key_lens, array, region)
        finally:
            log_group._compiled_fit_run = log_group_fit
        if numpy_path is None:
            assert with_c is None
            continue
        assert with_c is not None
        assert with_c[0] == numpy_path[0]
        assert with_c[1].dtype == numpy_path[1].dtype
        assert with_c[1].tolist() == numpy_path[1].tolist()


@pytest.mark.parametrize("seed", range(4))
def test_the_compiled_header_is_pack_groups(seed: int) -> None:
    """`pack_group_into` (the compiled entries, `_plan_core.pack_entries`) writes the bytes
    of `pack_group` (the reference) and nothing else: into a dirty buffer at an offset, for
    parts of keys of several lengths, fields up to their types' ranges, one record and
    enough to fill several header pages; the bytes before and after the header pages are
    left alone. And a value out of its field's range is refused, not wrapped."""
    assert log_format._compiled_entries is not None
    rng = random.Random(seed)
    namespace = bytes(rng.randrange(256) for _ in range(20))
    for count in (1, 7, 120, 400):
        keys = [
            bytes(rng.randrange(256) for _ in range(rng.choice((1, 8, 16, 33))))
            for _ in range(count)
        ]
        fields = {
            "slot": [rng.randrange(1 << 40) for _ in keys],
            "seq": [rng.randrange(1 << 64) for _ in keys],
            "checksum": [rng.randrange(1 << 64) for _ in keys],
            "offset": [rng.randrange(1 << 32) for _ in keys],
            "length": [rng.randrange(1 << 32) for _ in keys],
            "codec": [rng.choice((0, 1, TOMBSTONE)) for _ in keys],
        }
        epoch, span = rng.randrange(1 << 64), rng.randrange(1 << 40)
        want = log_format.pack_group(namespace, epoch, keys, fields, span)
        out = np.frombuffer(
            bytes(rng.randrange(256) for _ in range(len(want) + 2 * PAGE)), np.uint8
        ).copy()
        before = out.copy()
        assert log_format.pack_group_into(out, PAGE, namespace, epoch, keys, fields, span) == len(
            want
        )
        assert out[PAGE : PAGE + len(want)].tobytes() == want
        assert np.array_equal(out[:PAGE], before[:PAGE])
        assert np.array_equal(out[PAGE + len(want) :], before[PAGE + len(want) :])
    for name, value in (("offset", 1 << 32), ("codec", 256), ("slot", -1)):
        bad = {**fields, name: [value, *fields[name][1:]]}
        with pytest.raises(OverflowError):
            log_format.pack_group_into(out, 0, namespace, 1, keys, bad, 0)


@pytest.mark.parametrize("seed", range(4))
def test_the_compiled_placed_is_the_numpy_one(seed: int) -> None:
    """`placed`'s compiled loop (`_plan_core.placed_columns`) against its numpy path
    (`placed_arrays`): parts of new, moved and forget records in several regions, at
    several starts and header pages, with and without checksums: the same keys and
    columns, dtype and all; a new record's checksum still None is refused by both."""
    assert log_group._compiled_placed is not None
    rng = random.Random(seed)
    parts = []
    for number in range(rng.randint(0, 5)):
        part = Part(rng.randrange(64), rng.randrange(1 << 20) * PAGE, rng.randrange(9), False)
        part.head_pages = rng.randint(0, 3)
        for i in range(rng.choice((0, 1, 50, 300))):
            moved = rng.random() < 0.2
            log_group.add(
                part,
                OffloadKey(bytes([number, i % 256]) * rng.randint(1, 8)),
                rng.randrange(1 << 20),
                rng.randrange(1 << 64),
                rng.randrange(1 << 64),
                rng.randrange(1 << 30),
                rng.choice((0, 100, PAGE, 16 * PAGE)),
                rng.choice((0, 1, TOMBSTONE)),
                b"",
                rng.randrange(64) if moved else NO_REGION,
                True,
            )
        parts.append(part)
    for checksums in (True, False):
        got = log_group.placed(parts, checksums=checksums)
        want = log_group.placed_arrays(parts, checksums=checksums)
        assert got.keys == want.keys
        for name in ("slot", "region", "offset", "length", "codec", "seq", "checksum"):
            a, b = getattr(got, name), getattr(want, name)
            assert a.dtype == b.dtype and a.tolist() == b.tolist(), name
        assert got.moved_from.tolist() == want.moved_from.tolist()
    if any(part.keys for part in parts):
        part = next(part for part in parts if part.keys)
        part.checksum[-1] = None
        for make in (log_group.placed, log_group.placed_arrays):
            with pytest.raises(TypeError):
                make(parts)


@pytest.mark.parametrize("seed", range(6))
def test_a_batch_of_distinct_slots_and_keys_plans_as_the_numpy_plan(seed: int) -> None:
    """The compiled plan's usual batch (no slot and no key twice: planned without its
    per-record dicts) and the batches next to it, one slot twice, one key twice, a forget of
    a key a block of the batch writes: the same plans and states as the numpy path, over
    keys held at the open (sorted hashes) and keys written since (the dict)."""
    rng = random.Random(seed)
    pool = [bytes([1 + i % 250, i // 250]) * 4 for i in range(600)]
    fast, pure = opened(pool, random.Random(seed), True), opened(pool, random.Random(seed), False)
    seq = 1000
    for step in range(40):
        size = rng.choice((2, 20, SLOTS))
        slots = rng.sample(range(SLOTS), size)
        keys = rng.sample(pool, size)
        codecs = [0] * size
        twice = step % 4
        if twice == 1:  # one slot twice
            slots[rng.randrange(1, size)] = slots[0]
        elif twice == 2:  # one key twice, in two slots
            keys[rng.randrange(1, size)] = keys[0]
        elif twice == 3:  # a forget of a key a block writes again
            at = rng.randrange(1, size)
            keys[at], codecs[at] = keys[0], TOMBSTONE
        placed = Placed(
            keys=[OffloadKey(key) for key in keys],
            slot=np.array(slots, np.int64),
            region=np.array([rng.randrange(REGIONS) for _ in keys], np.int64),
            offset=np.array([rng.randrange(1 << 20) for _ in keys], np.int64),
            length=np.array([0 if c == TOMBSTONE else rng.randint(1, 300) for c in codecs]),
            codec=np.array(codecs, np.int64),
            seq=np.arange(seq, seq + size, dtype=np.uint64),
            checksum=np.arange(size, dtype=np.uint64),
            moved_from=np.full(size, NO_REGION, np.int64),
        )
        seq += size
        plans = fast.plan(placed), pure.plan(placed)
        assert_same_plan(*plans)
        fast.commit(plans[0])
        pure.commit(plans[1])
        assert state(fast) == state(pure), step
        for key in keys:
            assert fast.find(OffloadKey(key)) == pure.find(OffloadKey(key))
