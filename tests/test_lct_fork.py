"""`LCTCachePolicy.fork` (`LCTState.fork`): an independent copy of lct's whole state, on
keys whatever the original's mode. The fork shows the original's state, takes every
following decision the original would take on the same calls, and the two then go their
own ways: neither sees the other's calls. Run on the compiled core (when built) and on its
text as plain Python; a fork that leaves a field out (not copied, or shared) fails."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from test_compiled_core import LCT_CORE, compiled_lct, lct_state, pure_lct, pure_module
from test_lct_ids import check_counts

from kvtier.blocks import BlockStatus
from kvtier.keys import key_from_int
from kvtier.policies import LCTCachePolicy
from kvtier.policies._key_ids import KeyIds

CORES: dict[str, Callable[[], type[Any]]] = {"compiled": compiled_lct, "pure": pure_lct}


def full_state(policy: LCTCachePolicy) -> tuple[object, ...]:
    """`lct_state`, the resident blocks in the order they became resident, and on the pure
    core the nodes it has handed out (a free list lost, new ones are)."""
    nodes = getattr(policy._core, "_used", None)  # compiled: not an attribute Python sees
    return (lct_state(policy), [(key, block.block_id) for key, block in policy.items()], nodes)


class Driver:
    """One lct driven as a tier drives it: touches, announcements (a resident key now and
    then again), admissions, evictions with protected keys, pinned blocks, moves, removals;
    `table`: the original on ids, its calls on ids."""

    def __init__(self, policy: LCTCachePolicy, table: KeyIds | None = None) -> None:
        self.policy = policy
        self.table = table
        self.slot = 0

    def fork(self) -> Driver:
        """A driver of a fork of this one's policy, its blocks numbered on from here."""
        other = Driver(self.policy.fork())
        other.slot = self.slot
        return other

    def step(self, rng: random.Random, spread: int = 6) -> list[object]:
        """One call of a tier's, drawn from `rng` over `spread` x the capacity's keys; what
        the policy decided."""
        policy, capacity = self.policy, self.policy.cache_capacity
        universe = spread * capacity
        numbers = list(dict.fromkeys(rng.randrange(universe) for _ in range(rng.randint(1, 6))))
        keys = [key_from_int(n) for n in numbers]
        draw = rng.random()
        if draw < 0.08:  # a tier's move: announced, not an access
            policy.on_store_move(keys)
            return ["move"]
        if draw < 0.12 and len(policy):
            key = sorted(key for key, _ in policy.items())[rng.randrange(len(policy))]
            policy.remove(key)
            return ["remove", key]
        ids = self.table.intern(keys) if self.table is not None else []
        hit_at = [i for i, key in enumerate(keys) if policy.get(key) is not None]
        hits = [keys[i] for i in hit_at]
        if self.table is not None:
            policy.touch_ids([ids[i] for i in hit_at], hits)
        else:
            policy.touch(hits)
        announced = [keys[i] for i in range(len(keys)) if i not in hit_at]
        again = key_from_int(rng.randrange(universe))
        if draw > 0.8 and policy.get(again) is not None:
            announced.append(again)
        if self.table is not None:
            policy.on_store_miss_ids(self.table.intern(announced), announced)
        else:
            policy.on_store_miss(announced)
        answers = policy.admit(announced)
        stored = [k for k, ok in zip(announced, answers, strict=True) if ok and not policy.get(k)]
        decided: list[object] = [len(hits), answers]
        need = len(policy) + len(stored) - capacity
        if need > 0:
            evicted = policy.evict(need, set(keys))
            decided.append(None if evicted is None else [key for key, _ in evicted])
            if evicted is None:
                return decided
        for key in stored:
            self.slot += 1
            block = BlockStatus(self.slot)
            block.ref_cnt = 1 if rng.random() < 0.05 else 0
            policy.insert(key, block)
        return decided


