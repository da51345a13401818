"""Tiers: one module per medium. For now the slot-allocation `Backend` they share."""

from kvtier.tiers.backend import SPEC_TYPES, Backend, SlotPoolBackend

__all__ = ["SPEC_TYPES", "Backend", "SlotPoolBackend"]
