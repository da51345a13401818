# cython: language_level=3
"""`BlockStatus`'s constructor in C: a block is made for every block a tier stores.

`BlockStatus(block_id)` in Python runs a Python `__init__` (a frame, `super().__init__()`
and two ctypes field writes, each checked and converted): about three quarters of a
microsecond on the 2-core VM, as much as ARC's whole bookkeeping of a stored key. The
function here writes the two fields straight into the structure's memory (`ref_cnt = -1` at
offset 0, `block_id` at offset 8), converting `block_id` exactly as ctypes' `c_int64` field
does (an integer or an `__index__` object, wrapped modulo 2**64; anything else a
TypeError); `install` puts it in place of the Python `__init__` when the structure has
that layout.

Built by `scripts/build-core` with the other core modules (`kvtier.compiled`); when it is not
built or not selected, `kvtier.blocks` keeps the Python `__init__`.
`tests/test_compiled_core.py` checks that both make the same blocks and raise the same errors.
"""

from libc.stdint cimport int32_t, int64_t


cdef extern from "Python.h":
    unsigned long long PyLong_AsUnsignedLongLongMask(object o) except? <unsigned long long> -1


# A ctypes object's header: the address of its data comes first (CPython's CDataObject).
cdef extern from *:
    """
    typedef struct { PyObject_HEAD char *b_ptr; } kvtier_blocks_CDataObject;
    """
    ctypedef struct kvtier_blocks_CDataObject:
        char *b_ptr


cdef inline int64_t _as_block_id(object block_id) except? -1:
    """`block_id` as ctypes converts a value stored into a `c_int64` field (CPython's
    `get_longlong`): an `int` or `__index__` object, wrapped modulo 2**64."""
    return <int64_t> PyLong_AsUnsignedLongLongMask(block_id)


def init_block_status(self, block_id):
    """`BlockStatus.__init__`: a block being written (`ref_cnt = -1`) in slot `block_id`."""
    cdef int64_t value = _as_block_id(block_id)
    cdef char *data = (<kvtier_blocks_CDataObject *> self).b_ptr
    (<int32_t *> data)[0] = -1
    (<int64_t *> (data + 8))[0] = value


def install(cls):
    """Make `init_block_status` the `__init__` of `cls` (`kvtier.blocks.BlockStatus`) when its
    fields are laid out as it writes them; return whether it did."""
    ref_cnt, block_id = cls.ref_cnt, cls.block_id
    if not (
        ref_cnt.offset == 0
        and ref_cnt.size == sizeof(int32_t)
        and block_id.offset == 8
        and block_id.size == sizeof(int64_t)
    ):
        return False
    cls.__init__ = init_block_status
    return True
