"""Tier-aware admission (issue 12, item 2): the second-sighting filter as a policy (the
PolicyTests suite), through a tier and a chain, in a config, and through a real Hierarchy
whose lower tier admits fewer blocks than it is offered (bytes verified)."""

from __future__ import annotations

import textwrap
import tomllib
from pathlib import Path
from typing import ClassVar

import pytest
from hierarchy_helpers import blocks_of, chain_config, content

from kvtier import Hierarchy
from kvtier.config import parse_config
from kvtier.errors import ConfigError, InvalidValueError
from kvtier.keys import key_from_int
from kvtier.manager import make_tier_manager
from kvtier.policies import ARCCachePolicy, LRUCachePolicy, SecondSightingAdmission
from kvtier.policies.admission import with_admission
from kvtier.testing import PolicyTests
from kvtier.testing.policy import k
from kvtier_tools.workloads.simulation import load_trace, parse_capacities
from kvtier_tools.workloads.simulation.chain import (
    build_chain,
    chain_tiers,
    parse_chain_admissions,
    serve_request,
    simulate_chain,
)


class LRUSecondSighting(SecondSightingAdmission):
    """LRU behind the filter, built from a capacity as the suite builds policies."""

    name: ClassVar[str] = "lru+second-sighting"

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(LRUCachePolicy(cache_capacity))


class TestSecondSightingOverLRU(PolicyTests):
    policy_class = LRUSecondSighting

    def test_registered_name(self) -> None:
        """Not a registered policy: a filter that `with_admission` puts in front of one."""
        policy = with_admission(LRUCachePolicy(4), "second-sighting")
        assert isinstance(policy, SecondSightingAdmission)
        assert isinstance(policy.policy, LRUCachePolicy)
        assert with_admission(policy.policy, "all") is policy.policy

    def test_capacity_respected_under_the_tier_protocol(self) -> None:
        tier = make_tier_manager(10, 16, "cpu", admission="second-sighting")
        for i in list(range(40)) * 3:
            out = tier.prepare_store([k(i)])
            assert out is not None
            if out.keys_to_store:
                tier.complete_store(out.keys_to_store)
            assert tier.stats().used <= 10

    def test_a_cache_larger_than_the_key_space_misses_once_per_key(self) -> None:
        """Twice per key, here: the first sighting is never stored."""
        tier = make_tier_manager(64, 16, "cpu", admission="second-sighting")
        stored = []
        for i in list(range(30)) * 3:
            if tier.lookup(k(i)):
                continue
            out = tier.prepare_store([k(i)])
            assert out is not None
            stored += out.keys_to_store
            tier.complete_store(out.keys_to_store)
        assert sorted(stored) == sorted(k(i) for i in range(30))  # each stored once


def test_first_sightings_are_refused_second_ones_stored() -> None:
    policy = SecondSightingAdmission(ARCCachePolicy(4))
    policy.on_store_miss([k(1), k(2)])
    assert policy.admit([k(1), k(2)]) == [False, False]
    policy.on_store_miss([k(2), k(3)])
    assert policy.admit([k(2), k(3)]) == [True, False]
    assert policy.refused == 3


def test_a_move_of_a_block_already_judged_is_refused_an_unknown_one_is_a_sighting() -> None:
    policy = SecondSightingAdmission(LRUCachePolicy(4))
    policy.on_store_miss([k(1)])  # heard of (and refused) when it missed
    policy.on_store_move([k(1), k(2)])  # the tier above now evicts both
    assert policy.admit([k(1), k(2)]) == [False, False]
    policy.on_store_miss([k(2)])  # k(2)'s move counted: this is its second sighting
    assert policy.admit([k(2)]) == [True]
    policy.on_store_move([k(1)])  # judged again: not another chance
    assert policy.admit([k(1)]) == [False]


def test_the_directory_of_sightings_is_bounded() -> None:
    policy = SecondSightingAdmission(LRUCachePolicy(2))  # remembers 32 keys
    policy.on_store_miss([k(i) for i in range(100)])
    policy.on_store_miss([k(0), k(99)])
    assert policy.admit([k(0), k(99)]) == [False, True]  # k(0) was forgotten


def test_an_inner_policy_refusal_still_counts() -> None:
    class RefusesOdd(LRUCachePolicy):
        admits_all = False

        def admit(self, keys: object) -> list[bool]:
            return [key_from_int(1) != key for key in keys]  # type: ignore[attr-defined]

    policy = SecondSightingAdmission(RefusesOdd(4))
    policy.on_store_miss([k(1), k(2)] * 2)
    assert policy.admit([k(1), k(2)]) == [False, True]


