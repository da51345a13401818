"""`kvtier fleet`: kvtier across nodes. `kvtier fleet index` runs the fleet's prefix index.

    kvtier fleet index --node a=tcp://10.0.0.1:5557,tcp://10.0.0.1:5558 --node b=... \\
        --http 127.0.0.1:5590 [--json]

The daemon subscribes to each node's `[events]` publisher (`kvtier.fleet.subscriber`),
keeps which node holds which block on which medium (`kvtier.fleet.index`), and serves the
HTTP query endpoint a router asks (`kvtier.fleet.query`) until SIGTERM or SIGINT. It prints
a `ready` line once everything is bound, a `status` line every `--status-s`, and a
`stopped` line at the end (one JSON object per line with `--json`).

kvtier-tools adds `kvtier fleet simulate` to this group through the entry-point group
`kvtier.fleet.commands` (`FLEET_COMMANDS_GROUP`); without kvtier-tools, `kvtier fleet
simulate` says in one line where it is.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import threading
import time
import tomllib
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import click

from kvtier.cli.console import out
from kvtier.cli.entry_groups import EntryPointGroup
from kvtier.errors import ConfigError, KvtierError

if TYPE_CHECKING:
    from kvtier.fleet.auth import BatchAuth
    from kvtier.fleet.index import PrefixIndex
    from kvtier.fleet.subscriber import FleetSubscriber, NodeEndpoints


FLEET_COMMANDS_GROUP = "kvtier.fleet.commands"
"""The entry-point group through which another distribution adds a `kvtier fleet` command."""


class _FleetGroup(EntryPointGroup):
    """`kvtier fleet`: its own commands, and those other distributions add through
    `FLEET_COMMANDS_GROUP` (kvtier-tools: `simulate`)."""

    entry_group = FLEET_COMMANDS_GROUP
    tool_commands = ("simulate",)
    prefix = "kvtier fleet"


@click.group(cls=_FleetGroup)
def fleet() -> None:
    """kvtier across nodes: the fleet's prefix index (and, with kvtier-tools, its
    simulation)."""


def parse_http(value: str) -> tuple[str, int]:
    """`HOST:PORT` (an IPv6 host in brackets) -> (host, port); ConfigError naming it."""
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError([f"--http {value!r}: expected HOST:PORT, e.g. 127.0.0.1:5590"])
    return host, int(port)


def nodes_from_file(path: Path) -> list[NodeEndpoints]:
    """The `[[nodes]]` of a TOML file (name, endpoint, replay_endpoint); ConfigError naming
    the file and the entry that is wrong."""
    from kvtier.fleet.subscriber import NodeEndpoints

    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise ConfigError([f"{path}: {error}"]) from None
    entries = data.get("nodes")
    if not isinstance(entries, list) or not entries:
        raise ConfigError([f"{path}: expected [[nodes]] tables (name, endpoint, replay_endpoint)"])
    nodes = []
    for i, entry in enumerate(entries):
        fields = {"name", "endpoint", "replay_endpoint"}
        if not isinstance(entry, dict) or not {"name", "endpoint"} <= set(entry) <= fields:
            raise ConfigError([f"{path}: nodes[{i}]: expected name, endpoint, replay_endpoint"])
        if not all(isinstance(value, str) for value in entry.values()):
            raise ConfigError([f"{path}: nodes[{i}]: every value is a string"])
        node = NodeEndpoints(entry["name"], entry["endpoint"], entry.get("replay_endpoint", ""))
        node.check()
        nodes.append(node)
    return nodes


def _auth_of(events_config: Path | None) -> tuple[BatchAuth | None, str | None]:
    """The MAC key and topic of a node's config (its `[events]` table and namespace)."""
    if events_config is None:
        return None, None
    from kvtier.config import load_config
    from kvtier.fleet.auth import auth_from_config

    config = load_config(events_config)
    return auth_from_config(config.events, config.namespace), config.events.topic


