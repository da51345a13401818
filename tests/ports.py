"""Loopback ports for the tests' servers, chosen free at run time below Linux's ephemeral
range (32768 on): a port taken with `bind(("127.0.0.1", 0))` comes from that range, where
any outgoing connection (a ZMQ or Redis client, another test run's) can take it between the
choice and the server's own bind ("Address already in use"). Below it only an explicit
bind can, and `free_ports` checks none holds the ports at the choice."""

from __future__ import annotations

import random
import socket

LOW, HIGH = 10_000, 22_000
"""Where ports are chosen: below the ephemeral range even with Redis Cluster's bus ports
(each port + 10000)."""


def port_is_free(port: int) -> bool:
    """Whether nothing listens on, or holds, 127.0.0.1:`port` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int, *, cluster_bus: bool = False) -> int:
    """The first of `count` consecutive free ports on loopback, chosen at random in
    [LOW, HIGH). `cluster_bus`: Redis Cluster's bus ports (each port + 10000) are free too."""
    rng = random.SystemRandom()
    for _ in range(1000):
        base = rng.randrange(LOW, HIGH - count)
        wanted = [base + i for i in range(count)]
        if cluster_bus:
            wanted += [port + 10_000 for port in wanted]
        if all(port_is_free(port) for port in wanted):
            return base
    raise RuntimeError(f"no {count} consecutive free ports on 127.0.0.1 in 1000 tries")


def free_port() -> int:
    """One free loopback port (`free_ports`)."""
    return free_ports(1)
