"""`KeyIds`, the table of key ids `auto`'s shadows and lct serving share: every key it holds
is found with its id, and a key forgotten is not, through hash collisions, growths and the
deletions that shift a probe's slots back (compiled, its own open-addressing table; as plain
Python, a dict: the same answers either way)."""

from __future__ import annotations

import random
from array import array

import pytest

from kvtier.policies._key_ids import KeyIds


class Key:
    """A key with a chosen hash: many share one (a long probe), some differ only past the
    31 bits a compiled slot keeps, some are negative."""

    def __init__(self, value: int, hashed: int) -> None:
        self.value = value
        self.hashed = hashed

    def __hash__(self) -> int:
        return self.hashed

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Key) and other.value == self.value

    def __repr__(self) -> str:
        return f"Key({self.value}, {self.hashed})"


class Counter:
    """A user of the table that remembers keys by id, as a shadow does: one count each."""

    def __init__(self, table: KeyIds) -> None:
        self.refs: array[int] = array("i")
        self.released: list[int] = []
        self.held: dict[Key, int] = {}
        table.register(self)

    def resize_ids(self, refs: array[int], capacity: int, released: list[int]) -> None:
        self.refs = refs
        self.released = released

    def hold(self, key: Key, ident: int) -> None:
        if key not in self.held:
            self.held[key] = ident
            self.refs[ident] += 1

    def forget(self, key: Key) -> None:
        ident = self.held.pop(key)
        self.refs[ident] -= 1
        if self.refs[ident] == 0:
            self.released.append(ident)


def check(table: KeyIds, user: Counter, gone: set[Key]) -> None:
    table.intern([])  # recycles what was released
    assert len(table) == len(user.held)
    for key, ident in user.held.items():
        assert table.id_of(key) == ident and table.key_of(ident) == key, key
    for key in gone:
        assert table.id_of(key) == -1, key


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("hashes", [3, 40, 1 << 20])
def test_the_table_finds_every_key_through_collisions_growths_and_deletions(
    seed: int, hashes: int
) -> None:
    """Random requests of keys over few hashes (every probe long, wrapping round the slots)
    or many, each key held or forgotten at random: after each step every held key has its
    id and every forgotten one none; the table holds as many keys as are held, across
    growths to thousands of keys and shrinking back."""
    rng = random.Random(seed)
    table = KeyIds()
    user = Counter(table)
    gone: set[Key] = set()
    universe = 1_500
    for step in range(300):
        target = universe if step < 150 else 100  # grow, then mostly forget
        keys = list(
            {
                Key(v, v % hashes - hashes // 2 + (v % 7 << 40))
                for v in rng.sample(range(universe), 20)
            }
        )
        ids = table.intern(keys)
        assert len(set(ids)) == len(ids)
        for key, ident in zip(keys, ids, strict=True):
            if key in user.held:
                assert user.held[key] == ident, key
            if len(user.held) < target and rng.random() < 0.8:
                user.hold(key, ident)
                gone.discard(key)
        for key in rng.sample(sorted(user.held, key=lambda k: k.value), min(len(user.held), 15)):
            if len(user.held) > target or rng.random() < 0.3:
                user.forget(key)
                gone.add(key)
        if step % 5 == 4:
            check(table, user, gone)
    assert table.capacity >= 1_024


def test_a_key_found_is_the_equal_one_not_one_of_the_same_hash() -> None:
    """Keys of one hash are told apart by equality: each its own id, an equal key (another
    object) finds it, and forgetting one leaves the others found."""
    table = KeyIds()
    user = Counter(table)
    keys = [Key(v, 12345) for v in range(50)]
    ids = table.intern(keys)
    for key, ident in zip(keys, ids, strict=True):
        user.hold(key, ident)
    assert table.intern([Key(v, 12345) for v in range(50)]) == ids
    for key in keys[::3]:
        user.forget(key)
    check(table, user, set(keys[::3]))
