"""The fleet index's HTTP query endpoint, and a small client for routers and tests.

`QueryServer(index, host, port).start()` serves a `PrefixIndex` from a thread (the stdlib's
`ThreadingHTTPServer`: one thread per connection, HTTP/1.1 keep-alive), bound to
`host:port` (loopback by default; port 0 picks a free one: `.port`); `.close()` stops it.
JSON in, JSON out; every error is a status with `{"error": "<one line>"}`, and no request
can crash the server (an unexpected failure is a 500, logged).

    POST /v1/score   {"keys": ["<hex>", ...], "nodes": ["a", "b"]}     ("nodes" optional)
      200 {"keys": 3, "nodes": [
             {"node": "a", "matched_blocks": 2, "per_tier": {"GPU": 1, "CPU": 1},
              "score": 1.8, "load": 0.0},
             {"node": "b", "matched_blocks": 0, "per_tier": {}, "score": 0.0, "load": 0.0}]}
      The request's block keys in prefix order, each its bytes in hex (kvtier's OffloadKey,
      as the events carry them; a vLLM int hash as its 8 bytes, `index.key_of`). Nodes
      ranked best first (`PrefixIndex.score`): a node never heard of, or stale, is absent.
    POST /v1/load    {"loads": {"a": 3, "b": 0.5}}
      200 {"loads": 2}  each node's load, for the score's load term.
    GET  /v1/stats   200 the `IndexStats` fields: {"nodes": 3, "stale_nodes": 0, ...}
    GET  /v1/nodes   200 {"nodes": [{"node": "a", "stale": false, "entries": 1200,
                          "incarnation": 77, "expected_seq": 330712481890, "load": 0.0}]}

Errors: 400 malformed JSON, a missing or unknown field, a key that is not hex of 1 to 255
bytes (named by its position), a bad load; 404 an unknown path; 405 a wrong method; 411 a
POST without Content-Length; 413 a body over `MAX_BODY_BYTES` or more than `MAX_KEYS` keys.
Nothing on this endpoint changes what the index holds: only its events do.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import re
import socket
import threading
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast
from urllib.parse import urlsplit

from kvtier.errors import FleetQueryError, KvtierError
from kvtier.fleet.index import NodeMatch, PrefixIndex, key_of

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 5590
"""A daemon's default port (the events' 5557 is vLLM's)."""
MAX_BODY_BYTES = 8 << 20
"""A larger request body is refused (413) unread."""
MAX_KEYS = 100_000
"""Most keys in one score request."""
MAX_NODES = 4096
"""Most node names in one request."""
MAX_CONNECTIONS = 256
"""Most connections served at once (a thread each)."""
IDLE_TIMEOUT_S = 30.0
"""A connection idle (or a body stalled) this long is closed."""

_HEX = re.compile(r"(?:[0-9a-fA-F]{2}){1,255}")


class _BadRequest(Exception):
    """A request the endpoint refuses: its status and one line."""

    def __init__(self, status: int, line: str) -> None:
        super().__init__(line)
        self.status = status
        self.line = line