def test_unknown_admissions_are_named() -> None:
    with pytest.raises(InvalidValueError, match="unknown admission 'twice'"):
        with_admission(LRUCachePolicy(4), "twice")
    with pytest.raises(InvalidValueError, match="unknown admission 'twice'; valid"):
        parse_chain_admissions("all,twice", 2)
    with pytest.raises(InvalidValueError, match="3 admissions for 2 tiers"):
        parse_chain_admissions("all,all,all", 2)
    assert parse_chain_admissions("second-sighting", 2) == ("second-sighting",) * 2


def toml(text: str) -> dict[str, object]:
    return tomllib.loads(textwrap.dedent(text))


def test_config_takes_an_admission_per_tier_and_refuses_it_for_a_keyed_tier() -> None:
    config = parse_config(
        toml(
            """
        block_size = "4KiB"
        [[tiers]]
        name = "cpu"
        medium = "cpu"
        capacity = 8
        [[tiers]]
        name = "disk"
        medium = "disk"
        capacity = 32
        admission = "second-sighting"
        """
        )
    )
    assert [tier.admission for tier in config.tiers] == ["all", "second-sighting"]
    with pytest.raises(ConfigError, match=r"tiers\[1\]\.admission"):
        parse_config(
            toml(
                """
            block_size = "4KiB"
            model_id = "test-model"
            [[tiers]]
            name = "cpu"
            medium = "cpu"
            capacity = 8
            [[tiers]]
            name = "shared"
            medium = "shared-fs"
            capacity = 32
            path = "/tmp/kvtier-never-opened"
            admission = "second-sighting"
            """
            )
        )
    with pytest.raises(ConfigError, match="admission"):
        parse_config(
            toml(
                'block_size = "4KiB"\n[[tiers]]\nname = "cpu"\nmedium = "cpu"\ncapacity = 8\n'
                'admission = "twice"\n'
            )
        )


def test_a_demotion_the_lower_tier_refuses_copies_only_what_it_took() -> None:
    """Before, the DEMOTE step named every victim but only the admitted ones had slots."""
    tiers = chain_tiers(parse_capacities("2,8"), ["lru", "lru"], 1, ["all", "second-sighting"])
    manager = build_chain(tiers, "write-back")
    keys = [key_from_int(i) for i in range(12)]
    for key in keys[:6]:
        serve_request(manager, [key])  # t1 evicts; t2 hears of each victim once: refused
    assert manager.counters.demotions_refused > 0
    assert manager.tiers[1].stats().used == 0
    for key in keys[:6]:
        serve_request(manager, [key])  # second sighting of each: t2 now takes the victims
    assert manager.tiers[1].stats().used > 0
    manager.check()


async def test_a_hierarchy_whose_disk_admits_on_second_sighting_serves_exact_bytes(
    tmp_path: Path,
) -> None:
    config = chain_config(tmp_path)
    config["tiers"][-1]["admission"] = "second-sighting"
    async with Hierarchy.from_config(config) as h:
        keys = [key_from_int(i) for i in range(40)]
        for _ in range(2):
            for start in range(0, 40, 4):
                part = keys[start : start + 4]
                loaded = await h.get(part)
                if len(loaded) < len(part):
                    await h.put(part, blocks_of(part))
        await h.drain()
        disk = h.stats().tiers[-1]
        assert disk.used > 0  # second sightings reached the disk
        served = 0
        for key in keys:
            got = await h.get([key])
            if len(got):
                assert bool((got[0].cpu() == content(key)).all())
                served += 1
        assert served > 0
        h.check()


@pytest.mark.slow
def test_write_through_below_lru_writes_4x_fewer_blocks_and_hits_more() -> None:
    """Issue 12's two-tier target (1 % + 4 %, write-through, the shipped trace): the lower
    tier admitting on second sighting writes >= 4x fewer blocks than a plain LRU chain of the
    same tiers, and the chain hits more."""
    trace = load_trace(None, None)
    results = {}
    for admissions in (("all", "all"), ("all", "second-sighting")):
        tiers = chain_tiers(
            parse_capacities("1%,4%"), ["lru", "lru"], trace.unique_blocks, admissions
        )
        results[admissions] = simulate_chain(trace, tiers, "write-through")
    plain = results[("all", "all")]
    admitting = results[("all", "second-sighting")]
    assert admitting.tier_written[1] * 4 <= plain.tier_written[1]
    assert admitting.hit_ratio > plain.hit_ratio
