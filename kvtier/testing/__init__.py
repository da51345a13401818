"""Conformance suites that every policy and tier manager subclasses.

Like zarr's `StoreTests`: the suite ships in the package, so a new implementation (in kvtier
or outside it) proves it honours the contract by subclassing it in a few lines.
"""

from kvtier.testing.manager import ManagerTests
from kvtier.testing.policy import PolicyTests
from kvtier.testing.state_machine import TierManagerMachine, make_tier_manager_machine

__all__ = ["ManagerTests", "PolicyTests", "TierManagerMachine", "make_tier_manager_machine"]
