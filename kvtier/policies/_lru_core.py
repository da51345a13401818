# cython: annotation_typing=True, boundscheck=False, wraparound=False, initializedcheck=False
"""`LRUIds`: an LRU order over the ids of a `KeyIds` table, what an LRU shadow of `auto`
runs on (`LRUCachePolicy.use_ids`) instead of its ordered dict of keys.

The ids are the nodes: a doubly linked list over int arrays indexed by id (least recently
used at the head), a flag per id (resident or not) and each id's block in a list. An access
is no dict operation at all (the table's one look-up is shared by every shadow on ids;
`_key_ids.py` says why): a hit relinks its id at the tail; a miss evicts the head when full
(the oldest ready block when the head is pinned or pending) and links the new id. The
decisions are `LRUCachePolicy.access`'s, key for key (`tests/test_shadow_ids.py`).

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

_NO_BLOCK = BlockStatus(-1)  # the block of an id not held: never returned


@cython.final
@cython.cclass
class LRUIds:
    """An LRU order of ids with their blocks, each id counted in the table while held."""

    _capacity: cython.Py_ssize_t
    _table: object  # the `KeyIds` whose ids these are
    _prev = cython.declare(cython.int[::1])  # type: ignore[misc]
    _next = cython.declare(cython.int[::1])  # type: ignore[misc]
    _held = cython.declare(cython.int[::1])  # type: ignore[misc]
    _refs = cython.declare(cython.int[::1])  # type: ignore[misc]
    _released: list[int]
    _blocks: list[BlockStatus]
    _head: cython.int  # least recently used id (-1: empty)
    _tail: cython.int
    _count: cython.Py_ssize_t

    def __init__(self, capacity: cython.Py_ssize_t, table: Any) -> None:
        self._capacity = capacity
        self._table = table
        empty = array("i")
        self._prev = self._next = self._held = self._refs = empty
        self._released = []
        self._blocks = []
        self._head = self._tail = -1
        self._count = 0
        table.register(self)

    def resize_ids(self, refs: array[int], capacity: int, released: list[int]) -> None:
        """The table grew (`KeyIds.register`): its new counts, room for `capacity` ids."""
        self._refs = refs
        self._released = released
        old: cython.Py_ssize_t = len(self._held)
        if old < capacity:
            self._prev = grown_ids(self._prev, capacity, -1)
            self._next = grown_ids(self._next, capacity, -1)
            self._held = grown_ids(self._held, capacity, 0)
            # each list extended once (as `_arc_core.ARCLists._grow`)
            self._blocks.extend([_NO_BLOCK] * (capacity - old))

    def __len__(self) -> int:
        return self._count

    def order(self) -> list[Any]:
        """The keys held, least recently used first."""
        out: list[Any] = []
        node: cython.int = self._head
        while node >= 0:
            out.append(self._table.key_of(node))  # type: ignore[attr-defined]
            node = self._next[node]
        return out

    def entries(self) -> list[tuple[Any, BlockStatus]]:
        """The (key, block) held, least recently used first."""
        out: list[tuple[Any, BlockStatus]] = []
        node: cython.int = self._head
        while node >= 0:
            out.append((self._table.key_of(node), self._blocks[node]))  # type: ignore[attr-defined]
            node = self._next[node]
        return out

    def get(self, key: Any) -> BlockStatus | None:
        """The block of `key`, or None when it is not held."""
        ident: cython.Py_ssize_t = self._table.id_of(key)  # type: ignore[attr-defined]
        if ident < 0 or not self._held[ident]:
            return None
        return self._blocks[ident]

    def load(self, keys: Sequence[Any], blocks: Sequence[BlockStatus]) -> None:
        """Append `keys` (not held) with `blocks` at the recent end, in order."""
        i: cython.Py_ssize_t
        for i in range(len(keys)):
            found = self._table.intern_one(keys[i])  # type: ignore[attr-defined]
            self._hold(found, blocks[i])

    @cython.cfunc
    def _hold(self, found: object, block: BlockStatus) -> cython.int:
        """Id `found` (not held) joins at the recent end with `block`."""
        ident: cython.int = found  # type: ignore[assignment]
        self._held[ident] = 1
        self._blocks[ident] = block
        self._refs[ident] += 1
        self._link(ident)
        self._count += 1
        return 0

    @cython.cfunc
    def _forget(self, ident: cython.int) -> cython.int:
        """Held id `ident` leaves (evicted), its count in the table down by one."""
        self._unlink(ident)
        self._held[ident] = 0
        self._blocks[ident] = _NO_BLOCK
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
        ref: cython.int = block.ref_cnt  # read once (see `_miss`)
        for i in range(len(ids) - 1, -1, -1):
            found = ids[i]
            ident = found
            if self._held[ident]:
                if self._tail != ident:
                    self._unlink(ident)
                    self._link(ident)
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
            if not self._held[ident]:
                self._miss(found, block, ref)

    @cython.cfunc
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
