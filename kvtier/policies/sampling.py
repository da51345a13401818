"""`sample_point`: a key's place in [0, 2**32), a seeded hash that is the same in every
process (never Python's `hash`, salted per process for bytes). `auto` samples keys with it
(SHARDS) and lct admits the same share of a class's keys by it.
"""

from __future__ import annotations

import zlib
from collections.abc import Hashable

SCALE = 1 << 32
"""The points' range: a share `s` of the keys is those whose point is below `s * SCALE`."""
_MASK32 = SCALE - 1
_MASK64 = (1 << 64) - 1
_MIX32 = 0x9E3779B1
_MIX64 = 0x9E3779B97F4A7C15
_SPLIT1 = 0xBF58476D1CE4E5B9
_SPLIT2 = 0x94D049BB133111EB


def sample_point(key: Hashable, seed: int = 0) -> int:
    """Where `key` falls in [0, 2**32): a seeded, deterministic hash (never Python's `hash`,
    which is salted per process for bytes). A bytes key (an `OffloadKey`) is hashed by
    CRC-32, an int (a trace's block id) by splitmix64's finalizer, anything else by the
    CRC-32 of its repr; a CRC is multiplied by an odd constant so its high bits, which the
    sampling compares, depend on every bit of the key.

    Ints are mixed, not just multiplied: a multiplicative hash maps key 0 to point 0, in
    every sample, and key 0 is the shipped trace's hottest block (the first block of most
    prompts: 6,016 of the second half's 135,498 accesses). It was 62 % of the sampled
    accesses at 5 %, every shadow's hits were mostly its hits, and the real differences
    between the candidates drowned (auto left lct for ARC there: 0.1420, lct 0.1490)."""
    if type(key) is bytes:
        point = zlib.crc32(key, seed & _MASK32)
    elif type(key) is int:
        mixed = (key + (seed + 1) * _MIX64) & _MASK64
        mixed = ((mixed ^ (mixed >> 30)) * _SPLIT1) & _MASK64
        mixed = ((mixed ^ (mixed >> 27)) * _SPLIT2) & _MASK64
        return (mixed ^ (mixed >> 31)) >> 32
    else:
        point = zlib.crc32(repr(key).encode(), seed & _MASK32)
    return (point * _MIX32) & _MASK32
