"""LoadStoreSpec family: plain data that says where blocks live in one medium.

The manager (bookkeeping) produces specs; the transfer engine consumes them. A spec carries no
behaviour beyond validating that its own fields agree with each other.
"""

from kvtier.specs.base import (
    BlockIDsLoadStoreSpec,
    CPULoadStoreSpec,
    DiskLoadStoreSpec,
    GPULoadStoreSpec,
    LoadStoreSpec,
    Medium,
    SlotLoadStoreSpec,
    as_medium,
    slot_spec_type,
    spec_type_of,
)

__all__ = [
    "BlockIDsLoadStoreSpec",
    "CPULoadStoreSpec",
    "DiskLoadStoreSpec",
    "GPULoadStoreSpec",
    "LoadStoreSpec",
    "Medium",
    "SlotLoadStoreSpec",
    "as_medium",
    "slot_spec_type",
    "spec_type_of",
]
