"""The fleet index's HTTP query endpoint (issue 32, item 3): real HTTP over loopback on a port
the kernel picks; scores, loads, stats and nodes; malformed JSON, bad hex, an oversized body,
an unknown path, each one status and one line, and the server still answers after."""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("msgspec")

from kvtier.errors import FleetQueryError
from kvtier.fleet.events import BlockStored, KVEventBatch, block_stored
from kvtier.fleet.index import SEQ_BITS, PrefixIndex
from kvtier.fleet.query import MAX_BODY_BYTES, MAX_KEYS, IndexClient, QueryServer

pytestmark = pytest.mark.timeout(120)


def k(i: int) -> bytes:
    return i.to_bytes(8, "big") + b"\0\0\0\0"


def stored(keys: list[bytes], medium: str) -> BlockStored:
    return block_stored(keys, medium, block_size=16)


@pytest.fixture
def server() -> Iterator[QueryServer]:
    index = PrefixIndex(load_weight=1.0)
    index.apply("gpu", 5 << SEQ_BITS, KVEventBatch(ts=0.0, events=[stored([k(1), k(2)], "GPU")]))
    index.apply("cpu", 6 << SEQ_BITS, KVEventBatch(ts=0.0, events=[stored([k(1)], "CPU")]))
    with QueryServer(index, "127.0.0.1", 0) as serving:
        yield serving


