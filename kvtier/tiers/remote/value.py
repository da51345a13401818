"""The self-verifying value of a block in a store many nodes share (Redis, a shared
filesystem): a header that binds the block to its key, namespace, length and codec, then the
stored bytes.

    magic "KVTR" | version u8 | codec u8 | key length u16 | namespace digest (16 bytes)
    | block length u64 | stored length u64 | checksum u64 | key | stored bytes

The checksum is xxh3-64 of the stored bytes seeded with xxh3-64 of everything before it plus
the key, so a value that is torn, truncated, damaged, written under another key or by another
namespace (another model, block size or layout) is a miss when read, never data. The reader
passes the key it asked for; nothing in the value is trusted before the checksum matches.
"""

from __future__ import annotations

import enum
import logging
import struct
from collections.abc import Sequence

import xxhash

from kvtier.errors import InvalidValueError
from kvtier.keys import OffloadKey
from kvtier.tiers.disk.codec import BlockCodec, CodecError
from kvtier.tiers.storage import HostBuffer, ReadFailure

MAGIC = b"KVTR"
VERSION = 1
_HEADER = struct.Struct("<4sBBH16sQQQ")
HEADER_BYTES = _HEADER.size
_SEEDED = struct.Struct("<4sBBH16sQQ")  # the header without its checksum


class ValueProblem(enum.StrEnum):
    """Why a value was not served (counted by the tiers; each is a miss)."""

    MISSING = "missing"
    FOREIGN = "foreign"
    """Another key's or another namespace's value, or not a kvtier value at all."""
    DAMAGED = "damaged"
    """Torn, truncated or changed bytes (the checksum does not match)."""


log = logging.getLogger("kvtier.tiers.remote")


def check_block_buffers(buffers: Sequence[HostBuffer], block_size: int) -> None:
    """InvalidValueError unless every buffer holds exactly one block (a broken contract)."""
    for i, buffer in enumerate(buffers):
        if buffer.nbytes != block_size:
            raise InvalidValueError(
                f"buffers[{i}] must hold {block_size} bytes, got {buffer.nbytes}"
            )


def record_problem(
    problems: dict[str, int], problem: ValueProblem, key: OffloadKey, where: str
) -> None:
    """Count a value not served; a foreign or damaged one is also logged (a miss)."""
    problems[problem] = problems.get(problem, 0) + 1
    if problem is not ValueProblem.MISSING:
        log.warning("%s: the value of key %s is %s: a miss", where, key.hex()[:24], problem)


def namespace_digest(namespace: str) -> bytes:
    """The 16 bytes of a namespace that every value carries."""
    return xxhash.xxh3_128_digest(namespace.encode())


class ValueCodec:
    """Encodes blocks as values of one namespace and verifies values read back."""

    def __init__(self, namespace: str, block_size: int, codec: BlockCodec) -> None:
        self.namespace = namespace_digest(namespace)
        self.block_size = block_size
        self.codec = codec

    def _checksum(self, prefix: bytes, key: bytes, stored: bytes | memoryview) -> int:
        seed = xxhash.xxh3_64_intdigest(prefix + key)
        return xxhash.xxh3_64_intdigest(stored, seed=seed)

    def encode(self, key: OffloadKey, block: HostBuffer) -> bytes:
        """The value to store for `block` under `key` (one copy of the block's bytes)."""
        head, stored = self.encode_parts(key, block)
        return b"".join((head, stored))

    def encode_into(self, key: OffloadKey, block: HostBuffer, out: bytearray) -> memoryview:
        """The value written into `out` (reused between calls, so no fresh allocation is
        paid for); a view of the bytes used. `out` must hold `max_value_bytes(len(key))`."""
        head, stored = self.encode_parts(key, block)
        end = len(head) + len(stored)
        view = memoryview(out)
        view[: len(head)] = head
        view[len(head) : end] = memoryview(stored).cast("B")
        return view[:end]

    def max_value_bytes(self, key_length: int) -> int:
        """The largest value of a block (raw, or a zstd frame no larger than the block)."""
        return HEADER_BYTES + key_length + self.block_size

    def encode_parts(self, key: OffloadKey, block: HostBuffer) -> tuple[bytes, bytes | memoryview]:
        """The value as (header and key, stored bytes), for a writer that can write both
        without joining them (the stored bytes are the block's own memory when raw)."""
        codec, stored = self.codec.encode(block)
        prefix = _SEEDED.pack(
            MAGIC, VERSION, int(codec), len(key), self.namespace, block.nbytes, len(stored)
        )
        checksum = self._checksum(prefix, key, stored)
        return b"".join((prefix, struct.pack("<Q", checksum), key)), stored

    def decode_into(
        self, key: OffloadKey, value: bytes | memoryview | None, out: HostBuffer
    ) -> tuple[ReadFailure | None, ValueProblem | None]:
        """Fill `out` with the block `value` holds for `key`; (None, None) when it is intact,
        else the read failure to report and the problem to count."""
        if value is None:
            return ReadFailure.NOT_INDEXED, ValueProblem.MISSING
        view = memoryview(value).cast("B")
        if view[: len(MAGIC)] != MAGIC:
            return ReadFailure.NOT_INDEXED, ValueProblem.FOREIGN  # not a kvtier value
        if view.nbytes < HEADER_BYTES:
            return ReadFailure.SHORT_READ, ValueProblem.DAMAGED
        magic, version, codec, key_length, namespace, length, stored_length, checksum = (
            _HEADER.unpack_from(view)
        )
        if magic != MAGIC or version != VERSION:
            return ReadFailure.NOT_INDEXED, ValueProblem.FOREIGN
        if namespace != self.namespace or key_length != len(key):
            return ReadFailure.NOT_INDEXED, ValueProblem.FOREIGN
        stored = view[HEADER_BYTES + key_length :]
        if view[HEADER_BYTES : HEADER_BYTES + key_length].tobytes() != key:
            return ReadFailure.NOT_INDEXED, ValueProblem.FOREIGN
        if length != self.block_size or length != out.nbytes or stored.nbytes != stored_length:
            return ReadFailure.SHORT_READ, ValueProblem.DAMAGED
        prefix = view[: _SEEDED.size].tobytes()
        if self._checksum(prefix, key, stored) != checksum:
            return ReadFailure.CHECKSUM, ValueProblem.DAMAGED
        try:
            self.codec.decode_into(codec, stored, out)
        except CodecError:
            return ReadFailure.CODEC, ValueProblem.DAMAGED
        return None, None
