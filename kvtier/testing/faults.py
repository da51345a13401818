"""`FlakyStorage`: a `BlockStorage` that misbehaves on demand, for fault-injection tests.

`FaultyIO` (kvtier/tiers/disk/io.py) makes a disk tier's system calls raise `OSError`; a
`FlakyStorage` wraps any storage (a `TorchPool`, a `DiskStore`, ...) one level up, at the
`read` / `write` / `forget` calls the transfer engine makes, and can:

- raise an exception of any class (`Boom(Exception)`, `KeyError`, `lmdb.Error`, ...), in the
  event loop or from a worker thread (`asyncio.to_thread`), as a storage bug would;
- return after a delay (`asyncio.sleep`, or a blocking `time.sleep` in a worker thread);
- block until an `asyncio.Event` is set (a hung device or file system);
- fail only the next N calls (`times`), or every call until `clear()`;
- report per-block failures as values (`fail_blocks`: a checksum mismatch on read, an EIO on
  write), which is how a healthy storage reports bad blocks.

```python
flaky = install(hierarchy, 1)                 # wrap tier 1 of an open Hierarchy
flaky.fail("read", KeyError, times=2)         # its next two reads raise KeyError
fault = flaky.block("write")                  # its writes hang ...
fault.release()                               # ... until released
flaky.clear()                                 # healthy again (and nothing left blocked)
```

A wrapper is never a `TorchPool`, even around one: the engine copies tensor to tensor between
two `TorchPool`s without calling `read` / `write`, so wrapping a CPU or GPU tier makes the
engine move that tier's blocks through its generic path (host buffers handed to `read` and
`write`), which is what lets faults reach it. That path is a real one (it is how any storage
that is not a pool is driven); it also makes the engine treat the wrapped tier as a slow tier:
demotions into it are snapshotted into the staging arena and written behind, and demotions
out of it are not. A wrapped top tier of a `Hierarchy` hands `get` results on the CPU.
"""

from __future__ import annotations

import asyncio
import errno
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from kvtier.errors import InvalidValueError, ManagerClosedError
from kvtier.keys import OffloadKey
from kvtier.tiers.storage import BlockStorage, HostBuffer, ReadFailure, RestoredBlock

if TYPE_CHECKING:
    from kvtier.hierarchy import Hierarchy

CallKind = Literal["read", "write", "forget"]
CALL_KINDS: tuple[CallKind, ...] = ("read", "write", "forget")

ErrorSpec = BaseException | type[BaseException] | Callable[[], BaseException]
"""What a fault raises: an exception instance (raised as is, every time), an exception class
(instantiated with a message naming the call), or a factory returning a fresh instance."""


@dataclass(eq=False)
class Fault:
    """One rule of a `FlakyStorage`, applied to calls of `kind` while it is `active`.

    In order: wait `delay_s` (in a worker thread, blocking it, when `in_thread`), wait for
    `gate` to be set, then raise `error` (from a worker thread when `in_thread`) or, when
    `bad_keys` is given, let the call through and report those keys as failed blocks.
    `times`: how many calls it applies to (None: every call until removed); `fired` counts
    them, `waiting` counts calls held at its delay or gate right now.
    """

    kind: CallKind
    error: ErrorSpec | None = None
    delay_s: float = 0.0
    gate: asyncio.Event | None = None
    times: int | None = None
    in_thread: bool = False
    bad_keys: frozenset[OffloadKey] | None = None
    fired: int = 0
    waiting: int = 0

    @property
    def active(self) -> bool:
        """Whether the next call of its kind is affected."""
        return self.times is None or self.fired < self.times

    def release(self) -> None:
        """Open the gate (calls held there go on; later ones pass straight through)."""
        if self.gate is not None:
            self.gate.set()

    def make_error(self, what: str) -> BaseException | None:
        """The exception to raise for one call, or None when this rule raises nothing."""
        spec = self.error
        if spec is None:
            return None
        if isinstance(spec, BaseException):
            return spec
        made: object = spec(f"injected fault: {what}") if isinstance(spec, type) else spec()
        if not isinstance(made, BaseException):
            raise InvalidValueError(f"a fault's error factory returned {made!r}")
        return made


def _raise(error: BaseException) -> None:
    raise error


