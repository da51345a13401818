"""`kvtier simulate --tiers` / `--config`: a trace served through the real TieredManager with
instant copies, its per-tier hits, and the command's chained form."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.cli import main
from kvtier.errors import InvalidValueError, UnknownPolicyError
from kvtier.keys import key_from_int, make_offload_key
from kvtier.manager import make_tier_manager
from kvtier_tools.workloads.demo import replay_tier
from kvtier_tools.workloads.simulation import infinite_cache_hits, load_trace, parse_capacities
from kvtier_tools.workloads.simulation.chain import (
    ChainTier,
    chain_tiers,
    offload_key_of,
    parse_chain_policies,
    simulate_chain,
)
from kvtier_tools.workloads.simulation.sweep import Capacity, SimTrace
from kvtier_tools.workloads.traces import TraceRequest

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


NO_RESERVE = (0.95, 1.0)
"""Watermarks that keep no free slots in reserve: hand-worked chains place every block."""


def lru_chain(*blocks: int, reserve: bool = False) -> tuple[ChainTier, ...]:
    specs = parse_capacities(",".join(str(b) for b in blocks))
    tiers = chain_tiers(specs, ["lru"] * len(blocks), unique_blocks=1)
    return tiers if reserve else tuple(replace(tier, watermarks=NO_RESERVE) for tier in tiers)


# Requests as Mooncake prefixes are: a block id names its whole prefix, so a request's ids
# after its first new one are new too. Generated as paths in a small tree of prefixes.
@st.composite
def prefix_requests(draw: st.DrawFn, max_len: int = 12) -> list[list[int]]:
    requests: list[list[int]] = []
    known: list[list[int]] = [[]]
    next_id = 0
    for _ in range(draw(st.integers(1, 30))):
        base = draw(st.sampled_from(known))
        keep = draw(st.integers(0, len(base)))
        request = base[:keep]
        for _ in range(draw(st.integers(0 if request else 1, min(4, max_len - len(request))))):
            request.append(next_id)
            next_id += 1
        requests.append(request)
        known.append(request)
    return requests


def test_hand_worked_two_tier_chain() -> None:
    # t1 holds 2 blocks (so the Hierarchy's batches are of 1 block), t2 holds 4; LRU,
    # write-back.
    #   [1,2]   misses, stored at the top
    #   [3,4]   misses; the top evicts 1,2, demoted to t2
    #   [1,2]   both found in t2 and promoted (3, then 4, go down): 2 hits of t2
    #   [1,2,5] 1,2 hit the top, touched one by one, so 1 is the least recent when 5 is
    #           stored and is evicted (t2 still holds it: no copy)
    #   [2]     a hit of the top
    trace = SimTrace.from_requests([[1, 2], [3, 4], [1, 2], [1, 2, 5], [2]])
    result = simulate_chain(trace, lru_chain(2, 4))
    assert result.tier_hits == (3, 2)
    assert (result.accesses, result.hits, result.hit_ratio) == (10, 5, 0.5)
    assert result.counters["promotions"] == 2 and result.counters["demoted"] == 4
    assert [p.tier_hits for p in result.timeline] == [(0, 0), (0, 0), (0, 2), (2, 2), (3, 2)]
    assert [p.infinite_hits for p in result.timeline] == [0, 0, 2, 4, 5]


def test_a_partial_last_block_is_never_stored_by_the_chain() -> None:
    # [1,2] with 2 partial: 1 stored. [1,2,3] with 3 partial: 1 hits, 2 is stored (this time
    # it is not flagged), 3 is not. [1,2] with 2 flagged: both hit (a flag only stops a store).
    trace = SimTrace.from_requests([[1, 2], [1, 2, 3], [1, 2]])
    flags = [False, True, False, False, True, False, True]
    result = simulate_chain(trace, lru_chain(4), partial=flags)
    assert result.tier_hits == (3,)
    assert result.counters["partial_refused"] == 2
    assert result.tier_written == (2,)
    plain = simulate_chain(trace, lru_chain(4))
    assert plain.tier_hits == (4,)
    with pytest.raises(InvalidValueError, match="3 flags for a trace of 7"):
        simulate_chain(trace, lru_chain(4), partial=flags[:3])


def test_prefix_hits_stop_at_the_first_miss() -> None:
    # Block 9 is new, so 1 after it is recomputed although the top tier holds it.
    trace = SimTrace.from_requests([[1], [9, 1]])
    result = simulate_chain(trace, lru_chain(4))
    assert result.tier_hits == (0,)
    assert infinite_cache_hits(trace.accesses).hits == 1


def test_a_top_hit_is_not_evicted_by_a_promotion_of_the_same_lookup() -> None:
    # The top (4 blocks, so the Hierarchy's batch is 1... too small: use 8 with a batch of 2)
    # holds the older block at its LRU end while a later block of the same request is
    # promoted from t2: the block answered ready must still be served.
    trace = SimTrace.from_requests([[1], [2], [3], [4], [5], [6], [7], [8], [9], [2, 1]])
    result = simulate_chain(trace, lru_chain(8, 16))
    assert result.counters["lost_at_top"] == 0
    assert result.tier_hits == (1, 1)


@settings(max_examples=150, deadline=None)
@given(
    requests=prefix_requests(max_len=2),
    top=st.integers(8, 14),
    policy=st.sampled_from(["lru", "arc"]),
)
def test_one_tier_chain_matches_the_demo_replay_of_a_tier_manager(
    requests: list[list[int]], top: int, policy: str
) -> None:
    # The demo pins, touches and stores a request's blocks in one call each; a Hierarchy
    # does it in batches of a quarter of the top tier, so compare where one batch holds a
    # whole request (top >= 8 with requests of up to 2 blocks).
    trace = SimTrace.from_requests(requests)
    tiers = chain_tiers(parse_capacities(str(top)), [policy], trace.unique_blocks)
    result = simulate_chain(trace, tiers)
    manager = make_tier_manager(top, 1, "cpu", policy, name="t1")
    replay = replay_tier(
        manager, [TraceRequest(0, 512 * len(ids), 1, tuple(ids)) for ids in requests]
    )
    assert result.hits == replay.prefix_hits


@settings(max_examples=150, deadline=None)
@given(
    requests=prefix_requests(),
    sizes=st.lists(st.integers(1, 8), min_size=2, max_size=3),
    write_through=st.booleans(),
)
@pytest.mark.slow
def test_chains_never_beat_the_infinite_cache_and_stay_consistent(
    requests: list[list[int]], sizes: list[int], write_through: bool
) -> None:
    trace = SimTrace.from_requests(requests)
    write_policy = "write-through" if write_through else "write-back"
    result = simulate_chain(trace, lru_chain(*sizes), write_policy)  # manager.check() inside
    assert result.hits <= infinite_cache_hits(trace.accesses).hits
    assert result.timeline[-1].tier_hits == result.tier_hits
    assert result.timeline[-1].accesses == result.accesses == len(trace.accesses)


def test_a_chain_whose_bottom_holds_everything_reaches_the_infinite_bound() -> None:
    trace = load_trace(None, limit=1500)
    tiers = chain_tiers(parse_capacities("1%,100%"), ["lru", "lru"], trace.unique_blocks)
    result = simulate_chain(trace, tiers)
    assert result.counters["lost_at_top"] == 0
    assert result.hits == infinite_cache_hits(trace.accesses).hits
    assert result.counters["dropped_at_bottom"] == 0


def test_policies_for_a_chain() -> None:
    assert parse_chain_policies("arc", 3) == ("arc", "arc", "arc")
    assert parse_chain_policies("lru, ARC", 2) == ("lru", "arc")
    with pytest.raises(InvalidValueError, match="2 policies for 3 tiers"):
        parse_chain_policies("lru,arc", 3)
    with pytest.raises(UnknownPolicyError):
        parse_chain_policies("lru,mru", 2)


def test_tier_names_and_media() -> None:
    tiers = chain_tiers(parse_capacities("1%,5%,20%"), ["lru"] * 3, 1000)
    assert [(t.name, t.medium, t.capacity) for t in tiers] == [
        ("t1", "gpu", Capacity("1%", 10)),
        ("t2", "cpu", Capacity("5%", 50)),
        ("t3", "disk", Capacity("20%", 200)),
    ]
    assert [t.medium for t in chain_tiers(parse_capacities("1,2"), ["lru"] * 2, 9)] == [
        "cpu",
        "disk",
    ]


def test_offload_keys_of_trace_keys() -> None:
    assert offload_key_of(7) == key_from_int(7)
    assert offload_key_of("abc") == make_offload_key(b"abc")
    assert offload_key_of(-3) == make_offload_key(b"-3")


# -- the command ----------------------------------------------------------------------------


def test_tiers_happy_path(tmp_path: Path) -> None:
    code, stdout, stderr = run(
        "simulate", "--tiers", "1%,5%,20%", "--policy", "lru,arc,lru", "--limit", "300",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0, stderr
    assert "Per-tier prefix hits through the chain (write-back)" in stdout
    for cell in ("t1 (gpu)", "t2 (cpu)", "t3 (disk)", "chain", "infinite", "promoted"):
        assert cell in stdout
    document = json.loads((tmp_path / "simulate.json").read_text())
    chain = document["chain"]
    assert [(t["name"], t["policy"], t["capacity"]) for t in chain["tiers"]] == [
        ("t1", "lru", "1%"),
        ("t2", "arc", "5%"),
        ("t3", "lru", "20%"),
    ]
    assert chain["requests"] == 300
    assert chain["hits"] == sum(t["hits"] for t in chain["tiers"])
    assert chain["hits"] <= document["infinite_cache"]["hits"]
    assert chain["timeline"][-1]["tier_hits"] == [t["hits"] for t in chain["tiers"]]
    png = (tmp_path / "simulate.png").read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 10_000


def test_tiers_json_and_write_through(tmp_path: Path) -> None:
    code, stdout, stderr = run(
        "simulate", "--tiers", "2%,10%", "--write-policy", "write-through", "--limit", "300",
        "--json", "--no-plot", "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0, stderr
    chain = json.loads(stdout)["chain"]
    assert chain["write_policy"] == "write-through"
    assert chain["counters"]["cascaded"] > 0


def test_config_gives_the_chain(tmp_path: Path) -> None:
    config = tmp_path / "chain.toml"
    config.write_text(
        'block_size = 4096\nwrite_policy = "write-through"\n'
        '[[tiers]]\nname = "fast"\nmedium = "cpu"\ncapacity = 64\npolicy = "arc"\n'
        '[[tiers]]\nname = "slow"\nmedium = "disk"\ncapacity = "1MiB"\npolicy = "lru"\n'
    )
    code, stdout, stderr = run(
        "simulate", "--config", str(config), "--limit", "200", "--json", "--no-plot",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0, stderr
    chain = json.loads(stdout)["chain"]
    assert chain["write_policy"] == "write-through"
    assert [(t["name"], t["medium"], t["policy"], t["blocks"]) for t in chain["tiers"]] == [
        ("fast", "cpu", "arc", 64),
        ("slow", "disk", "lru", 256),
    ]
    for tier in chain["tiers"]:  # the config's block size turns blocks written into bytes
        assert tier["blocks_written"] > 0
        assert tier["bytes_written"] == tier["blocks_written"] * 4096
    code, stdout, _ = run(
        "simulate", "--tiers", "64,256", "--limit", "200", "--json", "--no-plot",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert {t["bytes_written"] for t in json.loads(stdout)["chain"]["tiers"]} == {None}


def one_line_error(args: list[str], *needles: str) -> None:
    code, stdout, stderr = run(*args)
    assert code == 2, (stdout, stderr)
    message = stderr.rstrip("\n").replace("\n", "")  # rich hard-wraps at 80 columns
    assert message.startswith("kvtier: error:") and message.count("kvtier:") == 1, stderr
    assert "Traceback" not in stdout + stderr
    squeezed = "".join(message.split())
    for needle in needles:
        assert "".join(needle.split()) in squeezed, stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--tiers", "1%,abc"], "--tiers: 'abc'"),
        (["--tiers", "1%,0%"], "--tiers: '0%'"),
        (["--tiers", "1%,5%", "--policy", "lru,arc,lru"], "3 policies for 2 tiers"),
        (["--tiers", "1%", "--policy", "fifo"], "valid policies: arc, auto, lct, lru, s3fifo"),
        (["--tiers", "1%", "--capacity", "5%"], "a chain takes --tiers"),
        (["--tiers", "1%", "--config", "x.toml"], "not both"),
        (["--write-policy", "write-through"], "needs a chain"),
        (["--config", "x.toml", "--policy", "lru"], "come from the file"),
        (["--config", "nope.toml"], "nope.toml"),
    ],
)
def test_chain_bad_input_is_one_line(args: list[str], needle: str, tmp_path: Path) -> None:
    one_line_error(["simulate", *args, "--out", str(tmp_path)], needle)


@pytest.mark.slow
def test_blocks_written_per_tier_and_an_admitting_lower_tier_writes_fewer() -> None:
    """Each tier reports the blocks stored into it; with `lct` below LRU (write-back), the
    lower tier refuses demotions of blocks that never pay: fewer disk writes, no fewer hits."""
    trace = load_trace(None, 3000)
    results = {}
    for policies in (("lru", "lru"), ("lru", "lct")):
        tiers = chain_tiers(parse_capacities("1%,4%"), policies, trace.unique_blocks)
        results[policies] = simulate_chain(trace, tiers, "write-back")
    plain, admitting = results[("lru", "lru")], results[("lru", "lct")]
    assert len(plain.tier_written) == 2 and plain.tier_written[1] > 0
    assert admitting.tier_written[1] * 2 < plain.tier_written[1]
    assert admitting.hits >= plain.hits
    assert plain.to_dict()["tiers"][1]["blocks_written"] == plain.tier_written[1]