def _shown(value: object, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _parse_keys(value: object) -> list[bytes]:
    """The "keys" field: a list of hex strings, as bytes; _BadRequest naming the first bad one."""
    if not isinstance(value, list):
        raise _BadRequest(400, f"keys must be a list of hex strings, got {_shown(value)}")
    if len(value) > MAX_KEYS:
        raise _BadRequest(413, f"keys: {len(value)} keys, at most {MAX_KEYS}")
    keys = []
    for position, item in enumerate(value):
        if not isinstance(item, str) or _HEX.fullmatch(item) is None:
            raise _BadRequest(
                400, f"keys[{position}] must be hex of 1 to 255 bytes, got {_shown(item)}"
            )
        keys.append(bytes.fromhex(item))
    return keys


def _parse_nodes(value: object) -> list[str] | None:
    if value is None:
        return None
    if (
        not isinstance(value, list)
        or len(value) > MAX_NODES
        or not all(isinstance(item, str) for item in value)
    ):
        raise _BadRequest(400, f"nodes must be a list of at most {MAX_NODES} names")
    return value


def _fields(body: object, required: str, optional: tuple[str, ...] = ()) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise _BadRequest(400, f"the body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - {required, *optional})
    if unknown:
        raise _BadRequest(400, f"unknown field {unknown[0]!r}")
    if required not in body:
        raise _BadRequest(400, f"missing field {required!r}")
    return body


def _match_json(match: NodeMatch) -> dict[str, Any]:
    return {
        "node": match.node,
        "matched_blocks": match.matched_blocks,
        "per_tier": match.per_tier,
        "score": match.score,
        "load": match.load,
    }


class _Handler(BaseHTTPRequestHandler):
    """One connection's requests; `server.index` is the index asked."""

    protocol_version = "HTTP/1.1"
    timeout = IDLE_TIMEOUT_S
    server_version = "kvtier-fleet-index"

    @property
    def index(self) -> PrefixIndex:
        return cast(_Server, self.server).index

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def _serve(self, method: str) -> None:
        self._body_read = False
        try:
            routes = {
                ("GET", "/v1/stats"): self._stats,
                ("GET", "/v1/nodes"): self._nodes,
                ("POST", "/v1/score"): self._score,
                ("POST", "/v1/load"): self._load,
            }
            path = self.path.split("?", 1)[0]
            route = routes.get((method, path))
            if route is None:
                known = {route_path for _, route_path in routes}
                status = 405 if path in known else 404
                raise _BadRequest(status, f"{method} {_shown(path)}: no such endpoint")
            self._send(200, route())
        except _BadRequest as refused:
            self.close_connection = True  # never read what is left of a body as a request
            try:
                self._drain()
            except OSError:
                return
            self._send(refused.status, {"error": refused.line})
        except OSError as error:  # the client went away, or stalled past the timeout
            log.debug("kvtier fleet query: a connection failed: %s", error)
            self.close_connection = True
        except Exception as error:  # never let one request take the server down
            log.warning("kvtier fleet query: %s %s failed: %r", method, self.path, error)
            self.close_connection = True
            self._send(500, {"error": f"internal error: {type(error).__name__}"})

    def _body(self) -> object:
        length_header = self.headers.get("Content-Length")
        if length_header is None:
            raise _BadRequest(411, "a POST needs a Content-Length")
        try:
            length = int(length_header)
        except ValueError:
            raise _BadRequest(400, f"bad Content-Length {_shown(length_header)}") from None
        if length < 0:
            raise _BadRequest(400, f"bad Content-Length {length}")
        if length > MAX_BODY_BYTES:
            raise _BadRequest(413, f"body of {length} bytes, at most {MAX_BODY_BYTES}")
        data = self.rfile.read(length)
        self._body_read = True
        if len(data) != length:
            raise OSError(f"body truncated at {len(data)} of {length} bytes")
        try:
            return json.loads(data)
        except (ValueError, RecursionError) as error:
            line = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise _BadRequest(400, f"malformed JSON: {line}") from None

    def _drain(self) -> None:
        """Read an unread body of an allowed size, so that the close after an error answer is
        a FIN (a close with unread bytes is a reset, which may lose the answer)."""
        length = self.headers.get("Content-Length", "")
        if self._body_read or not length.isdigit() or int(length) > MAX_BODY_BYTES:
            return
        self.rfile.read(int(length))
        self._body_read = True

    def _score(self) -> dict[str, Any]:
        body = _fields(self._body(), "keys", ("nodes",))
        keys = _parse_keys(body["keys"])
        nodes = _parse_nodes(body.get("nodes"))
        matches = self.index.score(keys, nodes)
        return {"keys": len(keys), "nodes": [_match_json(match) for match in matches]}

    def _load(self) -> dict[str, Any]:
        loads = _fields(self._body(), "loads")["loads"]
        if not isinstance(loads, dict) or len(loads) > MAX_NODES:
            raise _BadRequest(400, f"loads must be an object of at most {MAX_NODES} nodes")
        for node, load in loads.items():
            if isinstance(load, bool) or not isinstance(load, int | float):
                raise _BadRequest(400, f"load of {node!r} must be a number, got {_shown(load)}")
            if not math.isfinite(load):
                raise _BadRequest(400, f"load of {node!r} must be finite, got {load!r}")
        try:
            for node, load in loads.items():
                self.index.set_load(node, load)
        except KvtierError as error:
            raise _BadRequest(400, str(error)) from None
        return {"loads": len(loads)}

    def _stats(self) -> dict[str, Any]:
        return asdict(self.index.stats())

    def _nodes(self) -> dict[str, Any]:
        return {"nodes": [asdict(info) for info in self.index.node_info()]}

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
        except OSError as error:
            log.debug("kvtier fleet query: an answer was not sent: %s", error)
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("kvtier fleet query: " + format, *args)


class _Server(ThreadingHTTPServer):
    """One thread per connection, at most MAX_CONNECTIONS at once (past it a connection is
    closed unanswered, and counted)."""

    daemon_threads = True
    index: PrefixIndex

    def __init__(self, address: tuple[str, int], handler: type[_Handler]) -> None:
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.refused = 0

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.refused += 1
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("kvtier fleet query: a connection from %s failed", client_address)


class _Server6(_Server):
    address_family = socket.AF_INET6


class QueryServer:
    """A `PrefixIndex` served over HTTP (see the module docstring): bound at construction,
    serving from `start` until `close`."""

    def __init__(self, index: PrefixIndex, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT):
        """FleetQueryError naming `host:port` when it cannot be bound."""
        kind = _Server6 if ":" in host else _Server
        try:
            self._server = kind((host, port), _Handler)
        except (OSError, OverflowError) as error:
            reason = getattr(error, "strerror", None) or str(error)
            raise FleetQueryError(
                f"fleet query endpoint: cannot bind {host}:{port}: {reason}"
            ) from None
        self._server.index = index
        self.index = index
        self.host = host
        self.port: int = self._server.server_address[1]
        """The port bound (the one chosen when 0 was asked)."""
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="kvtier-fleet-query", daemon=True
        )

    @property
    def url(self) -> str:
        """The endpoint's base URL (`IndexClient`'s argument)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def refused(self) -> int:
        """Connections closed unanswered because MAX_CONNECTIONS were being served."""
        return self._server.refused

    def start(self) -> QueryServer:
        """Serve from a thread; returns self."""
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and release the port (open connections' threads end on their own)."""
        if self._thread.ident is not None:
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()

    def __enter__(self) -> QueryServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()


class IndexClient:
    """Asks a `QueryServer` (a connection per call; thread-safe). Every failure is a
    FleetQueryError naming the URL, and the server's status and line when it answered."""

    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise FleetQueryError(f"index URL must be http://HOST:PORT, got {url!r}")
        self.url = url.rstrip("/")
        self._host = parts.hostname
        self._port = parts.port or DEFAULT_PORT
        self.timeout_s = timeout_s

    def score(
        self, keys: Sequence[bytes | int], nodes: Sequence[str] | None = None
    ) -> list[NodeMatch]:
        """The ranked nodes for `keys` (bytes, or vLLM's int hashes), best first."""
        body: dict[str, Any] = {"keys": [key_of(key).hex() for key in keys]}
        if nodes is not None:
            body["nodes"] = list(nodes)
        answer = self._call("POST", "/v1/score", body)
        return [
            NodeMatch(
                item["node"], item["matched_blocks"], item["per_tier"], item["score"], item["load"]
            )
            for item in answer["nodes"]
        ]

    def set_loads(self, loads: Mapping[str, float]) -> None:
        """Each node's load, for the score's load term."""
        self._call("POST", "/v1/load", {"loads": dict(loads)})

    def stats(self) -> dict[str, Any]:
        """The index's `IndexStats`, as a dict."""
        return self._call("GET", "/v1/stats")

    def nodes(self) -> list[dict[str, Any]]:
        """Each node's state (`NodeInfo` fields)."""
        return cast(list[dict[str, Any]], self._call("GET", "/v1/nodes")["nodes"])

    def _call(self, method: str, path: str, body: object = None) -> dict[str, Any]:
        connection = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout_s)
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {} if data is None else {"Content-Type": "application/json"}
            connection.request(method, path, body=data, headers=headers)
            response = connection.getresponse()
            raw = response.read()
        except OSError as error:
            raise FleetQueryError(f"{self.url}{path}: {error}") from None
        finally:
            connection.close()
        try:
            answer = json.loads(raw)
        except ValueError:
            raise FleetQueryError(f"{self.url}{path}: {response.status}, not JSON") from None
        if response.status != 200:
            line = answer.get("error", "") if isinstance(answer, dict) else ""
            raise FleetQueryError(f"{self.url}{path}: {response.status} {line}")
        return cast(dict[str, Any], answer)
