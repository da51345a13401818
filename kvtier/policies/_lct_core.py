# cython: annotation_typing=True, boundscheck=False, wraparound=False, initializedcheck=False
"""lct's per-access state and steps, `LCTState`: the one source of what
`kvtier.policies.lct.LCTCachePolicy` does at every access, compiled or as plain Python.

The algorithm is lct.py's (its docstrings say why each step is so): `_observe` per access,
`on_store_miss`, `touch`, `insert`, `remove`, `admit`, `evict`, the ghosts forgotten after
`memory` accesses, the requeue when the horizon moves. Each key remembered is a node, each
node holds its state and last three access times in arrays, and the four class queues and
the ghosts are intrusive doubly linked lists over those arrays (oldest at the head). One
dict maps every remembered key, resident or not, to its node (the list it is on says
which): a key that becomes resident or is evicted keeps its node and its entry, so a
stored key costs its look-ups, the resident dict's write and, at its eviction, its delete
(with a dict of the resident keys' nodes and one of the others', before issue 34, it moved
between the two: about twice the dict operations, which on large dicts are lct's cost).
On ids (`use_ids`, what `auto` does with the lct that serves): the entries are by the key's
id in the `KeyIds` table that `auto`'s shadows share (`_node_of_id`, each id counted while
its key is remembered), and `on_store_miss_ids` and `touch_ids` take the ids the table gave
the request, so no dict of keys is probed but the table's (docs/BENCHMARKS.md, "Policy
cost, ninth round"); only `_find`, `_lookup`, `_register`, `_unregister` and `_rebind` look
at the mode, and the calls on keys look the id up. Nor is there a resident dict on ids
(`auto` keeps its own): `get`, `in`, `len` and `entries` read the nodes, and each node's
stamp (`_stamp`, when its key last became resident) keeps the dict's order, which `entries`
gives and `requeue` breaks ties of access times by (docs/BENCHMARKS.md, "Policy cost,
eleventh round"; the dict's write and delete per stored block were 3 % of `auto`'s
instructions at 10 %).
The reuse histogram and the arrivals are double arrays, updated by the same floating-point
operations in the same order whether compiled or not. The solver, run every `period`
accesses, is lct.py's (the policy reads and writes these arrays through `get_reuse`,
`set_vector` and the like), but for its inner loop: each class's curve (`class_curve`, the
sum of its states' reuse per bin and `_curve`'s loop in C doubles, the same floating-point
operations in the same order as lct.py's Python floats did) and the histogram's fading
(`decay_reuse`) run here (issue 34 item 3: the solver's boxed floats were a third of lct's
cost at 1 %).

Written in Cython's pure Python mode, as `_arc_core` is (its docstring says how): compiled by
`scripts/build-core` with its annotations as C types, and without a build the Python it is.
`tests/test_compiled_core.py` runs this file's text both ways in one process and compares
every state. mypy cannot read typed memoryviews or C arrays: those attributes are declared
with `cython.declare`, each with a `type: ignore`, and are `Any` to mypy.
"""

from __future__ import annotations

import ctypes
import math
from array import array
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

from kvtier.blocks import BlockStatus
from kvtier.errors import BlockStateError, InvalidValueError
from kvtier.keys import OffloadKey
from kvtier.policies._key_ids import grown_ids
from kvtier.policies.sampling import SCALE, sample_point

if TYPE_CHECKING:  # mypy checks this module against what runs without Cython
    from kvtier.policies import _cython_shim as cython
else:
    try:
        import cython
    except ImportError:  # no Cython: the module runs as the plain Python it is
        from kvtier.policies import _cython_shim as cython

# Compiled: C's `log2` (the one `math.log2` calls, for an int below 2**1024), and the
# array resize and `memset` of `_extend_zeroed` (Cython's cimports, known to mypy only by
# name: untyped with Cython installed, absent without).
if cython.compiled:
    from cython.cimports.cpython.array import array as _CArray  # type: ignore[import-untyped,import-not-found,unused-ignore]
    from cython.cimports.cpython.array import resize as _resize  # type: ignore[import-untyped,import-not-found,unused-ignore]
    from cython.cimports.libc.math import log2 as _log2  # type: ignore[import-untyped,import-not-found,unused-ignore]
    from cython.cimports.libc.string import memset as _memset  # type: ignore[import-untyped,import-not-found,unused-ignore]
else:
    from math import log2 as _log2

BINS_PER_OCTAVE = 4
"""Reuse-distance bins per doubling (lct.py's histograms)."""
NEVER = -(1 << 62)
"""The time of an access that did not happen (a key seen fewer than three times)."""
MAX_STATES = 35
"""States of a key for four candidate horizons, the most there are."""

# The lists a node can be on (`_where`): the class queues 0 to 3, the ghosts, none.
GHOSTS = cython.declare(cython.int, 4)
NOWHERE = cython.declare(cython.int, 5)
LISTS = cython.declare(cython.int, 5)

_C_NEVER = cython.declare(cython.longlong, NEVER)
_C_BINS = cython.declare(cython.int, BINS_PER_OCTAVE)
_INF = cython.declare(cython.double, math.inf)
_C_MAX_STATES = cython.declare(cython.int, MAX_STATES)

LIMITS = 0
SHARES = 1
CREDIT = 2
"""`get_vector`'s and `set_vector`'s `which`: the limits, shares or credits per class."""

# The key and block of a node that has none (free; a ghost has no block). Never looked up,
# never returned.
_NO_KEY = OffloadKey(b"")
_NO_BLOCK = BlockStatus(-1)


# Whether `_ref_cnt` reads the counts from the blocks' memory (set at import, below).
_DIRECT_REF_CNT = cython.declare(cython.bint, False)


@cython.cfunc
@cython.inline
def _ref_cnt(block: BlockStatus) -> cython.int:
    """`block.ref_cnt`: compiled, and when `_DIRECT_REF_CNT`, read straight from the
    structure's memory, as ctypes' field does (the address of its data comes first after a
    ctypes object's header, the field at offset 0), without the attribute look-up, the
    field's descriptor and the int object (about 200 instructions a block: lct's `evict`
    reads one per candidate, docs/BENCHMARKS.md, "Policy cost, thirteenth round"); a
    subclass, or any other object, through its attribute."""
    count: cython.int
    if cython.compiled and _DIRECT_REF_CNT and type(block) is BlockStatus:
        data = cython.cast(  # type: ignore[attr-defined]
            cython.pointer(cython.p_char),  # type: ignore[attr-defined]
            cython.cast(cython.p_void, block),  # type: ignore[attr-defined]
        )[2]
        return cython.cast(cython.pointer(cython.int), data)[0]  # type: ignore[attr-defined,no-any-return]
    count = block.ref_cnt
    return count


def _reads_ref_cnt_directly() -> bool:
    """Whether `_ref_cnt` can read a count from the structure's memory: compiled, the
    field a 4-byte int at offset 0, and the address after a probe's header its data's
    (`ctypes.addressof`); checked once, at import."""
    if not cython.compiled:
        return False
    field = BlockStatus.ref_cnt
    if field.offset != 0 or field.size != 4:  # type: ignore[attr-defined]
        return False
    probe = BlockStatus(-1)
    data = cython.cast(  # type: ignore[attr-defined]
        cython.pointer(cython.p_char),  # type: ignore[attr-defined]
        cython.cast(cython.p_void, probe),  # type: ignore[attr-defined]
    )[2]
    address: cython.Py_ssize_t = cython.cast(cython.Py_ssize_t, data)  # type: ignore[attr-defined]
    return address == ctypes.addressof(probe)


