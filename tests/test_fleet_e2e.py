"""The fleet end to end, with real processes (issue 32, item 5): three nodes, each a kvtier
`Hierarchy` (cpu -> disk, small enough that demotions and evictions happen) publishing its
KV events on loopback ports chosen at run time (`fleet_node.py`, driven over a pipe); one
`kvtier fleet index` daemon with its HTTP query endpoint; this test as the client, routing
a slice of the shipped conversation trace by the index's score.

At every quiescent point (each node drained and its events sent) the index holds, for each
node, exactly the blocks the node's tiers hold, on their best medium: every key the node
holds is reported on it, and the node has as many entries as it holds keys. Then:

- kill -9 a node and start it again (same ports, same disk): what it held in memory is gone
  from the index and what its disk restored is there. Bound: the restarted node's first
  batch (`AllBlocksCleared`, then the restored blocks) reaches the index as soon as its
  subscription reconnects, or, if that batch was sent before, by the index's probe of the
  silent node (`--probe-s`): the stale entries live at most until then.
- SIGSTOP the index for 10 s while every node puts megabytes of events (past ZMQ's
  high-water marks and socket buffers: batches are dropped); SIGCONT: the gap is detected
  (the index's `gaps` grows) and healed, by the replay socket on the nodes that keep enough
  batches (asked on the gap, or by the probe of a node silent since: the lost batches are
  the last ones) and by a snapshot on the one that keeps 32, and the index equals the truth
  again. Each node sends about 3800 batches, 9 MB, during the pause; a node's PUB queues
  1000 messages and the sockets some hundred kB more, so most are dropped.

Every wait polls for an invariant with a generous deadline that only catches a hang.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest
from ports import free_ports

pytest.importorskip("zmq")
pytest.importorskip("msgspec")
traces = pytest.importorskip("kvtier_tools.workloads.traces")

from kvtier.fleet.query import IndexClient  # noqa: E402 - needs the events extra
from kvtier.keys import key_from_int  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parent.parent
NODE_SCRIPT = Path(__file__).resolve().parent / "fleet_node.py"
DEADLINE_S = 120.0
NODES = ("n0", "n1", "n2")
REPLAY_BATCHES = {"n0": 10_000, "n1": 32, "n2": 10_000}
"""n1 keeps too few batches for a replay to fill the pause's gap: a snapshot heals it."""
WEIGHTS = {"GPU": 1.0, "CPU": 0.8, "DISK": 0.5}
SLICE = 60
"""Requests of the trace routed (a quiescent point every 20)."""