def check_a_fork(
    cls: type[LCTCachePolicy], seed: int, on_ids: bool, prefix: int = 900, **settings: Any
) -> None:
    """An lct (of `settings`) driven `prefix` calls (on ids if `on_ids`), then forked: the
    fork shows its state; then the original and the fork are driven by different calls,
    interleaved (the fork on ids after 50 calls, and its last 350 over four times as many
    keys, so that its nodes grow), each beside a twin that was never forked (built the same way,
    driven by the same calls): every decision and every state is its twin's. Raises
    AssertionError otherwise."""
    capacity = random.Random(seed).choice([4, 8, 24])
    table = KeyIds() if on_ids else None
    original = Driver(cls(capacity, **settings), table)
    if table is not None:
        original.policy.use_ids(table)
    twin_a, twin_b = Driver(cls(capacity, **settings)), Driver(cls(capacity, **settings))
    for number in range(prefix):
        for driver in (original, twin_a, twin_b):
            driver.step(random.Random(number))
    fork = original.fork()
    assert fork.policy.on_ids is False
    assert full_state(fork.policy) == full_state(original.policy)
    if table is not None:
        check_counts(table, original.policy)  # the fork took no id
    for number in range(prefix, prefix + 700):
        drawn_a, drawn_b = random.Random(number), random.Random(number + 10**6)
        assert original.step(drawn_a) == twin_a.step(random.Random(number)), number
        spread = 6 if number < prefix + 350 else 24
        assert fork.step(drawn_b, spread) == twin_b.step(random.Random(number + 10**6), spread)
        if number == prefix + 50:  # on ids from here: entries in the order of `_stamp`
            for driver in (fork, twin_b):
                driver.table = KeyIds()
                driver.policy.use_ids(driver.table)
            assert full_state(fork.policy) == full_state(twin_b.policy)
        if number % 100 == 0:
            assert full_state(original.policy) == full_state(twin_a.policy), number
            assert full_state(fork.policy) == full_state(twin_b.policy), number
    assert full_state(original.policy) == full_state(twin_a.policy)
    assert full_state(fork.policy) == full_state(twin_b.policy)
    assert full_state(fork.policy) != full_state(original.policy)


