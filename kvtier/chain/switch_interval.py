"""The interpreter's thread switch interval while a chain that asks for one is open
(`HierarchyConfig.switch_interval_ms`).

A tier's work runs on threads (a disk tier's lane, write, head, sync and read threads), and
each of them gives the GIL up for its system calls and needs it back after them. While a
thread of the embedding process runs Python (an engine's scheduler, a model runner's input
preparation), a thread that wants the GIL gets it when that thread blocks, or once it has
waited the interpreter's switch interval (`sys.setswitchinterval`, 5 ms by default). A disk
write call needs the GIL back some ten times: beside a thread that runs Python throughout,
a lone 7 MiB write took 49 ms instead of 5.1, a 16-block read 22 ms instead of 1.0; at 0.25
ms, 8.3 and 2.4 (docs/BENCHMARKS.md, "The disk tier beside a busy Python thread"). Under vLLM
(its engine thread beside kvtier's) a 2,048-token prefix loaded from kvtier's disk tier in
30-38 ms against 132-165.

The interval is the process's: `acquire` lowers it for as long as any chain that asked is
open (never raises it: a lower interval the process set itself is kept), and the last
`release` puts back the interval found before the first, unless something else changed it
meanwhile (then that value stays). Thread-safe; every chain's lease is released once.
"""

from __future__ import annotations

import itertools
import logging
import sys
import threading
from collections.abc import Callable
from typing import Literal

log = logging.getLogger("kvtier.chain")

_lock = threading.Lock()
_leases: dict[int, float] = {}  # lease number -> seconds asked for
_numbers = itertools.count(1)
_before: float | None = None  # the interval found when the first lease was taken
_set: float | None = None  # the interval as read back after kvtier last set it
_outside = False  # changed outside kvtier while leases were held


def acquire(seconds: float) -> Callable[[], None]:
    """Hold the process's switch interval at `seconds` or lower until the returned release
    is called (more calls of it do nothing)."""
    global _before
    with _lock:
        number = next(_numbers)
        if not _leases:
            _before = sys.getswitchinterval()
        _leases[number] = seconds
        _apply()
    released = False

    def release() -> None:
        nonlocal released
        with _lock:
            if released:
                return
            released = True
            del _leases[number]
            _apply()

    return release


def hold(interval_ms: float | Literal["keep"]) -> Callable[[], None]:
    """`acquire` for a config's `switch_interval_ms` (ms); "keep" holds nothing (its release
    does nothing)."""
    if interval_ms == "keep":
        return _nothing
    return acquire(interval_ms / 1e3)


def _nothing() -> None:
    """The release of a "keep": nothing was held."""


def held() -> float | None:
    """The lowest interval an open lease asks for (None: no lease)."""
    with _lock:
        return min(_leases.values()) if _leases else None


def _apply() -> None:
    """The interval the leases ask for set (the lowest; never above the one found before),
    or, with none left, the one found before put back where kvtier's is still in place. An
    interval changed outside kvtier while leases are held is left alone until none is."""
    global _before, _set, _outside
    now = sys.getswitchinterval()
    if _set is not None and now != _set:
        log.info("the switch interval is %g ms (set outside kvtier): left as it is", now * 1e3)
        _outside, _set = True, None
    if not _leases:
        if _set is not None and _before is not None:
            sys.setswitchinterval(_before)
        _before = _set = None
        _outside = False
        return
    if _outside or _before is None:
        return
    want = min(min(_leases.values()), _before)
    if want != now:
        sys.setswitchinterval(want)
        _set = sys.getswitchinterval()
