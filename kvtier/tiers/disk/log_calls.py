"""A write call's columns as the log lane places them (log_lane.py's `_append_write`): per
record its payload's and key's bytes, and two running sums from which the lane reads a run's
bytes (`record_bytes` summed) and whether every payload of the run is page-aligned memory of
whole pages (O_DIRECT from it) with two look-ups a run, not array calls or a list a run.

In one compiled pass over the call's buffers when the core is built (`_plan_core.call_columns`);
else with array operations (`call_columns_arrays`, its reference: a generator over the
buffers' sizes, `map(len, ...)` over the keys, `page_aligned` and two cumulative sums; ~75 us
a 1,024-block call on a quiet core, plus four array calls a run for its bytes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from kvtier.keys import OffloadKey
from kvtier.tiers.disk.log_format import PAGE, RECORD_HEADER_BYTES
from kvtier.tiers.disk.log_group import page_aligned

_compiled_columns: Callable[..., tuple[np.ndarray[Any, np.dtype[np.int64]], ...]] | None
try:  # the compiled pass, present only when kvtier.compiled selected it
    from kvtier.tiers.disk._plan_core import call_columns as _compiled_columns
except ImportError:
    _compiled_columns = None


class CallColumns(NamedTuple):
    """A write call's columns (int64 arrays; `ends` and `odd` one longer than the call)."""

    lengths: np.ndarray[Any, np.dtype[np.int64]]
    """Each payload's bytes."""
    key_lens: np.ndarray[Any, np.dtype[np.int64]]
    """Each key's bytes."""
    ends: np.ndarray[Any, np.dtype[np.int64]]
    """`ends[i]`: `record_bytes` summed over the records before record i."""
    odd: np.ndarray[Any, np.dtype[np.int64]]
    """`odd[i]`: how many of the payloads before record i O_DIRECT cannot write from their
    memory (`page_aligned` False)."""

    def run_bytes(self, first: int, stop: int) -> int:
        """`record_bytes` summed over records `first` to `stop` (not included)."""
        return int(self.ends[stop] - self.ends[first])

    def direct(self, first: int, stop: int) -> bool:
        """Whether every payload of records `first` to `stop` (not included) is
        page-aligned memory of whole pages (an empty one counts as such)."""
        return bool(self.odd[stop] == self.odd[first])


def call_columns(keys: list[OffloadKey], buffers: list[Any]) -> CallColumns:
    """The columns of a write call of `keys` and their stored `buffers` (contiguous
    buffers with an `nbytes`)."""
    if _compiled_columns is not None:
        return CallColumns(*_compiled_columns(keys, buffers, PAGE, RECORD_HEADER_BYTES))
    return call_columns_arrays(keys, buffers)


def call_columns_arrays(keys: list[OffloadKey], buffers: list[Any]) -> CallColumns:
    """`call_columns` with array operations (the compiled pass's fallback and reference)."""
    count = len(buffers)
    if len(keys) != count:
        raise ValueError("call_columns: keys and buffers differ in length")
    lengths = np.fromiter((buffer.nbytes for buffer in buffers), np.int64, count)
    key_lens = np.fromiter(map(len, keys), np.int64, count)
    sizes = RECORD_HEADER_BYTES + ((key_lens + 7) & ~7) + ((lengths + 7) & ~7)
    ends = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(sizes, out=ends[1:])
    odd = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(~np.array(page_aligned(buffers), dtype=np.bool_, ndmin=1), out=odd[1:])
    return CallColumns(lengths, key_lens, ends, odd)
