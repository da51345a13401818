# cython: annotation_typing=True, boundscheck=False, wraparound=False, initializedcheck=False
"""`LRUIds`: an LRU order over the ids of a `KeyIds` table, what an LRU shadow of `auto`
runs on (`LRUCachePolicy.use_ids`) instead of its ordered dict of keys.

Each id held has a node: a doubly linked list over int arrays of nodes (least recently used
at the head), each node's id and block, and one int array indexed by id giving each id's
node (-1: not held). An access is no dict operation at all (the table's one look-up is
shared by every shadow on ids; `_key_ids.py` says why): a hit relinks its node at the tail;
a miss evicts the head when full (the oldest ready block when the head is pinned or
pending) and links a node for the new id. The decisions are `LRUCachePolicy.access`'s, key
for key (`tests/test_shadow_ids.py`).

The nodes are as many as the blocks held (at most the capacity), not as many as the table
has ids: the table's ids number every key any shadow or lct remembers (at 1 % of the shipped
trace 44 x the capacity), so arrays indexed by id are large and sparse, and the ids being
the nodes (before) made every access and every link of a neighbour touch a cold line of each
of four such arrays and the table's growth copy them all. Now only `_node_of_id` is indexed
by id, as ARC's and S3-FIFO's cores do (docs/BENCHMARKS.md, "Policy cost, fourteenth
round").

Written in Cython's pure Python mode, as `_arc_core.py` is (compiled by `scripts/
build-core`; plain Python without a build).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kvtier.blocks import BlockStatus
from kvtier.policies._key_ids import grown_ids

if TYPE_CHECKING:  # mypy checks this module against what runs without Cython
    from kvtier.policies import _cython_shim as cython
else:
    try:
        import cython
    except ImportError:  # no Cython: the module runs as the plain Python it is
        from kvtier.policies import _cython_shim as cython

_NO_BLOCK = BlockStatus(-1)  # the block of a free node: never returned

INITIAL_NODES = 16
MOST_NODES_AT_START = 1 << 20


@cython.final
@cython.cclass
class LRUIds:
    """An LRU order of ids with their blocks, each id counted in the table while held."""

    _capacity: cython.Py_ssize_t
    _table: object  # the `KeyIds` whose ids these are
    # Per node: its neighbours (-1: none; a free node's `_next` chains the free list), its
    # id, its block (`_NO_BLOCK` while free).
    _prev = cython.declare(cython.int[::1])  # type: ignore[misc]
    _next = cython.declare(cython.int[::1])  # type: ignore[misc]
    _ident = cython.declare(cython.int[::1])  # type: ignore[misc]
    _blocks: list[BlockStatus]
    _allocated: cython.Py_ssize_t
    _free: cython.int  # the first free node (-1: none)
    # Per id: its node (-1: not held); the table's counts.
    _node_of_id = cython.declare(cython.int[::1])  # type: ignore[misc]
    _refs = cython.declare(cython.int[::1])  # type: ignore[misc]
    _released: list[int]
    _head: cython.int  # least recently used node (-1: empty)
    _tail: cython.int
    _count: cython.Py_ssize_t

    def __init__(self, capacity: cython.Py_ssize_t, table: Any) -> None:
        self._capacity = capacity
        self._table = table
        empty = array("i")
        self._prev = self._next = self._ident = self._node_of_id = self._refs = empty
        self._blocks = []
        self._allocated = 0
        self._free = -1
        self._released = []
        self._head = self._tail = -1
        self._count = 0
        self._grow(max(INITIAL_NODES, min(capacity + 1, MOST_NODES_AT_START)))
        table.register(self)

    def resize_ids(self, refs: array[int], capacity: int, released: list[int]) -> None:
        """The table grew (`KeyIds.register`): its new counts, room for `capacity` ids."""
        self._refs = refs
        self._released = released
        if len(self._node_of_id) < capacity:
            self._node_of_id = grown_ids(self._node_of_id, capacity, -1)

    @cython.cfunc
    @cython.exceptval(-1)
    def _grow(self, count: cython.Py_ssize_t) -> cython.int:
        """Add `count` free nodes, chained onto the free list lowest first."""
        old: cython.Py_ssize_t = self._allocated
        new: cython.Py_ssize_t = old + count
        i: cython.Py_ssize_t
        self._prev = grown_ids(self._prev, new, -1)
        self._next = grown_ids(self._next, new, -1)
        self._ident = grown_ids(self._ident, new, -1)
        self._blocks.extend([_NO_BLOCK] * count)  # extended once (as ARC's `_grow`)
        for i in range(old, new):
            self._next[i] = i + 1 if i + 1 < new else self._free
        self._free = old
        self._allocated = new
        return 0

    def __len__(self) -> int:
        return self._count

    @property
    def nodes(self) -> int:
        """How many nodes the arrays have room for (the capacity's, whatever the table's)."""
        return self._allocated

    def order(self) -> list[Any]:
        """The keys held, least recently used first."""
        out: list[Any] = []
        node: cython.int = self._head
        while node >= 0:
            out.append(self._table.key_of(self._ident[node]))  # type: ignore[attr-defined]
            node = self._next[node]
        return out

    def entries(self) -> list[tuple[Any, BlockStatus]]:
        """The (key, block) held, least recently used first."""
        out: list[tuple[Any, BlockStatus]] = []
        node: cython.int = self._head
        while node >= 0:
            key = self._table.key_of(self._ident[node])  # type: ignore[attr-defined]
            out.append((key, self._blocks[node]))
            node = self._next[node]
        return out

    def get(self, key: Any) -> BlockStatus | None:
        """The block of `key`, or None when it is not held."""
        ident: cython.Py_ssize_t = self._table.id_of(key)  # type: ignore[attr-defined]
        if ident < 0 or self._node_of_id[ident] < 0:
            return None
        node: cython.int = self._node_of_id[ident]
        return self._blocks[node]

    def load(self, keys: Sequence[Any], blocks: Sequence[BlockStatus]) -> None:
        """Append `keys` (not held) with `blocks` at the recent end, in order."""
        i: cython.Py_ssize_t
        for i in range(len(keys)):
            found = self._table.intern_one(keys[i])  # type: ignore[attr-defined]
            self._hold(found, blocks[i])

    @cython.cfunc
    @cython.exceptval(-1)
    def _hold(self, found: object, block: BlockStatus) -> cython.int:
        """Id `found` (not held) joins at the recent end with `block`, on a free node."""
        ident: cython.int = found  # type: ignore[assignment]
        if self._free < 0:
            self._grow(self._allocated)
        node: cython.int = self._free
        self._free = self._next[node]
        self._ident[node] = ident
        self._node_of_id[ident] = node
        self._blocks[node] = block
        self._refs[ident] += 1
        self._link(node)
        self._count += 1
        return 0

    @cython.cfunc
    @cython.exceptval(-1)
    def _forget(self, node: cython.int) -> cython.int:
        """Held `node` leaves (evicted) and is freed, its id's count in the table down by
        one."""
        ident: cython.int = self._ident[node]
        self._unlink(node)
        self._node_of_id[ident] = -1
        self._blocks[node] = _NO_BLOCK
        self._ident[node] = -1
        self._next[node] = self._free
        self._free = node
        self._count -= 1
        self._refs[ident] -= 1
        if self._refs[ident] == 0:
            self._released.append(ident)  # an int made now: none kept per id ahead
        return 0

    @cython.cfunc
    @cython.inline
    @cython.exceptval(check=False)
    def _link(self, node: cython.int) -> cython.void:
        tail: cython.int = self._tail
        self._prev[node] = tail
        self._next[node] = -1
        if tail < 0:
            self._head = node
        else:
            self._next[tail] = node
        self._tail = node

    @cython.cfunc
    @cython.inline
    @cython.exceptval(check=False)
    def _unlink(self, node: cython.int) -> cython.void:
        prev: cython.int = self._prev[node]
        nxt: cython.int = self._next[node]
        if prev < 0:
            self._head = nxt
        else:
            self._next[prev] = nxt
        if nxt < 0:
            self._tail = prev
        else:
            self._prev[nxt] = prev

    def access(self, ids: Sequence[int], block: BlockStatus) -> int:
        """Accesses of `ids`, last first, as `LRUCachePolicy.access` makes them: a hit
        becomes the most recent; a miss evicts the oldest ready block when full (not
        stored when none is ready) and is stored with `block`. Returns the hits."""
        hits: cython.Py_ssize_t = 0
        i: cython.Py_ssize_t
        ident: cython.int
        node: cython.int
        ref: cython.int = block.ref_cnt  # read once (see `_miss`)
        for i in range(len(ids) - 1, -1, -1):
            found = ids[i]
            ident = found
            node = self._node_of_id[ident]
            if node >= 0:
                if self._tail != node:
                    self._unlink(node)
                    self._link(node)
                hits += 1
                continue
            self._miss(found, block, ref)
        return hits

    def store(self, ids: Sequence[int], block: BlockStatus) -> None:
        """Each of `ids` not held, last first, stored as a miss of `access` stores it
        (`auto`'s `on_store_move`): nothing touched."""
        i: cython.Py_ssize_t
        ident: cython.int
        ref: cython.int = block.ref_cnt  # read once (see `_miss`)
        for i in range(len(ids) - 1, -1, -1):
            found = ids[i]
            ident = found
            if self._node_of_id[ident] < 0:
                self._miss(found, block, ref)

    @cython.cfunc
    @cython.exceptval(-1)
    def _miss(self, found: object, block: BlockStatus, ref: cython.int) -> cython.int:
        """Id `found` (not held) stored, after the oldest ready block's eviction when
        full (not stored when no block is ready). `ref` is `block`'s count, read once per
        call: a held id's block that is `block` (a shadow's all are; nothing here writes a
        count) is not read again (a ctypes field: about 200 instructions; docs/
        BENCHMARKS.md, "Policy cost, seventh round")."""
        victim: cython.int
        if self._count >= self._capacity:
            victim = self._head
            while victim >= 0 and (
                ref != 0 if self._blocks[victim] is block else self._blocks[victim].ref_cnt != 0
            ):
                victim = self._next[victim]
            if victim < 0:
                return 0
            self._forget(victim)
        self._hold(found, block)
        return 0

    def clear(self) -> None:
        """Forget every id held (each released)."""
        while self._head >= 0:
            self._forget(self._head)

    def drop_ids(self) -> None:
        """`clear` (every id released), and leave the table."""
        self.clear()
        self._table.unregister(self)  # type: ignore[attr-defined]
