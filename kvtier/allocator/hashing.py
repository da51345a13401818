"""Content hashes of token blocks, chained so that equal prefixes get equal hashes.

A block's hash covers its own token ids and the hash of the block before it, so it names the
whole prefix that ends with the block: two sequences share a physical block exactly when they
share every token up to its end. The hash must be the same in every process and on every host
(it keys blocks demoted to a shared CPU or disk tier), so it is BLAKE2b over an explicit byte
layout, never Python's salted `hash()`:

    first block:   BLAKE2b-128(person=PERSON, b"\\x00" + tokens)
    later blocks:  BLAKE2b-128(person=PERSON, b"\\x01" + prev_hash + tokens)

where `tokens` is each token id as 8 bytes, little-endian, unsigned. The leading byte keeps a
first block from ever colliding with a later one whose previous hash happens to spell tokens.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

from kvtier.errors import InvalidValueError

BLOCK_HASH_BYTES = 16
"""Length in bytes of every block content hash."""

TOKEN_ID_BYTES = 8
"""Bytes per token id in the hashed layout (unsigned, little-endian)."""

MAX_TOKEN_ID = (1 << (8 * TOKEN_ID_BYTES)) - 1
"""Largest token id a block accepts."""

PERSON = b"kvtier.block.v1"
"""BLAKE2b personalization: changing the layout means changing this, so old hashes never match."""

_FIRST = b"\x00"
_CHAINED = b"\x01"


def pack_token_ids(token_ids: Sequence[int]) -> bytes:
    """`token_ids` in the hashed layout; InvalidValueError names the first id that is not an
    int in [0, MAX_TOKEN_ID]. Packing doubles as validation, so it costs one pass."""
    try:
        return struct.pack(f"<{len(token_ids)}Q", *token_ids)
    except (struct.error, TypeError):
        for index, token in enumerate(token_ids):
            if isinstance(token, bool) or not isinstance(token, int):
                raise InvalidValueError(
                    f"token_ids[{index}] must be an int, got {type(token).__name__} {token!r}"
                ) from None
            if not 0 <= token <= MAX_TOKEN_ID:
                raise InvalidValueError(
                    f"token_ids[{index}] must be in [0, {MAX_TOKEN_ID}], got {token}"
                ) from None
        raise  # pragma: no cover - struct refused a sequence we could not fault


def hash_packed_tokens(prev_block_hash: bytes | None, packed_tokens: bytes) -> bytes:
    """The content hash of a full block whose tokens are already packed (`pack_token_ids`)."""
    digest = hashlib.blake2b(digest_size=BLOCK_HASH_BYTES, person=PERSON)
    if prev_block_hash is None:
        digest.update(_FIRST)
    else:
        if len(prev_block_hash) != BLOCK_HASH_BYTES:
            raise InvalidValueError(
                f"prev_block_hash must be {BLOCK_HASH_BYTES} bytes, got {len(prev_block_hash)}"
            )
        digest.update(_CHAINED)
        digest.update(prev_block_hash)
    digest.update(packed_tokens)
    return digest.digest()


def hash_block_tokens(prev_block_hash: bytes | None, token_ids: Sequence[int]) -> bytes:
    """The content hash of a full block holding `token_ids` after the block hashed
    `prev_block_hash` (None for the first block of a sequence)."""
    return hash_packed_tokens(prev_block_hash, pack_token_ids(token_ids))


def hash_token_blocks(
    token_ids: Sequence[int], block_size: int, prev_block_hash: bytes | None = None
) -> list[bytes]:
    """The chained hashes of every full block of `token_ids` cut into `block_size` tokens.

    This is what a scheduler or loader computes for a new sequence before allocating anything,
    to ask `find_cached_blocks_prefix` (and a lower tier) how much of it is already cached.
    A trailing partial block has no hash and is left out.
    """
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise InvalidValueError(f"block_size must be an int >= 1, got {block_size!r}")
    hashes: list[bytes] = []
    prev = prev_block_hash
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        prev = hash_block_tokens(prev, token_ids[start : start + block_size])
        hashes.append(prev)
    return hashes
