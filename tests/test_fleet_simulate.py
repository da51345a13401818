"""`kvtier fleet simulate`: simulated nodes behind four routers, the kvtier router fed by the
nodes' own events through the fleet's prefix index, and the command's JSON and errors."""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvtier.cli import main
from kvtier.keys import OffloadKey
from kvtier_tools.workloads.fleet import (
    ROUTERS,
    FleetResult,
    KvtierRouter,
    PrefixHashRouter,
    Router,
    RouterReport,
    SharedStore,
    SimNode,
    make_router,
    scale_tiers,
    simulate_fleet,
)
from kvtier_tools.workloads.simulation import (
    chain_tiers,
    infinite_cache_hits,
    parse_capacities,
    simulate_chain,
)
from kvtier_tools.workloads.simulation.chain import ChainTier, offload_key_of
from kvtier_tools.workloads.simulation.sweep import SimTrace

pytestmark = pytest.mark.timeout(120)


def needs_index() -> None:
    """The kvtier router needs the fleet's index and the events extra (msgspec)."""
    pytest.importorskip("msgspec")
    pytest.importorskip("kvtier.fleet.index")


def small_chain(*blocks: int) -> tuple[ChainTier, ...]:
    specs = parse_capacities(",".join(str(b) for b in blocks))
    return chain_tiers(specs, ["lru"] * len(blocks), unique_blocks=1)


def conversations(names: Sequence[str], turns: int, blocks_per_turn: int = 3) -> SimTrace:
    """Conversations taking turns (a, b, a, b, ...): turn t of a conversation repeats its
    previous turns' blocks and adds `blocks_per_turn` new ones (a Mooncake prefix)."""
    requests = []
    for turn in range(1, turns + 1):
        for name in names:
            requests.append(
                tuple(f"{name}{i}" for i in range(turn * blocks_per_turn))
            )  # keys are texts: distinct per conversation, no common first block
    return SimTrace.from_requests(requests)


class Recording:
    """A router that records the node of every request (delegating to `inner`)."""

    def __init__(self, inner: Router) -> None:
        self.inner = inner
        self.name = inner.name
        self.wants_events = inner.wants_events
        self.routes: list[int] = []

    def route(self, keys: Sequence[OffloadKey], counts: Sequence[int]) -> int:
        node = self.inner.route(keys, counts)
        self.routes.append(node)
        return node

    def observe(self, node: int, payloads: Sequence[tuple[int, bytes]]) -> None:
        self.inner.observe(node, payloads)

    def report(self) -> RouterReport | None:
        return self.inner.report()


def run_fleet(
    trace: SimTrace,
    router: str,
    nodes: int,
    tiers: tuple[ChainTier, ...] | None = None,
    *,
    seed: int = 0,
    max_imbalance: float = 1.2,
    prefix_blocks: int = 1,
) -> tuple[FleetResult, Recording]:
    names = [f"node{i}" for i in range(nodes)]
    recording = Recording(
        make_router(
            router, names, seed=seed, max_imbalance=max_imbalance, prefix_blocks=prefix_blocks
        )
    )
    result = simulate_fleet(trace, tiers or small_chain(64, 256), recording, nodes)
    return result, recording


# -- known outcomes ---------------------------------------------------------------------------


def test_the_kvtier_router_sends_each_conversation_to_the_node_holding_it() -> None:
    needs_index()
    trace = conversations(["a", "b"], turns=6)
    result, recording = run_fleet(trace, "kvtier", 2)
    a_nodes = {recording.routes[i] for i in range(0, len(trace.requests), 2)}
    b_nodes = {recording.routes[i] for i in range(1, len(trace.requests), 2)}
    assert len(a_nodes) == 1 and len(b_nodes) == 1 and a_nodes != b_nodes
    # every block seen before hits: the infinite cache's figure
    assert result.hits == infinite_cache_hits(trace.accesses).hits
    assert result.node_requests == (6, 6)
    assert result.outcomes == {"APPLIED": result.batches}
    assert result.matched_requests == len(trace.requests) - 2


