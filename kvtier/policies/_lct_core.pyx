# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""lct's compiled core: `kvtier.policies.lct.LCTCachePolicy` with its per-access state in C.

Built by `scripts/build-core` with the other core modules; when it is selected (see
`kvtier.compiled`), `kvtier.policies.lct` exports this class as `LCTCachePolicy` and keeps the
pure-Python one as `PureLCTCachePolicy`, the fallback (`KVTIER_PURE_PYTHON=1`, no build).

The algorithm is lct.py's, step for step (its docstrings say why each step is so): the same
`_observe` per access, `on_store_miss`, `touch`, `insert`, `remove`, `admit`, `evict`, the
ghosts forgotten after `memory` accesses, the requeue when the horizon moves. What differs is
the data structure: each key remembered is a node (one dict of the resident keys and one of
the others map a key to its node, as lct.py's `_history` and `_ghosts` do), each node holds
its state and last three access times in C arrays, and the four class queues and the ghosts
are intrusive doubly linked lists over those arrays (oldest at the head, as the ordered
dicts are). The reuse histogram and the arrivals are C double arrays, updated by the same
floating-point operations in the same order. The solver, run every `period` accesses, is
lct.py's own code (the subclass reads and writes the core's arrays through properties), so
the limits, shares and horizon moves are bit-identical; `tests/test_compiled_core.py` checks
that both classes take the same decisions.
"""

from cpython.mem cimport PyMem_Free, PyMem_Realloc
from cpython.object cimport PyObject
from libc.math cimport INFINITY, log2
from libc.stdint cimport int64_t


cdef extern from "Python.h":
    PyObject *PyDict_SetDefault(object d, object key, object default) except NULL

from kvtier.blocks import BlockStatus
from kvtier.errors import BlockStateError, InvalidValueError
from kvtier.policies.base import check_evict_count
from kvtier.policies.lct import BINS_PER_OCTAVE, CLASSES, NEVER, PureLCTCachePolicy

# The lists a node can be on (`_where`): the class queues 0 to 3, the ghosts, none.
cdef enum:
    GHOSTS = 4
    NOWHERE = 5
    LISTS = 5

cdef int64_t C_NEVER = NEVER
cdef int C_BINS_PER_OCTAVE = BINS_PER_OCTAVE


# A ctypes object's header: the address of its data comes first (CPython's CDataObject).
cdef extern from *:
    """
    typedef struct { PyObject_HEAD char *b_ptr; } kvtier_lct_CDataObject;
    """
    ctypedef struct kvtier_lct_CDataObject:
        char *b_ptr

# `BlockStatus.ref_cnt` read from the structure's memory (its first field, a 32-bit int) when
# the layout is the one expected, else by attribute as any other block's.
cdef bint _DIRECT = (
    BlockStatus.ref_cnt.offset == 0 and BlockStatus.ref_cnt.size == 4 and sizeof(int) == 4
)


cdef inline bint _unpinned(object block) except -1:
    """`block.ref_cnt == 0`; read in C for a `BlockStatus`."""
    if _DIRECT and type(block) is BlockStatus:
        return (<int *> (<kvtier_lct_CDataObject *> block).b_ptr)[0] == 0
    return block.ref_cnt == 0


cdef void *_resized(void *memory, size_t size) except NULL:
    """`memory` grown to `size` bytes (PyMem_Realloc); MemoryError when it cannot be, the old
    block then left as it was (still owned by the caller)."""
    cdef void *grown = PyMem_Realloc(memory, size)
    if grown == NULL:
        raise MemoryError()
    return grown


cdef class LCTState:
    """lct's per-access state: the nodes, the queues, the statistics, the limits."""

    cdef readonly dict resident  # resident key -> block (`get` is its bound `get`)
    cdef dict _rnode  # resident key -> its node (lct.py's `_history`)
    cdef dict _gnode  # remembered non-resident key -> its node (lct.py's `_ghosts`)
    cdef object _owner  # the policy: its `_solve` runs every `period` accesses
    # Per node: the neighbours (-1: none), the list, the state, the last three access times.
    cdef int *_prev
    cdef int *_next
    cdef signed char *_where
    cdef signed char *_state
    cdef int64_t *_last
    cdef int64_t *_second
    cdef int64_t *_third
    cdef list _keys  # per node: its key
    cdef list _blocks  # per node: its block (None for a ghost or a free node)
    cdef list _ids  # per node: its number as a Python int (the dicts' values)
    cdef int _allocated
    cdef int _free  # first free node, chained through `_next` (-1: none)
    cdef int _head[5]
    cdef int _tail[5]
    cdef Py_ssize_t _size[5]
    cdef int *_plan  # the victims of an eviction
    cdef Py_ssize_t _plan_cap
    # The settings (lct.py's attributes of the same names).
    cdef public int64_t clock, since_solve, period
    cdef public bint ratio  # `order == "ratio"`
    cdef int64_t _memory
    cdef int64_t _horizons[4]
    cdef int _nhorizons, _width, _first, _nstates, _bins, _nweights
    cdef int _ids_table[125]  # (candidates + 1) ** 3
    cdef signed char _classes[4][35]  # per candidate, the class of each state (35 at most)
    cdef readonly int horizon
    cdef double *_weights
    cdef double *_reuse  # _nstates rows of _bins
    cdef double _arrivals[35]
    cdef double _limits[4]
    cdef double _shares[4]
    cdef double _credit[4]
    # What `_observe` found: the key's new state and last three access times.
    cdef int _o_state
    cdef int64_t _o_last, _o_second, _o_third

    def __cinit__(self):
        self.resident = {}
        self._rnode = {}
        self._gnode = {}
        self._owner = None
        self._keys = []
        self._blocks = []
        self._ids = []
        self._allocated = 0
        self._free = -1
        self._prev = self._next = NULL
        self._where = self._state = NULL
        self._last = self._second = self._third = NULL
        self._plan = NULL
        self._plan_cap = 0
        self._weights = self._reuse = NULL
        self._nstates = self._bins = self._nweights = 0
        self.clock = self.since_solve = 0
        self.period = 1
        self.ratio = True
        self.horizon = 0
        cdef int i
        for i in range(LISTS):
            self._head[i] = self._tail[i] = -1
            self._size[i] = 0
        for i in range(4):
            self._limits[i] = INFINITY
            self._shares[i] = 1.0
            self._credit[i] = 0.0

    def __dealloc__(self):
        PyMem_Free(self._prev)
        PyMem_Free(self._next)
        PyMem_Free(self._where)
        PyMem_Free(self._state)
        PyMem_Free(self._last)
        PyMem_Free(self._second)
        PyMem_Free(self._third)
        PyMem_Free(self._plan)
        PyMem_Free(self._weights)
        PyMem_Free(self._reuse)

    def configure(self, owner):
        """Take the settings of `owner`, an lct policy whose `__init__` computed them."""
        cdef int i, s
        states = owner._states
        self._owner = owner
        self._nhorizons = len(owner._horizons)
        for i in range(self._nhorizons):
            self._horizons[i] = owner._horizons[i]
        self._memory = owner._memory
        self._width = states.width
        self._first = states.first
        self._nstates = states.count
        for i in range(len(states.ids)):
            self._ids_table[i] = states.ids[i]
        for i in range(self._nhorizons):
            for s in range(self._nstates):
                self._classes[i][s] = states.classes[i][s]
        self._bins = owner._bins
        self._nweights = len(owner._weights)
        self._weights = <double *> _resized(self._weights, self._nweights * sizeof(double))
        for i in range(self._nweights):
            self._weights[i] = owner._weights[i]
        self._reuse = <double *> _resized(
            self._reuse, self._nstates * self._bins * sizeof(double)
        )
        for i in range(self._nstates * self._bins):
            self._reuse[i] = 0.0
        for s in range(35):
            self._arrivals[s] = 0.0

    # -- nodes and lists ---------------------------------------------------------------------

    cdef int _grow(self) except -1:
        cdef int old = self._allocated, new = max(64, 2 * old), i
        self._prev = <int *> _resized(self._prev, new * sizeof(int))
        self._next = <int *> _resized(self._next, new * sizeof(int))
        self._where = <signed char *> _resized(self._where, new * sizeof(signed char))
        self._state = <signed char *> _resized(self._state, new * sizeof(signed char))
        self._last = <int64_t *> _resized(self._last, new * sizeof(int64_t))
        self._second = <int64_t *> _resized(self._second, new * sizeof(int64_t))
        self._third = <int64_t *> _resized(self._third, new * sizeof(int64_t))
        for i in range(old, new):
            self._keys.append(None)
            self._blocks.append(None)
            self._ids.append(i)
            self._where[i] = NOWHERE
            self._prev[i] = -1
            self._next[i] = i + 1 if i + 1 < new else self._free
        self._free = old
        self._allocated = new
        return 0

    cdef inline void _link(self, int node, int where):
        """Append `node` at the newest end of list `where`."""
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

    cdef int _new_node(self, object key) except -1:
        """A free node for `key`, on no list, remembering an access now and no other."""
        cdef int node
        if self._free < 0:
            self._grow()
        node = self._free
        self._free = self._next[node]
        self._keys[node] = key
        self._state[node] = self._first
        self._last[node] = self.clock
        self._second[node] = self._third[node] = C_NEVER
        return node

    cdef inline void _drop(self, int node):
        """Free `node` (unlinked already)."""
        self._keys[node] = None
        self._blocks[node] = None
        self._where[node] = NOWHERE
        self._next[node] = self._free
        self._free = node

    cdef inline void _store(self, int node):
        """Give `node` what `_observe` found."""
        self._state[node] = self._o_state
        self._last[node] = self._o_last
        self._second[node] = self._o_second
        self._third[node] = self._o_third

    # -- what every access does (lct.py's `_observe`) ----------------------------------------

    cdef inline int _within(self, int64_t age):
        """How many candidate horizons are at least `age` (lct.py: top - bisect_left)."""
        cdef int i, count = 0
        for i in range(self._nhorizons):
            if self._horizons[i] >= age:
                count += 1
        return count

    cdef int _observe(self, int node) except -1:
        """An access of the key of `node` (-1: nothing remembered of it): record the reuse
        and the arrival, leave what to remember of the key in `_o_*`; 1 if the solver ran
        (which may have forgotten `node`, if a ghost)."""
        cdef int64_t clock = self.clock + 1, last, gap, age, period = self.period
        cdef int g1, g2 = 0, g3 = 0, width, bin_
        self.clock = clock
        if node < 0 or clock - self._last[node] > self._memory:
            self._o_state = self._first
            self._o_last = clock
            self._o_second = self._o_third = C_NEVER
        else:
            last = self._last[node]
            gap = clock - last
            age = (clock - 1) // period - (last - 1) // period  # floor division, as Python's
            bin_ = <int> (log2(<double> gap) * C_BINS_PER_OCTAVE)
            if age < self._nweights:
                self._reuse[self._state[node] * self._bins + bin_] += self._weights[age]
            g1 = self._within(gap)
            if g1:
                g2 = self._within(clock - self._second[node])
                if g2:
                    g3 = self._within(clock - self._third[node])
            width = self._width
            self._o_state = self._ids_table[(g1 * width + g2) * width + g3]
            self._o_last = clock
            self._o_second = last
            self._o_third = self._second[node]
        self._arrivals[self._o_state] += 1.0
        self.since_solve += 1
        if self.since_solve >= self.period:
            self._owner._solve()
            return 1
        return 0

    cdef inline int _node_of(self, dict nodes, object key) except -2:
        cdef object found = nodes.get(key)
        return -1 if found is None else <int> found

    def on_store_miss(self, keys):
        cdef Py_ssize_t i
        cdef int node
        cdef object key
        cdef dict ghosts = self._gnode
        if type(keys) is not list:
            keys = list(keys)
        for i in range(len(keys) - 1, -1, -1):  # a request's deepest block first
            key = (<list> keys)[i]
            node = self._node_of(ghosts, key)
            if self._observe(node) and node >= 0:
                node = self._node_of(ghosts, key)  # the solver may have forgotten it
            if node < 0:
                node = self._new_node(key)
                ghosts[key] = self._ids[node]
            else:
                self._unlink(node)
            self._store(node)
            self._link(node, GHOSTS)

    def on_store_move(self, keys):
        cdef Py_ssize_t i
        cdef int node
        cdef object key
        if type(keys) is not list:
            keys = list(keys)
        for i in range(len(keys) - 1, -1, -1):
            key = (<list> keys)[i]
            if key in self.resident:
                continue
            node = self._node_of(self._gnode, key)
            if node < 0:
                node = self._new_node(key)
                self._gnode[key] = self._ids[node]
            else:
                self._unlink(node)
            self._link(node, GHOSTS)

    def touch(self, keys):
        cdef Py_ssize_t i
        cdef int node
        cdef dict nodes = self._rnode
        if type(keys) is not list:
            keys = list(keys)
        for i in range(len(keys) - 1, -1, -1):  # tail first, so the request's head is newest
            node = self._node_of(nodes, (<list> keys)[i])
            if node < 0:
                continue
            self._observe(node)  # may move the horizon (the queues then follow it)
            self._store(node)
            self._unlink(node)
            self._link(node, self._classes[self.horizon][self._o_state])

    cdef int _insert(self, object key, object block) except -1:
        cdef object found = self._gnode.pop(key, None)
        cdef int node
        if found is None:
            node = self._new_node(key)
        else:
            node = found
            self._unlink(node)
        self._blocks[node] = block
        self.resident[key] = block
        self._rnode[key] = self._ids[node]
        self._link(node, self._classes[self.horizon][self._state[node]])
        return 0

    def insert(self, key, block):
        if key in self.resident:
            raise BlockStateError(f"lct: key {key!r} is already resident")
        self._insert(key, block)

    def insert_many(self, keys, blocks):
        """`insert` of each pair, in order (checked by the caller: none resident, no key
        twice, as many blocks as keys)."""
        cdef Py_ssize_t i
        for i in range(len(keys)):
            self._insert(keys[i], blocks[i])

    cdef int _remember(self, int node) except -1:
        """Remember the key of resident `node` (unlinked, no longer in `_rnode`) as a ghost,
        the newest (lct.py's `_remember`)."""
        cdef object id_ = self._ids[node]
        # the key's entry among the ghosts: this node's, unless it has one already
        cdef int ghost = <int> <object> PyDict_SetDefault(self._gnode, self._keys[node], id_)
        if ghost == node:
            self._blocks[node] = None
            self._link(node, GHOSTS)
        else:  # announced again while resident: one entry, the resident one's history
            self._state[ghost] = self._state[node]
            self._last[ghost] = self._last[node]
            self._second[ghost] = self._second[node]
            self._third[ghost] = self._third[node]
            self._unlink(ghost)
            self._link(ghost, GHOSTS)
            self._drop(node)
        return 0

    def remove(self, key):
        """lct.py's `remove` but for the hints (the caller's)."""
        cdef int node
        if self.resident.pop(key, None) is None:
            raise BlockStateError(f"lct: key {key!r} is not resident")
        node = self._rnode.pop(key)
        self._unlink(node)
        self._remember(node)

    def forget_old(self):
        """lct.py's `_forget_old`: drop the ghosts last accessed more than `memory` accesses
        ago, from the oldest stored."""
        cdef int64_t oldest = self.clock - self._memory
        cdef int node = self._head[GHOSTS]
        while node >= 0 and self._last[node] < oldest:
            del self._gnode[self._keys[node]]
            self._unlink(node)
            self._drop(node)
            node = self._head[GHOSTS]

    def admit(self, keys):
        cdef list answers = []
        cdef signed char decided[4]
        cdef int node, cls, state
        cdef double credit
        cdef signed char *class_of = self._classes[self.horizon]
        for cls in range(4):
            decided[cls] = -1
        for key in keys:
            node = self._node_of(self._rnode, key)
            if node < 0:
                node = self._node_of(self._gnode, key)
            state = self._first if node < 0 else self._state[node]
            cls = class_of[state]
            if self._limits[cls] <= 0:
                answers.append(False)
            elif self._shares[cls] >= 1.0:
                answers.append(True)
            else:
                if decided[cls] < 0:
                    credit = self._credit[cls] + self._shares[cls]
                    decided[cls] = credit >= 1.0
                    self._credit[cls] = credit - 1.0 if decided[cls] else credit
                answers.append(decided[cls] == 1)
        return answers

    # -- evict ------------------------------------------------------------------------------

    cdef int _next_evictable(self, int *cursor, object protected) except -2:
        """Advance `cursor` past the next block that may be evicted and return its node."""
        cdef int node = cursor[0]
        while node >= 0:
            cursor[0] = self._next[node]
            if _unpinned(self._blocks[node]) and self._keys[node] not in protected:
                return node
            node = cursor[0]
        return -1

    cdef inline double _past_limit(self, int cls, int node):
        """lct.py's `_past_limit`."""
        cdef double age = <double> (self.clock - self._last[node])
        cdef double limit = self._limits[cls]
        if limit == INFINITY:
            return age - 1e18
        if self.ratio:
            return age / limit if limit > 0 else 1e18 + age
        return age - limit

    def evict(self, Py_ssize_t n, protected):
        """lct.py's `evict` for n >= 1 without hints (the caller's)."""
        cdef int cursor[4]
        cdef int heads[4]
        cdef double overs[4]
        cdef int cls, best, node
        cdef Py_ssize_t count = 0, i
        cdef list out = []
        cdef object key
        if n > len(self.resident):  # fewer blocks than asked for, evictable or not
            return None
        if n > self._plan_cap:
            self._plan = <int *> _resized(self._plan, n * sizeof(int))
            self._plan_cap = n
        for cls in range(4):
            cursor[cls] = self._head[cls]
            heads[cls] = self._next_evictable(&cursor[cls], protected)
            overs[cls] = self._past_limit(cls, heads[cls]) if heads[cls] >= 0 else 0.0
        while True:
            best = -1
            for cls in range(4):
                if heads[cls] >= 0 and (best < 0 or overs[cls] > overs[best]):
                    best = cls
            if best < 0:
                return None
            self._plan[count] = heads[best]
            count += 1
            if count == n:
                break
            node = heads[best] = self._next_evictable(&cursor[best], protected)
            if node >= 0:
                overs[best] = self._past_limit(best, node)
        for i in range(n):
            node = self._plan[i]
            key = self._keys[node]
            out.append((key, self._blocks[node]))
            del self._rnode[key]
            self._unlink(node)
            del self.resident[key]
            if self.clock - self._last[node] <= self._memory:
                self._remember(node)
            else:
                self._drop(node)
        return out

    # -- the solver's side -------------------------------------------------------------------

    def requeue(self, int horizon):
        """Count classes over candidate `horizon`: the resident blocks queued again by their
        class under it, oldest first (stable over the resident dict's order, as lct.py's
        `sorted` is)."""
        cdef list nodes = [self._rnode[key] for key in self.resident]
        cdef list times = [self._last[<int> node] for node in nodes]
        cdef int cls, node
        self.horizon = horizon
        for cls in range(4):
            self._head[cls] = self._tail[cls] = -1
            self._size[cls] = 0
        for i in sorted(range(len(nodes)), key=times.__getitem__):
            node = nodes[i]
            self._link(node, self._classes[horizon][self._state[node]])

    def set_horizon(self, int horizon):
        """Count classes over candidate `horizon`, leaving the queues as they are."""
        self.horizon = horizon

    def seen(self, key):
        """What is remembered of `key` (lct.py's History), resident or not; None: nothing."""
        cdef int node = self._node_of(self._rnode, key)
        if node < 0:
            node = self._node_of(self._gnode, key)
            if node < 0:
                return None
        return (self._state[node], self._last[node], self._second[node], self._third[node])

    def get_reuse(self):
        cdef int s, b
        return [
            [self._reuse[s * self._bins + b] for b in range(self._bins)]
            for s in range(self._nstates)
        ]

    def set_reuse(self, rows):
        cdef int s, b
        for s in range(self._nstates):
            row = rows[s]
            for b in range(self._bins):
                self._reuse[s * self._bins + b] = row[b]

    def get_arrivals(self):
        cdef int s
        return [self._arrivals[s] for s in range(self._nstates)]

    def set_arrivals(self, values):
        cdef int s
        for s in range(self._nstates):
            self._arrivals[s] = values[s]

    cdef double *_vector(self, int which):
        """The limits (0), shares (1) or credits (2), per class."""
        if which == 0:
            return &self._limits[0]
        if which == 1:
            return &self._shares[0]
        return &self._credit[0]

    def get_vector(self, int which):
        """The limits (0), shares (1) or credits (2), per class."""
        cdef double *v = self._vector(which)
        return [v[0], v[1], v[2], v[3]]

    def set_vector(self, int which, values):
        cdef double *v = self._vector(which)
        cdef int i
        if len(values) != 4:
            raise InvalidValueError(f"lct: 4 values per class expected, got {values!r}")
        for i in range(4):
            v[i] = values[i]

    # -- inspection and reset ----------------------------------------------------------------

    def keys_of(self, int where):
        """The keys of class queue `where` (0 to 3) or of the ghosts (4), oldest first."""
        cdef list out = []
        cdef int node = self._head[where]
        while node >= 0:
            out.append(self._keys[node])
            node = self._next[node]
        return out

    def ghost_entries(self):
        """The remembered non-resident keys and what is remembered of each (lct.py's
        History), oldest stored first."""
        cdef list out = []
        cdef int node = self._head[GHOSTS]
        while node >= 0:
            out.append((
                self._keys[node],
                (self._state[node], self._last[node], self._second[node], self._third[node]),
            ))
            node = self._next[node]
        return out

    def clear(self):
        """Forget every key (the learned state is the policy's `_learn_afresh`)."""
        cdef int i
        self.resident.clear()
        self._rnode.clear()
        self._gnode.clear()
        for i in range(self._allocated):
            self._keys[i] = None
            self._blocks[i] = None
            self._where[i] = NOWHERE
            self._prev[i] = -1
            self._next[i] = i + 1 if i + 1 < self._allocated else -1
        self._free = 0 if self._allocated else -1
        for i in range(LISTS):
            self._head[i] = self._tail[i] = -1
            self._size[i] = 0


