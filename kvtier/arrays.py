"""Array helpers that keep numpy's lazily imported modules off the serving path.

numpy 2.3's `np.unique(values)` (no index, inverse or counts asked for) calls
`np.ma.is_masked`, and `numpy.ma` is imported on that first use: 6 ms on an idle core, 13-15
ms inside vLLM's CPU engine, with the GIL and the import lock held. kvtier's first load after
an engine start checked its rows that way on the event loop, so the first disk hit's load
waited for the import (docs/BENCHMARKS.md, "The first load after an engine start"). These
helpers sort instead: the same results, no import, and faster on a call's few hundred
values (numpy's `unique` hashes first: ~30 us on a quiet core, ~100 us on the loaded 2-core
VM, against ~4 us sorted; docs/BENCHMARKS.md, "The replay's pair, a lone call's CPU"). The log
index's plan uses them in both its forms (log_index.py, _plan_core.pyx).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["has_duplicates", "sorted_unique"]


def sorted_unique(values: npt.ArrayLike) -> np.ndarray[Any, Any]:
    """The distinct values of `values` (flattened), ascending: `np.unique(values)`."""
    ordered = np.sort(np.asarray(values), axis=None)
    if ordered.size < 2:
        return ordered
    first = np.empty(ordered.size, dtype=np.bool_)
    first[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    return ordered[first]


def has_duplicates(values: npt.ArrayLike) -> bool:
    """Whether some value of `values` (flattened) occurs more than once."""
    ordered = np.sort(np.asarray(values), axis=None)
    return bool(ordered.size > 1 and np.any(ordered[1:] == ordered[:-1]))