def test_random_routing_loses_what_the_kvtier_router_keeps() -> None:
    needs_index()
    trace = conversations(["a", "b", "c", "d"], turns=8)
    kvtier, _ = run_fleet(trace, "kvtier", 4)
    random, recording = run_fleet(trace, "random", 4, seed=1)
    assert len(set(recording.routes[::4])) > 1  # conversation a moved between nodes
    assert random.hits < kvtier.hits == infinite_cache_hits(trace.accesses).hits


def test_the_prefix_router_keeps_a_first_block_on_one_node() -> None:
    # every request starts with the same block (a system prompt): one node takes them all
    trace = SimTrace.from_requests([(0, i) for i in range(1, 40)])
    result, recording = run_fleet(trace, "prefix", 4)
    assert len(set(recording.routes)) == 1
    assert result.imbalance == 4.0
    _, recording = run_fleet(trace, "prefix", 4, prefix_blocks=2)
    assert len(set(recording.routes)) > 1


def test_a_consistent_hash_moves_few_prefixes_when_a_node_joins() -> None:
    keys = [[offload_key_of(i)] for i in range(2000)]
    four = PrefixHashRouter([f"node{i}" for i in range(4)])
    five = PrefixHashRouter([f"node{i}" for i in range(5)])
    moved = sum(four.route(k, ()) != five.route(k, ()) for k in keys)
    assert moved < len(keys) * 0.35  # about 1/5 move; a modulo hash would move about 4/5
    assert all(five.route(k, ()) in (four.route(k, ()), 4) for k in keys)


def test_the_load_bound_holds_a_hot_conversation_to_its_share() -> None:
    needs_index()
    # one conversation every request continues: affinity alone would send all to one node
    trace = SimTrace.from_requests([tuple(range(turn + 2)) for turn in range(200)])
    result, _ = run_fleet(trace, "kvtier", 4, max_imbalance=1.2)
    assert result.imbalance <= 1.2
    unbounded, _ = run_fleet(trace, "kvtier", 4, max_imbalance=100.0)
    assert unbounded.imbalance == 4.0
    assert unbounded.hits >= result.hits


def test_the_index_holds_what_each_node_holds() -> None:
    """The events the nodes published, applied by the index, are their ground truth."""
    needs_index()
    from kvtier.fleet.events import wire_medium

    trace = conversations(["a", "b", "c"], turns=10, blocks_per_turn=5)
    tiers = small_chain(8, 40)  # small: blocks are demoted and dropped at the bottom
    names = ["node0", "node1"]
    router = KvtierRouter(names)
    fleet = [SimNode(name, tiers, "write-back", publish=True) for name in names]
    counts = [0, 0]
    for number, request in enumerate(trace.requests):
        keys = [offload_key_of(key) for key in request]
        chosen = router.route(keys, counts)
        counts[chosen] += 1
        fleet[chosen].serve(keys)
        router.observe(chosen, fleet[chosen].take_payloads(float(number)))
    unique = {offload_key_of(key) for key in trace.accesses}
    evicted_somewhere = False
    for node in fleet:
        held = router.index.holdings(node.name)
        for key in unique:
            truth = {
                wire_medium(tier.medium) for tier in node.manager.tiers if tier.has(key) is True
            }
            assert set(held.get(bytes(key), frozenset())) == truth
            evicted_somewhere |= not truth
        node.close()
    assert evicted_somewhere


# -- invariants -----------------------------------------------------------------------------


@pytest.mark.parametrize("router", ROUTERS)
@pytest.mark.parametrize("nodes", [1, 3])
def test_invariants_of_every_router(router: str, nodes: int) -> None:
    if router == "kvtier":
        needs_index()
    trace = conversations(["a", "b", "c", "d", "e"], turns=5, blocks_per_turn=4)
    result, recording = run_fleet(trace, router, nodes, small_chain(8, 24))
    assert sum(result.node_requests) == result.requests == len(trace.requests)
    assert result.accesses == len(trace.accesses)
    assert 0.0 <= result.hit_ratio <= 1.0
    assert result.hits <= infinite_cache_hits(trace.accesses).hits
    assert result.imbalance >= 1.0
    assert set(result.tier_hits) == {"t1", "t2"}
    assert all(0 <= node < nodes for node in recording.routes)
    assert (result.index is not None) == (router == "kvtier")


