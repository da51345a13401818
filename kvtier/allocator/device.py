"""The devices a `DeviceAwareBlockAllocator` keeps paged-KV blocks on."""

from __future__ import annotations

import enum

from kvtier.errors import InvalidValueError


class Device(enum.StrEnum):
    """A memory that holds one pool of KV blocks. String-valued, so `"gpu"` works too."""

    GPU = "gpu"
    CPU = "cpu"

    @classmethod
    def parse(cls, value: Device | str) -> Device:
        """`value` as a Device; InvalidValueError names a value that is none."""
        if isinstance(value, Device):
            return value
        if isinstance(value, str):
            try:
                return cls(value.lower())
            except ValueError:
                pass
        valid = ", ".join(repr(device.value) for device in cls)
        raise InvalidValueError(f"unknown device {value!r}; valid devices: {valid}")
