# cython: language_level=3, boundscheck=False, wraparound=False
"""A CPU paged-KV job's row copies in one call without the GIL (`kvtier.embed.paged_kv`).

`PagedKVHandler` copies a job's rows (one per block and canonical tensor) on its worker
thread beside the serving engine's own thread, which runs Python throughout a step. Every
numpy or torch call of the copy gives the GIL up and waits for it back, up to the
interpreter's switch interval each time: a 2,048-token load in vLLM's CPU engine (256 rows
of 16 KiB) took 3.2-3.9 ms in numpy's gathers and scatters, against ~0.5 ms of memory
traffic. `copy_spans` makes every copy of the job in one stretch without the GIL.

Built by `scripts/build-core` with the other core modules (`kvtier.compiled`); when it is not
built or not selected, paged_kv.py copies with numpy (the same bytes;
`tests/test_paged_kv.py` checks both).
"""

from libc.stdint cimport int64_t, uintptr_t
from libc.string cimport memcpy


def copy_spans(const int64_t[::1] targets, const int64_t[::1] sources, const int64_t[::1] sizes):
    """`memcpy(targets[i], sources[i], sizes[i])` for every i, without the GIL.

    The caller guarantees that every span lies in memory it holds for the whole call, that
    no target overlaps a source, and that the sizes are not negative (paged_kv.py builds them
    from bounds-checked rows of its own tensors)."""
    cdef Py_ssize_t i, n = targets.shape[0]
    if sources.shape[0] != n or sizes.shape[0] != n:
        raise ValueError(
            f"copy_spans needs as many sources and sizes as targets ({n}), got "
            f"{sources.shape[0]} and {sizes.shape[0]}"
        )
    with nogil:
        for i in range(n):
            memcpy(<void *><uintptr_t>targets[i], <const void *><uintptr_t>sources[i], <size_t>sizes[i])
