"""The disk tier's storage: fixed-size slots in preallocated slab files, an LMDB index that
records each block's slot, codec and checksum, and every read verified.

`DiskStore` is the `BlockStorage` (store.py, a facade over the parts listed there);
`FileIO` / `FaultyIO` are the replaceable system calls it makes (the latter injects errors for
tests); `StoreLayout`, `BlockIndex` and `BlockCodec` are parts exposed for tools.
"""

from kvtier.tiers.disk.codec import BlockCodec, Codec, Compression
from kvtier.tiers.disk.index import BlockIndex
from kvtier.tiers.disk.io import ALIGNMENT, Fault, FaultyIO, FileIO
from kvtier.tiers.disk.layout import (
    LAYOUT_VERSION,
    IndexRecord,
    StoreLayout,
    layout_fingerprint,
    slab_file_name,
)
from kvtier.tiers.disk.store import (
    DEFAULT_SLAB_FILE_BYTES,
    CheckProblem,
    CheckReport,
    DirectIO,
    DiskStore,
    DiskStoreStats,
)

__all__ = [
    "ALIGNMENT",
    "DEFAULT_SLAB_FILE_BYTES",
    "LAYOUT_VERSION",
    "BlockCodec",
    "BlockIndex",
    "CheckProblem",
    "CheckReport",
    "Codec",
    "Compression",
    "DirectIO",
    "DiskStore",
    "DiskStoreStats",
    "Fault",
    "FaultyIO",
    "FileIO",
    "IndexRecord",
    "StoreLayout",
    "layout_fingerprint",
    "slab_file_name",
]
