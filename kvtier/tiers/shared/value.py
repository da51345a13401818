"""The authenticated value of a block in a store many nodes share (Redis, a shared
filesystem): a header that binds the block to its key, namespace, length, codec and the key
that made it, then the stored bytes.

    offset  field
         0  magic "KVTR"
         4  version u8 (2)
         5  codec u8 (0 raw, 1 zstd)
         6  flags u16: bit 0 MAC (keyed BLAKE3), bit 1 encrypted (AES-256-GCM); 0: unkeyed
         8  key length u32
        12  key id (8 bytes; zero when unkeyed)
        20  namespace digest (16 bytes: xxh3-128 of the namespace)
        36  block length u64
        44  stored length u64
        52  nonce (12 bytes; zero unless encrypted)
        64  tag (32 bytes)
        96  key, then the stored bytes

- **Authenticated** (`flags = 1`, the default): the tag is keyed BLAKE3-256, with a key
  derived from the tier's key and the namespace (`kvtier.tiers.shared.auth`), of the header's
  first 64 bytes, the namespace, the key and the stored bytes. Only a node holding the key
  can make a value that verifies: anyone else's, even built from public data, is a miss
  counted as FORGED, as is a value of an unknown key id. A changed byte cannot be told from
  a forgery, so it is counted forged too.
- **Encrypted** (`flags = 3`, `encrypt = true`): the stored bytes are AES-256-GCM of the
  block (raw or its zstd frame) with a random 96-bit nonce and the 16-byte GCM tag at their
  end; the header's first 64 bytes, the namespace and the key are the associated data and the
  tag field is zero. With random nonces a key must not make more than about 2**32 values
  of one namespace (NIST SP 800-38D; 1 PiB of 256 KiB blocks, a day and a half at 8 GB/s
  of writes): rotate it (`auth_previous_key_*`) well before. The MAC has no such limit.
- **Unkeyed** (`flags = 0`, `authenticate = false`): the tag is xxh3-128 of the same bytes
  (then 16 zero bytes): it catches torn, damaged and misplaced values, not forgeries.

A reader accepts what its configuration can verify: a node with keys only authenticated
values of its keys (an unkeyed value is forged: an attacker needs no key to make one), a node
without keys only unkeyed values. A node with `encrypt = true` also accepts a key holder's
MAC-only value (written with `encrypt = false`), counting it (`unencrypted_served`), or with
`require_encrypted = true` refuses it as UNENCRYPTED. A value that is torn or truncated is
DAMAGED; one written under another key, for another namespace, or in another format
(version 1) is FOREIGN.
Nothing in a value is trusted before its tag matches, and no length in it is used to
allocate: the block size bounds everything.
"""

from __future__ import annotations

import enum
import hmac
import logging
import secrets
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import blake3
import xxhash

from kvtier.errors import ConfigError, InvalidValueError
from kvtier.keys import OffloadKey
from kvtier.tiers.codec import BlockCodec, CodecError
from kvtier.tiers.shared.auth import NamespaceKey, ValueAuth, require_encryption
from kvtier.tiers.storage import HostBuffer, ReadFailure

MAGIC = b"KVTR"
VERSION = 2
_HEADER = struct.Struct("<4sBBHI8s16sQQ12s32s")
HEADER_BYTES = _HEADER.size
"""96: the fixed header before the key."""
_PREFIX = struct.Struct("<4sBBHI8s16sQQ12s")  # the header without its tag: what is covered
TAG_BYTES = 32
NONCE_BYTES = 12
GCM_TAG_BYTES = 16
"""Encrypted stored bytes end with AES-GCM's 16-byte tag."""

FLAG_MAC = 1
FLAG_ENCRYPTED = 2
_ZERO_TAG = bytes(TAG_BYTES)
_ZERO_KEY_ID = bytes(8)
_ZERO_NONCE = bytes(NONCE_BYTES)

LOG_INTERVAL_S = 60.0
"""A tier logs each kind of problem at most once per this many seconds (with the count)."""


class ValueProblem(enum.StrEnum):
    """Why a value was not served (counted by the tiers; each is a miss)."""

    MISSING = "missing"
    FOREIGN = "foreign"
    """Another key's or another namespace's value, or not a kvtier value (of this version)."""
    DAMAGED = "damaged"
    """Torn or truncated bytes, or a block that does not decode."""
    FORGED = "forged"
    """Not made with a key this node holds: its MAC fails, its key id is unknown, or it is
    unkeyed where values are authenticated. Never deleted by kvtier (it could be a node with
    a newer key); served never."""
    OVERSIZED = "oversized"
    """Longer than any value of a block: not read past one block's frame, never served."""
    UNENCRYPTED = "unencrypted"
    """Made with a key this node holds but not encrypted (a key holder with `encrypt =
    false`), read where `require_encrypted = true`: verified, not served. Without that
    option such a value is served and counted (`ValueCodec.unencrypted_served`)."""


