"""kvtier in a fleet: a node's KV events, in vLLM's wire format (`events.py`), published over
ZMQ (`publisher.py`); and the fleet's side, a prefix index of what every node holds on which
medium (`index.py`), queried over HTTP (`query.py`). Needs the `events` extra (pyzmq,
msgspec); importing this package imports neither, its modules do.

The chain emits plain objects (`kvtier.manager.events`); this package imports them, never
the reverse (`tests/test_layout.py`).
"""