_DIRECT_REF_CNT = _reads_ref_cnt_directly()


def reads_ref_cnt_directly() -> bool:
    """Whether this build reads the blocks' counts from their memory (`_ref_cnt`)."""
    return bool(_DIRECT_REF_CNT)


def _nothing() -> None:
    """The solver of a state not configured yet."""


@cython.cfunc
def _extend_zeroed(items: Any, count: cython.Py_ssize_t) -> cython.int:
    """Append `count` zeros to `items` (an int or long array no view holds): compiled,
    resized in place and the new items zeroed, one pass over them; as Python, appended from
    a bytes object of zeros, which writes them twice and reads them once (lct's `_grow`:
    docs/BENCHMARKS.md, "Policy cost, thirteenth round")."""
    old: cython.Py_ssize_t = len(items)
    size: cython.Py_ssize_t
    if cython.compiled:
        grown: _CArray = items
        size = grown.ob_descr.itemsize
        _resize(grown, old + count)
        _memset(grown.data.as_chars + old * size, 0, count * size)
    else:
        items.frombytes(bytes(count * items.itemsize))
    return 0


def _ints(values: Sequence[int]) -> array[int]:
    return array("i", values)


def _longs(values: Sequence[int]) -> array[int]:
    return array("q", values)


def _doubles(values: Sequence[float]) -> array[float]:
    return array("d", values)


