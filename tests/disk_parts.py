"""A disk store taken apart, for the tests of its parts (test_disk_lane.py, test_disk_reader.py,
test_disk_recovery.py): opened by `Recovery`, with its write lane, reader and checker built on
what recovery returned, and no `DiskStore` facade around them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvtier.keys import OffloadKey, key_from_int
from kvtier.tiers.codec import BlockCodec, Compression
from kvtier.tiers.disk.catalog import Catalog
from kvtier.tiers.disk.files import StoreFiles
from kvtier.tiers.disk.fsck import StoreChecker
from kvtier.tiers.disk.guard import Guard
from kvtier.tiers.disk.io import FileIO
from kvtier.tiers.disk.lane import WriteLane
from kvtier.tiers.disk.layout import StoreLayout
from kvtier.tiers.disk.reader import BlockReader, BlockVerifier
from kvtier.tiers.disk.recovery import Recovery
from kvtier.tiers.disk.stats import StoreCounters
from kvtier.tiers.disk.testing import deterministic_block
from kvtier.tiers.storage import HostBuffer

BLOCK = 4096


def k(i: int) -> OffloadKey:
    return key_from_int(i)


def blocks(ids: list[int]) -> list[HostBuffer]:
    return [deterministic_block(i, BLOCK) for i in ids]


@dataclass
class Parts:
    """The parts of one open store."""

    recovery: Recovery
    layout: StoreLayout
    files: StoreFiles
    catalog: Catalog
    counters: StoreCounters
    guard: Guard
    codec: BlockCodec
    lane: WriteLane
    reader: BlockReader
    checker: StoreChecker

    def close(self) -> None:
        self.lane.close()
        self.files.close(clean=self.guard.reason is None, catalog=self.catalog)

    def read(self, ids: list[int], slots: list[int]) -> tuple[list[object], list[HostBuffer]]:
        buffers = [np.zeros(BLOCK, dtype=np.uint8) for _ in ids]
        return list(self.reader.read([k(i) for i in ids], slots, buffers)), buffers


def recovery(
    directory: Path,
    *,
    num_blocks: int = 32,
    slots_per_file: int = 8,
    io: FileIO | None = None,
    compression: Compression = "none",
    inspect: bool = False,
) -> Recovery:
    layout = StoreLayout(num_blocks, BLOCK, slots_per_file, "m")
    return Recovery(
        layout,
        directory,
        io=io if io is not None else FileIO(),
        codec=BlockCodec(compression),
        counters=StoreCounters(),
        fsync=True,
        inspect=inspect,
        create_parents=True,
    )


def open_parts(
    directory: Path,
    *,
    num_blocks: int = 32,
    slots_per_file: int = 8,
    io: FileIO | None = None,
    compression: Compression = "none",
    inspect: bool = False,
) -> Parts:
    opening = recovery(
        directory,
        num_blocks=num_blocks,
        slots_per_file=slots_per_file,
        io=io,
        compression=compression,
        inspect=inspect,
    )
    catalog = opening.open(direct_io=False)
    layout, files, codec, counters = opening.layout, opening.files, opening.codec, opening.counters
    guard = Guard()
    lane = WriteLane(
        layout, files, catalog, codec, counters, guard, max_workers=2, fsync=opening.fsync
    )
    reader = BlockReader(layout, files, catalog, codec, counters, guard)
    verifier = BlockVerifier(layout, files, codec)
    checker = StoreChecker(
        layout,
        files,
        catalog,
        verifier,
        guard,
        open_problems=opening.problems,
        inspect=inspect,
    )
    return Parts(opening, layout, files, catalog, counters, guard, codec, lane, reader, checker)
