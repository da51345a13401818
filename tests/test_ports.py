"""`ports.free_ports`: consecutive loopback ports below the ephemeral range, none held."""

from __future__ import annotations

import socket

from ports import HIGH, LOW, free_port, free_ports, port_is_free


def test_free_ports_are_consecutive_bindable_and_below_the_ephemeral_range() -> None:
    base = free_ports(6)
    assert base >= LOW and base + 6 <= HIGH < 32768
    held = []
    try:
        for port in range(base, base + 6):  # each can be bound, by a listener at once
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(listener)
            listener.bind(("127.0.0.1", port))
            listener.listen()
    finally:
        for listener in held:
            listener.close()


def test_a_held_port_is_not_free_and_is_never_chosen() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        port = free_port()
        listener.bind(("127.0.0.1", port))
        listener.listen()
        assert not port_is_free(port)
        assert all(free_port() != port for _ in range(200))
    assert port_is_free(port)