@pytest.mark.slow
@pytest.mark.parametrize("core", sorted(CORES))
@pytest.mark.parametrize("on_ids", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_a_fork_shows_the_state_and_decides_as_the_original_would(
    core: str, on_ids: bool, seed: int
) -> None:
    """Through solves, horizon moves and forgotten ghosts (6 x the capacity's keys, 1,600
    calls), on keys and on ids."""
    check_a_fork(CORES[core](), seed, on_ids)


@pytest.mark.parametrize("core", sorted(CORES))
def test_a_fork_with_a_block_holds_it_for_every_resident_key(core: str) -> None:
    """`fork(block)`: a shadow's copy, every resident key on `block`, the original's blocks
    as they were; a fresh lct forks too."""
    cls = CORES[core]()
    driver = Driver(cls(8))
    assert full_state(cls(8).fork()) == full_state(cls(8))
    for number in range(300):
        driver.step(random.Random(number))
    shadow_block = BlockStatus(0)
    fork = driver.policy.fork(shadow_block)
    assert [key for key, _ in fork.items()] == [key for key, _ in driver.policy.items()]
    assert all(block is shadow_block for _, block in fork.items())
    assert all(fork.get(key) is shadow_block for key, _ in driver.policy.items())
    assert all(block is not shadow_block for _, block in driver.policy.items())


# -- a fork that leaves a field out is caught ------------------------------------------------

SCRATCH = {
    # per call: what `_observe`, `evict` and `admit` find, set before each is read
    "_o_state",
    "_o_last",
    "_o_second",
    "_o_third",
    "_cursor",
    "_heads",
    "_overs",
    "_decided",
    "_plan",
    "_column",
    # the announcement's nodes: without them the keys are looked up, with the same answers
    "_ann",
    "_nann",
    "_ann_pos",
    # a cache of the periods' bins, rebuilt when `_jperiod` is not the period
    "_jtab",
    "_jperiod",
    # on ids only (the fork is on keys), and the solver (the forked policy's)
    "_by_id",
    "_table",
    "_node_of_id",
    "_refs",
    "_released",
    "_solve",
    # the nine views of `_arrays` (`_view_arrays`): the fork copies the arrays, not them
    "_prev",
    "_next",
    "_where",
    "_state",
    "_last",
    "_second",
    "_third",
    "_idents",
    "_stamp",
}
"""The core's fields whose value at a fork decides nothing after it."""
RARELY_READ = {"_low_values", "_min_reuse"}
"""Settings whose omission these runs cannot see: `_low_values` is read only to rebuild
`_jtab` when the period changes (it does not); without `_min_reuse` (0.0) a class whose
reuse is under 1e-4 of its arrivals would get a curve."""
READ_ONLY = {"_horizons", "_ids_table", "_classes", "_weights", "_lows", "_mids", "_edges"}
READ_ONLY |= RARELY_READ | {"_credit"}
"""Settings never written after `configure` (and the credits, always 0): sharing them is
no fault."""


def wrong(value: Any, default: Any) -> Any:
    """What a field left out of a fork holds: a new state's `default`, or where that is
    `value` (a setting this run has at its default) something else of its kind."""
    if default != value:
        return default
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 2 + 1
    return [x * 2 + 1 for x in value]  # the per-class lists


@contextmanager
def broken_fork(state_class: type[Any], field: str, shared: bool) -> Iterator[None]:
    """`state_class.fork` (the pure core's) leaving `field` out: the new state's own
    default or another wrong value (`wrong`), or the original's object itself
    (`shared`)."""
    fork = state_class.fork

    def leaky(self: Any, solve: Any, block: Any) -> Any:
        other = fork(self, solve, block)
        value = getattr(self, field)
        if shared:
            setattr(other, field, value)
        elif field == "_arrays":
            other._arrays = state_class()._arrays
            other._view_arrays()
        else:
            setattr(other, field, wrong(value, getattr(state_class(), field)))
        return other

    state_class.fork = leaky
    try:
        yield
    finally:
        state_class.fork = fork


OTHER_SETTINGS: dict[str, Any] = {"order": "over", "start": 1}
"""Settings whose fields differ from a new state's defaults (`ratio`, `_horizon`)."""


def fields() -> list[str]:
    """The pure core's fields (every attribute its `__init__` sets)."""
    return sorted(vars(pure_module(LCT_CORE).LCTState()))


def test_the_fields_are_the_cores() -> None:
    """Every field the sets above name is the core's (one renamed there is renamed here)."""
    assert len(fields()) > 60
    assert set(fields()) >= SCRATCH | READ_ONLY


@pytest.mark.slow
@pytest.mark.parametrize("shared", [False, True])
def test_a_fork_that_leaves_a_field_out_fails(shared: bool) -> None:
    """Each field of the core left out of the pure core's fork in turn: every one but the
    scratch ones and two rarely read settings (and, shared, the read-only settings and
    the immutable values) fails `check_a_fork`, on keys, on ids or with other settings."""
    cls = pure_lct()
    assert issubclass(cls, LCTCachePolicy)
    state_class = cls.state_class
    missed = []
    for field in fields():
        if field in SCRATCH or field in RARELY_READ or (shared and field in READ_ONLY):
            continue
        if shared and isinstance(getattr(state_class(), field), (int, float, type(None))):
            continue  # an immutable value: shared is copied
        caught = False
        for on_ids, settings in ((False, {}), (True, {}), (False, OTHER_SETTINGS)):
            with broken_fork(state_class, field, shared):
                try:
                    check_a_fork(cls, 1, on_ids, prefix=400, **settings)
                except Exception:  # a failed check, or a call the leak broke
                    caught = True
            if caught:
                break
        if not caught:
            missed.append(field)
    assert missed == []
