# cython: language_level=3
"""A disk store's system calls of one step of a write group, run in C without the GIL.

A write group's lane thread makes some fifteen system calls (the in-flight log, a `pwritev`
per run of slots, the header entries, the `fdatasync` calls, the `stat` calls of the ground
check). Each one releases the GIL, and while the serving process's own thread runs Python
(the event loop of a busy engine, a replay) the lane waits up to the interpreter's switch
interval (5 ms) to take it back, after every call: a group of 236 blocks of 16 KiB took 47 ms
beside one busy Python thread against 8 ms beside an idle one. `run_batch` makes all the
calls of a batch in one stretch without the GIL, so a group takes it back two or three
times, not fifteen.

The operations are `kvtier.tiers.disk.io`'s `WriteOp`, `SyncOp` and `StatOp` (told apart by
their `KIND`); each gets its outcome as its Python counterpart in io.py (`run_in_python`)
gives it: a write resumes after a partial write until every byte is written (OSError(EIO)
when a call writes nothing), a call interrupted by a signal is made again, an error is the
op's `error` (an OSError with the errno) and does not stop the ops after it, and a stat op's
`stat` is `(st_dev, st_ino, st_nlink)` (`os.fstat`, or `os.stat` not following a symlink).

Built by `scripts/build-core` with the other core modules (`kvtier.compiled`); when it is not
built or not selected, io.py runs the same ops one Python call at a time.
`tests/test_disk_io_batch.py` checks that both give every op the same outcome.

`page_aligned` is the log lane's per-block check whether O_DIRECT can write a block
straight from its memory (log_group.py's `page_aligned` in Python: ~2-4 us a numpy row,
against ~0.1 us here).

`bound_checksums` is log_format.py's `bound_checksums` (a log part's records' bound
checksums, on a head thread) with every hash of the part computed in one stretch without the
GIL: python-xxhash holds the GIL over a hash of 64 KiB or less, so at 64 KiB blocks a head
thread held it for all of a 64 MiB call's hashing (docs/BENCHMARKS.md, "Write threads and
the GIL"). It calls the very xxh3 the `xxhash` module runs, found in its extension with
dlsym: `XXH3_64bits_withSeed_dispatch` where the extension was built with xxHash's x86
dispatcher (it picks the widest vector unit the CPU has, as `xxhash.xxh3_64_intdigest` does),
else `XXH3_64bits_withSeed` (a stable function of xxHash's API, which in such a build is the
baseline SSE2 loop: ~15 % more CPU a 64 MiB call of 64 KiB blocks than the dispatched one
on an AVX-512 VM, docs/BENCHMARKS.md, "The write row's CPU per block, third round"); checked
against `xxhash.xxh3_64_intdigest` once at import (`checksum_function()` names the one
bound): `has_checksums()` is False when neither was found or agreed, and then log_format.py
hashes in Python.
"""

import os
import struct

import xxhash

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from libc.errno cimport EINTR, EIO, errno
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy, memset
from posix.dlfcn cimport RTLD_NOW, dlopen, dlsym
from posix.stat cimport fstat, lstat, struct_stat
from posix.types cimport off_t
from posix.uio cimport iovec, pwritev
from posix.unistd cimport fdatasync

cdef enum:  # the KIND of each op class in io.py
    _WRITE = 0
    _SYNC = 1
    _STAT = 2


cdef struct _Op:
    int kind
    int fd
    off_t offset
    Py_ssize_t first   # its buffers: views[first : first + count], iovs likewise
    Py_ssize_t count
    const char *path   # a stat op's path (NULL: fstat of fd)
    int error          # 0, an errno, or -1: a write call wrote nothing
    off_t done         # bytes a write op wrote
    unsigned long long dev, ino, nlink


cdef int _write_all(_Op *op, iovec *iovs, Py_ssize_t iov_max) noexcept nogil:
    """Write `op`'s buffers (its slice of `iovs`, which this advances) back to back at its
    offset; 0, an errno, or -1 when a call wrote nothing."""
    cdef Py_ssize_t first = op.first
    cdef Py_ssize_t end = op.first + op.count
    cdef Py_ssize_t count
    cdef ssize_t written
    cdef size_t left
    while True:
        while first < end and iovs[first].iov_len == 0:
            first += 1
        if first >= end:
            return 0
        count = end - first
        if count > iov_max:
            count = iov_max
        written = pwritev(op.fd, &iovs[first], <int> count, op.offset + op.done)
        if written < 0:
            if errno == EINTR:
                continue
            return errno
        if written == 0:
            return -1
        op.done += written
        left = <size_t> written
        while left > 0:
            if left >= iovs[first].iov_len:
                left -= iovs[first].iov_len
                iovs[first].iov_len = 0
                first += 1
            else:
                iovs[first].iov_base = <void *> (<char *> iovs[first].iov_base + left)
                iovs[first].iov_len -= left
                left = 0


