"""Offload keys: a block hash plus the KV-cache group it belongs to, packed in one `bytes`.

Packing (rather than a tuple) keeps keys cheap to hash and compare and free of GC overhead,
which matters because every bookkeeping operation is a dict lookup on a key.
"""

from __future__ import annotations

from typing import NewType

from kvtier.errors import KeyFormatError

OffloadKey = NewType("OffloadKey", bytes)
"""A block hash with its KV-group index appended (4 bytes, big-endian, unsigned)."""

GROUP_IDX_BYTES = 4
SGLANG_PAGE_TAG = b"\x01"
"""The first byte of a key made from an SGLang page hash (a 64-digit hex digest), its 32
bytes following: the SGLang backend makes such keys (`page_key`), the fleet's events read
SGLang's int64 back out of them (`[events] block_hashes = "sglang-int"`)."""
_MAX_GROUP_IDX = (1 << (8 * GROUP_IDX_BYTES)) - 1

MIN_KEY_BYTES = 1
"""The shortest key any tier accepts."""
MAX_KEY_BYTES = 255
"""The longest key any tier accepts: enough for a 32-byte hash with its group index many
times over, short enough for a disk tier's fixed-size block header and LMDB's key limit."""


def describe_key(key: object, limit: int = 24) -> str:
    """A short printable form of a (possibly malformed) key, for error messages."""
    if isinstance(key, bytes | bytearray | memoryview):
        data = bytes(key)
        shown = data[:limit].hex()
        return f"{shown}...({len(data)} bytes)" if len(data) > limit else (shown or "b''")
    text = repr(key)
    return text if len(text) <= 2 * limit else text[: 2 * limit] + "..."


def check_key(key: object, what: str = "key") -> OffloadKey:
    """`key` as an `OffloadKey`, or a KeyFormatError naming it and what is wrong: a key is
    `bytes` of MIN_KEY_BYTES to MAX_KEY_BYTES bytes. Every entry point of kvtier checks its
    keys with this before it changes any state, so one bad key never costs the good ones."""
    if not isinstance(key, bytes):
        raise KeyFormatError(f"{what} must be bytes, got {type(key).__name__} {describe_key(key)}")
    if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
        raise KeyFormatError(
            f"{what} must have {MIN_KEY_BYTES} to {MAX_KEY_BYTES} bytes, got {len(key)}: "
            f"{describe_key(key)}"
        )
    return OffloadKey(key)


def make_offload_key(block_hash: bytes, group_idx: int = 0) -> OffloadKey:
    """Pack `block_hash` and `group_idx` into an `OffloadKey`."""
    if not isinstance(block_hash, bytes | bytearray | memoryview):
        raise KeyFormatError(f"block_hash must be bytes, got {type(block_hash).__name__}")
    if isinstance(group_idx, bool) or not isinstance(group_idx, int):
        raise KeyFormatError(f"group_idx must be an int, got {type(group_idx).__name__}")
    if not 0 <= group_idx <= _MAX_GROUP_IDX:
        raise KeyFormatError(f"group_idx must be in [0, {_MAX_GROUP_IDX}], got {group_idx}")
    return check_key(bytes(block_hash) + group_idx.to_bytes(GROUP_IDX_BYTES, "big"), "offload key")


def split_offload_key(key: OffloadKey) -> tuple[bytes, int]:
    """Unpack an `OffloadKey` into `(block_hash, group_idx)`; the inverse of `make_offload_key`."""
    if not isinstance(key, bytes):
        raise KeyFormatError(f"an offload key must be bytes, got {type(key).__name__}")
    if len(key) < GROUP_IDX_BYTES:
        raise KeyFormatError(f"an offload key has at least {GROUP_IDX_BYTES} bytes, got {len(key)}")
    return key[:-GROUP_IDX_BYTES], int.from_bytes(key[-GROUP_IDX_BYTES:], "big")


def get_offload_block_hash(key: OffloadKey) -> bytes:
    """The block hash part of `key`."""
    return split_offload_key(key)[0]


def get_offload_group_idx(key: OffloadKey) -> int:
    """The KV-group index part of `key`."""
    return split_offload_key(key)[1]


def key_from_int(value: int, group_idx: int = 0) -> OffloadKey:
    """A key for a non-negative integer block id (as trace hash ids are): 8 bytes, big-endian."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 64:
        raise KeyFormatError(f"an integer block id must be in [0, 2**64), got {value!r}")
    return make_offload_key(value.to_bytes(8, "big"), group_idx)
