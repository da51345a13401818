# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""ARC's compiled core: `kvtier.policies.arc.ARCCachePolicy` with its four lists in C.

Built by `scripts/build-core` with the other core modules; when it is selected (see
`kvtier.compiled`), `kvtier.policies.arc` exports this class as `ARCCachePolicy` and keeps the
pure-Python one as `PureARCCachePolicy`, the fallback (`KVTIER_PURE_PYTHON=1`, no build).

The algorithm is arc.py's, step for step (its docstrings say why each step is so): the same
`insert`, `insert_many`, `touch`, `on_store_miss` and `remove`, and `evict` planned as
arc.py's `_plan_evictions` plans it, then applied as arc.py applies a plan. What differs is
the data structure: T1, T2, B1 and B2 are intrusive doubly linked lists over C arrays of
node numbers (least recently used at the head), one dict maps every listed key to its node,
and moving a key between lists relinks two nodes instead of deleting from one ordered dict
and inserting into another. The keys announced by `on_store_miss` (arc.py's `_incoming`) are
nodes too, flagged and kept in announcement order in a C array: a new key announced gets its
node then (PENDING, on no list), so announcing it is one dict operation and its `insert` and
`evict`'s look-ups none. `tests/test_compiled_core.py` checks that both classes take the
same decisions (hits, victims, final lists, p) on the shipped trace and on random programs.
"""

from cpython.mem cimport PyMem_Free, PyMem_Realloc
from cpython.object cimport PyObject


cdef extern from "Python.h":
    PyObject *PyDict_SetDefault(object d, object key, object default) except NULL

from kvtier.blocks import BlockStatus
from kvtier.errors import BlockStateError
from kvtier.policies.base import CachePolicy, check_evict_count
from kvtier.policies.hinted import HintBook

# The lists a node can be on (`_where`), indexes of `_head`, `_tail` and `_size`.
cdef enum:
    T1 = 0
    T2 = 1
    B1 = 2
    B2 = 3
    NOWHERE = 4  # a free node
    PENDING = 5  # an announced key on no list (see `on_store_miss`)

# What an eviction plan does with each victim (arc.py's _EVICT_T1, _EVICT_T2, _DROP_T1).
cdef enum:
    EVICT_T1 = 0
    EVICT_T2 = 1
    DROP_T1 = 2

# Where a requested key comes from (arc.py's _NEW, _FROM_B1, _FROM_B2).
cdef enum:
    NEW = 0
    FROM_B1 = 1
    FROM_B2 = 2


# A ctypes object's header: the address of its data comes first (CPython's CDataObject).
cdef extern from *:
    """
    typedef struct { PyObject_HEAD char *b_ptr; } kvtier_CDataObject;
    """
    ctypedef struct kvtier_CDataObject:
        char *b_ptr

# `BlockStatus.ref_cnt` read from the structure's memory (its first field, a 32-bit int) when
# the layout is the one expected, else by attribute as any other block's.
cdef bint _DIRECT = (
    BlockStatus.ref_cnt.offset == 0 and BlockStatus.ref_cnt.size == 4 and sizeof(int) == 4
)


cdef inline object _ref_cnt(object block):
    """`block.ref_cnt`; read in C for a `BlockStatus`."""
    if _DIRECT and type(block) is BlockStatus:
        return (<int *> (<kvtier_CDataObject *> block).b_ptr)[0]
    return block.ref_cnt


cdef void *_resized(void *memory, size_t size) except NULL:
    """`memory` grown to `size` bytes (PyMem_Realloc); MemoryError when it cannot be, the old
    block then left as it was (still owned by the caller)."""
    cdef void *grown = PyMem_Realloc(memory, size)
    if grown == NULL:
        raise MemoryError()
    return grown


cdef class ARCLists:
    """ARC's state: the four lists, the resident blocks, p and the announced keys."""

    cdef readonly Py_ssize_t capacity
    cdef public double p
    cdef readonly dict resident  # T1 and T2's keys -> block (`get` is its bound `get`)
    cdef dict _node  # every listed key (all four lists) and announced key -> its node number
    cdef readonly bint incoming_adapted
    # The announced keys (arc.py's `_incoming`): the nodes flagged `_incoming`, in the order
    # of `_ann[:_nann]` (the announcement, duplicates and resident keys left out), which also
    # keeps those whose flag was cleared since (inserted) until `evict` compacts it. A tier
    # inserts the keys it announced in that order: `_ann_pos` is where the next one is.
    cdef int *_ann
    cdef Py_ssize_t _nann, _ann_cap, _ann_pos
    cdef signed char *_incoming
    cdef Py_ssize_t _insert_room
    # Per node: the neighbours (-1: none), the list, a mark used while planning.
    cdef int *_prev
    cdef int *_next
    cdef signed char *_where
    cdef signed char *_gone
    cdef list _keys  # per node: its key
    cdef list _blocks  # per node: its block (None on a ghost list or free)
    cdef list _ids  # per node: its number as a Python int (the `_node` dict's values)
    cdef int _allocated
    # While planning an eviction: the nodes marked gone (`_gone`), the ghosts the plan
    # deletes (both at most one per node), the victims and what happens to each.
    cdef int *_marked
    cdef int *_popped
    cdef Py_ssize_t _nmarked, _npopped, _nplan, _plan_cap
    cdef int *_plan
    cdef signed char *_ops
    cdef int _free  # first free node, chained through `_next` (-1: none)
    cdef int _head[4]
    cdef int _tail[4]
    cdef Py_ssize_t _size[4]

    def __cinit__(self, Py_ssize_t capacity):
        self.capacity = capacity
        self.p = 0.0
        self.resident = {}
        self._node = {}
        self.incoming_adapted = False
        self._ann = NULL
        self._incoming = NULL
        self._nann = self._ann_cap = self._ann_pos = 0
        self._insert_room = 0
        self._keys = []
        self._blocks = []
        self._ids = []
        self._allocated = 0
        self._free = -1
        self._prev = NULL
        self._next = NULL
        self._where = NULL
        self._gone = NULL
        self._marked = NULL
        self._popped = NULL
        self._plan = NULL
        self._ops = NULL
        self._nmarked = self._npopped = self._nplan = self._plan_cap = 0
        cdef int i
        for i in range(4):
            self._head[i] = -1
            self._tail[i] = -1
            self._size[i] = 0
        self._grow(max(16, min(2 * capacity + 8, 1 << 20)))

    def __dealloc__(self):
        PyMem_Free(self._prev)
        PyMem_Free(self._next)
        PyMem_Free(self._where)
        PyMem_Free(self._gone)
        PyMem_Free(self._marked)
        PyMem_Free(self._popped)
        PyMem_Free(self._plan)
        PyMem_Free(self._ops)
        PyMem_Free(self._ann)
        PyMem_Free(self._incoming)

    # -- nodes and lists ---------------------------------------------------------------------

    cdef int _grow(self, int count) except -1:
        cdef int old = self._allocated, new = old + count, i
        self._prev = <int *> _resized(self._prev, new * sizeof(int))
        self._next = <int *> _resized(self._next, new * sizeof(int))
        self._where = <signed char *> _resized(self._where, new * sizeof(signed char))
        self._gone = <signed char *> _resized(self._gone, new * sizeof(signed char))
        self._marked = <int *> _resized(self._marked, new * sizeof(int))
        self._popped = <int *> _resized(self._popped, new * sizeof(int))
        self._incoming = <signed char *> _resized(self._incoming, new * sizeof(signed char))
        for i in range(old, new):
            self._keys.append(None)
            self._blocks.append(None)
            self._ids.append(i)
            self._where[i] = NOWHERE
            self._gone[i] = 0
            self._incoming[i] = 0
            self._prev[i] = -1
        # chain the new nodes onto the free list, lowest first
        for i in range(old, new):
            self._next[i] = i + 1 if i + 1 < new else self._free
        self._free = old
        self._allocated = new
        return 0

    cdef inline void _link(self, int node, int where):
        """Append `node` at the most recently used end of list `where`."""
        cdef int tail = self._tail[where]
        self._where[node] = where
        self._prev[node] = tail
        self._next[node] = -1
        if tail < 0:
            self._head[where] = node
        else:
            self._next[tail] = node
        self._tail[where] = node
        self._size[where] += 1

    cdef inline void _unlink(self, int node):
        cdef int where = self._where[node]
        cdef int prev = self._prev[node], nxt = self._next[node]
        if prev < 0:
            self._head[where] = nxt
        else:
            self._next[prev] = nxt
        if nxt < 0:
            self._tail[where] = prev
        else:
            self._prev[nxt] = prev
        self._size[where] -= 1
        self._where[node] = NOWHERE

    cdef inline void _move(self, int node, int where):
        self._unlink(node)
        self._link(node, where)

    cdef inline int _node_of(self, object key, bint *created) except -1:
        """The node of `key`, or a free node registered for it (`created[0]` then says so;
        it is on no list, NOWHERE): one dict operation."""
        if self._free < 0:
            self._grow(self._allocated)
        cdef int node = self._free
        ident = self._ids[node]
        found = <object> PyDict_SetDefault(self._node, key, ident)
        if found is ident:
            self._free = self._next[node]
            self._keys[node] = key
            created[0] = True
            return node
        created[0] = False
        return <int> found

    cdef inline void _join_t1(self, int node, object block):
        """`node` (on no list: new or announced) joins T1 with `block`, out of the announced
        keys."""
        self._unannounce(node)
        self._blocks[node] = block
        self._link(node, T1)

    cdef int _add_to_t1(self, object key, object block) except -1:
        """`key` (not resident, not a ghost) joins T1 with `block`: its announced node, or a
        new node registered in `_node`."""
        cdef bint created
        self._join_t1(self._node_of(key, &created), block)
        return 0

    cdef inline void _unannounce(self, int node):
        """Take `node` out of the announced keys (if it is there)."""
        self._incoming[node] = 0

    cdef int _free_node(self, int node) except -1:
        """Forget `node`'s key (off every list already) and put it on the free list."""
        del self._node[self._keys[node]]
        self._keys[node] = None
        self._blocks[node] = None
        self._where[node] = NOWHERE
        self._next[node] = self._free
        self._free = node
        return 0

    cdef int _drop(self, int node) except -1:
        """Take `node` off its list and forget its key; an announced key keeps its node, on
        no list (PENDING), as it stays announced."""
        self._unlink(node)
        if self._incoming[node]:
            self._blocks[node] = None
            self._where[node] = PENDING
            return 0
        return self._free_node(node)

    cdef int _release_announced(self) except -1:
        """Forget the announced keys: each flag cleared, each node on no list freed."""
        cdef Py_ssize_t i
        cdef int node
        for i in range(self._nann):
            node = self._ann[i]
            if self._incoming[node]:
                self._incoming[node] = 0
                if self._where[node] == PENDING:
                    self._free_node(node)
        self._nann = self._ann_pos = 0
        return 0

    cdef inline int _find(self, object key) except -2:
        """The node of `key` (on any list, or PENDING), or -1."""
        cdef object node = self._node.get(key)
        return -1 if node is None else <int> node

    cdef inline bint _is_ghost(self, int node):
        return node >= 0 and (self._where[node] == B1 or self._where[node] == B2)

    cdef int _bound_ghosts(self) except -1:
        cdef Py_ssize_t c = self.capacity
        while self._size[B1] and self._size[T1] + self._size[B1] > c:
            self._drop(self._head[B1])
        while (self._size[B1] or self._size[B2]) and (
            self._size[T1] + self._size[T2] + self._size[B1] + self._size[B2] > 2 * c
        ):
            self._drop(self._head[B2] if self._size[B2] else self._head[B1])
        return 0

    # -- inspection --------------------------------------------------------------------------

    cpdef list keys_of(self, int where):
        """The keys of list `where` (0: T1, 1: T2, 2: B1, 3: B2), least recently used first."""
        cdef list out = []
        cdef int node = self._head[where]
        while node >= 0:
            out.append(self._keys[node])
            node = self._next[node]
        return out

    cpdef list announced(self):
        """The announced keys not inserted yet, in order (arc.py's `_incoming`)."""
        cdef Py_ssize_t i
        return [
            self._keys[self._ann[i]] for i in range(self._nann) if self._incoming[self._ann[i]]
        ]

    cpdef list entries(self):
        """T1's and then T2's (key, block), each least recently used first."""
        cdef list out = []
        cdef int where, node
        for where in (T1, T2):
            node = self._head[where]
            while node >= 0:
                out.append((self._keys[node], self._blocks[node]))
                node = self._next[node]
        return out

    def clear(self):
        cdef int where
        for where in range(4):
            while self._head[where] >= 0:
                self._drop(self._head[where])
        self._release_announced()
        self.resident.clear()
        self.incoming_adapted = False
        self._insert_room = 0
        self.p = 0.0

    def reset_insert_room(self):
        self._insert_room = 0

    # -- the hot calls (arc.py's methods of the same names) ----------------------------------

    def insert(self, key, block):
        cdef Py_ssize_t c, t1n, b1n, b2n, rn, a, b
        cdef int node, where
        cdef bint created
        if self._ann_pos < self._nann and self._keys[self._ann[self._ann_pos]] is key:
            # the next key announced, as a tier inserts them: its node is at hand
            node = self._ann[self._ann_pos]
            self._ann_pos += 1
        else:
            node = self._node_of(key, &created)
        where = self._where[node]
        if where == PENDING or where == NOWHERE:
            self._join_t1(node, block)
        elif where == B1 or where == B2:
            self.insert_many((key,), (block,))
            return
        else:
            raise BlockStateError(f"arc: key {key!r} is already resident")
        self.resident[key] = block
        if self._insert_room:
            self._insert_room -= 1
            return
        c = self.capacity
        t1n, b1n, b2n = self._size[T1], self._size[B1], self._size[B2]
        rn = len(self.resident)
        if (b1n and t1n + b1n > c) or (rn + b1n + b2n > 2 * c and (b1n or b2n)):
            self._bound_ghosts()
            b1n, b2n = self._size[B1], self._size[B2]
            t1n = self._size[T1]
        a = c - t1n - b1n if b1n else c
        b = 2 * c - rn - b1n - b2n if (b1n or b2n) else c
        self._insert_room = a if a < b else b

    def insert_many(self, keys, blocks):
        """arc.py's `insert_many` after its batch checks (the caller made them)."""
        self._insert_room = 0
        cdef Py_ssize_t c = self.capacity, m = len(keys)
        cdef Py_ssize_t t1n = self._size[T1], t2n = self._size[T2]
        cdef Py_ssize_t b1n = self._size[B1], b2n = self._size[B2]
        cdef dict resident = self.resident
        cdef double p
        cdef bint adapted_all, adapted, ghost_hit = False
        cdef int node
        for key in keys:
            if self._is_ghost(self._find(key)):
                ghost_hit = True
                break
        if (
            not ghost_hit
            and not (b1n and t1n + m + b1n > c)
            and not ((b1n or b2n) and t1n + m + t2n + b1n + b2n > 2 * c)
        ):
            for key, block in zip(keys, blocks, strict=True):
                self._add_to_t1(key, block)
                resident[key] = block
            return
        p = self.p
        adapted_all = self.incoming_adapted
        for key, block in zip(keys, blocks, strict=True):
            node = self._find(key)
            adapted = node >= 0 and self._incoming[node] and adapted_all
            if node >= 0:
                self._unannounce(node)  # whichever list it joins below
            if node >= 0 and self._where[node] == B1:
                if not adapted:
                    p = min(p + (1.0 if b1n >= b2n else <double> b2n / b1n), <double> c)
                self._move(node, T2)
                self._blocks[node] = block
                b1n -= 1
                t2n += 1
            elif node >= 0 and self._where[node] == B2:
                if not adapted:
                    p = max(p - (1.0 if b2n >= b1n else <double> b1n / b2n), 0.0)
                self._move(node, T2)
                self._blocks[node] = block
                b2n -= 1
                t2n += 1
            else:
                self._add_to_t1(key, block)
                t1n += 1
            resident[key] = block
            if (b1n and t1n + b1n > c) or ((b1n or b2n) and t1n + t2n + b1n + b2n > 2 * c):
                self._bound_ghosts()
                b1n, b2n = self._size[B1], self._size[B2]
        self.p = p

    def remove(self, key):
        """arc.py's `remove` but for the hints (the caller's)."""
        if self.resident.pop(key, None) is None:
            raise BlockStateError(f"arc: key {key!r} is not resident")
        self._drop(self._find(key))  # resident: never an announced key

    def touch(self, keys):
        cdef int node, where
        cdef Py_ssize_t i
        for i in range(len(keys) - 1, -1, -1):
            node = self._find(keys[i])
            if node < 0:
                continue
            where = self._where[node]
            if where == T2:
                if self._tail[T2] != node:
                    self._move(node, T2)
            elif where == T1:
                if _ref_cnt(self._blocks[node]) >= 0:
                    self._move(node, T2)  # case I
                elif self._tail[T1] != node:
                    self._move(node, T1)

    def on_store_miss(self, keys):
        """arc.py's: the keys that are not resident become the announced ones, in order and
        each once. Each is one dict operation: its node if it has one (a ghost's), else a
        new PENDING node registered for it."""
        cdef Py_ssize_t m = len(keys)
        cdef int node, where
        cdef bint created
        for key in keys:
            hash(key)  # an unhashable key fails here, before anything changed (as in arc.py)
        self._release_announced()
        if m > self._ann_cap:
            self._ann = <int *> _resized(self._ann, m * sizeof(int))
            self._ann_cap = m
        for key in keys:
            node = self._node_of(key, &created)
            where = self._where[node]
            if created:
                self._where[node] = PENDING
            elif where == T1 or where == T2 or self._incoming[node]:
                continue  # resident, or announced already
            self._incoming[node] = 1
            self._ann[self._nann] = node
            self._nann += 1
        self.incoming_adapted = False

    # -- evict: arc.py's _plan_evictions, then the plan applied --------------------------------

    cdef int _next_evictable(self, int *cursor, object protected) except -2:
        """Advance `cursor` past the next block that may be evicted and return its node."""
        cdef int node = cursor[0]
        while node >= 0:
            cursor[0] = self._next[node]
            if _ref_cnt(self._blocks[node]) == 0 and self._keys[node] not in protected:
                return node
            node = cursor[0]
        return -1

    cdef inline void _mark(self, int node):
        """Mark `node` gone for this plan (a ghost hit, or a ghost the plan deletes)."""
        self._gone[node] = 1
        self._marked[self._nmarked] = node
        self._nmarked += 1

    cdef inline void _pop_oldest(self, int *cursor):
        """Delete (in the plan) the oldest ghost at or after `cursor` not gone yet."""
        cdef int node = cursor[0]
        while node >= 0:
            cursor[0] = self._next[node]
            if not self._gone[node]:
                self._mark(node)
                self._popped[self._npopped] = node
                self._npopped += 1
                return
            node = cursor[0]

    cdef inline void _plan_victim(self, int node, signed char op):
        self._plan[self._nplan] = node
        self._ops[self._nplan] = op
        self._nplan += 1

    def evict(self, Py_ssize_t n, protected):
        """arc.py's `evict` (n >= 1, no hinted block): the victims, or None changing nothing."""
        cdef Py_ssize_t i
        if n > self._plan_cap:
            self._plan = <int *> _resized(self._plan, n * sizeof(int))
            self._ops = <signed char *> _resized(self._ops, n * sizeof(signed char))
            self._plan_cap = n
        self._nplan = self._nmarked = self._npopped = 0
        try:
            return self._evict(n, protected)
        finally:
            for i in range(self._nmarked):
                self._gone[self._marked[i]] = 0
            self._nmarked = 0

    cdef object _evict(self, Py_ssize_t n, object protected):
        cdef Py_ssize_t c = self.capacity
        cdef double fc = <double> c, p = self.p
        cdef Py_ssize_t t1n = self._size[T1], t2n = self._size[T2]
        cdef Py_ssize_t b1n = self._size[B1], b2n = self._size[B2]
        cdef Py_ssize_t k = self._compact_announced(), i, free_slots, unannounced
        cdef int *incoming = self._ann  # the announced keys' nodes, in order
        cdef int t1_cur = self._head[T1], t2_cur = self._head[T2]
        cdef int b1_cur = self._head[B1], b2_cur = self._head[B2]
        cdef int node, victim, origin
        cdef bint steady, from_t1, is_key
        # arc.py's free-slot keys (the first k - n announced) and paying keys (the last n,
        # led by `unannounced` keys that no announcement named when k < n)
        if k >= n:
            free_slots, unannounced = k - n, 0
        else:
            free_slots, unannounced = 0, n - k
        # keys served by free slots
        for i in range(free_slots):
            node = incoming[i]  # an announced key always has a node
            if b1n > 0 and self._where[node] == B1 and not self._gone[node]:
                p = min(p + (1.0 if b1n >= b2n else <double> b2n / b1n), fc)
                t2n += 1
                b1n -= 1
                self._gone[node] = 1
                self._mark(node)
            elif b2n > 0 and self._where[node] == B2 and not self._gone[node]:
                p = max(p - (1.0 if b2n >= b1n else <double> b1n / b2n), 0.0)
                t2n += 1
                b2n -= 1
                self._gone[node] = 1
                self._mark(node)
            else:
                t1n += 1
            self._trim(t1n, t2n, &b1n, &b2n, &b1_cur, &b2_cur)
        steady = b1n > 0 and p < t1n and t1n < c and c <= t1n + b1n
        for i in range(n):
            is_key = i >= unannounced
            node = incoming[free_slots + i - unannounced] if is_key else -1
            origin = NEW
            if node >= 0 and not self._gone[node]:
                if b1n > 0 and self._where[node] == B1:
                    origin = FROM_B1
                elif b2n > 0 and self._where[node] == B2:
                    origin = FROM_B2
            if steady and is_key and origin == NEW:
                victim = self._next_evictable(&t1_cur, protected)
                if victim >= 0:
                    self._plan_victim(victim, EVICT_T1)
                    self._pop_oldest(&b1_cur)
                    continue
            if origin == FROM_B1:  # case II
                p = min(p + (1.0 if b1n >= b2n else <double> b2n / b1n), fc)
                self._gone[node] = 1
                self._mark(node)
            elif origin == FROM_B2:  # case III
                p = max(p - (1.0 if b2n >= b1n else <double> b1n / b2n), 0.0)
                self._gone[node] = 1
                self._mark(node)
            else:  # case IV
                if t1n + b1n >= c:  # IV.A
                    if t1n >= c:
                        victim = self._next_evictable(&t1_cur, protected)
                        if victim >= 0:
                            self._plan_victim(victim, DROP_T1)
                            t1n -= 1
                        else:
                            victim = self._next_evictable(&t2_cur, protected)
                            if victim < 0:
                                return None
                            self._plan_victim(victim, EVICT_T2)
                            t2n -= 1
                            b2n += 1
                        if is_key:
                            t1n += 1
                        self._trim(t1n, t2n, &b1n, &b2n, &b1_cur, &b2_cur)
                        steady = b1n > 0 and p < t1n and t1n < c and c <= t1n + b1n
                        continue
                    if b1n > 0:
                        self._pop_oldest(&b1_cur)
                        b1n -= 1
                elif t1n + t2n + b1n + b2n >= 2 * c and b2n > 0:  # IV.B
                    self._pop_oldest(&b2_cur)
                    b2n -= 1
            # REPLACE(x, p)
            from_t1 = t1n > 0 and (t1n > p or (origin == FROM_B2 and t1n == p))
            victim = self._next_evictable(&t1_cur if from_t1 else &t2_cur, protected)
            if victim < 0:
                from_t1 = not from_t1
                victim = self._next_evictable(&t1_cur if from_t1 else &t2_cur, protected)
                if victim < 0:
                    return None
            self._plan_victim(victim, EVICT_T1 if from_t1 else EVICT_T2)
            if from_t1:
                t1n -= 1
                b1n += 1
            else:
                t2n -= 1
                b2n += 1
            if origin == FROM_B1:
                t2n += 1
                b1n -= 1
            elif origin == FROM_B2:
                t2n += 1
                b2n -= 1
            elif is_key:
                t1n += 1
            self._trim(t1n, t2n, &b1n, &b2n, &b1_cur, &b2_cur)
            steady = b1n > 0 and p < t1n and t1n < c and c <= t1n + b1n
        return self._apply(p)

    cdef Py_ssize_t _compact_announced(self):
        """Leave in `_ann` only the keys still announced (in order) and return how many."""
        cdef Py_ssize_t i, k = 0
        cdef int node
        for i in range(self._nann):
            node = self._ann[i]
            if self._incoming[node]:
                self._ann[k] = node
                k += 1
        self._nann = k
        self._ann_pos = 0
        return k

    cdef inline void _trim(
        self,
        Py_ssize_t t1n,
        Py_ssize_t t2n,
        Py_ssize_t *b1n,
        Py_ssize_t *b2n,
        int *b1_cur,
        int *b2_cur,
    ):
        """arc.py's `trimmed`: `_bound_ghosts` as the step order applies it, on the ghost
        counts `b1n` and `b2n` (updated)."""
        cdef Py_ssize_t c = self.capacity
        while b1n[0] and t1n + b1n[0] > c:
            self._pop_oldest(b1_cur)
            b1n[0] -= 1
        while (b1n[0] or b2n[0]) and t1n + t2n + b1n[0] + b2n[0] > 2 * c:
            if b2n[0]:
                self._pop_oldest(b2_cur)
                b2n[0] -= 1
            else:
                self._pop_oldest(b1_cur)
                b1n[0] -= 1

    cdef list _apply(self, double p):
        """Apply a plan as arc.py's `evict` does: the victims in order to the MRU end of B1
        or B2 (or dropped), then the ghosts the plan deleted."""
        cdef list out = []
        cdef dict resident = self.resident
        cdef Py_ssize_t i
        cdef int node, op
        for i in range(self._nplan):
            node = self._plan[i]
            op = self._ops[i]
            key = self._keys[node]
            out.append((key, self._blocks[node]))
            del resident[key]
            if op == EVICT_T1:
                self._move(node, B1)
                self._blocks[node] = None
            elif op == EVICT_T2:
                self._move(node, B2)
                self._blocks[node] = None
            else:
                self._drop(node)
        for i in range(self._npopped):
            self._drop(self._popped[i])
        self.p = p
        self.incoming_adapted = True
        self._insert_room = 0
        self._bound_ghosts()
        return out


class ARCCachePolicy(CachePolicy):
    """ARC: balances recency (T1) against frequency (T2) with a self-tuning target.

    `kvtier.policies.arc.ARCCachePolicy` with its lists in C (`ARCLists`); the per-key calls
    (`get`, `insert`) and `on_store_miss` are the core's own, with no Python frame, unless a
    subclass overrides them."""

    name = "arc"

    def __init__(self, cache_capacity):
        super().__init__(cache_capacity)
        core = ARCLists(cache_capacity)
        self._core = core
        self._hints = HintBook()
        cls = type(self)
        if cls.get is ARCCachePolicy.get:
            self.get = core.resident.get
        if cls.insert is ARCCachePolicy.insert:
            self.insert = core.insert
        if cls.on_store_miss is ARCCachePolicy.on_store_miss:
            self.on_store_miss = core.on_store_miss

    @property
    def target_t1_size(self):
        """The adaptive target p for |T1|."""
        return self._core.p

    def lists(self):
        """T1, T2, B1 and B2, each least recently used first (for tests and inspection)."""
        core = self._core
        return {
            "t1": core.keys_of(0),
            "t2": core.keys_of(1),
            "b1": core.keys_of(2),
            "b2": core.keys_of(3),
        }

    def get(self, key):
        return self._core.resident.get(key)

    def getter(self):
        return self._core.resident.get

    def insert(self, key, block):
        self._core.insert(key, block)

    def insert_many(self, keys, blocks):
        core = self._core
        self._check_insert_batch(keys, blocks, core.resident)
        core.insert_many(keys, blocks)

    def remove(self, key):
        self._core.remove(key)
        if self._hints.reuse:
            self._hints.discard(key)

    def hint(self, key, reuse):
        self._hints.mark(key, reuse, key in self._core.resident)

    def touch(self, keys):
        if self._hints.reuse:
            self._hints.touched(keys)
        self._core.touch(keys)

    def on_store_miss(self, keys):
        self._core.on_store_miss(keys)

    def evict(self, n, protected=()):
        if type(n) is not int or n < 1:  # the common case skips check_evict_count's call
            check_evict_count(n)
            if n == 0:
                return []
        if self._hints.active:
            return self._hints.evict_hinted(
                n, protected, self.evict, self._core.resident.get, self.remove, self.items
            )
        return self._core.evict(n, protected)

    def clear(self):
        self._core.clear()
        self._hints.clear()

    def __len__(self):
        return len(self._core.resident)

    def items(self):
        return iter(self._core.entries())
