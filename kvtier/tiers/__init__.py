"""Tiers: the storage interface (`storage.py`), the registry of tier kinds (`registry.py`), and
one package per tier (`pool/`, `disk/`, `redis/`, `sharedfs/`; `shared/` is what the shared
ones have in common). Here: the slot-allocation `Backend` the slot-pool tiers share."""

from kvtier.tiers.backend import SPEC_TYPES, Backend, SlotPoolBackend

__all__ = ["SPEC_TYPES", "Backend", "SlotPoolBackend"]
