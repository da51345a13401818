"""`kvtier fleet index`: its one-line errors for bad input, the nodes file, and a clean stop
on SIGINT (the end-to-end test, `test_fleet_e2e.py`, runs it against real nodes)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvtier.cli import main
from kvtier.errors import ConfigError

pytest.importorskip("zmq")
pytest.importorskip("msgspec")

from kvtier.cli.commands.fleet import nodes_from_file, parse_http
from kvtier.fleet.subscriber import NodeEndpoints

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["fleet", "index", *args])
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize(
    ("args", "line"),
    [
        ((), "kvtier: error: no node: give --node NAME=PUB[,REPLAY] or --nodes-file\n"),
        (("--node", "a"), "kvtier: error: node 'a': expected name=pub_endpoint"),
        (("--node", "a=http://x"), "kvtier: error: node 'a': 'http://x' is not a ZMQ address"),
        (
            ("--node", "a=tcp://127.0.0.1:1", "--node", "a=tcp://127.0.0.1:2"),
            "kvtier: error: node 'a' is given twice\n",
        ),
        (
            ("--node", "a=tcp://127.0.0.1:1", "--http", "nowhere"),
            "kvtier: error: --http 'nowhere': expected HOST:PORT",
        ),
        (
            ("--node", "a=tcp://127.0.0.1:1", "--probe-s", "0"),
            "kvtier: error: probe_after_s must be > 0, got 0.0\n",
        ),
    ],
)
def test_bad_input_is_one_line_naming_it(args: tuple[str, ...], line: str) -> None:
    code, stdout, stderr = run(*args)
    assert code == 2 and stdout == ""
    assert stderr.startswith(line) and stderr.count("\n") == 1


def test_an_http_address_that_cannot_bind_is_named() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        code, _, stderr = run("--node", "a=tcp://127.0.0.1:1", "--http", f"127.0.0.1:{port}")
    assert code == 2
    assert stderr.startswith(f"kvtier: error: fleet query endpoint: cannot bind 127.0.0.1:{port}")


def test_the_nodes_file_and_its_errors(tmp_path: Path) -> None:
    good = tmp_path / "fleet.toml"
    good.write_text(
        '[[nodes]]\nname = "a"\nendpoint = "tcp://10.0.0.1:5557"\n'
        'replay_endpoint = "tcp://10.0.0.1:5558"\n'
        '[[nodes]]\nname = "b"\nendpoint = "tcp://10.0.0.2:5557"\n'
    )
    assert nodes_from_file(good) == [
        NodeEndpoints("a", "tcp://10.0.0.1:5557", "tcp://10.0.0.1:5558"),
        NodeEndpoints("b", "tcp://10.0.0.2:5557"),
    ]
    bad = tmp_path / "bad.toml"
    bad.write_text('[[nodes]]\nname = "a"\nendpont = "tcp://10.0.0.1:5557"\n')
    with pytest.raises(ConfigError, match=r"bad\.toml: nodes\[0\]: expected name, endpoint"):
        nodes_from_file(bad)
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    with pytest.raises(ConfigError, match=r"empty\.toml: expected \[\[nodes\]\] tables"):
        nodes_from_file(empty)
    assert parse_http("[::1]:0") == ("::1", 0)
    with pytest.raises(ConfigError, match=r"--http '127\.0\.0\.1:70000'"):
        parse_http("127.0.0.1:70000")


@pytest.mark.slow
def test_sigint_stops_the_daemon_cleanly() -> None:
    """Ready, then SIGINT: a `stopped` line naming it, exit status 0."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "kvtier.cli", "fleet", "index", "--json"]
    command += ["--node", "a=tcp://127.0.0.1:1,tcp://127.0.0.1:2", "--http", "127.0.0.1:0"]
    daemon = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    try:
        assert daemon.stdout is not None
        ready = json.loads(daemon.stdout.readline())
        assert ready["event"] == "ready" and ready["http"].startswith("http://127.0.0.1:")
        daemon.send_signal(signal.SIGINT)
        assert daemon.wait(timeout=60) == 0
        stopped = json.loads(daemon.stdout.read().splitlines()[-1])
        assert stopped["event"] == "stopped" and stopped["signal"] == "SIGINT"
        assert stopped["index"]["nodes"] == 0 and list(stopped["nodes"]) == ["a"]
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
