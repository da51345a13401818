"""The `[events]` table of a config: whether and where a node publishes its KV events.

Off by default (no table, or `enabled = false`). When on, `Hierarchy.open` starts the fleet's
publisher (`kvtier.fleet`), which binds `endpoint` (a ZMQ PUB socket) and, if given,
`replay_endpoint` (a ROUTER socket serving missed batches), in vLLM's KV-events wire format.
Validating the table opens no socket and imports no ZMQ: an endpoint that cannot bind fails
at `Hierarchy.open`, naming it.
"""

from __future__ import annotations

from pydantic import field_validator, model_validator

from kvtier.config_fields import FrozenModel, config_error

ENDPOINT_SCHEMES = ("tcp://", "ipc://", "inproc://")
"""The ZMQ transports an endpoint may name."""
MAX_QUEUE_EVENTS = 10_000_000
"""The largest `queue_events` (events held for the publisher thread)."""
BLOCK_HASH_FORMATS = ("bytes", "vllm-int", "sglang-int")
"""The ways a key may be written on the wire (`EventsConfig.block_hashes`)."""
MAX_REPLAY_BATCHES = 1_000_000
"""The largest `replay_batches` (batches kept for the replay socket)."""


class EventsConfig(FrozenModel):
    """Where and what a node publishes (see the module docstring)."""

    enabled: bool = False
    endpoint: str = "tcp://*:5557"
    """The PUB socket's address, bound (vLLM's default)."""
    replay_endpoint: str = ""
    """The ROUTER socket's address, bound, for missed sequence numbers ("": no replay)."""
    topic: str = ""
    """The first frame of every message ("" as vLLM's default: subscribers take all)."""
    queue_events: int = 100_000
    """Events held between the chain and the publisher thread; past it new ones are dropped,
    counted, and seen by subscribers as a gap in the sequence numbers."""
    replay_batches: int = 10_000
    """Batches kept for the replay socket (the oldest go first)."""
    tiers: tuple[str, ...] = ()
    """The tiers whose blocks are announced, by name (empty: every tier)."""
    wire_block_size: int = 0
    """The `block_size` the events announce, in tokens as vLLM's consumers read it (kvtier's
    own block size is in bytes): the serving engine's tokens per block; 0 when unknown."""
    block_hashes: str = "bytes"
    """How a block's key is written in `block_hashes` (`BLOCK_HASH_FORMATS`): "bytes",
    kvtier's whole key (exact; the index's default); "vllm-int", the int vLLM's own events
    carry for that block (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`, vLLM's default), so a
    router joins kvtier's tiers to vLLM's device events; "sglang-int", the int64 SGLang's
    events carry for a page (`hash_str_to_int64`), which SGLang's own decoder requires."""
    auth_key_file: str = ""
    """A key file (as the shared tiers': `kvtier keys new PATH`): every message gets a
    fourth frame, its MAC (`kvtier.fleet.auth`). Off ("") by default: vLLM's consumers read
    three frames, and would not read a fourth."""
    auth_key_env: str = ""
    """Or the environment variable holding that key (hex)."""

    @model_validator(mode="after")
    def _one_key_source(self) -> EventsConfig:
        if self.auth_key_file and self.auth_key_env:
            raise config_error("auth_key", "give auth_key_file or auth_key_env, not both")
        return self

    @property
    def authenticated(self) -> bool:
        """Whether each message carries a MAC (a key is configured)."""
        return bool(self.auth_key_file or self.auth_key_env)

    @field_validator("endpoint", "replay_endpoint")
    @classmethod
    def _check_endpoint(cls, value: str, info: object) -> str:
        if value == "" and getattr(info, "field_name", "") == "replay_endpoint":
            return value
        if not value.startswith(ENDPOINT_SCHEMES) or len(value) == value.find("//") + 2:
            raise config_error(
                "endpoint", "expected a ZMQ address such as tcp://*:5557 or ipc:///tmp/kv.sock"
            )
        return value

    @field_validator("queue_events")
    @classmethod
    def _check_queue(cls, value: int) -> int:
        if not 1 <= value <= MAX_QUEUE_EVENTS:
            raise config_error("queue_events", f"expected 1 to {MAX_QUEUE_EVENTS}")
        return value

    @field_validator("replay_batches")
    @classmethod
    def _check_replay(cls, value: int) -> int:
        if not 1 <= value <= MAX_REPLAY_BATCHES:
            raise config_error("replay_batches", f"expected 1 to {MAX_REPLAY_BATCHES}")
        return value

    @field_validator("wire_block_size")
    @classmethod
    def _check_wire_block_size(cls, value: int) -> int:
        if value < 0:
            raise config_error("wire_block_size", "expected 0 (unknown) or a token count")
        return value

    @field_validator("block_hashes")
    @classmethod
    def _check_block_hashes(cls, value: str) -> str:
        if value not in BLOCK_HASH_FORMATS:
            raise config_error("block_hashes", f"expected one of {', '.join(BLOCK_HASH_FORMATS)}")
        return value

    @field_validator("tiers", mode="before")
    @classmethod
    def _tiers_as_tuple(cls, value: object) -> object:
        return tuple(value) if isinstance(value, list) else value