@dataclass
class FlakyCounters:
    """Calls of each kind (`CallKind`): made, raised by a fault, and returned by the wrapped
    storage (calls still in flight or that raised are not `returned`)."""

    calls: Counter[str] = field(default_factory=Counter)
    raised: Counter[str] = field(default_factory=Counter)
    returned: Counter[str] = field(default_factory=Counter)


class FlakyStorage(BlockStorage):
    """Wraps `inner`, applying its `Fault` rules to the calls of each kind before passing
    them on. Every rule of the call's kind that is active applies, oldest first; the first
    that raises ends the call. For use in tests, on one event loop."""

    def __init__(self, inner: BlockStorage) -> None:
        if isinstance(inner, FlakyStorage):
            raise InvalidValueError("wrap the storage itself, not another FlakyStorage")
        self.inner = inner
        self.num_blocks = inner.num_blocks
        self.block_size = inner.block_size
        self.faults: list[Fault] = []
        self.counters = FlakyCounters()
        self.replaced_access = False
        """Set by `install`: the engine's "tensor pool" flag of the tier it replaced."""

    # -- rules -----------------------------------------------------------------------------

    def add(self, fault: Fault) -> Fault:
        """Add a rule and return it."""
        if fault.kind not in CALL_KINDS:
            raise InvalidValueError(f"kind must be one of {CALL_KINDS}, got {fault.kind!r}")
        if fault.times is not None and fault.times < 0:
            raise InvalidValueError(f"times must be >= 0 or None, got {fault.times}")
        if fault.delay_s < 0:
            raise InvalidValueError(f"delay_s must be >= 0, got {fault.delay_s}")
        if fault.bad_keys is not None and fault.kind == "forget":
            raise InvalidValueError("forget has no per-block results; bad_keys needs read/write")
        self.faults.append(fault)
        return fault

    def fail(
        self,
        kind: CallKind,
        error: ErrorSpec,
        *,
        times: int | None = None,
        in_thread: bool = False,
        delay_s: float = 0.0,
    ) -> Fault:
        """Calls of `kind` raise `error` (after `delay_s`), from a worker thread when
        `in_thread`; only the next `times` calls when given."""
        return self.add(Fault(kind, error=error, times=times, in_thread=in_thread, delay_s=delay_s))

    def delay(
        self, kind: CallKind, seconds: float, *, times: int | None = None, in_thread: bool = False
    ) -> Fault:
        """Calls of `kind` take `seconds` longer (`asyncio.sleep`; a blocking sleep in a
        worker thread when `in_thread`), then go through."""
        return self.add(Fault(kind, delay_s=seconds, times=times, in_thread=in_thread))

    def block(
        self, kind: CallKind, *, times: int | None = None, gate: asyncio.Event | None = None
    ) -> Fault:
        """Calls of `kind` wait until the rule's `gate` is set (`Fault.release`), then go
        through. Create it in the event loop that will make the calls."""
        return self.add(
            Fault(kind, gate=gate if gate is not None else asyncio.Event(), times=times)
        )

    def fail_blocks(
        self,
        kind: Literal["read", "write"],
        keys: Collection[OffloadKey],
        *,
        times: int | None = None,
    ) -> Fault:
        """Calls of `kind` go through, but report `keys` as failed blocks: a read as
        `ReadFailure.CHECKSUM` (bad stored bytes: the engine drops the block and asks the
        storage to `forget` it), a write as `OSError(EIO)`."""
        return self.add(Fault(kind, bad_keys=frozenset(keys), times=times))

    def clear(self, kind: CallKind | None = None) -> None:
        """Remove the rules (of `kind`, or all) and open their gates, so no call stays
        blocked; later calls go straight through."""
        for fault in self.faults:
            if kind is None or fault.kind == kind:
                fault.release()
        self.faults = [f for f in self.faults if kind is not None and f.kind != kind]

    @property
    def waiting(self) -> int:
        """Calls held at a delay or gate right now."""
        return sum(fault.waiting for fault in self.faults)

    def fired(self, kind: CallKind | None = None) -> int:
        """Calls that the current rules (of `kind`, or all) have applied to."""
        return sum(f.fired for f in self.faults if kind is None or f.kind == kind)

    async def _apply(self, kind: CallKind, count: int) -> frozenset[OffloadKey]:
        """Run the active rules of `kind` for one call of `count` blocks; the keys to report
        as failed (or raise)."""
        self.counters.calls[kind] += 1
        bad: set[OffloadKey] = set()
        for fault in list(self.faults):
            if fault.kind != kind or not fault.active:
                continue
            fault.fired += 1
            if fault.delay_s or fault.gate is not None:
                fault.waiting += 1
                try:
                    if fault.delay_s and fault.in_thread:
                        await asyncio.to_thread(time.sleep, fault.delay_s)
                    elif fault.delay_s:
                        await asyncio.sleep(fault.delay_s)
                    if fault.gate is not None:
                        await fault.gate.wait()
                finally:
                    fault.waiting -= 1
            error = fault.make_error(f"{kind} of {count} blocks (call {fault.fired})")
            if error is not None:
                self.counters.raised[kind] += 1
                if fault.in_thread:
                    await asyncio.to_thread(_raise, error)
                raise error
            if fault.bad_keys is not None:
                bad |= fault.bad_keys
        return frozenset(bad)

    # -- BlockStorage --------------------------------------------------------------------------

    @property
    def persistent(self) -> bool:
        return self.inner.persistent

    def restore(self) -> list[RestoredBlock]:
        return self.inner.restore()

    async def write(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], buffers: Sequence[HostBuffer]
    ) -> list[OSError | None]:
        bad = await self._apply("write", len(keys))
        results = await self.inner.write(keys, slots, buffers)
        self.counters.returned["write"] += 1
        if not bad:
            return results
        injected = OSError(errno.EIO, "injected: bad block")
        return [
            injected if key in bad else result for key, result in zip(keys, results, strict=True)
        ]

    async def read(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], buffers: Sequence[HostBuffer]
    ) -> list[ReadFailure | None]:
        bad = await self._apply("read", len(keys))
        results = await self.inner.read(keys, slots, buffers)
        self.counters.returned["read"] += 1
        if not bad:
            return results
        return [
            ReadFailure.CHECKSUM if key in bad else result
            for key, result in zip(keys, results, strict=True)
        ]

    async def forget(self, keys: Sequence[OffloadKey]) -> None:
        await self._apply("forget", len(keys))
        await self.inner.forget(keys)
        self.counters.returned["forget"] += 1

    async def aclose(self) -> None:
        """Open every gate (nothing stays blocked), then close the wrapped storage."""
        for fault in self.faults:
            fault.release()
        await self.inner.aclose()

    def __repr__(self) -> str:
        return f"FlakyStorage({self.inner!r}, {len(self.faults)} rules)"


