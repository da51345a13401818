"""A real Redis for tests, started by `scripts/redis.sh` on loopback with a password (on
ports chosen free at run time, so a user's server and another test run are left alone);
skipped with the script's reason where Redis cannot be installed."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from ports import free_ports

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "redis.sh"


# Ports chosen free when this run starts (five in a row: standalone, TLS, and the cluster's
# three), or given with these variables, so that a user's server is left alone and two test
# runs on one machine (two clones, two CI jobs) never meet.
_BASE = free_ports(5, cluster_bus=True)
PORT = int(os.environ.get("KVTIER_TEST_REDIS_PORT") or _BASE)
TLS_PORT = int(os.environ.get("KVTIER_TEST_REDIS_TLS_PORT") or _BASE + 1)
CLUSTER_PORT = int(os.environ.get("KVTIER_TEST_REDIS_CLUSTER_PORT") or _BASE + 2)  # and 2 after
PASSWORD_ENV = "KVTIER_TEST_REDIS_PASSWORD"


class Server:
    """A Redis of `scripts/redis.sh`, for these tests."""

    def __init__(self, directory: Path) -> None:
        self.env = {
            **os.environ,
            "KVTIER_REDIS_DIR": str(directory),
            "KVTIER_REDIS_PORT": str(PORT),
            "KVTIER_REDIS_CLUSTER_PORT": str(CLUSTER_PORT),
            "KVTIER_REDIS_TLS_PORT": str(TLS_PORT),
            "KVTIER_REDIS_MAXMEMORY": "64mb",
        }
        self.password = ""

    def run(self, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(SCRIPT), command], env=self.env, capture_output=True, text=True, timeout=300
        )

    def start(self) -> None:
        done = self.run("start")
        if done.returncode == 3:
            pytest.skip(f"no Redis here: {done.stderr.strip()}")
        assert done.returncode == 0, done.stderr
        self.password = (Path(self.env["KVTIER_REDIS_DIR"]) / "password").read_text().strip()

    def stop(self) -> None:
        assert self.run("stop").returncode == 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{PORT}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=PORT, password=self.password)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = Server(tmp_path_factory.mktemp("redis"))
    server.start()
    os.environ[PASSWORD_ENV] = server.password
    try:
        yield server
    finally:
        server.run("cluster-stop")
        server.run("tls-stop")
        server.stop()


@pytest.fixture
def redis_clean(server: Server) -> Iterator[None]:
    """Every test starts from an empty, running server with its usual memory bound."""
    server.start()
    with server.client() as client:
        client.flushall()
        client.config_set("maxmemory", "64mb")
        client.config_set("maxmemory-policy", "allkeys-lru")
    yield
