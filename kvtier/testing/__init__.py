"""Conformance suites that every policy, tier manager, storage and block allocator subclasses.

Like zarr's `StoreTests`: the suite ships in the package, so a new implementation (in kvtier
or outside it) proves it honours the contract by subclassing it in a few lines.
"""

from kvtier.testing.allocator import BlockAllocatorTests, PrefixCachingAllocatorMachine
from kvtier.testing.keyed import KeyedStorageTests
from kvtier.testing.manager import ManagerTests
from kvtier.testing.policy import PolicyTests
from kvtier.testing.state_machine import TierManagerMachine, make_tier_manager_machine
from kvtier.testing.storage import StorageTests

__all__ = [
    "BlockAllocatorTests",
    "KeyedStorageTests",
    "ManagerTests",
    "PolicyTests",
    "PrefixCachingAllocatorMachine",
    "StorageTests",
    "TierManagerMachine",
    "make_tier_manager_machine",
]
