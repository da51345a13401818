"""Admission filters: which absent blocks a tier stores at all, in front of any policy.

A tier's policy decides what to keep; an admission filter decides what is worth writing in
the first place. Below a memory tier that matters more than the hit ratio: a disk or a remote
store pays for every write, and on real traces most blocks are seen once (138,646 of the
shipped trace's 182,790), so writing them all wears the device for nothing.

`second-sighting`: a block is stored the second time this tier hears of it being requested
(its miss reached the tier), never the first. The tier remembers the keys it heard of in a
bounded directory (`SIGHTING_FACTOR` x capacity keys, oldest forgotten). A block that a tier
above is evicting (`on_store_move`) carries no new request: if this tier already heard of
it, the tier judged that request (refused it, or kept it and evicted it since) and refuses
the move; if not (its cascade was dropped, or the directory forgot it), the move stands for
the request this tier never heard of and counts as a sighting.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import ClassVar, Literal, get_args

from kvtier.blocks import BlockStatus
from kvtier.errors import InvalidValueError
from kvtier.hints import Reuse
from kvtier.keys import OffloadKey
from kvtier.policies.base import CachePolicy

SIGHTING_FACTOR = 16
"""Keys the sighting directory remembers, per block of capacity."""

Admission = Literal["all", "second-sighting"]
"""Admission filters by the name a config file and `kvtier simulate --admission` use."""
ADMISSIONS: tuple[str, ...] = get_args(Admission)


class SecondSightingAdmission(CachePolicy):
    """`policy` (any `CachePolicy`) that stores a block only on its second sighting."""

    name: ClassVar[str] = "second-sighting"
    admits_all: ClassVar[bool] = False

    def __init__(self, policy: CachePolicy) -> None:
        super().__init__(policy.cache_capacity)
        self.policy = policy
        self._sightings: OrderedDict[OffloadKey, int] = OrderedDict()
        self._limit = SIGHTING_FACTOR * policy.cache_capacity
        self._judged: set[OffloadKey] = set()
        """Keys of the current `on_store_move` that this tier already judged."""
        self.refused = 0
        """Stores not admitted."""

    def _sight(self, key: OffloadKey) -> None:
        sightings = self._sightings
        sightings[key] = sightings.pop(key, 0) + 1
        if len(sightings) > self._limit:
            sightings.popitem(last=False)

    # -- admission --------------------------------------------------------------------------

    def on_store_miss(self, keys: Sequence[OffloadKey]) -> None:
        for key in keys:
            self._sight(key)
        self.policy.on_store_miss(keys)

    def on_store_move(self, keys: Sequence[OffloadKey]) -> None:
        for key in keys:
            if key in self._sightings:
                self._judged.add(key)
            else:
                self._sight(key)
        self.policy.on_store_move(keys)

    def admit(self, keys: Sequence[OffloadKey]) -> list[bool]:
        sightings, judged = self._sightings, self._judged
        inner = self.policy.admit(keys) if not self.policy.admits_all else None
        answers = [
            sightings.get(key, 0) >= 2 and key not in judged and (inner is None or inner[index])
            for index, key in enumerate(keys)
        ]
        judged.clear()
        self.refused += answers.count(False)
        return answers

    # -- everything else is the policy's ---------------------------------------------------

    def get(self, key: OffloadKey) -> BlockStatus | None:
        return self.policy.get(key)

    def getter(self) -> Callable[[OffloadKey], BlockStatus | None]:
        return self.policy.getter()

    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        self.policy.insert(key, block)

    def insert_many(self, keys: Sequence[OffloadKey], blocks: Sequence[BlockStatus]) -> None:
        self.policy.insert_many(keys, blocks)

    def remove(self, key: OffloadKey) -> None:
        self.policy.remove(key)

    def touch(self, keys: Sequence[OffloadKey]) -> None:
        self.policy.touch(keys)

    def hint(self, key: OffloadKey, reuse: Reuse | None) -> None:
        self.policy.hint(key, reuse)

    def evict(
        self, n: int, protected: Collection[OffloadKey] = ()
    ) -> list[tuple[OffloadKey, BlockStatus]] | None:
        return self.policy.evict(n, protected)

    def clear(self) -> None:
        self.policy.clear()
        self._sightings.clear()
        self._judged.clear()

    def __len__(self) -> int:
        return len(self.policy)

    def items(self) -> Iterator[tuple[OffloadKey, BlockStatus]]:
        return self.policy.items()

    def __contains__(self, key: object) -> bool:
        return key in self.policy

    def __repr__(self) -> str:
        return f"{self.policy!r} + second-sighting admission"


def with_admission(policy: CachePolicy, admission: str) -> CachePolicy:
    """`policy` behind the named admission filter ("all": the policy itself)."""
    if admission == "all":
        return policy
    if admission == "second-sighting":
        return SecondSightingAdmission(policy)
    raise InvalidValueError(
        f"unknown admission {admission!r}; valid admissions: {', '.join(ADMISSIONS)}"
    )