@cython.final
@cython.cclass
class LCTState:
    """lct's per-access state: the nodes, the queues, the statistics, the limits."""

    # The resident blocks by key, in the order they became resident (`LCTCachePolicy.get`
    # is its `get`); on ids empty, and refilled in that order (`_stamp`) by `use_keys`.
    _resident: dict[OffloadKey, BlockStatus]
    _nodes: dict[OffloadKey, int]  # remembered key -> its node (resident or a ghost)
    # A ghost of a key that is resident (announced again while resident: `on_store_miss`
    # of a resident key), apart from its resident node; rare, usually empty.
    _dup: dict[OffloadKey, int]
    _solve: Callable[[], None]  # the policy's solver, run every `period` accesses
    # Per node: the neighbours (-1: none), the list, the state, the last three access times,
    # its key, its block (the dicts hold its number, a Python int made at each write: a
    # list of each node's int cost a cold read and a reference count per write).
    _prev = cython.declare(cython.int[::1])  # type: ignore[misc]
    _next = cython.declare(cython.int[::1])  # type: ignore[misc]
    _where = cython.declare(cython.int[::1])  # type: ignore[misc]
    _state = cython.declare(cython.int[::1])  # type: ignore[misc]
    _last = cython.declare(cython.longlong[::1])  # type: ignore[misc]
    _second = cython.declare(cython.longlong[::1])  # type: ignore[misc]
    _third = cython.declare(cython.longlong[::1])  # type: ignore[misc]
    _idents = cython.declare(cython.int[::1])  # type: ignore[misc]  # on ids: the key's id
    # When the node's key last became resident (`_stamps` counts): the resident dict's order,
    # which `requeue` keeps among equal access times and `entries` gives, without the dict.
    _stamp = cython.declare(cython.longlong[::1])  # type: ignore[misc]
    _stamps: cython.longlong
    _keys: list[OffloadKey]
    _blocks: list[BlockStatus]
    _arrays: list[array[int]]  # the arrays the nine views view, in that order (grown in place)
    _allocated: cython.int
    _used: cython.int  # the nodes ever handed out: those past it are free, on no chain
    _free: cython.int  # first free node below `_used`, chained through `_next` (-1: none)
    # Per list (the queues, the ghosts): its oldest and newest node (-1: empty), its length.
    _head = cython.declare(cython.int[5])  # type: ignore[misc,valid-type]
    _tail = cython.declare(cython.int[5])  # type: ignore[misc,valid-type]
    _size = cython.declare(cython.int[5])  # type: ignore[misc,valid-type]
    _plan = cython.declare(cython.int[::1])  # type: ignore[misc]  # an eviction's victims
    # The last `on_store_miss`'s nodes, one per key in the call's order (-1: a resident key's),
    # `_nann` of them: `admit` and `insert` find a key's node there, with no dict look-up, when
    # the tier gives them the keys it announced, in order (`_announced`); `_ann_pos`: where
    # `insert` looks next.
    _ann = cython.declare(cython.int[::1])  # type: ignore[misc]
    _nann: cython.Py_ssize_t
    _ann_pos: cython.Py_ssize_t
    # Per class, while evicting: the next node to look at, the queue's evictable head, how
    # far past its limit that head is; and `admit`'s decision for the class (-1: none yet).
    _cursor = cython.declare(cython.int[4])  # type: ignore[misc,valid-type]
    _heads = cython.declare(cython.int[4])  # type: ignore[misc,valid-type]
    _overs = cython.declare(cython.double[4])  # type: ignore[misc,valid-type]
    _decided = cython.declare(cython.int[4])  # type: ignore[misc,valid-type]
    # The settings (lct.py's attributes of the same names).
    # (public: the policy's properties read and write them)
    clock = cython.declare(cython.longlong, visibility="public")
    since_solve = cython.declare(cython.longlong, visibility="public")
    period = cython.declare(cython.longlong, visibility="public")
    capacity = cython.declare(cython.longlong, visibility="public")  # the policy's, blocks
    ratio = cython.declare(cython.bint, visibility="public")  # `order == "ratio"`
    by_class = cython.declare(cython.bint, visibility="public")  # lct.py's `BY_CLASS`
    _memory: cython.longlong
    _horizons = cython.declare(cython.longlong[::1])  # type: ignore[misc]
    _nhorizons: cython.int
    _width: cython.int
    _first: cython.int
    _nstates: cython.int
    _bins: cython.int
    _nweights: cython.int
    _ids_table = cython.declare(cython.int[::1])  # type: ignore[misc]  # triple -> state
    _classes = cython.declare(cython.int[::1])  # type: ignore[misc]  # [candidate * 35 + state]
    _horizon: cython.int
    _weights = cython.declare(cython.double[::1])  # type: ignore[misc]
    _reuse = cython.declare(cython.double[::1])  # type: ignore[misc]  # _nstates rows of _bins
    _arrivals = cython.declare(cython.double[::1])  # type: ignore[misc]
    _limits = cython.declare(cython.double[4])  # type: ignore[misc,valid-type]
    _shares = cython.declare(cython.double[4])  # type: ignore[misc,valid-type]
    _credit = cython.declare(cython.double[4])  # type: ignore[misc,valid-type]
    # The solver's tables (lct.py's, per bin: the lower edge, the middle, the upper edge), the
    # least reuse a curve needs (lct.py's `MIN_REUSE`), a class's reuse per bin (a curve's
    # input), and per bin the solve period its lower edge falls in, for period `_jperiod`.
    _lows = cython.declare(cython.double[::1])  # type: ignore[misc]
    _mids = cython.declare(cython.double[::1])  # type: ignore[misc]
    _edges = cython.declare(cython.double[::1])  # type: ignore[misc]
    _low_values: list[float]
    _min_reuse: cython.double
    _column = cython.declare(cython.double[::1])  # type: ignore[misc]
    _jtab = cython.declare(cython.longlong[::1])  # type: ignore[misc]
    _jperiod: cython.longlong
    # On ids (`use_ids`): every remembered key's entry is its id's node in `_node_of_id`
    # (-1: none), its id in `_idents`, instead of `_nodes`; each entry counts its id in
    # `_refs` (the table's counts), released to `_released` at 0; `_keys` keeps the keys.
    _by_id: cython.bint
    _table: Any
    _node_of_id = cython.declare(cython.int[::1])  # type: ignore[misc]
    _refs = cython.declare(cython.int[::1])  # type: ignore[misc]
    _released: list[int]
    # What `_observe` found: the key's new state and last three access times.
    _o_state: cython.int
    _o_last: cython.longlong
    _o_second: cython.longlong
    _o_third: cython.longlong

    def __init__(self) -> None:
        self._resident = {}
        self._nodes = {}
        self._dup = {}
        self._solve = _nothing
        self._arrays = [_ints([]) for _ in range(4)] + [_longs([]) for _ in range(3)]
        self._arrays.append(_ints([]))
        self._arrays.append(_longs([]))
        self._stamps = 0
        self._view_arrays()
        self._plan = _ints([])
        self._keys = []
        self._blocks = []
        self._allocated = self._used = 0
        self._free = -1
        self._head = [-1, -1, -1, -1, -1]
        self._tail = [-1, -1, -1, -1, -1]
        self._size = [0, 0, 0, 0, 0]
        self._cursor = [-1, -1, -1, -1]
        self._heads = [-1, -1, -1, -1]
        self._overs = [0.0, 0.0, 0.0, 0.0]
        self._decided = [-1, -1, -1, -1]
        self.clock = self.since_solve = 0
        self.period = 1
        self.capacity = 1
        self.ratio = True
        self.by_class = False
        self._memory = 0
        self._horizons = _longs([])
        self._nhorizons = self._width = self._first = self._nstates = 0
        self._bins = self._nweights = 0
        self._ids_table = self._classes = _ints([])
        self._horizon = 0
        self._weights = self._reuse = self._arrivals = _doubles([])
        self._limits = [_INF, _INF, _INF, _INF]
        self._shares = [1.0, 1.0, 1.0, 1.0]
        self._credit = [0.0, 0.0, 0.0, 0.0]
        self._o_state = 0
        self._o_last = self._o_second = self._o_third = 0
        self._ann = _ints([])
        self._nann = self._ann_pos = 0
        self._lows = self._mids = self._edges = self._column = _doubles([])
        self._low_values = []
        self._min_reuse = 0.0
        self._jtab = _longs([])
        self._jperiod = 0
        self._by_id = False
        self._table = None
        self._node_of_id = self._refs = _ints([])
        self._released = []

    def configure(
        self,
        solve: Callable[[], None],
        horizons: Sequence[int],
        memory: int,
        states: tuple[int, int, int, Sequence[int], Sequence[Sequence[int]]],
        bins: int,
        weights: Sequence[float],
    ) -> None:
        """Take lct.py's settings: its solver, the candidate horizons and the memory in
        accesses, the states (width, first, count, the ids of the triples, the class of
        each state per candidate), the histogram's bins, the weights by age."""
        width, first, count, ids, classes = states
        self._solve = solve
        self._horizons = _longs(horizons)
        self._nhorizons = len(horizons)
        self._memory = memory
        self._width = width
        self._first = first
        self._nstates = count
        self._ids_table = _ints(ids)
        flat = [0] * (len(classes) * MAX_STATES)
        for i, row in enumerate(classes):
            flat[i * MAX_STATES : i * MAX_STATES + len(row)] = row
        self._classes = _ints(flat)
        self._bins = bins
        self._nweights = len(weights)
        self._weights = _doubles(weights)
        self._reuse = _doubles([0.0] * (count * bins))
        self._arrivals = _doubles([0.0] * count)

    def configure_solver(
        self,
        lows: Sequence[float],
        mids: Sequence[float],
        edges: Sequence[float],
        min_reuse: float,
    ) -> None:
        """Take lct.py's per-bin tables (`_LOWS`, `_MIDS`, `_EDGES`, at least `bins` of each)
        and `MIN_REUSE`, for `curve` and `class_curve`."""
        self._low_values = [float(x) for x in lows]
        self._lows = _doubles(lows)
        self._mids = _doubles(mids)
        self._edges = _doubles(edges)
        self._min_reuse = min_reuse
        self._column = _doubles([0.0] * len(lows))
        self._jtab = _longs([0] * len(lows))
        self._jperiod = 0

    @property
    def resident(self) -> dict[OffloadKey, BlockStatus]:
        """The resident blocks by key, on keys: `LCTCachePolicy.get` is its `get` (on ids
        empty: `get`, `len`, `in` and `entries` read the nodes)."""
        return self._resident

    def get(self, key: OffloadKey) -> BlockStatus | None:
        """The block of `key` if resident (None: not resident)."""
        node: cython.int
        if not self._by_id:
            return self._resident.get(key)
        node = self._find(key)
        if not self._resident_node(node):
            return None
        return self._blocks[node]

    def __contains__(self, key: Any) -> bool:
        """Whether `key` is resident."""
        if not self._by_id:
            return key in self._resident
        return self._resident_node(self._find(key))

    def __len__(self) -> int:
        """The resident blocks."""
        return self._count()

    @cython.cfunc
    @cython.inline
    @cython.exceptval(check=False)
    def _count(self) -> cython.Py_ssize_t:
        """The resident blocks: the class queues' lengths."""
        return self._size[0] + self._size[1] + self._size[2] + self._size[3]  # type: ignore[no-any-return]

    @cython.cfunc
    def _resident_nodes(self) -> list[int]:
        """The resident nodes in the order they became resident (the resident dict's)."""
        nodes: list[int] = []
        cls: cython.int
        node: cython.int
        for cls in range(4):
            node = self._head[cls]
            while node >= 0:
                nodes.append(node)
                node = self._next[node]
        stamps: list[int] = [self._stamp[node] for node in nodes]
        return [nodes[i] for i in sorted(range(len(nodes)), key=stamps.__getitem__)]

    def entries(self) -> list[tuple[OffloadKey, BlockStatus]]:
        """The resident (key, block) pairs in the order they became resident (the resident
        dict's)."""
        if not self._by_id:
            return list(self._resident.items())
        return [(self._keys[node], self._blocks[node]) for node in self._resident_nodes()]

    @property
    def horizon(self) -> int:
        """The index of the candidate the classes are counted over now."""
        return self._horizon

    # -- nodes and lists ---------------------------------------------------------------------

    @cython.cfunc
    def _view_arrays(self) -> cython.int:
        """Point the nine views at `_arrays`."""
        arrays = self._arrays
        self._prev = arrays[0]
        self._next = arrays[1]
        self._where = arrays[2]
        self._state = arrays[3]
        self._last = arrays[4]
        self._second = arrays[5]
        self._third = arrays[6]
        self._idents = arrays[7]
        self._stamp = arrays[8]
        return 0

    @cython.cfunc
    def _grow(self) -> cython.int:
        """Double the nodes (64 at first), the new ones free (past `_used`, handed out in
        order, so not set here). Each array grows in place (none is viewed while it is
        resized: compiled, nothing checks), a large one by remapping its pages instead of
        copying them, and only its new items are written (`_extend_zeroed`)."""
        old: cython.int = self._allocated
        new: cython.int = max(64, 2 * old)
        ints = _ints([])
        longs = _longs([])
        self._prev = self._next = self._where = self._state = self._idents = ints
        self._last = self._second = self._third = self._stamp = longs
        for items in self._arrays:
            _extend_zeroed(items, new - old)
        self._view_arrays()
        # each list extended once: appends one by one reallocated (copied) them every
        # eighth of their length (docs/BENCHMARKS.md, "Policy cost, seventh round")
        self._keys.extend([_NO_KEY] * (new - old))
        self._blocks.extend([_NO_BLOCK] * (new - old))
        self._allocated = new
        return 0

    @cython.cfunc
    @cython.inline
    @cython.exceptval(check=False)
    def _link(self, node: cython.int, where: cython.int) -> cython.void:
        """Append `node` at the newest end of list `where`."""
        tail: cython.int = self._tail[where]
        self._where[node] = where
        self._prev[node] = tail
        self._next[node] = -1
        if tail < 0:
            self._head[where] = node
        else:
            self._next[tail] = node
        self._tail[where] = node
        self._size[where] += 1

    @cython.cfunc
    @cython.inline
    @cython.exceptval(check=False)
    def _unlink(self, node: cython.int) -> cython.void:
        """Take `node` off its list (it is then NOWHERE)."""
        where: cython.int = self._where[node]
        prev: cython.int = self._prev[node]
        nxt: cython.int = self._next[node]
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

    @cython.cfunc
    def _new_node(self, key: OffloadKey) -> cython.int:
        """A free node for `key`, on no list, remembering an access now and no other."""
        node: cython.int = self._free
        if node >= 0:
            self._free = self._next[node]
        else:
            if self._used == self._allocated:
                self._grow()
            node = self._used
            self._used += 1
            self._where[node] = NOWHERE
        self._keys[node] = key
        self._state[node] = self._first
        self._last[node] = self.clock
        self._second[node] = _C_NEVER
        self._third[node] = _C_NEVER
        return node

    @cython.cfunc
    @cython.inline
    @cython.exceptval(check=False)
    def _drop(self, node: cython.int) -> cython.void:
        """Free `node` (unlinked already)."""
        self._keys[node] = _NO_KEY
        self._blocks[node] = _NO_BLOCK
        self._where[node] = NOWHERE
        self._next[node] = self._free
        self._free = node

    @cython.cfunc
    @cython.inline
    @cython.exceptval(check=False)
    def _store(self, node: cython.int) -> cython.void:
        """Give `node` what `_observe` found."""
        self._state[node] = self._o_state
        self._last[node] = self._o_last
        self._second[node] = self._o_second
        self._third[node] = self._o_third

    @cython.cfunc
    @cython.inline
    def _class_of(self, state: cython.int) -> cython.int:
        """The class of `state` under the horizon in use."""
        cls: cython.int = self._classes[self._horizon * _C_MAX_STATES + state]
        return cls

    # -- what every access does (lct.py's `_observe`) ----------------------------------------

    @cython.cfunc
    @cython.inline
    @cython.exceptval(check=False)
    def _within(self, age: cython.longlong) -> cython.int:
        """How many candidate horizons are at least `age`."""
        i: cython.int
        count: cython.int = 0
        for i in range(self._nhorizons):
            if self._horizons[i] >= age:
                count += 1
        return count

    @cython.cfunc
    def _recall(self, node: cython.int, clock: cython.longlong) -> cython.void:
        """`_observe` of a key remembered within the memory: record the reuse, leave the
        key's new state and times in `_o_*`."""
        period: cython.longlong = self.period
        last: cython.longlong = self._last[node]
        gap: cython.longlong = clock - last
        age: cython.longlong = (clock - 1) // period - (last - 1) // period
        # compiled, C's `log2` of the gap as a double (what `math.log2` computes for an
        # int) and C's truncation: no int or float object, no call through the module
        # (docs/BENCHMARKS.md, "Policy cost, thirteenth round")
        exact: cython.double = gap
        bin_: cython.int = int(_log2(exact) * _C_BINS)
        g2: cython.int = 0
        g3: cython.int = 0
        if age < self._nweights:
            self._reuse[self._state[node] * self._bins + bin_] += self._weights[age]
        g1: cython.int = self._within(gap)
        if g1:
            g2 = self._within(clock - self._second[node])
            if g2:
                g3 = self._within(clock - self._third[node])
        self._o_state = self._ids_table[(g1 * self._width + g2) * self._width + g3]
        self._o_last = clock
        self._o_second = last
        self._o_third = self._second[node]

    @cython.cfunc
    def _observe(self, node: cython.int) -> cython.int:
        """An access of the key of `node` (-1: nothing remembered of it): record the reuse
        and the arrival, leave what to remember of the key in `_o_*`; 1 if the solver ran
        (which may have forgotten `node`, if a ghost)."""
        clock: cython.longlong = self.clock + 1
        self.clock = clock
        if node < 0 or clock - self._last[node] > self._memory:
            self._o_state = self._first
            self._o_last = clock
            self._o_second = _C_NEVER
            self._o_third = _C_NEVER
        else:
            self._recall(node, clock)
        self._arrivals[self._o_state] += 1.0
        self.since_solve += 1
        if self.since_solve >= self.period:
            self._solve()
            return 1
        return 0

    @cython.cfunc
    @cython.inline
    def _node_of(self, nodes: dict[OffloadKey, int], key: OffloadKey) -> cython.int:
        found = nodes.get(key)
        if found is None:
            return -1
        return found

    @cython.cfunc
    def _find(self, key: OffloadKey) -> cython.int:
        """The entry of `key` (its resident node, else its ghost; -1: none): `_nodes`', or
        on ids its id's node (the id looked up in the table)."""
        ident: cython.Py_ssize_t
        if not self._by_id:
            return self._node_of(self._nodes, key)
        ident = self._table.id_of(key)
        if ident < 0:
            return -1
        return self._node_of_id[ident]  # type: ignore[no-any-return]

    @cython.cfunc
    @cython.inline
    def _lookup(self, key: OffloadKey, ident: cython.Py_ssize_t) -> cython.int:
        """`_find(key)`, or the node of id `ident` when the caller gave it (>= 0, on ids):
        no dict look-up."""
        if ident >= 0:
            return self._node_of_id[ident]  # type: ignore[no-any-return]
        return self._find(key)

    @cython.cfunc
    def _register(self, key: OffloadKey, node: cython.int, ident: cython.Py_ssize_t) -> cython.int:
        """`node` is `key`'s entry from now on: in `_nodes`, or on ids its id's (`ident`, or
        the table's id of `key` when -1), the id counted."""
        if not self._by_id:
            self._nodes[key] = node
            return 0
        if ident < 0:
            ident = self._table.intern_one(key)
        self._idents[node] = ident
        self._node_of_id[ident] = node
        self._refs[ident] += 1
        return 0

    @cython.cfunc
    def _unregister(self, key: OffloadKey, node: cython.int) -> cython.int:
        """`key`, whose entry is `node`, has none now: out of `_nodes`, or its id released."""
        ident: cython.Py_ssize_t
        if not self._by_id:
            del self._nodes[key]
            return 0
        ident = self._idents[node]
        self._node_of_id[ident] = -1
        self._refs[ident] -= 1
        if self._refs[ident] == 0:
            self._released.append(ident)
        return 0

    @cython.cfunc
    def _rebind(self, key: OffloadKey, ghost: cython.int) -> cython.int:
        """`key`'s ghost apart (out of `_dup` already) becomes its entry (the id's count
        unchanged: the entry it replaces held it)."""
        if self._by_id:
            self._node_of_id[self._idents[ghost]] = ghost
        else:
            self._nodes[key] = ghost
        return 0

    @cython.cfunc
    @cython.inline
    @cython.exceptval(check=False)
    def _resident_node(self, node: cython.int) -> cython.bint:
        """Whether `node` (-1: none) is a resident key's, on a class queue."""
        return node >= 0 and self._where[node] < GHOSTS

    @cython.cfunc
    @cython.inline
    @cython.exceptval(check=False)
    def _is_ghost_of(self, node: cython.int, key: OffloadKey) -> cython.bint:
        """Whether `node` (-1: none), found in `_ann`, is still the ghost node of `key`: a
        node announced for a key that was not resident is its entry in `_nodes` for as long
        as it holds that key and is a ghost (freed, it holds none; reused, another)."""
        return node >= 0 and self._keys[node] is key and self._where[node] == GHOSTS

    @cython.cfunc
    def _announced(self, key: OffloadKey) -> cython.int:
        """`_nodes`' node of `key` (-1: none): found in `_ann` when `key` is announced after
        the last key found there (as a tier inserts the admitted keys it announced, in
        order), else looked up (and `_ann` is no longer read until the next announcement)."""
        node: cython.int
        pos: cython.Py_ssize_t = self._ann_pos
        while pos < self._nann:
            node = self._ann[pos]
            pos += 1
            if self._is_ghost_of(node, key):
                self._ann_pos = pos
                return node
        self._nann = 0
        return self._find(key)

    @cython.cfunc
    def _forget_ghost(self, node: cython.int) -> cython.int:
        """Take ghost `node`'s key out of the dicts (the node is the caller's to free)."""
        key = self._keys[node]
        if self._dup and self._node_of(self._dup, key) == node:
            del self._dup[key]
        else:
            self._unregister(key, node)
        return 0

    def on_store_miss(self, keys: Sequence[OffloadKey]) -> None:
        items: list[OffloadKey] = keys if type(keys) is list else list(keys)
        i: cython.Py_ssize_t
        self._start_announcing(len(items))
        for i in range(len(items) - 1, -1, -1):  # a request's deepest block first
            self._announce(i, items[i], -1)

    def on_store_miss_ids(self, ids: Sequence[int], keys: Sequence[OffloadKey]) -> None:
        """`on_store_miss(keys)` on ids: `ids[i]` is the id of `keys[i]` in the table."""
        items: list[OffloadKey] = keys if type(keys) is list else list(keys)
        i: cython.Py_ssize_t
        self._check_on_ids()
        self._start_announcing(len(items))
        for i in range(len(items) - 1, -1, -1):
            self._announce(i, items[i], ids[i])

    @cython.cfunc
    def _check_on_ids(self) -> cython.int:
        if not self._by_id:
            raise BlockStateError("lct: ids given to a policy on keys (use_ids first)")
        return 0

    @cython.cfunc
    def _start_announcing(self, count: cython.Py_ssize_t) -> cython.int:
        """`_ann` ready for an announcement of `count` keys."""
        if count > len(self._ann):
            self._ann = _ints([0] * count)
        self._nann = count
        self._ann_pos = 0
        return 0

    @cython.cfunc
    def _announce(
        self, i: cython.Py_ssize_t, key: OffloadKey, ident: cython.Py_ssize_t
    ) -> cython.int:
        """The access of `key` (id `ident`; -1: look it up), the `i`-th key announced."""
        node: cython.int = self._lookup(key, ident)
        main: cython.int = node
        resident: cython.bint = self._resident_node(node)
        if resident:  # announced again while resident: its ghost apart, if any
            node = self._node_of(self._dup, key) if self._dup else -1
        if self._observe(node) and node >= 0:  # the solver may have forgotten it
            if resident:
                node = self._node_of(self._dup, key) if self._dup else -1
            else:
                node = self._lookup(key, ident)
        if node < 0:
            node = self._new_node(key)
            if resident:
                self._dup[key] = node
                self._idents[node] = self._idents[main]  # read on ids only
            else:
                self._register(key, node, ident)
        else:
            self._unlink(node)
            # the caller's key object: `admit` and `insert` find the node in `_ann` by it
            self._keys[node] = key
        self._store(node)
        self._link(node, GHOSTS)
        self._ann[i] = -1 if resident else node
        return 0

    def on_store_move(self, keys: Sequence[OffloadKey]) -> None:
        items: list[OffloadKey] = keys if type(keys) is list else list(keys)
        i: cython.Py_ssize_t
        node: cython.int
        for i in range(len(items) - 1, -1, -1):
            key = items[i]
            node = self._find(key)
            if self._resident_node(node):
                continue
            if node < 0:
                node = self._new_node(key)
                self._register(key, node, -1)
            else:
                self._unlink(node)
            self._link(node, GHOSTS)

    def touch(self, keys: Sequence[OffloadKey]) -> None:
        items: list[OffloadKey] = keys if type(keys) is list else list(keys)
        i: cython.Py_ssize_t
        for i in range(len(items) - 1, -1, -1):  # tail first: the request's head is newest
            self._touch_node(self._find(items[i]))

    def touch_ids(self, ids: Sequence[int]) -> None:
        """`touch` of the keys of `ids` (on ids)."""
        i: cython.Py_ssize_t
        ident: cython.Py_ssize_t
        self._check_on_ids()
        for i in range(len(ids) - 1, -1, -1):
            ident = ids[i]
            self._touch_node(self._node_of_id[ident])

    @cython.cfunc
    def _touch_node(self, node: cython.int) -> cython.int:
        """The access of a key whose entry is `node` (-1: none), if resident."""
        if not self._resident_node(node):
            return 0
        self._observe(node)  # may move the horizon (the queues then follow it)
        self._store(node)
        self._unlink(node)
        self._link(node, self._class_of(self._o_state))
        return 0

    @cython.cfunc
    def _insert(self, key: OffloadKey, node: cython.int, block: BlockStatus) -> cython.int:
        """Make `key` (not resident; `node`: its ghost, -1: none) resident with `block`."""
        if node < 0:
            node = self._new_node(key)
            self._register(key, node, -1)
        else:
            self._unlink(node)
        self._blocks[node] = block
        self._stamp[node] = self._stamps
        self._stamps += 1
        if not self._by_id:
            self._resident[key] = block
        self._link(node, self._class_of(self._state[node]))
        return 0

    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        node: cython.int = self._announced(key)
        if self._resident_node(node):
            raise BlockStateError(f"lct: key {key!r} is already resident")
        self._insert(key, node, block)

    def insert_many(self, keys: Sequence[OffloadKey], blocks: Sequence[BlockStatus]) -> None:
        """`insert` of each pair, in order (checked by the caller: none resident, no key
        twice, as many blocks as keys)."""
        i: cython.Py_ssize_t
        for i in range(len(keys)):
            key = keys[i]
            self._insert(key, self._announced(key), blocks[i])

    def first_resident(self, keys: Sequence[OffloadKey]) -> int:
        """The index of the first resident key of `keys` (-1: none), in one C loop:
        `insert_many`'s check of its batch on ids (on keys, the resident dict's
        `isdisjoint`, one C call too)."""
        i: cython.Py_ssize_t
        for i in range(len(keys)):
            if self._resident_node(self._find(keys[i])):
                return i
        return -1

    @cython.cfunc
    def _remember(self, node: cython.int) -> cython.int:
        """Remember the key of resident `node` (unlinked, out of `_resident`) as a ghost, the
        newest."""
        # the key's ghost: this node, unless it has one already (`_dup`)
        ghost: cython.int = -1
        if self._dup:
            key = self._keys[node]
            ghost = self._node_of(self._dup, key)
            if ghost >= 0:
                del self._dup[key]
                self._rebind(key, ghost)
        if ghost < 0:
            self._blocks[node] = _NO_BLOCK
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

    def remove(self, key: OffloadKey) -> None:
        """lct.py's `remove` but for the hints (the caller's)."""
        node: cython.int = self._find(key)
        if not self._resident_node(node):
            raise BlockStateError(f"lct: key {key!r} is not resident")
        if not self._by_id:
            del self._resident[key]
        self._unlink(node)
        self._remember(node)

    def forget_old(self) -> None:
        """Drop the ghosts last accessed more than `memory` accesses ago, from the oldest
        stored (a key stored later with an older access waits its turn)."""
        oldest: cython.longlong = self.clock - self._memory
        node: cython.int = self._head[GHOSTS]
        while node >= 0 and self._last[node] < oldest:
            self._forget_ghost(node)
            self._unlink(node)
            self._drop(node)
            node = self._head[GHOSTS]

    def admit(self, keys: Sequence[OffloadKey]) -> list[bool]:
        """lct.py's `admit`: per key, whether its class's limit and share take it."""
        items: list[OffloadKey] = keys if type(keys) is list else list(keys)
        answers: list[bool] = []
        i: cython.Py_ssize_t
        node: cython.int
        cls: cython.int
        for cls in range(4):
            self._decided[cls] = -1
        for i in range(len(items)):
            key = items[i]
            # the key announced at this place (the tier's call), else the resident node or
            # the ghost
            node = self._ann[i] if i < self._nann else -1
            if not self._is_ghost_of(node, key):
                node = self._find(key)
            cls = self._class_of(self._first if node < 0 else self._state[node])
            if self._limits[cls] <= 0:
                answers.append(False)
            elif self._shares[cls] >= 1.0:
                answers.append(True)
            else:
                if self._decided[cls] < 0:  # the call's first key of the class decides
                    self._decided[cls] = self._admits_share(key, self._shares[cls])
                answers.append(self._decided[cls] == 1)
        return answers

    @cython.cfunc
    def _admits_share(self, key: OffloadKey, share: cython.double) -> cython.int:
        """Whether a class admitted in part (`share` of its keys) takes `key` (and the keys
        of its class that follow it in the call): always while the cache has room; when it
        is full, only a key of the share, by its hash (the same keys every time, so that a
        loop longer than the cache keeps a fixed part of itself, as the optimum does,
        instead of each admitted key evicting the next one needed), and only if some
        resident block is past its limit (a block still expected back is not given up for
        one of a class that pays less)."""
        cls: cython.int
        node: cython.int
        if self._count() < self.capacity:
            return 1
        if sample_point(key) >= share * SCALE:
            return 0
        for cls in range(4):
            node = self._head[cls]
            if (
                node >= 0
                and self._limits[cls] != _INF
                and self.clock - self._last[node] > self._limits[cls]
            ):
                return 1
        return 0

    # -- evict -------------------------------------------------------------------------------

    @cython.cfunc
    def _next_evictable(self, cls: cython.int, protected: Collection[OffloadKey]) -> cython.int:
        """Advance `_cursor[cls]` past the next block of queue `cls` that may be evicted and
        return its node (-1: none)."""
        node: cython.int = self._cursor[cls]
        while node >= 0:
            self._cursor[cls] = self._next[node]
            if _ref_cnt(self._blocks[node]) == 0 and self._keys[node] not in protected:
                return node
            node = self._cursor[cls]
        return -1

    @cython.cfunc
    def _past_limit(self, cls: cython.int, node: cython.int) -> cython.double:
        """How far resident `node` of class `cls` is past its class limit (lct.py's
        `evict`): the largest goes first; with `by_class`, a block past its limit ranks
        above every block of a higher class (the classes 1e10 apart, beyond any ratio or
        age)."""
        age: cython.double = self.clock - self._last[node]
        limit: cython.double = self._limits[cls]
        over: cython.double = age - limit
        if limit == _INF:
            return age - 1e18
        if self.ratio:
            over = age / limit if limit > 0 else 1e18 + age
        if self.by_class and 0 < limit < age:  # past its limit: the lowest class first
            return (4 - cls) * 1e10 + over
        return over

    @cython.cfunc
    def _take_head(self, cls: cython.int, protected: Collection[OffloadKey]) -> cython.int:
        """The next evictable head of queue `cls` into `_heads` and `_overs`."""
        node: cython.int = self._next_evictable(cls, protected)
        self._heads[cls] = node
        if node >= 0:
            self._overs[cls] = self._past_limit(cls, node)
        return node

    @cython.cfunc
    @cython.exceptval(check=False)
    def _furthest(self) -> cython.int:
        """The class whose evictable head is furthest past its limit (-1: none)."""
        best: cython.int = -1
        cls: cython.int
        for cls in range(4):
            if self._heads[cls] >= 0 and (best < 0 or self._overs[cls] > self._overs[best]):
                best = cls
        return best

    @cython.cfunc
    def _plan_victims(self, n: cython.Py_ssize_t, protected: Collection[OffloadKey]) -> cython.bint:
        """The `n` victims into `_plan`, one at a time among the queues' evictable heads;
        False when fewer can be evicted."""
        count: cython.Py_ssize_t = 0
        cls: cython.int
        if n > len(self._plan):
            self._plan = _ints([0] * n)
        for cls in range(4):
            self._cursor[cls] = self._head[cls]
            self._take_head(cls, protected)
        while count < n:
            cls = self._furthest()
            if cls < 0:
                return False
            self._plan[count] = self._heads[cls]
            count += 1
            if count < n:
                self._take_head(cls, protected)
        return True

    def evict(
        self, n: cython.Py_ssize_t, protected: Collection[OffloadKey]
    ) -> list[tuple[OffloadKey, BlockStatus]] | None:
        """lct.py's `evict` for n >= 1 without hints (the caller's)."""
        i: cython.Py_ssize_t
        node: cython.int
        ghost: cython.int
        out: list[tuple[OffloadKey, BlockStatus]] = []
        if n > self._count():  # fewer blocks than asked for, evictable or not
            return None
        if not self._plan_victims(n, protected):
            return None
        for i in range(n):
            node = self._plan[i]
            key = self._keys[node]
            out.append((key, self._blocks[node]))
            self._unlink(node)
            if not self._by_id:
                del self._resident[key]
            if self.clock - self._last[node] <= self._memory:
                self._remember(node)
            else:  # forgotten; its ghost apart, if any, becomes its entry
                ghost = self._node_of(self._dup, key) if self._dup else -1
                if ghost >= 0:
                    del self._dup[key]
                    self._rebind(key, ghost)
                else:
                    self._unregister(key, node)
                self._drop(node)
        return out

    # -- the solver's side -------------------------------------------------------------------

    def requeue(self, horizon: cython.int) -> None:
        """Count classes over candidate `horizon`: the resident blocks queued again by their
        class under it, oldest first (stable over the order they became resident in, the
        resident dict's)."""
        node: cython.int
        if cython.compiled and self._requeue_by_packed_key(horizon):
            return
        nodes: list[int] = self._resident_nodes()
        times: list[int] = [self._last[node] for node in nodes]
        self._empty_queues(horizon)
        for i in sorted(range(len(nodes)), key=times.__getitem__):
            node = nodes[i]
            self._link(node, self._class_of(self._state[node]))

    @cython.cfunc
    def _requeue_by_packed_key(self, horizon: cython.int) -> cython.bint:
        """`requeue` in one C sort (compiled): each resident node keyed by its access time
        and then its stamp packed in one 64-bit int (`last << 32 | stamp`, each less its
        least), the order of `requeue`'s two stable sorts (stamps are unique). False, and
        nothing done, when the times span 2**31 or more or the stamps 2**32 or more (the two
        sorts then)."""
        n: cython.Py_ssize_t = self._count()
        nodes = cython.declare(cython.int[::1], _ints([0]) * n)  # type: ignore[misc]
        keys = cython.declare(cython.longlong[::1], _longs([0]) * n)  # type: ignore[misc]
        i: cython.Py_ssize_t = 0
        cls: cython.int
        node: cython.int
        for cls in range(4):
            node = self._head[cls]
            while node >= 0:
                nodes[i] = node
                i += 1
                node = self._next[node]
        low: cython.longlong = -_C_NEVER  # the times' least and greatest, the stamps'
        high: cython.longlong = _C_NEVER
        first: cython.longlong = -_C_NEVER
        newest: cython.longlong = _C_NEVER
        for i in range(n):
            node = nodes[i]
            low = min(low, self._last[node])
            high = max(high, self._last[node])
            first = min(first, self._stamp[node])
            newest = max(newest, self._stamp[node])
        if high - low >= 1 << 31 or newest - first >= 1 << 32:
            return False
        for i in range(n):
            node = nodes[i]
            keys[i] = (self._last[node] - low) << 32 | (self._stamp[node] - first)
        # a bottom-up merge sort of the keys and their nodes (no ties: the stamps differ)
        other_keys = cython.declare(cython.longlong[::1], _longs([0]) * n)  # type: ignore[misc]
        other_nodes = cython.declare(cython.int[::1], _ints([0]) * n)  # type: ignore[misc]
        width: cython.Py_ssize_t = 1
        start: cython.Py_ssize_t
        mid: cython.Py_ssize_t
        end: cython.Py_ssize_t
        j: cython.Py_ssize_t
        k: cython.Py_ssize_t
        while width < n:
            start = 0
            while start < n:
                mid = min(start + width, n)
                end = min(start + 2 * width, n)
                i = start
                j = mid
                k = start
                while i < mid or j < end:
                    if j >= end or (i < mid and keys[i] < keys[j]):
                        other_keys[k] = keys[i]
                        other_nodes[k] = nodes[i]
                        i += 1
                    else:
                        other_keys[k] = keys[j]
                        other_nodes[k] = nodes[j]
                        j += 1
                    k += 1
                start = end
            keys, other_keys = other_keys, keys
            nodes, other_nodes = other_nodes, nodes
            width *= 2
        self._empty_queues(horizon)
        for i in range(n):
            node = nodes[i]
            self._link(node, self._class_of(self._state[node]))
        return True

    @cython.cfunc
    def _empty_queues(self, horizon: cython.int) -> cython.int:
        """Count classes over candidate `horizon`, the four class queues emptied: what both
        ways of `requeue` do before they link the resident nodes again, oldest first."""
        cls: cython.int
        self._horizon = horizon
        for cls in range(4):
            self._head[cls] = self._tail[cls] = -1
            self._size[cls] = 0
        return 0

    def set_horizon(self, horizon: cython.int) -> None:
        """Count classes over candidate `horizon`, leaving the queues as they are."""
        self._horizon = horizon

    def seen(self, key: OffloadKey) -> tuple[int, int, int, int] | None:
        """What is remembered of `key` (lct.py's History), resident or not; None: nothing."""
        node: cython.int = self._find(key)  # the resident node, else the ghost
        if node < 0:
            return None
        return (self._state[node], self._last[node], self._second[node], self._third[node])

    def decay_reuse(self, decay: cython.double) -> None:
        """Every reuse weighted by `decay` (the solve's fading; as lct.py's `x * decay`)."""
        i: cython.Py_ssize_t
        for i in range(len(self._reuse)):
            self._reuse[i] = self._reuse[i] * decay

    def class_curve(
        self,
        states: Sequence[int],
        per_epoch: Sequence[float],
        exposed: Sequence[float],
        top: cython.int,
        rate: cython.double,
    ) -> list[tuple[float, float, float]]:
        """lct.py's `_curve` of the class made of `states`, its reuse per bin the sum of
        theirs (in their order, as `sum` adds), each option's slots and hits times `rate`."""
        b: cython.int
        s: cython.int
        n: cython.Py_ssize_t = len(states)
        i: cython.Py_ssize_t
        total: cython.double
        for b in range(top + 1):
            total = 0.0
            for i in range(n):
                s = states[i]
                total += self._reuse[s * self._bins + b]
            self._column[b] = total
        return self._curve_of(per_epoch, exposed, top, rate)

    def curve(
        self, reuse: Sequence[float], per_epoch: Sequence[float], exposed: Sequence[float], top: int
    ) -> list[tuple[float, float, float]]:
        """lct.py's `_curve` of a class whose reuse per bin is `reuse` (tests)."""
        b: cython.int
        for b in range(top + 1):
            self._column[b] = reuse[b]
        return self._curve_of(per_epoch, exposed, top, 1.0)

    @cython.cfunc
    def _exposure_periods(self) -> cython.int:
        """Per bin, the solve period its lower edge falls in (`int(low // period)`, Python's
        float floor division), for the current period."""
        b: cython.Py_ssize_t
        period: int = self.period  # a Python int: the floor division is Python's
        for b in range(len(self._low_values)):
            self._jtab[b] = int(self._low_values[b] // period)
        self._jperiod = self.period
        return 0

    @cython.cfunc
    def _curve_of(
        self,
        per_epoch: Sequence[float],
        exposed: Sequence[float],
        top: cython.int,
        rate: cython.double,
    ) -> list[tuple[float, float, float]]:
        """lct.py's `_curve` of `_column` (the one loop, in C doubles: the same operations in
        the same order as its Python floats), slots and hits times `rate`."""
        curve: list[tuple[float, float, float]] = [(0.0, 0.0, 0.0)]
        if exposed[0] <= 0.0:
            return curve
        if self._jperiod != self.period:
            self._exposure_periods()
        period: cython.longlong = self.period
        epochs: cython.longlong = len(per_epoch)
        found: cython.double = 0.0
        time_reused: cython.double = 0.0
        reused: cython.double
        distance: cython.double
        fraction: cython.double
        at_risk: cython.double
        share: cython.double
        left: cython.double
        limit: cython.double
        j: cython.longlong
        b: cython.int
        for b in range(top + 1):
            reused = self._column[b]
            if reused > 0.0:
                distance = self._lows[b]  # the arrivals at least this old
                j = self._jtab[b]
                if j < epochs:
                    fraction = ((j + 1) * period - distance) / period
                    at_risk = exposed[j + 1] + fraction * per_epoch[j]
                else:
                    at_risk = exposed[epochs]
                if at_risk > 0.0:
                    share = reused / at_risk
                    left = 1.0 - found
                    if left < share:  # `min(share, left)`
                        share = left
                    found += share
                    time_reused += share * self._mids[b]
            if reused > 0.0 or b == top:
                limit = self._edges[b]
                curve.append(((time_reused + (1.0 - found) * limit) * rate, found * rate, limit))
        if found >= self._min_reuse:
            return curve
        return curve[:1]

    def get_reuse(self) -> list[list[float]]:
        """The reuse histogram, a row of bins per state."""
        return [
            [self._reuse[s * self._bins + b] for b in range(self._bins)]
            for s in range(self._nstates)
        ]

    def set_reuse(self, rows: Sequence[Sequence[float]]) -> None:
        s: cython.int
        b: cython.int
        for s in range(self._nstates):
            row = rows[s]
            for b in range(self._bins):
                self._reuse[s * self._bins + b] = row[b]

    def get_arrivals(self) -> list[float]:
        """The arrivals per state in the current solve period."""
        return [self._arrivals[s] for s in range(self._nstates)]

    def set_arrivals(self, values: Sequence[float]) -> None:
        s: cython.int
        for s in range(self._nstates):
            self._arrivals[s] = values[s]

    def get_vector(self, which: cython.int) -> list[float]:
        """The limits (`LIMITS`), shares (`SHARES`) or credits (`CREDIT`), per class."""
        if which == LIMITS:
            return [self._limits[0], self._limits[1], self._limits[2], self._limits[3]]
        if which == SHARES:
            return [self._shares[0], self._shares[1], self._shares[2], self._shares[3]]
        return [self._credit[0], self._credit[1], self._credit[2], self._credit[3]]

    def set_vector(self, which: cython.int, values: Sequence[float]) -> None:
        """Set the limits, shares or credits (see `get_vector`), one value per class."""
        i: cython.int
        if len(values) != 4:
            raise InvalidValueError(f"lct: 4 values per class expected, got {values!r}")
        for i in range(4):
            if which == LIMITS:
                self._limits[i] = values[i]
            elif which == SHARES:
                self._shares[i] = values[i]
            else:
                self._credit[i] = values[i]

    # -- inspection and reset ----------------------------------------------------------------

    def keys_of(self, where: cython.int) -> list[OffloadKey]:
        """The keys of class queue `where` (0 to 3) or of the ghosts (4), oldest first."""
        out: list[OffloadKey] = []
        node: cython.int = self._head[where]
        while node >= 0:
            out.append(self._keys[node])
            node = self._next[node]
        return out

    def ghost_entries(self) -> list[tuple[OffloadKey, tuple[int, int, int, int]]]:
        """The remembered non-resident keys and what is remembered of each (lct.py's
        History), oldest stored first."""
        out: list[tuple[OffloadKey, tuple[int, int, int, int]]] = []
        node: cython.int = self._head[GHOSTS]
        while node >= 0:
            history = (self._state[node], self._last[node], self._second[node], self._third[node])
            out.append((self._keys[node], history))
            node = self._next[node]
        return out

    def clear(self) -> None:
        """Forget every key (the learned state is the policy's `_learn_afresh`)."""
        i: cython.int
        if self._by_id:  # every id released, the table kept
            for i in range(self._used):
                if self._keys[i] is not _NO_KEY and self._node_of_id[self._idents[i]] == i:
                    self._unregister(self._keys[i], i)
        self._resident.clear()
        self._nodes.clear()
        self._dup.clear()
        self._stamps = 0
        self._nann = self._ann_pos = 0
        for i in range(self._used):
            self._keys[i] = _NO_KEY
            self._blocks[i] = _NO_BLOCK
        self._used = 0
        self._free = -1
        for i in range(LISTS):
            self._head[i] = self._tail[i] = -1
            self._size[i] = 0

    # -- on ids --------------------------------------------------------------------------------

    @property
    def on_ids(self) -> bool:
        """Whether the entries are by id (`use_ids`)."""
        return self._by_id

    def use_ids(self, table: Any) -> None:
        """Keep the entries by the ids of `table` (a `KeyIds`) from now on, in the same state:
        each remembered key interned and counted, `_nodes` and the resident dict emptied."""
        if self._by_id:
            return
        self._table = table
        self._node_of_id = _ints([])
        table.register(self)
        self._by_id = True
        for key, node in self._nodes.items():
            self._register(key, node, -1)
        entry: cython.int
        for key, node in self._dup.items():
            entry = node
            self._idents[entry] = self._idents[self._find(key)]
        self._nodes.clear()
        self._resident.clear()

    def use_keys(self) -> None:
        """Keep the entries in `_nodes` again, in the same state: each id released, the
        table left, the resident dict refilled in the order its keys became resident."""
        i: cython.int
        if not self._by_id:
            return
        for key, block in self.entries():
            self._resident[key] = block
        for i in range(self._used):
            if self._keys[i] is not _NO_KEY and self._node_of_id[self._idents[i]] == i:
                key = self._keys[i]
                self._unregister(key, i)
                self._nodes[key] = i
        self._by_id = False
        self._table.unregister(self)
        self._table = None

    def resize_ids(self, refs: array[int], capacity: int, released: list[int]) -> None:
        """The table grew (`KeyIds.register`): its new counts, room for `capacity` ids."""
        self._refs = refs
        self._released = released
        if len(self._node_of_id) < capacity:
            self._node_of_id = grown_ids(self._node_of_id, capacity, -1)