def test_one_node_is_the_products_chain_simulator() -> None:
    trace = conversations(["a", "b", "c", "d"], turns=6, blocks_per_turn=4)
    tiers = small_chain(8, 24)
    fleet, _ = run_fleet(trace, "round-robin", 1, tiers)
    chain = simulate_chain(trace, tiers)
    assert tuple(fleet.tier_hits.values()) == chain.tier_hits


def test_capacity_scale_multiplies_every_tier() -> None:
    tiers = small_chain(8, 24)
    assert [tier.capacity.blocks for tier in scale_tiers(tiers, 8)] == [64, 192]
    assert scale_tiers(tiers, 1) == tiers


def test_a_shared_tier_serves_what_another_node_computed() -> None:
    trace = conversations(["a", "b"], turns=6)
    alone, _ = run_fleet(trace, "random", 2, seed=3)
    names = ["node0", "node1"]
    shared = SharedStore(1000)
    with_shared = simulate_fleet(
        trace, small_chain(64, 256), make_router("random", names, seed=3), 2, shared=shared
    )
    assert with_shared.tier_hits["shared"] == shared.hits > 0
    # the nodes serve the same requests: the shared tier only adds hits
    assert with_shared.hits == infinite_cache_hits(trace.accesses).hits > alone.hits
    assert shared.written == len(set(trace.accesses))


def test_a_full_shared_store_evicts_by_its_policy() -> None:
    store = SharedStore(2)
    keys = [offload_key_of(i) for i in range(3)]
    store.write(keys)
    assert store.continuation(keys[1:]) == 2 and store.continuation(keys) == 0
    assert store.hits == 2


# -- the command ------------------------------------------------------------------------------


@pytest.fixture
def fleet_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """`kvtier fleet simulate` as installed (the environment's metadata may predate its entry
    point): in kvtier's own `fleet` group."""
    import click

    from kvtier_tools.cli.fleet import simulate

    product = main.commands["fleet"]
    assert isinstance(product, click.Group)
    monkeypatch.setattr(product, "commands", {**product.commands, "simulate": simulate})


def write_trace(path: Path, trace: SimTrace) -> Path:
    ids = {key: number for number, key in enumerate(dict.fromkeys(trace.accesses))}
    lines = [
        json.dumps(
            {
                "timestamp": i,
                "input_length": 512 * len(r),
                "output_length": 1,
                "hash_ids": [ids[k] for k in r],
            }
        )
        for i, r in enumerate(trace.requests)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


CONFIG = """
block_size = 1024
[[tiers]]
name = "cpu"
medium = "cpu"
capacity = 16
policy = "lru"
"""


@pytest.mark.usefixtures("fleet_command")
@pytest.mark.parametrize("router", ROUTERS)
def test_the_json_report(tmp_path: Path, router: str) -> None:
    if router == "kvtier":
        needs_index()
    trace = write_trace(tmp_path / "t.jsonl", conversations(["a", "b", "c"], turns=4))
    config = tmp_path / "c.toml"
    config.write_text(CONFIG)
    code, stdout, stderr = run(
        "fleet", "simulate", "--nodes", "2", "--router", router, "--trace", str(trace),
        "--config", str(config), "--shared-tier", "10%", "--json",
    )  # fmt: skip
    assert code == 0, stderr
    document = json.loads(stdout)
    assert set(document) == {
        "trace", "chain", "shared_tier", "fleet", "infinite_cache_hit_ratio", "router",
    }  # fmt: skip
    fleet = document["fleet"]
    assert fleet["router"] == router and fleet["nodes"] == 2 and fleet["requests"] == 12
    assert set(fleet["tier_hits"]) == {"cpu", "shared"}
    assert fleet["load_imbalance"] >= 1.0
    assert 0.0 <= fleet["hit_ratio"] <= document["infinite_cache_hit_ratio"]
    assert document["chain"]["tiers"] == [
        {"name": "cpu", "medium": "cpu", "policy": "lru", "blocks": 16}
    ]
    if router == "kvtier":
        assert fleet["index"]["keys"] > 0 and fleet["index"]["memory_bytes"] > 0
        assert fleet["events"] > 0 and fleet["events_per_s"] > 0
        assert fleet["event_blocks"] > 0 and fleet["event_blocks_per_s"] > 0
    else:
        assert fleet["index"] is None and fleet["events"] == 0


@pytest.mark.usefixtures("fleet_command")
def test_the_reference_of_one_bigger_node(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.jsonl", conversations(["a", "b"], turns=3))
    code, stdout, stderr = run(
        "fleet", "simulate", "--nodes", "1", "--capacity-scale", "8", "--router", "random",
        "--trace", str(trace), "--json",
    )  # fmt: skip
    assert code == 0, stderr
    document = json.loads(stdout)
    assert document["chain"]["capacity_scale"] == 8
    assert [t["blocks"] for t in document["chain"]["tiers"]] == [4096 * 8, 8192 * 8, 65536 * 8]


@pytest.mark.usefixtures("fleet_command")
@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--nodes", "0"), "'--nodes'"),
        (("--router", "fastest"), "'--router'"),
        (("--shared-tier", "lots"), "--shared-tier"),
        (("--shared-tier", "5%,6%"), "--shared-tier"),
        (("--max-imbalance", "0.5"), "'--max-imbalance'"),
        (("--capacity-scale", "0"), "'--capacity-scale'"),
    ],
)
def test_bad_input_is_one_line(tmp_path: Path, args: tuple[str, ...], named: str) -> None:
    trace = write_trace(tmp_path / "t.jsonl", conversations(["a"], turns=2))
    code, stdout, stderr = run("fleet", "simulate", "--trace", str(trace), *args)
    assert code == 2
    assert stdout == ""
    assert len(stderr.strip().splitlines()) == 1
    assert stderr.startswith("kvtier: error: ") and named in stderr


