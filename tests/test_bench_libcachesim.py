"""libCacheSim's reference columns (`kvtier_tools.bench.libcachesim_reference`): calibrated
against kvtier's own LRU and ARC, which must give the same hit ratios (within 0.002) on the
same keys; skipped without the `bench` extra."""

from __future__ import annotations

import math
import random

import pytest

from kvtier.policies import simulate
from kvtier_tools.bench import libcachesim_reference


@pytest.mark.timeout(120)
def test_its_lru_and_arc_match_kvtiers() -> None:
    pytest.importorskip("libcachesim")
    rng = random.Random(5)
    keys = [min(int(rng.paretovariate(0.7)), 5_000) for _ in range(30_000)]
    found = libcachesim_reference.reference(keys, ["LRU", "ARC"])
    distinct = len(set(keys))
    for fraction, lru, arc in zip(
        libcachesim_reference.FRACTIONS, found["LRU"], found["ARC"], strict=True
    ):
        capacity = max(1, math.floor(fraction * distinct))
        assert abs(lru - simulate("lru", capacity, keys).hit_ratio) < 0.002
        assert abs(arc - simulate("arc", capacity, keys).hit_ratio) < 0.002


def test_a_trace_is_name_equals_path() -> None:
    with pytest.raises(SystemExit, match="NAME=PATH"):
        libcachesim_reference.main(["no-path-here"])