cdef int _errno_of(int result) noexcept nogil:
    return errno if result < 0 else 0


cdef void _run(_Op *ops, Py_ssize_t nops, iovec *iovs, Py_ssize_t iov_max) noexcept nogil:
    cdef Py_ssize_t i
    cdef struct_stat info
    cdef int result
    for i in range(nops):
        if ops[i].kind == _WRITE:
            ops[i].error = _write_all(&ops[i], iovs, iov_max)
        elif ops[i].kind == _SYNC:
            while True:
                result = fdatasync(ops[i].fd)
                if result < 0 and errno == EINTR:
                    continue
                ops[i].error = _errno_of(result)
                break
        else:
            if ops[i].path != NULL:
                result = lstat(ops[i].path, &info)
            else:
                result = fstat(ops[i].fd, &info)
            ops[i].error = _errno_of(result)
            if result == 0:
                ops[i].dev = info.st_dev
                ops[i].ino = info.st_ino
                ops[i].nlink = info.st_nlink


def run_batch(list ops, Py_ssize_t iov_max):
    """Run `ops` in order without the GIL, each to its end; set each op's outcome."""
    cdef Py_ssize_t nops = len(ops)
    cdef Py_ssize_t nviews = 0
    cdef Py_ssize_t i, j, held = 0
    cdef _Op *cops = NULL
    cdef Py_buffer *views = NULL
    cdef iovec *iovs = NULL
    cdef list paths = []
    cdef object path
    if nops == 0:
        return
    for op in ops:
        if op.KIND == _WRITE:
            nviews += len(op.buffers)
    cops = <_Op *> calloc(nops, sizeof(_Op))  # zeroed: every outcome 0 until run
    views = <Py_buffer *> calloc(nviews + 1, sizeof(Py_buffer))
    iovs = <iovec *> calloc(nviews + 1, sizeof(iovec))
    try:
        if cops == NULL or views == NULL or iovs == NULL:
            raise MemoryError()
        for i in range(nops):
            op = ops[i]
            cops[i].kind = op.KIND
            cops[i].first = held
            if cops[i].kind == _WRITE:
                cops[i].fd = op.fd
                cops[i].offset = op.offset
                for buffer in op.buffers:
                    PyObject_GetBuffer(buffer, &views[held], PyBUF_SIMPLE)
                    iovs[held].iov_base = views[held].buf
                    iovs[held].iov_len = <size_t> views[held].len
                    held += 1
                cops[i].count = held - cops[i].first
            elif cops[i].kind == _SYNC:
                cops[i].fd = op.fd
            else:
                if op.path is None:
                    cops[i].fd = op.fd
                else:
                    path = os.fsencode(op.path)
                    paths.append(path)
                    cops[i].path = <const char *> path
        with nogil:
            _run(cops, nops, iovs, iov_max)
        for i in range(nops):
            op = ops[i]
            if cops[i].error == -1:
                op.error = OSError(
                    EIO, f"pwritev wrote nothing at offset {cops[i].offset + cops[i].done}"
                )
            elif cops[i].error != 0:
                op.error = OSError(cops[i].error, os.strerror(cops[i].error))
            else:
                op.error = None
                if cops[i].kind == _STAT:
                    op.stat = (cops[i].dev, cops[i].ino, cops[i].nlink)
    finally:
        for j in range(held):
            PyBuffer_Release(&views[j])
        free(views)
        free(iovs)
        free(cops)


def page_aligned(list buffers, Py_ssize_t page):
    """Per buffer whether it is `page`-aligned memory of whole pages (an empty one: True;
    one that is not a contiguous buffer: False)."""
    cdef Py_buffer view
    cdef list out = []
    for buffer in buffers:
        try:
            PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE)
        except (BufferError, TypeError, ValueError):
            out.append(False)
            continue
        out.append(
            view.len == 0 or (view.len % page == 0 and (<size_t> view.buf) % page == 0)
        )
        PyBuffer_Release(&view)
    return out


ctypedef unsigned long long (*_xxh3_fn)(const void *, size_t, unsigned long long) noexcept nogil

cdef _xxh3_fn _xxh3 = NULL
_xxh3_name = None  # the name of the function bound to `_xxh3` (`checksum_function()`)

_XXH3_NAMES = (b"XXH3_64bits_withSeed_dispatch", b"XXH3_64bits_withSeed")
"""The extension's xxh3 functions tried in order: the dispatched one first (the same values,
with the CPU's widest vector unit), the plain one where the extension has no dispatcher."""

cdef enum:
    _BINDING_BYTES = 43  # log_format.py's _BINDING: "<2s20sQIBQ"
    _NAMESPACE_BYTES = 20


cdef void _put(unsigned char *at, unsigned long long value, int size) noexcept nogil:
    """`value` little-endian in `size` bytes at `at`."""
    cdef int i
    for i in range(size):
        at[i] = <unsigned char> ((value >> (8 * i)) & 0xFF)


