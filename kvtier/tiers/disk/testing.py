"""Test helpers for the disk store: backdoors that read and plant blocks in the slab files and
the index without going through `DiskStore.read` / `DiskStore.write` (what `StorageTests`
needs; they reach into the store's parts), byte flipping, and block contents that are a
function of the block id (so a process that reopens a store can tell right bytes from wrong
ones)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from kvtier.keys import OffloadKey
from kvtier.tiers.codec import BlockCodec
from kvtier.tiers.disk.io import pwritev_all
from kvtier.tiers.disk.layout import IndexRecord, entry_offset
from kvtier.tiers.disk.store import DiskStore
from kvtier.tiers.storage import HostBuffer


def stored_bytes(store: DiskStore, slot: int, length: int) -> bytes:
    """The first `length` bytes of `slot` in its slab file, read with plain file I/O."""
    path, offset = store.slot_location(slot)
    with path.open("rb") as file:
        file.seek(offset)
        return file.read(length)


def backdoor_read(store: DiskStore, slot: int) -> bytes:
    """The block that the index says lives in `slot`, read and decoded behind the store's back."""
    records = [(key, record) for key in store if (record := store.record(key))]
    owners = [(key, record) for key, record in records if record.slot == slot]
    if len(owners) != 1:
        raise LookupError(f"slot {slot} is indexed for {len(owners)} keys")
    key, record = owners[0]
    stored = stored_bytes(store, slot, record.length)
    if store.checksum_of(key, record, stored) != record.checksum:
        raise ValueError(f"slot {slot}: the stored bytes do not match the indexed checksum")
    block = np.empty(store.block_size, dtype=np.uint8)
    BlockCodec().decode_into(record.codec, stored, block)
    return block.tobytes()


def backdoor_write(store: DiskStore, key: OffloadKey, slot: int, data: bytes) -> None:
    """Plant `data` as block `key` in `slot`: encode it with the store's compression, write it
    into the slab file with plain file I/O, and index it through the store's internals."""
    codec, stored = BlockCodec(store.compression).encode(np.frombuffer(data, np.uint8).copy())
    payload = bytes(stored)
    path, offset = store.slot_location(slot)
    store._catalog.unindex_slots([slot])
    fd = os.open(path, os.O_WRONLY)
    try:
        pwritev_all(fd, [payload], offset)
    finally:
        os.close(fd)
    index_behind(store, [(key, slot, int(codec), payload)])


def index_behind(store: DiskStore, blocks: list[tuple[OffloadKey, int, int, bytes]]) -> None:
    """Index `blocks` ((key, slot, codec, stored bytes) each) in one transaction, with
    increasing sequence numbers and their slot headers written, as if the store had written
    them (for backdoors that wrote, or pretend to have written, the bytes behind its back)."""
    catalog, layout, files = store._catalog, store._layout, store._files
    index = catalog.index
    with catalog.writing:
        new = []
        for (key, slot, codec, stored), seq in zip(
            blocks, catalog.take_seqs(len(blocks)), strict=True
        ):
            record = IndexRecord(slot, len(stored), codec, 0, seq)
            checksum = layout.checksum(key, record, stored)
            new.append((key, IndexRecord(slot, len(stored), codec, checksum, seq)))
        if files.headers_fd is not None:
            for key, record in new:
                pwritev_all(
                    files.headers_fd, [layout.pack_entry(key, record)], entry_offset(record.slot)
                )
        index.update((), [(key, record.pack()) for key, record in new])
        catalog.remember(new)


def flip_byte(path: Path, offset: int) -> None:
    """Invert one byte of a file in place."""
    with path.open("r+b") as file:
        file.seek(offset)
        value = file.read(1)[0]
        file.seek(offset)
        file.write(bytes([value ^ 0xFF]))


def damage_every_page(slabs: list[Path], at: int = 2048) -> int:
    """Flip byte `at` of every 4 KiB page of each slab file, so every block on disk fails its
    checksum whatever the block size; returns the pages damaged."""
    pages = 0
    for slab in slabs:
        data = bytearray(slab.read_bytes())
        for offset in range(at, len(data), 4096):
            data[offset] ^= 0xFF
            pages += 1
        slab.write_bytes(bytes(data))
    return pages


def damage_stored_blocks(tier_dir: Path, step: int = 4096, at: int = 2048) -> int:
    """Flip one byte in every `step` bytes (from byte `at % step`) of every block stored under
    the disk tier directory `tier_dir`, whatever its layout: every page of the per-block
    store's slab files, and every live payload of a log store (found by opening it to
    inspect; its headers and checkpoint are left whole, so the store opens as before and each
    block fails its checksum when read). Returns the pages or payloads damaged."""
    from kvtier.tiers.disk.open_checks import open_recorded_log_store

    slabs = sorted(tier_dir.glob("*/slab-*.bin"))
    firsts = range(at % step, 4096, step) if step < 4096 else [at % 4096]
    damaged = sum(damage_every_page(slabs, at=first) for first in firsts)
    for store_dir in sorted(tier_dir.glob("kvtier-log-*")):
        store = open_recorded_log_store(store_dir, inspect=True, max_workers=1)
        if store is None:
            continue
        try:
            index, files = store._index, store._files
            spans = [
                (files.base(int(index.region[i])) + int(index.offset[i]), int(index.length[i]))
                for i in index.held_slots().tolist()
            ]
            path = files.root / "regions.bin"
        finally:
            store.close()
        with open(path, "r+b") as file:
            for start, length in spans:
                for offset in range(start + at % step, start + length, step):
                    file.seek(offset)
                    byte = file.read(1)
                    file.seek(offset)
                    file.write(bytes([byte[0] ^ 0xFF]))
                damaged += 1
    return damaged


def deterministic_block(i: int, block_size: int) -> HostBuffer:
    """The content of block `i`: a deterministic function of `i`, half of them compressible,
    so a reader can tell whether a block's bytes are the right ones."""
    rng = np.random.default_rng(i)
    if i % 2:
        return rng.integers(0, 256, block_size, dtype=np.uint8)
    values = rng.integers(0, 4, -(-block_size // 32), dtype=np.uint8)
    return np.repeat(values, 32)[:block_size].copy()