def raw(
    server: QueryServer, method: str, path: str, body: bytes | None, headers: dict[str, str]
) -> tuple[int, dict[str, Any]]:
    """One request as bytes, the status and the JSON answer."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def post(server: QueryServer, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
    return raw(server, "POST", path, body, {"Content-Type": "application/json"})


def test_the_port_is_chosen_and_a_score_ranks_the_nodes(server: QueryServer) -> None:
    assert server.port != 0
    status, answer = post(
        server, "/v1/score", json.dumps({"keys": [k(1).hex(), k(2).hex()]}).encode()
    )
    assert status == 200
    assert answer == {
        "keys": 2,
        "nodes": [
            {"node": "gpu", "matched_blocks": 2, "per_tier": {"GPU": 2}, "score": 2.0, "load": 0.0},
            {"node": "cpu", "matched_blocks": 1, "per_tier": {"CPU": 1}, "score": 0.8, "load": 0.0},
        ],
    }


def test_the_client_scores_sets_loads_and_reads_stats_and_nodes(server: QueryServer) -> None:
    client = IndexClient(server.url)
    client.set_loads({"gpu": 1.5})
    ranked = client.score([k(1), k(2)])
    assert [(m.node, m.matched_blocks, m.load) for m in ranked] == [
        ("cpu", 1, 0.0),
        ("gpu", 2, 1.5),
    ]
    assert ranked[1].score == pytest.approx(0.5)
    assert [m.node for m in client.score([k(1)], nodes=["gpu", "ghost"])] == ["gpu"]
    stats = client.stats()
    assert (stats["nodes"], stats["entries"], stats["batches_applied"]) == (2, 3, 2)
    nodes = client.nodes()
    assert [(n["node"], n["entries"], n["load"]) for n in nodes] == [
        ("cpu", 1, 0.0),
        ("gpu", 2, 1.5),
    ]
    assert nodes[1]["expected_seq"] == (5 << SEQ_BITS) + 1


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (b"{not json", "malformed JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"keys": ["zz"]}', "keys[0]"),
        (b'{"keys": ["00", "abc"]}', "keys[1]"),
        (b'{"keys": ["00 11"]}', "keys[0]"),
        (b'{"keys": [""]}', "keys[0]"),
        (('{"keys": ["' + "00" * 256 + '"]}').encode(), "keys[0]"),
        (b'{"keys": "00"}', "keys must be a list"),
        (b'{"key": ["00"]}', "unknown field 'key'"),
        (b"{}", "missing field 'keys'"),
        (b'{"keys": [], "nodes": [1]}', "nodes"),
        (b"\xff\xfe", "malformed JSON"),
    ],
)
def test_a_bad_score_request_is_a_400_naming_what_is_wrong(
    server: QueryServer, body: bytes, named: str
) -> None:
    status, answer = post(server, "/v1/score", body)
    assert status == 400
    assert named in answer["error"]
    assert "\n" not in answer["error"]
    assert post(server, "/v1/score", b'{"keys": []}')[0] == 200  # still serving


def test_a_bad_load_is_a_400_naming_the_node(server: QueryServer) -> None:
    for loads, named in (('{"gpu": "high"}', "'gpu'"), ('{"gpu": NaN}', "'gpu'"), ("[1]", "loads")):
        status, answer = post(server, "/v1/load", f'{{"loads": {loads}}}'.encode())
        assert (status, named in answer["error"]) == (400, True), answer
    assert IndexClient(server.url).nodes()[1]["load"] == 0.0


def exchange(server: QueryServer, request: bytes) -> bytes:
    """Send `request` as it is on a socket; what comes back until the server closes. (The
    server reads all that is sent, so its close is a FIN, never a reset.)"""
    connection = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    try:
        connection.sendall(request)
        reply = b""
        while chunk := connection.recv(65536):
            reply += chunk
        return reply
    finally:
        connection.close()


def test_an_oversized_body_is_a_413_unread(server: QueryServer) -> None:
    """The size is refused from the header: the body is never read (nor sent here)."""
    head = f"POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Length: {MAX_BODY_BYTES + 1}\r\n\r\n"
    reply = exchange(server, head.encode())  # no body byte: none is left unread at the close
    assert reply.startswith(b"HTTP/1.1 413")
    assert f"at most {MAX_BODY_BYTES}".encode() in reply
    assert post(server, "/v1/score", b'{"keys": []}')[0] == 200


def test_too_many_keys_is_a_413(server: QueryServer) -> None:
    body = json.dumps({"keys": ["00"] * (MAX_KEYS + 1)}).encode()
    assert len(body) < MAX_BODY_BYTES
    status, answer = post(server, "/v1/score", body)
    assert status == 413
    assert str(MAX_KEYS) in answer["error"]


def test_a_post_without_length_an_unknown_path_and_a_wrong_method(server: QueryServer) -> None:
    assert exchange(server, b"POST /v1/score HTTP/1.1\r\nHost: x\r\n\r\n").startswith(
        b"HTTP/1.1 411"
    )
    assert raw(server, "GET", "/v2/nothing", None, {})[0] == 404
    assert raw(server, "GET", "/v1/score", None, {})[0] == 405
    assert raw(server, "POST", "/v1/stats", b"{}", {})[0] == 405


def test_the_client_raises_one_line_naming_the_status_and_the_url(server: QueryServer) -> None:
    with pytest.raises(FleetQueryError, match=r"/v1/load: 400 load of 'gpu'"):
        IndexClient(server.url).set_loads({"gpu": float("inf")})
    with pytest.raises(FleetQueryError, match="http://"):
        IndexClient("ftp://x")


def test_a_port_in_use_fails_at_construction_naming_it(server: QueryServer) -> None:
    with pytest.raises(FleetQueryError, match=f"127.0.0.1:{server.port}"):
        QueryServer(server.index, "127.0.0.1", server.port)


def test_a_closed_server_releases_its_port() -> None:
    first = QueryServer(PrefixIndex(), "127.0.0.1", 0).start()
    port = first.port
    assert IndexClient(first.url).stats()["nodes"] == 0
    first.close()
    with pytest.raises(FleetQueryError, match=str(port)):
        IndexClient(first.url).stats()
    QueryServer(PrefixIndex(), "127.0.0.1", port).close()  # bound again


def test_past_the_connection_bound_a_connection_is_closed_unanswered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("kvtier.fleet.query.MAX_CONNECTIONS", 1)
    with QueryServer(PrefixIndex(), "127.0.0.1", 0) as server:
        held = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        held.request("GET", "/v1/stats")  # keep-alive: its thread waits for the next request
        assert held.getresponse().read()
        assert exchange(server, b"") == b""  # closed unanswered (sending nothing: a FIN, no RST)
        assert server.refused == 1
        held.request("GET", "/v1/nodes")  # the held one is still served
        assert json.loads(held.getresponse().read()) == {"nodes": []}
        held.close()