_LIMITS, _SHARES, _CREDIT = 0, 1, 2


class LCTCachePolicy(PureLCTCachePolicy):
    """Learned class thresholds over a learned horizon (see `kvtier.policies.lct`).

    lct.py's class with its per-access state in C (`LCTState`); the solver is lct.py's,
    reading and writing the core's arrays through the properties below. `get`, `insert`,
    `on_store_miss` and `admit` are the core's own, with no Python frame, unless a subclass
    overrides them."""

    def __init__(self, cache_capacity, **settings):
        self._core = LCTState()
        super().__init__(cache_capacity, **settings)

    def _init_store(self):
        core = self._core
        core.configure(self)
        cls = type(self)
        if cls.get is LCTCachePolicy.get:
            self.get = core.resident.get
        if cls.insert is LCTCachePolicy.insert:
            self.insert = core.insert
        if cls.on_store_miss is LCTCachePolicy.on_store_miss:
            self.on_store_miss = core.on_store_miss
        if cls.admit is LCTCachePolicy.admit:
            self.admit = core.admit

    # -- the state the solver reads and writes, kept by the core ------------------------------

    @property
    def _clock(self):
        return self._core.clock

    @_clock.setter
    def _clock(self, value):
        self._core.clock = value

    @property
    def _since_solve(self):
        return self._core.since_solve

    @_since_solve.setter
    def _since_solve(self, value):
        self._core.since_solve = value

    @property
    def period(self):
        """A solve every this many accesses."""
        return self._core.period

    @period.setter
    def period(self, value):
        self._core.period = value

    @property
    def order(self):
        """How far past its class limit a block is: "ratio" or "over" (lct.py's ORDER)."""
        return "ratio" if self._core.ratio else "over"

    @order.setter
    def order(self, value):
        self._core.ratio = value == "ratio"

    @property
    def _reuse(self):
        return self._core.get_reuse()

    @_reuse.setter
    def _reuse(self, rows):
        self._core.set_reuse(rows)

    @property
    def _arrivals(self):
        return self._core.get_arrivals()

    @_arrivals.setter
    def _arrivals(self, values):
        self._core.set_arrivals(values)

    @property
    def limits(self):
        """Per class, the accesses since its last use a block may stay (inf: no limit)."""
        return self._core.get_vector(_LIMITS)

    @limits.setter
    def limits(self, values):
        self._core.set_vector(_LIMITS, values)

    @property
    def shares(self):
        """Per class, the share of its new blocks admitted where its limit is above 0."""
        return self._core.get_vector(_SHARES)

    @shares.setter
    def shares(self, values):
        self._core.set_vector(_SHARES, values)

    @property
    def _credit(self):
        return self._core.get_vector(_CREDIT)

    @_credit.setter
    def _credit(self, values):
        self._core.set_vector(_CREDIT, values)

    @property
    def horizon(self):
        """The index of the candidate the classes are counted over now."""
        return self._core.horizon

    @horizon.setter
    def horizon(self, value):
        self._core.set_horizon(value)

    @property
    def _class_of(self):
        return self._states.classes[self._core.horizon]

    @property
    def _resident(self):
        return self._core.resident

    def _set_horizon(self, horizon):
        self._core.set_horizon(horizon)

    def _move_horizon(self, horizon):
        self._core.requeue(horizon)

    def _forget_old(self):
        self._core.forget_old()

    def _seen(self, key):
        return self._core.seen(key)

    def queues(self):
        """The class queues' keys, each oldest first (for tests and inspection)."""
        return [self._core.keys_of(cls) for cls in range(CLASSES)]

    def ghosts(self):
        """The remembered non-resident keys and what is remembered of each (lct.py's
        History), oldest stored first (for tests and inspection)."""
        return self._core.ghost_entries()

    # -- CachePolicy ------------------------------------------------------------------------

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

    def on_store_move(self, keys):
        self._core.on_store_move(keys)

    def admit(self, keys):
        return self._core.admit(keys)

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
        self._learn_afresh()

    def __len__(self):
        return len(self._core.resident)

    def items(self):
        return iter(list(self._core.resident.items()))