def _bind_xxh3():
    """The first of `_XXH3_NAMES` the xxhash module's extension has that agrees with the
    module, if any (its first call, here with the GIL, also makes the dispatcher's choice:
    no thread races it later)."""
    global _xxh3, _xxh3_name
    cdef bytes path
    cdef bytes name
    cdef _xxh3_fn found
    try:  # a python-xxhash laid out otherwise: the Python path hashes instead
        import xxhash._xxhash as _xxhash_ext

        path = os.fsencode(_xxhash_ext.__file__)
    except (ImportError, AttributeError, TypeError):
        return
    cdef void *handle = dlopen(path, RTLD_NOW)
    if handle == NULL:
        return
    cdef bytes probe = bytes(range(256)) * 300  # short and long inputs, several seeds
    cdef const unsigned char *data = probe
    for name in _XXH3_NAMES:
        found = <_xxh3_fn> dlsym(handle, name)
        if found == NULL:
            continue
        for size, seed in ((0, 0), (5, 7), (200, 0), (4096, 2**63 + 5), (65536, 3), (76800, 1)):
            if found(data, size, seed) != xxhash.xxh3_64_intdigest(probe[:size], seed=seed):
                break
        else:
            _xxh3, _xxh3_name = found, name.decode()
            return


_bind_xxh3()


def has_checksums():
    """Whether `bound_checksums` can run (the xxhash module's xxh3 was found and agrees)."""
    return _xxh3 != NULL


def checksum_function():
    """The name of the xxhash extension's function `bound_checksums` calls, or None."""
    return _xxh3_name


def bound_checksums(
    bytes namespace, list keys, list slots, list lengths, list codecs, list seqs, list stored
):
    """log_format.py's `bound_checksums`: per record, xxh3-64 of its stored bytes seeded
    with xxh3-64 of its binding (magic, namespace, slot, length, codec, sequence) and key;
    every hash without the GIL. The same outcomes: a value out of its field's range raises
    struct.error, stored bytes that are not a buffer TypeError."""
    cdef Py_ssize_t count = len(keys)
    cdef Py_ssize_t i, held = 0, bound_at = 0, bound_total = 0
    cdef Py_buffer *views = NULL
    cdef unsigned long long *seeds = NULL
    cdef Py_ssize_t *bound_len = NULL
    cdef unsigned char *bindings = NULL
    cdef const unsigned char *key
    cdef unsigned char *at
    cdef bytes key_bytes
    cdef Py_ssize_t name_len = min(len(namespace), _NAMESPACE_BYTES)
    if _xxh3 == NULL:
        raise RuntimeError("the compiled checksums are not available (has_checksums())")
    if not (len(slots) == len(lengths) == len(codecs) == len(seqs) == len(stored) == count):
        raise ValueError("bound_checksums: the columns differ in length")
    if count == 0:
        return []
    for i in range(count):
        bound_total += _BINDING_BYTES + len(keys[i])
    views = <Py_buffer *> calloc(count, sizeof(Py_buffer))
    seeds = <unsigned long long *> calloc(count, sizeof(unsigned long long))
    bound_len = <Py_ssize_t *> calloc(count, sizeof(Py_ssize_t))
    bindings = <unsigned char *> calloc(bound_total + 1, 1)
    try:
        if views == NULL or seeds == NULL or bound_len == NULL or bindings == NULL:
            raise MemoryError()
        for i in range(count):
            slot, length, codec, seq = slots[i], lengths[i], codecs[i], seqs[i]
            if not (0 <= slot < 2**64 and 0 <= length < 2**32 and 0 <= codec < 256
                    and 0 <= seq < 2**64):
                raise struct.error("argument out of range")
            key_bytes = keys[i] if type(keys[i]) is bytes else bytes(memoryview(keys[i]))
            at = bindings + bound_at
            at[0] = 75  # "K"
            at[1] = 76  # "L"
            memset(at + 2, 0, _NAMESPACE_BYTES)
            memcpy(at + 2, <const unsigned char *> namespace, name_len)
            _put(at + 22, slot, 8)
            _put(at + 30, length, 4)
            _put(at + 34, codec, 1)
            _put(at + 35, seq, 8)
            key = key_bytes
            memcpy(at + _BINDING_BYTES, key, len(key_bytes))
            bound_len[i] = _BINDING_BYTES + len(key_bytes)
            bound_at += bound_len[i]
            PyObject_GetBuffer(stored[i], &views[i], PyBUF_SIMPLE)
            held += 1
        with nogil:
            bound_at = 0
            for i in range(count):
                seeds[i] = _xxh3(bindings + bound_at, <size_t> bound_len[i], 0)
                bound_at += bound_len[i]
                seeds[i] = _xxh3(views[i].buf, <size_t> views[i].len, seeds[i])
        return [seeds[i] for i in range(count)]
    finally:
        for i in range(held):
            PyBuffer_Release(&views[i])
        free(views)
        free(seeds)
        free(bound_len)
        free(bindings)