log = logging.getLogger("kvtier.tiers.shared")


def check_block_buffers(buffers: Sequence[HostBuffer], block_size: int) -> None:
    """InvalidValueError unless every buffer holds exactly one block (a broken contract)."""
    for i, buffer in enumerate(buffers):
        if buffer.nbytes != block_size:
            raise InvalidValueError(
                f"buffers[{i}] must hold {block_size} bytes, got {buffer.nbytes}"
            )


_WHY = {
    ValueProblem.FOREIGN: "foreign (another key's or namespace's, or not a kvtier value)",
    ValueProblem.DAMAGED: "damaged (torn, truncated or not decodable)",
    ValueProblem.OVERSIZED: "oversized (longer than a block's value; not downloaded)",
    ValueProblem.UNENCRYPTED: (
        "unencrypted (made by a key holder with encrypt = false) where require_encrypted = "
        "true; not served, not deleted"
    ),
    ValueProblem.FORGED: (
        "forged: not made with a key this tier holds (written by whoever can write the "
        "store, or by a node with another key or authenticate = false); not served, not "
        "deleted"
    ),
}


class ProblemLog:
    """Logs each (tier, problem) at most once per `interval_s`, with how many were not
    logged since: a store full of forged values must not flood the log."""

    def __init__(
        self, interval_s: float = LOG_INTERVAL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self._lock = threading.Lock()
        self._last: dict[tuple[str, str], tuple[float, int]] = {}

    def note(self, where: str, problem: ValueProblem, key: OffloadKey) -> None:
        now = self.clock()
        with self._lock:
            last = self._last.get((where, problem))
            if last is not None and now - last[0] < self.interval_s:
                self._last[(where, problem)] = (last[0], last[1] + 1)
                return
            unlogged = 0 if last is None else last[1]
            self._last[(where, problem)] = (now, 0)
        more = f" ({unlogged} more since the last report)" if unlogged else ""
        log.warning(
            "%s: the value of key %s is %s: a miss%s", where, key.hex()[:24], _WHY[problem], more
        )


problem_log = ProblemLog()
"""The process's rate limiter of `record_problem`."""


def record_problem(
    problems: dict[str, int], problem: ValueProblem, key: OffloadKey, where: str
) -> None:
    """Count a value not served; a foreign, damaged or forged one is also logged, at most
    once per LOG_INTERVAL_S for each tier and problem (a miss)."""
    problems[problem] = problems.get(problem, 0) + 1
    if problem is not ValueProblem.MISSING:
        problem_log.note(where, problem, key)


def reported_problems(problems: dict[str, int]) -> dict[str, int]:
    """A copy of a shared tier's problem counters (`record_problem`) without the missing
    values (absent keys, not problems): what its `value_problems()` exports."""
    return {
        str(reason): count
        for reason, count in dict(problems).items()
        if reason != ValueProblem.MISSING
    }


def namespace_digest(namespace: str) -> bytes:
    """The 16 bytes of a namespace that every value carries."""
    return xxhash.xxh3_128_digest(namespace.encode())


Outcome = tuple[ReadFailure | None, ValueProblem | None]
"""What a decode found: (None, None) for an intact, verified block, else the read failure to
report and the problem to count."""


@dataclass(frozen=True, slots=True)
class _Frame:
    """The parts of a value whose framing is sound, not yet verified."""

    codec: int
    flags: int
    key_id: bytes
    nonce: bytes
    tag: bytes
    prefix: memoryview
    """The header without its tag: what the tag covers."""
    stored: memoryview
    """The stored (possibly compressed, possibly encrypted) block."""


class _Cipher:
    """AES-256-GCM from `cryptography` (the `encrypt` extra), imported on first use."""

    def __init__(self, key: bytes) -> None:
        require_encryption()
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self.aead = AESGCM(key)
        self.invalid: type[Exception] = InvalidTag

    def encrypt(self, nonce: bytes, data: bytes | memoryview, aad: bytes) -> bytes:
        sealed: bytes = self.aead.encrypt(nonce, data, aad)
        return sealed

    def decrypt(self, nonce: bytes, data: bytes | memoryview, aad: bytes) -> bytes | None:
        """The plaintext, or None when the tag does not verify."""
        try:
            plain: bytes = self.aead.decrypt(nonce, data, aad)
        except self.invalid:
            return None
        return plain


class ValueCodec:
    """Encodes blocks as values of one namespace and verifies values read back.

    `auth` holds the namespace's keys (`ValueAuth.for_namespace`); None makes and accepts
    unkeyed values only (`authenticate = false`)."""

    def __init__(
        self,
        namespace: str,
        block_size: int,
        codec: BlockCodec,
        auth: ValueAuth | None = None,
    ) -> None:
        self.namespace_name = namespace
        self.namespace = namespace_digest(namespace)
        self.block_size = block_size
        self.codec = codec
        self.auth = auth
        name = namespace.encode()
        self._bound = struct.pack("<I", len(name)) + name
        """The namespace itself, covered by every tag (its digest is only an early check)."""
        self._ciphers: dict[bytes, _Cipher] = {}
        self.unencrypted_served = 0
        """MAC-only values (a key holder's, written with `encrypt = false`) served by this
        codec although its own values are encrypted (counted; `require_encrypted` refuses
        them instead)."""
        self._lock = threading.Lock()  # decodes run in threads
        if auth is not None and auth.encrypt:
            self._cipher(auth.current)  # ConfigError naming the extra when it is missing

    def _cipher(self, key: NamespaceKey) -> _Cipher:
        cipher = self._ciphers.get(key.key_id)
        if cipher is None:
            cipher = self._ciphers[key.key_id] = _Cipher(key.encryption_key)
        return cipher

    @property
    def authenticated(self) -> bool:
        return self.auth is not None

    def _mac(
        self, mac_key: bytes, prefix: bytes | memoryview, key: bytes, stored: bytes | memoryview
    ) -> bytes:
        hasher = blake3.blake3(key=mac_key)
        hasher.update(prefix)
        hasher.update(self._bound)
        hasher.update(key)
        hasher.update(stored)
        return hasher.digest()

    def _checksum(
        self, prefix: bytes | memoryview, key: bytes, stored: bytes | memoryview
    ) -> bytes:
        hasher = xxhash.xxh3_128()
        hasher.update(prefix)
        hasher.update(self._bound)
        hasher.update(key)
        hasher.update(stored)
        return hasher.digest() + bytes(TAG_BYTES - 16)

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
        """The largest value of a block (raw, or a zstd frame no larger than the block, and
        an encrypted one's GCM tag)."""
        return HEADER_BYTES + key_length + self.block_size + GCM_TAG_BYTES

    def encode_parts(self, key: OffloadKey, block: HostBuffer) -> tuple[bytes, bytes | memoryview]:
        """The value as (header and key, stored bytes), for a writer that can write both
        without joining them (the stored bytes are the block's own memory when raw and not
        encrypted)."""
        codec, stored = self.codec.encode(block)
        return self.seal_parts(key, codec, stored, block.nbytes)

    def seal_parts(
        self, key: bytes, codec: int, stored: bytes | memoryview, block_length: int
    ) -> tuple[bytes, bytes | memoryview]:
        """The value of bytes already encoded with `codec`, tagged (and encrypted) with this
        codec's current key: the second half of `encode_parts`. Conformance tests seal
        hostile payloads with it (a zstd bomb a key holder made must still be refused)."""
        auth = self.auth
        if auth is None:
            prefix = _PREFIX.pack(
                MAGIC,
                VERSION,
                codec,
                0,
                len(key),
                _ZERO_KEY_ID,
                self.namespace,
                block_length,
                len(stored),
                _ZERO_NONCE,
            )
            tag = self._checksum(prefix, key, stored)
        elif auth.encrypt:
            nonce = secrets.token_bytes(NONCE_BYTES)
            prefix = _PREFIX.pack(
                MAGIC,
                VERSION,
                codec,
                FLAG_MAC | FLAG_ENCRYPTED,
                len(key),
                auth.current.key_id,
                self.namespace,
                block_length,
                len(stored) + GCM_TAG_BYTES,
                nonce,
            )
            stored = self._cipher(auth.current).encrypt(
                nonce, stored, b"".join((prefix, self._bound, key))
            )
            tag = _ZERO_TAG
        else:
            prefix = _PREFIX.pack(
                MAGIC,
                VERSION,
                codec,
                FLAG_MAC,
                len(key),
                auth.current.key_id,
                self.namespace,
                block_length,
                len(stored),
                _ZERO_NONCE,
            )
            tag = self._mac(auth.current.mac_key, prefix, key, stored)
        return b"".join((prefix, tag, key)), stored

    def decode_into(
        self, key: OffloadKey, value: bytes | memoryview | None, out: HostBuffer
    ) -> Outcome:
        """Fill `out` with the block `value` holds for `key`; (None, None) when it is intact
        and verified, else the read failure to report and the problem to count. Never raises
        for any bytes in `value`, and allocates at most one block."""
        frame, refused = self._frame(key, value, out)
        if frame is None:
            return refused
        if self.auth is None:
            if frame.flags != 0:
                return ReadFailure.NOT_INDEXED, ValueProblem.FOREIGN  # a keyed node's value
            if not hmac.compare_digest(self._checksum(frame.prefix, key, frame.stored), frame.tag):
                return ReadFailure.CHECKSUM, ValueProblem.DAMAGED
            return self._decode(frame.codec, frame.stored, out)
        return self._verify_keyed(self.auth, key, frame, out)

    def _frame(
        self, key: OffloadKey, value: bytes | memoryview | None, out: HostBuffer
    ) -> tuple[_Frame | None, Outcome]:
        """The parts of `value` once its framing is sound for `key` (magic, version, namespace,
        key, lengths), else None and why not; nothing is verified yet."""
        if value is None:
            return None, (ReadFailure.NOT_INDEXED, ValueProblem.MISSING)
        view = memoryview(value).cast("B")
        if view[: len(MAGIC)] != MAGIC:
            return None, (ReadFailure.NOT_INDEXED, ValueProblem.FOREIGN)  # not a kvtier value
        if view.nbytes > len(MAGIC) and view[len(MAGIC)] != VERSION:
            return None, (ReadFailure.NOT_INDEXED, ValueProblem.FOREIGN)  # another format
        if view.nbytes < HEADER_BYTES:
            return None, (ReadFailure.SHORT_READ, ValueProblem.DAMAGED)
        (_, _, codec, flags, key_length, key_id, namespace, length, stored_length, nonce, tag) = (
            _HEADER.unpack_from(view)
        )
        if namespace != self.namespace or key_length != len(key):
            return None, (ReadFailure.NOT_INDEXED, ValueProblem.FOREIGN)
        if view.nbytes < HEADER_BYTES + key_length:
            return None, (ReadFailure.SHORT_READ, ValueProblem.DAMAGED)
        if view[HEADER_BYTES : HEADER_BYTES + key_length].tobytes() != key:
            return None, (ReadFailure.NOT_INDEXED, ValueProblem.FOREIGN)
        stored = view[HEADER_BYTES + key_length :]
        if (
            length != self.block_size
            or length != out.nbytes
            or stored.nbytes != stored_length
            or stored_length > self.block_size + GCM_TAG_BYTES
        ):
            return None, (ReadFailure.SHORT_READ, ValueProblem.DAMAGED)
        frame = _Frame(codec, flags, key_id, nonce, tag, view[: _PREFIX.size], stored)
        return frame, (None, None)

    def _verify_keyed(
        self, auth: ValueAuth, key: OffloadKey, frame: _Frame, out: HostBuffer
    ) -> Outcome:
        """Verify (and, if encrypted, decrypt) a framed value with the key that made it, one
        of those `auth` accepts, then decode it into `out`."""
        known = auth.accepted.get(frame.key_id)
        if known is None or frame.flags not in (FLAG_MAC, FLAG_MAC | FLAG_ENCRYPTED):
            return ReadFailure.CHECKSUM, ValueProblem.FORGED
        if frame.flags == FLAG_MAC:
            mac = self._mac(known.mac_key, frame.prefix, key, frame.stored)
            if not hmac.compare_digest(mac, frame.tag):
                return ReadFailure.CHECKSUM, ValueProblem.FORGED
            if auth.encrypt:
                if auth.require_encrypted:
                    return ReadFailure.NOT_INDEXED, ValueProblem.UNENCRYPTED
                outcome = self._decode(frame.codec, frame.stored, out)
                if outcome == (None, None):
                    with self._lock:
                        self.unencrypted_served += 1
                return outcome
            return self._decode(frame.codec, frame.stored, out)
        if frame.tag != _ZERO_TAG or frame.stored.nbytes < GCM_TAG_BYTES:
            return ReadFailure.CHECKSUM, ValueProblem.FORGED
        try:
            cipher = self._cipher(known)
        except ConfigError:
            return ReadFailure.NOT_INDEXED, ValueProblem.FOREIGN  # no cryptography here
        plain = cipher.decrypt(
            frame.nonce, frame.stored, b"".join((frame.prefix, self._bound, key))
        )
        if plain is None:
            return ReadFailure.CHECKSUM, ValueProblem.FORGED
        return self._decode(frame.codec, plain, out)

    def _decode(self, codec: int, stored: bytes | memoryview, out: HostBuffer) -> Outcome:
        try:
            self.codec.decode_into(codec, stored, out)
        except CodecError:
            return ReadFailure.CODEC, ValueProblem.DAMAGED
        return None, None
