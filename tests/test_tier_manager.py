"""TierManager runs the manager conformance suite and the state machine, once per policy."""

from __future__ import annotations

import pytest
from hypothesis import settings

from kvtier.errors import BlockStateError
from kvtier.manager import OffloadingManager, SlotPoolBackend, TierManager, make_tier_manager
from kvtier.policies import LRUCachePolicy
from kvtier.specs import CPULoadStoreSpec, DiskLoadStoreSpec, GPULoadStoreSpec
from kvtier.testing import make_tier_manager_machine
from kvtier.testing.manager import TierManagerTests, keys


class TestTierManagerLRU(TierManagerTests):
    def make_manager(self, num_blocks: int) -> OffloadingManager:
        return make_tier_manager(num_blocks, self.block_size, "cpu", "lru")

    def test_touch_changes_the_victim(self) -> None:
        manager = self.make_manager(2)
        self.stored(manager, [1, 2])
        manager.touch(keys(1))
        out = manager.prepare_store(keys(3))
        assert out is not None and out.evicted_keys == keys(2)


class TestTierManagerARC(TierManagerTests):
    def make_manager(self, num_blocks: int) -> OffloadingManager:
        return make_tier_manager(num_blocks, self.block_size, "cpu", "arc")


@pytest.mark.parametrize(
    ("medium", "spec_type"),
    [("gpu", GPULoadStoreSpec), ("cpu", CPULoadStoreSpec), ("disk", DiskLoadStoreSpec)],
)
def test_each_medium_gets_its_spec_type(medium: str, spec_type: type) -> None:
    manager = make_tier_manager(2, 64, medium)
    out = manager.prepare_store(keys(1))
    assert out is not None and type(out.store_spec) is spec_type
    assert out.store_spec.medium().value == medium


def test_policy_and_backend_sizes_must_agree() -> None:
    with pytest.raises(BlockStateError, match="capacity"):
        TierManager(SlotPoolBackend(4, 64, "cpu"), LRUCachePolicy(3))  # type: ignore[arg-type]


_machine_settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
TestStateMachineLRU = make_tier_manager_machine("lru").TestCase
TestStateMachineLRU.pytestmark = [pytest.mark.slow]
TestStateMachineLRU.settings = _machine_settings
TestStateMachineARC = make_tier_manager_machine("arc").TestCase
TestStateMachineARC.pytestmark = [pytest.mark.slow]
TestStateMachineARC.settings = _machine_settings
