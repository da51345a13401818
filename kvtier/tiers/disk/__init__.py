"""The disk tier's storage, in one of two layouts, every read verified: `layout = "log"` (the
default, `LogStore`, log_store.py: blocks appended to a log of regions, an in-memory index
checkpointed to LMDB) or `layout = "slots"` (`DiskStore`: fixed-size slots in preallocated
slab files, an LMDB index that records each block's slot, codec and checksum).

`DiskStore` is the per-block `BlockStorage` (store.py, a facade over the parts listed there,
and the disk kind's opener, which picks the layout: open_checks.py);
`FileIO` / `FaultyIO` are the replaceable system calls it makes (the latter injects errors for
tests); `StoreLayout`, `BlockIndex` and `BlockCodec` are parts exposed for tools.

The names are imported on first use (the module's `__getattr__`): validating a config imports
this package's `kind.py`, which must not bring the store's libraries (lmdb, zstandard).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvtier.tiers.codec import BlockCodec, Codec, Compression
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

_HOMES = {
    "kvtier.tiers.codec": ("BlockCodec", "Codec", "Compression"),
    "kvtier.tiers.disk.index": ("BlockIndex",),
    "kvtier.tiers.disk.io": ("ALIGNMENT", "Fault", "FaultyIO", "FileIO"),
    "kvtier.tiers.disk.layout": (
        "LAYOUT_VERSION",
        "IndexRecord",
        "StoreLayout",
        "layout_fingerprint",
        "slab_file_name",
    ),
    "kvtier.tiers.disk.store": (
        "DEFAULT_SLAB_FILE_BYTES",
        "CheckProblem",
        "CheckReport",
        "DirectIO",
        "DiskStore",
        "DiskStoreStats",
    ),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> object:
    """A public name, imported from its module on first use."""
    home = _HOME_OF.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


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
