"""A log part's bound checksums (log_format.py's `bound_checksums`): the compiled ones
(`_io_core.pyx`, every hash without the GIL) equal the Python ones record for record, bad
input raises the same errors in both, and a head thread's failure to checksum a part fails
that write's blocks, not the store."""

from __future__ import annotations

import random
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from disk_helpers import open_small, read, write, write_ok

from kvtier.tiers.disk import log_format
from kvtier.tiers.disk.log_format import bound_checksum, python_bound_checksums
from kvtier.tiers.disk.log_store import LogStore

pytestmark = pytest.mark.timeout(120)


def compiled() -> Any:
    """The compiled `bound_checksums`, or a skip where it is not built or not available."""
    try:
        from kvtier.tiers.disk import _io_core
    except ImportError:
        pytest.skip("the compiled core is not built (scripts/build-core)")
    if not _io_core.has_checksums():
        pytest.skip("the xxhash module's xxh3 was not found in its extension")
    return _io_core.bound_checksums


def columns(rng: random.Random, count: int) -> tuple[list[Any], ...]:
    """`count` records with keys, fields at their ranges' ends and payloads of every size
    the hash treats differently (empty, short, a page, 64 KiB, over 64 KiB, a numpy row)."""
    pool = np.frombuffer(rng.randbytes(4 * 65536), np.uint8).reshape(4, 65536)
    payloads: list[Any] = [b"", b"x", rng.randbytes(4096), bytearray(rng.randbytes(70000))]
    payloads += [pool[1], memoryview(rng.randbytes(5000))[3:4003]]
    return (
        [rng.randbytes(rng.randint(1, 80)) for _ in range(count)],
        [rng.choice([0, 1, 2**64 - 1, rng.randrange(2**64)]) for _ in range(count)],
        [rng.choice([0, 2**32 - 1, rng.randrange(2**32)]) for _ in range(count)],
        [rng.choice([0, 255, rng.randrange(256)]) for _ in range(count)],
        [rng.choice([0, 2**64 - 1, rng.randrange(2**64)]) for _ in range(count)],
        [rng.choice(payloads) for _ in range(count)],
    )


@pytest.mark.parametrize("namespace", [b"0123456789abcdef0123", b"short", b"x" * 25])
def test_compiled_checksums_equal_pythons(namespace: bytes) -> None:
    checksums = compiled()
    rng = random.Random(11)
    for count in (0, 1, 7, 300):
        cols = columns(rng, count)
        expected = python_bound_checksums(namespace, *cols)
        assert checksums(namespace, *(list(c) for c in cols)) == expected
        assert expected == [bound_checksum(namespace, *row) for row in zip(*cols, strict=True)]
        other_keys = [bytearray(key) if i % 2 else memoryview(key) for i, key in enumerate(cols[0])]
        assert checksums(namespace, other_keys, *(list(c) for c in cols[1:])) == expected


def test_the_compiled_checksums_call_the_dispatched_xxh3_where_there_is_one() -> None:
    """Where the xxhash module's extension was built with xxHash's x86 dispatcher (it
    exports `XXH3_64bits_withSeed_dispatch`), the compiled checksums call that one, as
    `xxhash.xxh3_64_intdigest` does, not the plain `XXH3_64bits_withSeed` (the baseline
    SSE2 loop in such a build: the same values with more CPU a byte); else the plain one."""
    compiled()
    import ctypes
    import importlib

    from kvtier.tiers.disk import _io_core

    library = ctypes.CDLL(importlib.import_module("xxhash._xxhash").__file__)
    dispatched = hasattr(library, "XXH3_64bits_withSeed_dispatch")
    expected = "XXH3_64bits_withSeed_dispatch" if dispatched else "XXH3_64bits_withSeed"
    assert _io_core.checksum_function() == expected


def test_bad_input_raises_the_same_errors_in_both() -> None:
    checksums = compiled()
    good = [b"key"], [1], [4], [0], [9], [b"abcd"]
    for column, bad, error in (
        (0, [5], TypeError),
        (0, ["key"], TypeError),
        (5, ["not a buffer"], TypeError),
        (5, [None], TypeError),
        (1, [-1], struct.error),
        (2, [2**32], struct.error),
        (3, [256], struct.error),
        (4, [2**64], struct.error),
    ):
        cols = [list(c) for c in good]
        cols[column] = bad
        with pytest.raises(error):
            python_bound_checksums(b"n" * 20, *cols)
        with pytest.raises(error):
            checksums(b"n" * 20, *cols)
    with pytest.raises(ValueError, match="differ in length"):
        checksums(b"n" * 20, [b"a", b"b"], [1], [4], [0], [9], [b"abcd"])


async def test_a_part_that_cannot_be_checksummed_fails_its_blocks_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_small(LogStore, tmp_path, num_blocks=32)
    try:
        real = log_format.bound_checksums

        def broken(*args: Any) -> list[int]:
            raise TypeError("a payload that is not a buffer")

        monkeypatch.setattr("kvtier.tiers.disk.log_group.bound_checksums", broken)
        results = await write(store, [1, 2, 3], [1, 2, 3])
        assert all(isinstance(result, OSError) for result in results)
        monkeypatch.setattr("kvtier.tiers.disk.log_group.bound_checksums", real)
        await write_ok(store, [4, 5], [4, 5])
        found, _ = await read(store, [4, 5], [4, 5])
        assert found == [None, None]
    finally:
        await store.aclose()
