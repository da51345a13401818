"""How a block's bytes are stored: raw, or as one zstd frame.

Each stored block records its codec, so a store opened with another `compression` setting
still reads what was written before, and a block that zstd cannot shrink is kept raw (it is
then read straight into the caller's buffer, with no copy). zstd objects are not thread-safe,
so every worker thread gets its own compressor and decompressor.
"""

from __future__ import annotations

import enum
import threading
from typing import Literal

import numpy as np
import zstandard

from kvtier.errors import InvalidValueError
from kvtier.tiers.storage import HostBuffer

Stored = bytes | memoryview
"""Bytes as stored in a slot (a zstd frame, or a raw block's memory)."""

Compression = Literal["none", "zstd"]
"""The `compression` setting of a disk tier."""

ZSTD_LEVELS = range(1, 23)
"""The zstd levels a disk tier accepts (as the config does)."""


class Codec(enum.IntEnum):
    """How one stored block is encoded; the value is what the index records."""

    NONE = 0
    ZSTD = 1


class CodecError(Exception):
    """Stored bytes could not be decoded into a block (internal: a read reports it as
    `ReadFailure.CODEC`, never raises it)."""


class BlockCodec:
    """Encodes blocks for a store and decodes any codec a store may have written."""

    def __init__(self, compression: Compression = "none", level: int = 3) -> None:
        if compression not in ("none", "zstd"):
            raise InvalidValueError(f'compression must be "none" or "zstd", got {compression!r}')
        if isinstance(level, bool) or not isinstance(level, int) or level not in ZSTD_LEVELS:
            raise InvalidValueError(f"zstd_level must be an int in [1, 22], got {level!r}")
        self.compression: Compression = compression
        self.level = level
        self._local = threading.local()

    def encode(self, block: HostBuffer) -> tuple[Codec, Stored]:
        """The codec and the bytes to store for `block`: a zstd frame when compression is on
        and the frame is shorter than the block, else the block's own memory (not copied)."""
        if self.compression == "zstd":
            compressor: zstandard.ZstdCompressor | None = getattr(self._local, "cctx", None)
            if compressor is None:
                compressor = zstandard.ZstdCompressor(level=self.level, write_content_size=True)
                self._local.cctx = compressor
            frame: bytes = compressor.compress(block.data)
            if len(frame) < block.nbytes:
                return Codec.ZSTD, frame
        return Codec.NONE, block.data

    def decode_into(self, codec: int, stored: Stored, out: HostBuffer) -> None:
        """Decode `stored` (written with `codec`) into `out`, which it must fill exactly.
        Raises CodecError when the codec is unknown or the bytes do not decode to a block."""
        if codec == Codec.NONE:
            view = memoryview(stored).cast("B")
            if view.nbytes != out.nbytes:
                raise CodecError(f"raw block of {view.nbytes} bytes, expected {out.nbytes}")
            out[:] = np.frombuffer(view, dtype=np.uint8)
            return
        if codec != Codec.ZSTD:
            raise CodecError(f"unknown codec {codec}")
        decompressor: zstandard.ZstdDecompressor | None = getattr(self._local, "dctx", None)
        if decompressor is None:
            decompressor = zstandard.ZstdDecompressor()
            self._local.dctx = decompressor
        try:
            # A frame's declared size is checked first: zstd allocates what a frame declares
            # (max_output_size bounds only frames that declare none), so a tiny frame
            # declaring gigabytes would otherwise cost that much memory and time.
            declared = zstandard.frame_content_size(stored)
            if declared not in (-1, out.nbytes):
                raise CodecError(f"zstd frame declares {declared} bytes, expected {out.nbytes}")
            data: bytes = decompressor.decompress(stored, max_output_size=out.nbytes)
        except zstandard.ZstdError as error:
            raise CodecError(f"zstd frame does not decode: {error}") from None
        if len(data) != out.nbytes:
            raise CodecError(f"zstd frame decodes to {len(data)} bytes, expected {out.nbytes}")
        out[:] = np.frombuffer(data, dtype=np.uint8)
