"""Keyed authentication of event batches, for fleets whose event network is not trusted.

Off by default: vLLM's consumers read exactly three frames (topic, sequence, payload), and
an authenticated message has a fourth, so only a kvtier consumer reads it. On (`[events]`
`auth_key_file` or `auth_key_env`), every message, replayed ones too, carries a fourth frame:
the key id (8 bytes, as the shared tiers write it: derived from the key, says nothing about
it) and HMAC-SHA256 over the topic, the sequence number and the payload, with a key derived
(HKDF, `ValueKey.derive`) from the shared tiers' key for the purpose "events" and the chain's
namespace (model, block size, tenant). A node that lacks the key cannot make a batch a
consumer accepts; nor can a node of another model or tenant. No key byte is ever sent or
shown.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from pathlib import Path

from kvtier.config_events import EventsConfig
from kvtier.tiers.shared.auth import KEY_ID_BYTES, ValueKey, load_key_env, load_key_file

MAC_BYTES = 32
"""HMAC-SHA256."""
PURPOSE = b"kv events"


class BatchAuth:
    """Signs and checks the messages of one namespace with one key."""

    __slots__ = ("_mac_key", "key_id")

    def __init__(self, key: ValueKey, namespace: str) -> None:
        self.key_id = key.key_id
        self._mac_key = key.derive(PURPOSE, namespace)

    def __repr__(self) -> str:
        return f"BatchAuth(id={self.key_id.hex()})"

    def _mac(self, topic: bytes, seq: bytes, payload: bytes) -> bytes:
        message = len(topic).to_bytes(4, "big") + topic + seq + payload
        return hmac.digest(self._mac_key, message, hashlib.sha256)

    def sign(self, topic: bytes, seq: bytes, payload: bytes) -> bytes:
        """The fourth frame of a message."""
        return self.key_id + self._mac(topic, seq, payload)

    def verify(self, frames: Sequence[bytes]) -> bool:
        """Whether `frames` (topic, seq, payload, tag) were signed with this key."""
        if len(frames) != 4 or len(frames[3]) != KEY_ID_BYTES + MAC_BYTES:
            return False
        topic, seq, payload, tag = frames
        if not hmac.compare_digest(tag[:KEY_ID_BYTES], self.key_id):
            return False
        return hmac.compare_digest(tag[KEY_ID_BYTES:], self._mac(topic, seq, payload))


def auth_from_config(events: EventsConfig, namespace: str) -> BatchAuth | None:
    """The `[events]` key's `BatchAuth` for `namespace` (None: no key, vLLM's default).
    ConfigError naming the key file or variable (never the key) when it cannot be loaded."""
    if events.auth_key_file:
        return BatchAuth(load_key_file(Path(events.auth_key_file)), namespace)
    if events.auth_key_env:
        return BatchAuth(load_key_env(events.auth_key_env), namespace)
    return None
