"""S3-FIFO's compiled core (`kvtier/policies/_s3fifo_core.py`, Cython's pure Python mode)
against the same text run as plain Python, in one process: every answer and the whole state
alike, on seeded and random programs, on the shipped trace, and on a shadow's batch of
accesses (`access`, what `auto` drives its shadows with). The tests skip when the compiled
core is not selected (`scripts/build-core` builds it); the batch's equivalence with the
accesses one by one is tested both ways (`tests/test_shadow_access.py`)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_compiled_core import (
    TwinARC,
    is_compiled,
    pair_of_blocks,
    policy_steps,
    pure_module,
    run_twin_program,
    run_twin_trace,
    seeded_program,
)

from kvtier.blocks import BlockStatus
from kvtier.keys import key_from_int
from kvtier.policies import CachePolicy

S3FIFO_CORE = "kvtier.policies._s3fifo_core"


def compiled_s3fifo() -> type[CachePolicy]:
    """`S3FIFOCachePolicy`, or a skip when its core (`_s3fifo_core`) is not the compiled one."""
    from kvtier.policies import _s3fifo_core
    from kvtier.policies.s3fifo import S3FIFOCachePolicy

    if not is_compiled(_s3fifo_core):
        pytest.skip("S3-FIFO's compiled core is not selected (scripts/build-core builds it)")
    return S3FIFOCachePolicy


def pure_s3fifo() -> type[CachePolicy]:
    """`S3FIFOCachePolicy` over `_s3fifo_core.py` run as plain Python."""
    from kvtier.policies.s3fifo import S3FIFOCachePolicy

    queues = pure_module(S3FIFO_CORE).S3FIFOQueues
    return type("PythonS3FIFO", (S3FIFOCachePolicy,), {"queues_class": queues})


def s3fifo_state(policy: CachePolicy) -> tuple[object, ...]:
    """What an S3-FIFO shows: its queues (S, M, G in order), every counter, its blocks."""
    queues = policy.queues()  # type: ignore[attr-defined]
    counters = [policy.frequency(key) for key in queues["small"] + queues["main"]]  # type: ignore[attr-defined]
    blocks = sorted((key, block.block_id, block.ref_cnt) for key, block in policy.items())
    return (queues, counters, len(policy), blocks)


class TwinS3FIFO(TwinARC):
    """The S3-FIFO over its core run as Python and over the compiled core, driven by the same
    calls (see `TwinARC`)."""

    def __init__(self, capacity: int, *, check_states: bool = True) -> None:
        self.check_states = check_states
        self.pure = pure_s3fifo()(capacity)
        self.fast = compiled_s3fifo()(capacity)
        self.calls = 0

    def check(self, where: str) -> None:
        assert s3fifo_state(self.pure) == s3fifo_state(self.fast), where


def test_the_pure_s3fifo_runs_the_core_as_python() -> None:
    policy = pure_s3fifo()(4)
    core = policy._core  # type: ignore[attr-defined]
    assert type(core).__module__ == S3FIFO_CORE + "_as_python"
    assert not is_compiled(pure_module(S3FIFO_CORE))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_compiled_s3fifo_decides_as_the_pure_one_on_seeded_programs() -> None:
    for seed in range(60):
        run_twin_program(*seeded_program(seed), TwinS3FIFO)


@st.composite
def s3fifo_programs(draw: st.DrawFn) -> tuple[int, list[tuple[object, ...]]]:
    """A capacity and a random program of S3-FIFO calls."""
    capacity = draw(st.integers(1, 12))
    return capacity, draw(st.lists(policy_steps(capacity), min_size=20, max_size=150))


@pytest.mark.slow
@pytest.mark.timeout(300)
@settings(max_examples=300, deadline=None)
@given(s3fifo_programs())
def test_compiled_s3fifo_decides_as_the_pure_one_on_random_programs(
    program: tuple[int, list[tuple[object, ...]]],
) -> None:
    run_twin_program(*program, TwinS3FIFO)


def test_the_s3fifo_twin_sees_a_different_state() -> None:
    """The comparison can fail: a twin whose compiled S3-FIFO was touched once more differs."""
    twin = TwinS3FIFO(4)
    key = key_from_int(1)
    twin.call("insert", key, blocks=pair_of_blocks(1, 0))
    twin.fast.touch([key])
    with pytest.raises(AssertionError):
        twin.check("one hit more")


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("fraction", [0.01, 0.1])
def test_compiled_s3fifo_decides_as_the_pure_one_on_the_trace(fraction: float) -> None:
    """The loop driver of `kvtier_tools.bench.policy_speed` over the shipped trace's first
    3,000 requests: every hit, victim and insert alike, the queues every 100 requests."""
    compiled_s3fifo()
    run_twin_trace(TwinS3FIFO, fraction, every=100)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("twin_class", [TwinS3FIFO, TwinARC])
def test_compiled_cores_shadow_access_as_the_pure_ones(
    twin_class: type[TwinARC], seed: int
) -> None:
    """`access` (a shadow's batch of accesses, S3-FIFO's and ARC's in their cores) hits and
    changes state alike both ways, with blocks pinned meanwhile (a former live policy's)
    skipped by the evictions."""
    rng = random.Random(seed)
    capacity = rng.choice([1, 3, 8, 32])
    twin = twin_class(capacity, check_states=True)
    shared = (BlockStatus(0), BlockStatus(0))
    for block in shared:
        block.ref_cnt = 0
    for number in range(300):
        keys = [key_from_int(rng.randrange(4 * capacity)) for _ in range(rng.randint(1, 6))]
        twin.call("access", keys, blocks=shared)
        if number % 7 == 0 and len(twin.pure):
            key = rng.choice(sorted(key for key, _ in twin.pure.items()))
            pair = pair_of_blocks(number, rng.choice([0, 1]))
            twin.call("remove", key)
            twin.call("insert", key, blocks=pair)
