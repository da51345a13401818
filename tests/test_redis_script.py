"""`scripts/redis.sh status` says in one line whether its server runs (and where, which
process), with the exit status scripts test: 0 when it answers, 1 when not."""

from __future__ import annotations

import re
from pathlib import Path

from ports import free_port
from redis_helpers import PORT, Server


def test_status_of_a_running_server_is_one_line_with_its_pid(server: Server) -> None:
    server.start()
    done = server.run("status")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout
    found = re.fullmatch(rf"running on 127\.0\.0\.1:{PORT}, pid (\d+) \(files in .+\)", lines[0])
    assert found is not None, lines
    with server.client() as client:
        assert int(found.group(1)) == client.info("server")["process_id"]


def test_status_of_no_server_says_so_and_fails(server: Server, tmp_path: Path) -> None:
    """(`server` only makes sure redis-cli is installed: it is not asked.)"""
    port = free_port()
    nobody = Server(tmp_path)
    nobody.env["KVTIER_REDIS_PORT"] = str(port)
    done = nobody.run("status")
    assert done.returncode == 1
    assert done.stdout == f"not running on 127.0.0.1:{port}\n"