def test_the_tools_entry_points_name_the_fleet_commands() -> None:
    import tomllib

    import click

    from kvtier_tools.cli.fleet import simulate

    project = tomllib.loads((Path(__file__).parents[1] / "tools" / "pyproject.toml").read_text())
    points = project["project"]["entry-points"]
    assert points["kvtier.fleet.commands"]["simulate"] == "kvtier_tools.cli.fleet:simulate"
    entry = EntryPoint("simulate", points["kvtier.fleet.commands"]["simulate"], "")
    assert entry.load() is simulate and isinstance(simulate, click.Command)


def test_a_simulated_node_batches_as_the_publisher_does() -> None:
    pytest.importorskip("msgspec")
    from kvtier.fleet import publisher
    from kvtier_tools.workloads.fleet import nodes

    assert nodes.MAX_BATCH_EVENTS == publisher.MAX_BATCH_EVENTS
    assert nodes.SEQ_BITS == publisher.SEQ_BITS


def test_a_nodes_first_batch_clears_and_sequence_numbers_follow() -> None:
    pytest.importorskip("msgspec")
    from kvtier.fleet.events import AllBlocksCleared, BlockStored, decode_batch

    node = SimNode("n", small_chain(4, 8), "write-back", publish=True, incarnation=7)
    node.serve([offload_key_of(i) for i in range(3)])
    first = node.take_payloads(1.0)
    node.serve([offload_key_of(i) for i in range(3, 6)])
    second = node.take_payloads(2.0)
    assert [seq for seq, _ in first + second] == [7 << 32, 7 << 32 | 1]
    events = decode_batch(first[0][1]).events
    assert isinstance(events[0], AllBlocksCleared)
    assert isinstance(events[1], BlockStored) and events[1].medium == "CPU"
    assert node.take_payloads(3.0) == []
    node.close()


def test_the_commands_router_names_are_the_routers() -> None:
    from kvtier_tools.cli.fleet import ROUTER_NAMES, simulate
    from kvtier_tools.workloads.fleet import DEFAULT_MAX_IMBALANCE

    assert ROUTER_NAMES == ROUTERS
    defaults = {param.name: param.default for param in simulate.params}
    assert defaults["max_imbalance"] == DEFAULT_MAX_IMBALANCE