def install(
    hierarchy: Hierarchy, tier_index: int, flaky: FlakyStorage | None = None
) -> FlakyStorage:
    """Put `flaky` (by default a new `FlakyStorage` around the tier's storage) in place of
    tier `tier_index`'s storage in an open `hierarchy`, and return it.

    For tests only: it replaces the storage in the chain's and its transfer engine's
    lists and clears the engine's "tensor pool" flag of the tier, so every later copy goes
    through the wrapper (see the module docstring for what changes when a `TorchPool` is
    wrapped). `uninstall` puts the wrapped storage back."""
    try:
        chain = hierarchy.chain
    except ManagerClosedError:
        raise ManagerClosedError("install needs an open hierarchy") from None
    engine = chain.engine
    current = chain.storages[tier_index]
    if flaky is None:
        flaky = FlakyStorage(current)
    elif flaky.inner is not current:
        raise InvalidValueError(f"{flaky!r} does not wrap tier {tier_index}'s {current!r}")
    chain.storages[tier_index] = flaky
    engine.storages[tier_index] = flaky
    flaky.replaced_access = engine.tensor_tiers[tier_index]
    engine.tensor_tiers[tier_index] = False  # a wrapper is driven through read/write
    return flaky


def uninstall(hierarchy: Hierarchy, tier_index: int) -> BlockStorage:
    """Undo `install`: clear the wrapper's rules and put the wrapped storage back."""
    chain = hierarchy.chain
    engine = chain.engine
    current = chain.storages[tier_index]
    if not isinstance(current, FlakyStorage):
        raise InvalidValueError(f"tier {tier_index} has no FlakyStorage installed")
    current.clear()
    chain.storages[tier_index] = current.inner
    engine.storages[tier_index] = current.inner
    engine.tensor_tiers[tier_index] = current.replaced_access
    return current.inner


__all__ = [
    "CALL_KINDS",
    "CallKind",
    "ErrorSpec",
    "Fault",
    "FlakyCounters",
    "FlakyStorage",
    "install",
    "uninstall",
]
