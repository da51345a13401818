"""The one exception hierarchy of kvtier.

Every error kvtier raises on purpose derives from `KvtierError`, so an embedder can catch
kvtier's failures in one place. Where an error is also a classic Python category (bad value,
bad key), it derives from that builtin too, so idiomatic `except ValueError` keeps working.

"Cannot" is not an error on the hot path: a miss, or a store that finds no space, is a value
(`None` / `False`). These exceptions mean a caller broke a contract or gave bad input.
"""

from __future__ import annotations


class KvtierError(Exception):
    """Base class of every error kvtier raises on purpose."""


class ConfigError(KvtierError, ValueError):
    """A configuration is invalid. The message names each offending key path and value."""

    def __init__(self, problems: list[str], source: str | None = None) -> None:
        self.problems = list(problems)
        self.source = source
        where = f"{source}: " if source else ""
        if len(self.problems) == 1:
            message = f"{where}{self.problems[0]}"
        else:
            lines = "\n".join(f"  {problem}" for problem in self.problems)
            message = f"{where}{len(self.problems)} problems:\n{lines}"
        super().__init__(message)


class UnknownPolicyError(KvtierError, KeyError):
    """A cache policy name is not registered; the message lists the valid names."""

    def __init__(self, name: str, valid: list[str]) -> None:
        self.name = name
        self.valid = sorted(valid)
        super().__init__(name)

    def __str__(self) -> str:
        return f"unknown cache policy {self.name!r}; valid policies: {', '.join(self.valid)}"


class InvalidValueError(KvtierError, ValueError):
    """An argument has a value outside its domain (a capacity below 1, a negative count, ...)."""


class UnknownSessionError(InvalidValueError):
    """A session hint names a session no put named, or one that ended (`kvtier.sessions`)."""


class SpecError(KvtierError, ValueError):
    """A LoadStoreSpec was built from inconsistent data."""


class KeyFormatError(KvtierError, ValueError):
    """An offload key or block hash has the wrong type or length."""


class AllocationError(KvtierError):
    """A backend was asked for more slots than it has free; nothing was allocated."""


class DoubleFreeError(KvtierError):
    """A slot was freed that is not allocated; nothing was changed."""


class BlockStateError(KvtierError):
    """A block was used against its lifecycle: loading an absent or unready block, unpinning a
    block that is not pinned, completing a store that was never prepared, ..."""


class ManagerClosedError(KvtierError):
    """An operation was attempted on a manager after `shutdown()`."""


class TraceFormatError(KvtierError, ValueError):
    """A request trace is malformed; the message names the file and line."""


class StorageClosedError(KvtierError):
    """A block storage (a tier's bytes) was used after it was closed."""


class DiskTierError(KvtierError):
    """The disk tier cannot be opened or used as configured (its directory cannot be created,
    its files cannot be preallocated, ...). The message names the path and the reason."""


class DiskLayoutError(DiskTierError):
    """The files found on disk do not belong to this store: the fingerprint (block size,
    layout version, model id) recorded in the index differs from the expected one, or the
    index's metadata is unreadable. Nothing is served from such a directory."""


class DirectIOError(DiskTierError):
    """O_DIRECT was required (`direct_io = true`) but the block size, the platform or the
    filesystem does not support it; the message says which."""


class DiskLockedError(DiskTierError):
    """The disk tier's directory is already open in another store (this process or another);
    two writers would overwrite each other's slots."""


class NoFreeBlocksError(AllocationError):
    """A paged-KV block allocator has no free block and no unused cached block to evict;
    nothing was allocated. The message names the allocator's size and what it was asked for."""


class TierConnectionError(KvtierError, OSError):
    """A remote tier (Redis, ...) could not be reached or refused a round trip. An OSError,
    so a failed store reports it like a failed disk write; a read turns it into a miss."""


class FleetQueryError(KvtierError, OSError):
    """The fleet index's HTTP query endpoint (`kvtier.fleet.query`) could not bind its
    address, or answered a client's request with an error: the message names the address
    and, for an answer, its status and one line."""


class EventsEndpointError(KvtierError, OSError):
    """The `[events]` publisher could not bind one of its endpoints (in use, a bad address,
    no permission), or its extra (pyzmq, msgspec) is not installed: `Hierarchy.open` fails,
    naming the key and the endpoint."""