class _Stop:
    """Set by SIGTERM or SIGINT: the daemon's loop ends and it closes cleanly."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signal = ""

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.signal = signal.Signals(signum).name
        self.event.set()


def _status(index: PrefixIndex, subscriber: FleetSubscriber) -> dict[str, Any]:
    return {
        "index": dataclasses.asdict(index.stats()),
        "nodes": {
            name: dataclasses.asdict(counters) for name, counters in subscriber.counters().items()
        },
        "healing": subscriber.healing(),
    }


def _say(as_json: bool, event: str, fields: dict[str, Any]) -> None:
    """One line on stdout, flushed (a supervisor reading a pipe sees it at once)."""
    if as_json:
        line = json.dumps({"event": event, "time": round(time.time(), 3), **fields})
        out.print(line, markup=False)
    else:
        out.print(f"kvtier fleet index: {_text(event, fields)}", markup=False)
    out.file.flush()


def _text(event: str, fields: dict[str, Any]) -> str:
    if event == "ready":
        return f"ready: {len(fields['nodes'])} nodes, {fields['http'] or 'no HTTP endpoint'}"
    stats = fields["index"]
    extra = f" ({fields['signal']})" if event == "stopped" else ""
    return (
        f"{event}{extra}: {stats['nodes']} nodes ({stats['stale_nodes']} stale), "
        f"{stats['keys']} keys, {stats['entries']} entries, "
        f"{stats['memory_bytes'] / 1e6:.1f} MB, {stats['batches_applied']} batches applied, "
        f"{stats['gaps']} gaps, {stats['batches_rejected']} rejected"
    )


@fleet.command("index")
@click.option(
    "--node",
    "node_specs",
    multiple=True,
    metavar="NAME=PUB[,REPLAY]",
    help="A node: its name, its [events] endpoint and replay_endpoint (repeat for each).",
)
@click.option(
    "--nodes-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A TOML file of [[nodes]] tables: name, endpoint, replay_endpoint.",
)
@click.option(
    "--http",
    "http",
    metavar="HOST:PORT",
    help="Serve the query endpoint there (port 0: a free one, named by the ready line).",
)
@click.option("--topic", default=None, help="The events' topic (default: the config's, or '').")
@click.option(
    "--events-config",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A node's kvtier TOML: its [events] key (auth_key_file / auth_key_env) and topic, "
    "and its namespace, to check each batch's MAC.",
)
@click.option("--load-weight", type=float, default=0.0, show_default=True)
@click.option(
    "--probe-s", type=float, default=5.0, show_default=True, help="Probe a node silent this long."
)
@click.option(
    "--unreachable-s",
    type=float,
    default=30.0,
    show_default=True,
    help="Drop the entries of a node that answers nothing this long.",
)
@click.option("--status-s", type=float, default=10.0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def index(
    node_specs: Sequence[str],
    nodes_file: Path | None,
    http: str | None,
    topic: str | None,
    events_config: Path | None,
    load_weight: float,
    probe_s: float,
    unreachable_s: float,
    status_s: float,
    as_json: bool,
) -> None:
    """Run the fleet's prefix index: subscribe to every node's KV events and serve the
    query endpoint a router asks, until SIGTERM or SIGINT.

    \b
    Each node publishes with an [events] table in its kvtier TOML:
      [events]
      enabled = true
      endpoint = "tcp://*:5557"
      replay_endpoint = "tcp://*:5558"

    \b
    Examples:
      kvtier fleet index --node a=tcp://10.0.0.1:5557,tcp://10.0.0.1:5558 \\
          --node b=tcp://10.0.0.2:5557,tcp://10.0.0.2:5558 --http 0.0.0.0:5590
      kvtier fleet index --nodes-file fleet.toml --http 127.0.0.1:0 --json

    \b
    Then, from a router:
      curl -s localhost:5590/v1/score -d '{"keys": ["<hex key>", ...]}'
    ranks the nodes by cached prefix (GET /v1/stats, /v1/nodes: the index's state;
    kvtier.fleet.query documents the endpoint). Without a replay endpoint a node's gaps
    cannot be healed, and it answers nothing from its first gap until it restarts.
    """
    try:
        from kvtier.fleet.index import PrefixIndex
        from kvtier.fleet.query import QueryServer
        from kvtier.fleet.subscriber import FleetSubscriber, nodes_from
    except ImportError as error:
        raise KvtierError(
            f"kvtier fleet index needs the events extra ({error.name} is missing): "
            "pip install 'kvtier[events]'"
        ) from None
    nodes = nodes_from(node_specs)
    if nodes_file is not None:
        nodes += nodes_from_file(nodes_file)
    if not nodes:
        raise ConfigError(["no node: give --node NAME=PUB[,REPLAY] or --nodes-file"])
    if not status_s > 0:
        raise ConfigError([f"--status-s must be > 0, got {status_s}"])
    address = parse_http(http) if http is not None else None
    auth, config_topic = _auth_of(events_config)
    chosen_topic = topic if topic is not None else (config_topic or "")
    prefix_index = PrefixIndex(load_weight=load_weight)
    server = QueryServer(prefix_index, *address) if address is not None else None
    try:
        subscriber = FleetSubscriber(
            prefix_index,
            nodes,
            topic=chosen_topic.encode(),
            auth=auth,
            probe_after_s=probe_s,
            unreachable_after_s=unreachable_s,
        )
    except BaseException:
        if server is not None:
            server.close()
        raise
    stop = _Stop()
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        subscriber.start()
        if server is not None:
            server.start()
        _say(
            as_json,
            "ready",
            {
                "http": None if server is None else server.url,
                "nodes": [dataclasses.asdict(node) for node in nodes],
                "authenticated": auth is not None,
            },
        )
        while not stop.event.wait(status_s):
            _say(as_json, "status", _status(prefix_index, subscriber))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        subscriber.close()
        if server is not None:
            server.close()
    _say(as_json, "stopped", {"signal": stop.signal, **_status(prefix_index, subscriber)})