def environment() -> dict[str, str]:
    paths = [str(ROOT), str(ROOT / "tools"), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def read_json_line(stream: IO[str], what: str) -> dict[str, Any]:
    line = stream.readline()
    if not line:
        raise AssertionError(f"{what} ended without answering")
    return dict(json.loads(line))


class NodeProcess:
    """One node: its process, its ports (kept across restarts) and its disk directory."""

    def __init__(self, name: str, tmp_path: Path, ports: tuple[int, int]) -> None:
        self.name = name
        self.spec = {
            "block_size": 4096,
            "cpu": 16,
            "disk": 64,
            "disk_dir": str(tmp_path / name),
            "pub_port": ports[0],
            "replay_port": ports[1],
            "replay_batches": REPLAY_BATCHES[name],
        }
        self.process: subprocess.Popen[str] | None = None

    @property
    def argument(self) -> str:
        port, replay = self.spec["pub_port"], self.spec["replay_port"]
        return f"{self.name}=tcp://127.0.0.1:{port},tcp://127.0.0.1:{replay}"

    def start(self) -> int:
        self.process = subprocess.Popen(
            [sys.executable, str(NODE_SCRIPT), json.dumps(self.spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=environment(),
        )
        return int(self.answer()["incarnation"])

    def send(self, request: dict[str, Any]) -> None:
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()

    def answer(self) -> dict[str, Any]:
        assert self.process is not None and self.process.stdout is not None
        return read_json_line(self.process.stdout, f"node {self.name}")

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        self.send(request)
        return self.answer()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                self.ask({"op": "stop"})
                self.process.wait(timeout=60)
            except (AssertionError, OSError, subprocess.TimeoutExpired):
                self.kill()


def best_medium(media: list[str]) -> str:
    return max(media, key=lambda medium: WEIGHTS.get(medium, 0.0))


def index_view(client: IndexClient, keys: set[str]) -> dict[str, dict[str, str]]:
    """node -> {hex key -> best medium}, asked of the index one key at a time."""
    view: dict[str, dict[str, str]] = {name: {} for name in NODES}
    for key in sorted(keys):
        for match in client.score([bytes.fromhex(key)]):
            if match.matched_blocks == 1:
                view[match.node][key] = best_medium(list(match.per_tier))
    return view


def wait_until_equal(client: IndexClient, nodes: dict[str, NodeProcess], what: str) -> None:
    """Flush every node, then wait until the index holds exactly its truth."""
    truths = {name: node.ask({"op": "flush"})["truth"] for name, node in nodes.items()}
    expected = {
        name: {key: best_medium(media) for key, media in truth.items()}
        for name, truth in truths.items()
    }
    keys = {key for truth in truths.values() for key in truth}

    def entries_match() -> bool:
        found = {item["node"]: item for item in client.nodes()}
        return all(
            name in found
            and not found[name]["stale"]
            and found[name]["entries"] == len(truths[name])
            for name in nodes
        )

    poll(entries_match, f"{what}: each node's entries as many as it holds")
    poll(lambda: index_view(client, keys) == expected, f"{what}: the index equals the truth")


def poll(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}")
        time.sleep(0.05)


def trace_slice() -> Iterator[list[bytes]]:
    for number, request in enumerate(traces.read_mooncake()):
        if number == SLICE:
            return
        yield [bytes(key_from_int(hash_id)) for hash_id in request.hash_ids]


class DaemonLines:
    """The daemon's JSON lines, read by a thread as they come (its status every 0.2 s)."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: list[dict[str, Any]] = []
        self.reader = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.reader.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            if line.strip():
                self.lines.append(json.loads(line))

    def status_after(self, moment: float) -> dict[str, Any]:
        """The first status line stamped after `moment` (a state later than it)."""

        def found() -> bool:
            return any(x["event"] == "status" and x["time"] > moment for x in list(self.lines))

        poll(found, "a status line")
        return next(x for x in list(self.lines) if x["event"] == "status" and x["time"] > moment)


@pytest.fixture
def fleet(
    tmp_path: Path,
) -> Iterator[tuple[dict[str, NodeProcess], subprocess.Popen[str], str, DaemonLines]]:
    base = free_ports(2 * len(NODES))  # (distinct, and outside the ephemeral range)
    nodes = {
        name: NodeProcess(name, tmp_path, (base + 2 * i, base + 2 * i + 1))
        for i, name in enumerate(NODES)
    }
    daemon: subprocess.Popen[str] | None = None
    try:
        for node in nodes.values():
            node.start()
        command = [sys.executable, "-m", "kvtier.cli", "fleet", "index", "--json"]
        for node in nodes.values():
            command += ["--node", node.argument]
        command += ["--http", "127.0.0.1:0", "--probe-s", "0.5", "--unreachable-s", "300"]
        command += ["--status-s", "0.2"]
        daemon = subprocess.Popen(
            command, stdout=subprocess.PIPE, text=True, cwd=ROOT, env=environment()
        )
        assert daemon.stdout is not None
        ready = read_json_line(daemon.stdout, "the index daemon")
        assert ready["event"] == "ready"
        lines = DaemonLines(daemon.stdout)
        yield nodes, daemon, ready["http"], lines
    finally:
        if daemon is not None and daemon.poll() is None:
            daemon.send_signal(signal.SIGCONT)
            daemon.kill()
            daemon.wait()
        for node in nodes.values():
            node.stop()


def test_the_index_follows_a_fleet_through_restarts_and_a_pause(
    fleet: tuple[dict[str, NodeProcess], subprocess.Popen[str], str, DaemonLines],
) -> None:
    nodes, daemon, url, lines = fleet
    client = IndexClient(url)
    names = list(NODES)
    served = dict.fromkeys(names, 0)
    routed_by_prefix = 0

    # -- a trace slice routed by the index: quiescent points every 20 requests -------------
    for number, keys in enumerate(trace_slice(), start=1):
        ranked = [m for m in client.score(keys) if m.matched_blocks > 0]
        if ranked:
            target = ranked[0].node
            routed_by_prefix += 1
        else:
            target = min(names, key=lambda name: (served[name], name))
        served[target] += 1
        nodes[target].ask({"op": "put", "keys": [key.hex() for key in keys]})
        if number % 20 == 0:
            wait_until_equal(client, nodes, f"after {number} requests")
    assert routed_by_prefix > 0  # the trace repeats prefixes: the index found them

    # -- kill -9 a node, start it again: its memory is gone, its disk restored -------------
    victim = nodes["n2"]
    before = victim.ask({"op": "flush"})["truth"]
    assert any("CPU" in media for media in before.values())  # something only memory held
    victim.kill()
    victim.start()
    wait_until_equal(client, nodes, "after the restart")
    after = {key: best_medium(m) for key, m in victim.ask({"op": "flush"})["truth"].items()}
    assert set(after.values()) <= {"DISK"}
    assert index_view(client, set(before))["n2"] == after  # nothing it lost is reported

    # -- the index paused 10 s while the nodes put past every high-water mark --------------
    gaps_before = client.stats()["gaps"]
    before_pause = lines.status_after(time.time())["nodes"]
    daemon.send_signal(signal.SIGSTOP)
    paused_at = time.monotonic()
    try:
        for seed, node in enumerate(nodes.values()):
            node.send({"op": "bulk", "puts": 150, "blocks": 64, "key_bytes": 200, "seed": seed})
        for node in nodes.values():
            assert node.answer()["stored"] > 0
        time.sleep(max(0.0, 10.0 - (time.monotonic() - paused_at)))
    finally:
        daemon.send_signal(signal.SIGCONT)
    wait_until_equal(client, nodes, "after the pause")
    assert client.stats()["gaps"] > gaps_before  # batches were lost, and it noticed

    # -- a clean stop: the daemon's last line says how each node was healed ---------------
    daemon.send_signal(signal.SIGTERM)
    assert daemon.wait(timeout=60) == 0
    lines.reader.join(timeout=60)
    stopped = lines.lines[-1]
    assert stopped["event"] == "stopped" and stopped["signal"] == "SIGTERM"
    counters = stopped["nodes"]
    assert counters["n1"]["snapshots"] > before_pause["n1"]["snapshots"]  # it kept too few
    assert counters["n0"]["snapshots"] == before_pause["n0"]["snapshots"]  # replayed all
