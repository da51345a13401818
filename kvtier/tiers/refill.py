"""A floor on the size of a tier's background refill (`BaseTierConfig.min_refill`).

A tier above another keeps a reserve of free slots, refilled in the background by demoting
its least valuable blocks to the tier below once it is fuller than `high_watermark`, down to
`low_watermark` (`kvtier.manager.planner`). Each refill is one copy to the tier below, so a
disk store below is handed one write per refill, and each of its write calls pays fixed
costs (~1.2-2 ms: its threads' hand-offs, an `fdatasync`, an index commit) besides a few
microseconds a block. The watermarks' gap is a fraction of the tier: on a small tier (the
replay's, whose blocks are scaled down to 16 KiB) a refill is a few MB and the fixed costs
halve the disk's rate. `min_refill` raises a refill to at least a size (as a flash cache
flushes whole regions): 8 MiB by default when the tier below is a disk store, where 8 MiB
calls reach about 70-80 % of the rate of large calls (docs/BENCHMARKS.md, "A floor on a
refill's size"). The floor never takes more than 1/8 of the tier, so a small tier is not
emptied for it; at real block sizes the watermarks' gap is larger and the floor does
nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from kvtier.config_fields import (
    CHAIN_SCOPE,
    SizeError,
    config_error,
    parse_size,
    readable_size,
    size_in_bytes,
)
from kvtier.tiers.storage import TierAccess

__all__ = ["DEFAULT_MIN_REFILL", "RefillTier", "check_min_refill", "refill_floors"]

DEFAULT_MIN_REFILL = 8 << 20
"""Bytes a refill demotes at least (`min_refill = "auto"`) when the tier below is a disk
store (its bytes go through host buffers: `TierAccess.HOST_BUFFERS`)."""

_EXAMPLE = 'expected "auto", 0 (off), a byte count or a size like "8MiB"'


class _Kind(Protocol):
    @property
    def access(self) -> TierAccess: ...


class RefillTier(Protocol):
    """What `refill_floors` reads of a tier's config (a `BaseTierConfig`)."""

    @property
    def min_refill(self) -> int | str: ...

    @property
    def kind(self) -> _Kind: ...


def check_min_refill(value: object, capacity: object) -> int | str:
    """`value` as a tier's `min_refill` ("auto", 0, or a size), checked against the tier's
    `capacity` (a block count or a size, as already checked; None when it was invalid);
    else a validation error of the key `min_refill`."""
    if value == "auto":
        return "auto"
    if isinstance(value, int) and not isinstance(value, bool) and value <= 0:
        if value < 0:
            raise config_error("min_refill", '"auto", 0 (off) or a size of at least 1 byte')
        return 0
    try:
        size, _ = size_in_bytes(value)
    except SizeError as error:
        raise config_error("min_refill", _EXAMPLE if error.malformed else error.reason) from None
    scope = CHAIN_SCOPE.get()
    if scope is not None and scope.block_size is not None and isinstance(capacity, int | str):
        blocks = capacity if isinstance(capacity, int) else parse_size(capacity) // scope.block_size
        if size > blocks * scope.block_size:
            raise config_error(
                "min_refill",
                f"{readable_size(size)} is more than the tier holds "
                f"({readable_size(blocks * scope.block_size)})",
            )
    return value if isinstance(value, str) else size


def refill_floors(configs: Sequence[RefillTier], block_size: int) -> list[int]:
    """Per tier of a chain (the tiers opened, top first), the least blocks a refill of its
    reserve frees, rounded up (`ChainPlanner`, `refill_target`): "auto" depends on the tier
    below, the next one opened (not the next one the config lists); the bottom tier keeps no
    reserve (0)."""
    floors = []
    for tier, below in zip(configs, [*configs[1:], None], strict=True):
        if below is None or tier.min_refill == 0:
            size = 0
        elif tier.min_refill == "auto":
            size = DEFAULT_MIN_REFILL if below.kind.access is TierAccess.HOST_BUFFERS else 0
        else:
            size = parse_size(tier.min_refill)
        floors.append(-(-size // block_size))
    return floors
