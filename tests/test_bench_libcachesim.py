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


def test_calibration_names_each_cell_where_lru_or_arc_differ_from_kvtiers() -> None:
    theirs = {"oltp": {"LRU": [0.41, 0.60, 0.66, 0.73], "ARC": [0.45, 0.61, 0.67, 0.74]}}
    ours = {
        "oltp": {
            "lru": {"hit_ratios": [0.4105, 0.60, 0.66, 0.7301], "us_per_access": 1.0},
            "arc": {"hit_ratios": [0.45, 0.6125, 0.67, 0.74], "us_per_access": 1.0},
        },
        "web12": {"lru": {"hit_ratios": [0.0] * 4, "us_per_access": 1.0}},
    }
    summary, misses = libcachesim_reference.calibration(theirs, ours)
    assert summary == [
        "oltp LRU: largest difference from kvtier 0.0005",
        "oltp ARC: largest difference from kvtier 0.0025",
    ]
    assert misses == ["oltp ARC at 5%: libCacheSim and kvtier differ by 0.0025"]


@pytest.mark.timeout(60)
def test_signed_64_bit_keys_stay_distinct() -> None:
    pytest.importorskip("libcachesim")
    keys = [-5, -5, 7, -(2**63), 2**64 - 5, -5]  # -5 and 2**64 - 5 are one id modulo 2**64
    assert libcachesim_reference.hit_ratios(keys, 2, "LRU") == pytest.approx(2 / 6)
