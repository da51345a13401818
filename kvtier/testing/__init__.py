"""Conformance suites that every policy, tier manager, storage and block allocator subclasses.

Like zarr's `StoreTests`: the suite ships in the package, so a new implementation (in kvtier
or outside it) proves it honours the contract by subclassing it in a few lines.

A failed check of a suite shows the values it compared, also in a third party's test run:
the suites' modules are registered for pytest's assertion rewriting before they are imported
(pytest rewrites only test files and conftest.py by itself, so without it an `assert` of a
package module fails with a bare AssertionError).
"""

import pytest

pytest.register_assert_rewrite(
    "kvtier.testing.allocator",
    "kvtier.testing.keyed",
    "kvtier.testing.manager",
    "kvtier.testing.policy",
    "kvtier.testing.state_machine",
    "kvtier.testing.storage",
)

from kvtier.testing.allocator import BlockAllocatorTests, PrefixCachingAllocatorMachine  # noqa: E402
from kvtier.testing.keyed import KeyedStorageTests  # noqa: E402
from kvtier.testing.manager import ManagerTests  # noqa: E402
from kvtier.testing.policy import PolicyTests  # noqa: E402
from kvtier.testing.state_machine import TierManagerMachine, make_tier_manager_machine  # noqa: E402
from kvtier.testing.storage import StorageTests  # noqa: E402

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
