"""kvtier in a fleet: a node's KV events, in vLLM's wire format (`events.py`), published over
ZMQ (`publisher.py`, which also answers snapshots of the node's contents); the fleet's side:
`subscriber.py` feeds the prefix index (`index.py`) from N nodes, `query.py` serves it over
HTTP (`kvtier fleet index` runs both). Needs the `events` extra (pyzmq, msgspec); importing
this package imports neither, its modules do.

The chain emits plain objects (`kvtier.manager.events`); this package imports them, never
the reverse (`tests/test_layout.py`).
"""
