"""KeyedTierManager: the bookkeeping of a tier that owns its index."""

from __future__ import annotations

from collections.abc import Sequence

from kvtier.keys import OffloadKey, key_from_int
from kvtier.manager.keyed import KeyedTierManager


class Answers:
    """A store's index whose answers the test sets."""

    def __init__(self) -> None:
        self.present: dict[OffloadKey, bool | None] = {}

    def probe(self, keys: Sequence[OffloadKey]) -> list[bool | None]:
        return [self.present.get(key) for key in keys]


def k(i: int) -> OffloadKey:
    return key_from_int(i)


def stored(manager: KeyedTierManager, ids: range) -> None:
    keys = [k(i) for i in ids]
    out = manager.prepare_store(keys)
    assert out is not None and out.keys_to_store == keys
    manager.complete_store(keys)


def test_it_forgets_the_oldest_unpinned_keys_past_its_bound_behind_many_pinned() -> None:
    """18 of 20 remembered keys pinned at the least recent end: storing one more forgets
    a ready key further along, so it never remembers more than its bound."""
    manager = KeyedTierManager(Answers(), 20, 16, name="remote", medium="memkv")
    stored(manager, range(20))
    manager.prepare_load([k(i) for i in range(18)])
    stored(manager, range(20, 21))
    assert len(manager) == 20
    assert manager.has(k(18)) is False  # the least recent ready key was forgotten
    assert all(manager.has(k(i)) is True for i in (*range(18), 19, 20))
    manager.check()


def test_a_lookup_asks_the_store_and_remembers_a_yes() -> None:
    answers = Answers()
    manager = KeyedTierManager(answers, 8, 16, name="remote", medium="memkv")
    assert manager.lookup(k(1)) is None  # not known yet: ask again
    assert manager.has(k(1)) is False
    answers.present[k(1)] = True
    assert manager.lookup(k(1)) is True
    assert manager.has(k(1)) is True  # remembered without asking again
    answers.present[k(2)] = False
    assert manager.lookup(k(2)) is False
    manager.check()
