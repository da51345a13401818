# cython: annotation_typing=True, boundscheck=False, wraparound=False, initializedcheck=False
"""ARC's state and steps, `ARCLists`: the one source of the algorithm that
`kvtier.policies.arc.ARCCachePolicy` runs, compiled or as plain Python.

The algorithm is the paper's, step for step, with the departures a tier needs (arc.py's
docstring says which and why). T1, T2, B1 and B2 are intrusive doubly linked lists over int
arrays of node numbers (least recently used at the head); one dict maps every listed key to
its node, so moving a key between lists relinks two nodes instead of deleting from one
ordered dict and inserting into another. The keys announced by `on_store_miss` are nodes too,
flagged and kept in announcement order: a new key announced gets its node then (PENDING, on
no list), so announcing it is one dict operation and its `insert` and `evict`'s look-ups none.
`evict` plans first (the victims, what happens to each, the ghosts deleted, the new p),
without changing anything, and applies the plan only when all n victims were found.
`access` (a shadow's request, what `auto` drives) takes a miss's steps with no more than a
lone key needs: the node its look-up found, announced alone, and the plan applied without a
list of victims (issue 34's third round; docs/BENCHMARKS.md, "Policy cost, third round").
A shadow of `auto` runs on ids (`use_ids`: `kvtier.policies._key_ids`): a key is then its
int id in the table `auto` shares among its shadows, each id's node is in an int array
indexed by the id (no `_node` dict), the resident blocks are counted (no `_resident`
dict), and a node made or freed counts its id up or down in the table; `access` and `store`
take ids, the inspection (`keys_of`, `entries`, `get`) reads keys through the table, and
`use_keys` goes back. The steps are the same text either way: only `_find`, `_node_of`,
`_new_node`, `_free_node` and the resident count and writes look at the mode
(docs/BENCHMARKS.md, "Policy cost, fifth round").

Written in Cython's pure Python mode: `scripts/build-core` compiles this file with its
annotations as C types (the `cython:` line above; the arrays typed memoryviews, the counts C
integers, the class an extension type, its `@cython.cfunc` methods C functions). Without a
build it runs as the Python it is: `cython` is then Cython's shadow module, or
`_cython_shim` where Cython is not installed, whose decorators change nothing. Both take
the same decisions (`tests/test_compiled_core.py` runs this file's text both ways in one
process and compares every answer and state). mypy cannot read a typed memoryview
(`cython.int[::1]`) or a C array (`cython.int[4]`): the int arrays are declared with
`cython.declare`, each with a `type: ignore`, and are `Any` to mypy. The four-item arrays
(one item per list) are C arrays inside the object, lists when not compiled: no pointer to
follow on the hottest reads.
"""

from __future__ import annotations

from array import array
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

from kvtier.blocks import BlockStatus
from kvtier.errors import BlockStateError
from kvtier.keys import OffloadKey
from kvtier.policies._key_ids import grown_ids

if TYPE_CHECKING:  # mypy checks this module against what runs without Cython
    from kvtier.policies import _cython_shim as cython
else:
    try:
        import cython
    except ImportError:  # no Cython: the module runs as the plain Python it is
        from kvtier.policies import _cython_shim as cython

# The lists a node can be on (`_where`), indexes of `_head`, `_tail`, `_size` and of a
# plan's `_count` and `_cursor`.
T1 = cython.declare(cython.int, 0)
T2 = cython.declare(cython.int, 1)
B1 = cython.declare(cython.int, 2)
B2 = cython.declare(cython.int, 3)
NOWHERE = cython.declare(cython.int, 4)  # a free node
PENDING = cython.declare(cython.int, 5)  # an announced key on no list (see `on_store_miss`)

# What an eviction plan does with each victim.
EVICT_T1 = cython.declare(cython.int, 0)  # move a T1 block to the MRU end of B1
EVICT_T2 = cython.declare(cython.int, 1)  # move a T2 block to the MRU end of B2
DROP_T1 = cython.declare(cython.int, 2)  # delete a T1 block unremembered (case IV.A, |T1| = c)

# Where a requested key comes from: a new key, or a hit in ghost list B1 or B2.
NEW = cython.declare(cython.int, 0)
FROM_B1 = cython.declare(cython.int, 1)
FROM_B2 = cython.declare(cython.int, 2)

# What case IV did with a request (`_case_iv`).
TO_REPLACE = cython.declare(cython.int, 0)  # a REPLACE follows
SERVED = cython.declare(cython.int, 1)  # served whole (|T1| = c: T1's LRU dropped)
STUCK = cython.declare(cython.int, 2)  # no block can be evicted

INITIAL_NODES = 16
MOST_NODES_AT_START = 1 << 20

# The key and block of a node that has none (free; a ghost has no block). Never looked up,
# never returned: they keep the lists' item types exact (and release what a node held).
_NO_KEY = OffloadKey(b"")
_NO_BLOCK = BlockStatus(-1)


def _filled(count: int, value: int) -> array[int]:
    """An int array of `count` copies of `value`."""
    return array("i", [value]) * count


@cython.final
@cython.cclass
class ARCLists:
    """ARC's state: the four lists, the resident blocks, p and the announced keys; and its
    steps, each one of `ARCCachePolicy`'s calls once the policy has checked its arguments."""

    _capacity: cython.Py_ssize_t
    _p: cython.double
    _resident: dict[OffloadKey, BlockStatus]  # T1's and T2's blocks
    _node: dict[OffloadKey, int]  # every listed key (all four lists), announced key -> node
    _incoming_adapted: cython.bint  # whether p adapted to the announced keys (by `evict`)
    # The announced keys: the nodes flagged `_incoming`, in the order of `_ann[:_nann]` (the
    # announcement, duplicates and resident keys left out), which also keeps those whose
    # flag was cleared since (inserted) until `evict` compacts it. A tier inserts the keys it
    # announced in that order: `_ann_pos` is where the next one is.
    _ann = cython.declare(cython.int[::1])  # type: ignore[misc]
    _nann: cython.Py_ssize_t
    _ann_pos: cython.Py_ssize_t
    # How many new keys `insert` may still add to T1 without testing the ghost bound
    # (`_bound_ghosts`): only insert and evict add to |T1|+|B1| or to the lists' total, so
    # evict and insert_many set it to 0, meaning "test".
    _insert_room: cython.Py_ssize_t
    # Per node: the neighbours (-1: none), the list, whether it is announced, a mark used
    # while planning, its key, its block (`_NO_BLOCK` on a ghost list or free), its number as a
    # Python int (the `_node` dict's values).
    _prev = cython.declare(cython.int[::1])  # type: ignore[misc]
    _next = cython.declare(cython.int[::1])  # type: ignore[misc]
    _where = cython.declare(cython.int[::1])  # type: ignore[misc]
    _incoming = cython.declare(cython.int[::1])  # type: ignore[misc]
    _gone = cython.declare(cython.int[::1])  # type: ignore[misc]
    _keys: list[OffloadKey]
    _blocks: list[BlockStatus]
    _ids: list[int]
    _allocated: cython.int
    _free: cython.int  # the first free node, chained through `_next` (-1: none)
    _created: cython.bint  # whether `_node_of` registered a new node
    # Per list (T1, T2, B1, B2): its oldest and newest node (-1: empty), its length.
    # (The type ignores: see the module's docstring.)
    _head = cython.declare(cython.int[4])  # type: ignore[misc,valid-type]
    _tail = cython.declare(cython.int[4])  # type: ignore[misc,valid-type]
    _size = cython.declare(cython.int[4])  # type: ignore[misc,valid-type]
    # An eviction plan: the nodes marked gone (a ghost hit, or a ghost the plan deletes)
    # and the ghosts it deletes (each at most once per node), the victims and what happens
    # to each; the list sizes and p as the step-by-step order sees them, the next node
    # to look at in each list, and whether the next new key takes the steady path.
    _marked = cython.declare(cython.int[::1])  # type: ignore[misc]
    _popped = cython.declare(cython.int[::1])  # type: ignore[misc]
    _victims = cython.declare(cython.int[::1])  # type: ignore[misc]
    _ops = cython.declare(cython.int[::1])  # type: ignore[misc]
    _nmarked: cython.Py_ssize_t
    _npopped: cython.Py_ssize_t
    _nplan: cython.Py_ssize_t
    _plan_room: cython.Py_ssize_t
    _count = cython.declare(cython.int[4])  # type: ignore[misc,valid-type]
    _cursor = cython.declare(cython.int[4])  # type: ignore[misc,valid-type]
    _planned_p: cython.double
    _steady: cython.bint
    # On ids (`use_ids`): a key is its id in `_table` (a `KeyIds`), `_keys` holds the id's
    # int object, `_node_of_id` each id's node (-1: none) instead of the `_node` dict, and
    # `_nres` counts the resident blocks instead of the `_resident` dict; `_refs` and
    # `_released` are the table's counts and released ids.
    _by_id: cython.bint
    _table: object
    _node_of_id = cython.declare(cython.int[::1])  # type: ignore[misc]
    _refs = cython.declare(cython.int[::1])  # type: ignore[misc]
    _released: list[int]
    _nres: cython.Py_ssize_t
    # During `access` and `store`: the call's block and its count, read once (`_ref_cnt`).
    _known: object
    _known_ref: cython.int

    def __init__(self, capacity: cython.Py_ssize_t) -> None:
        self._capacity = capacity
        self._p = 0.0
        self._resident = {}
        self._node = {}
        self._incoming_adapted = False
        self._ann = _filled(0, 0)
        self._nann = self._ann_pos = 0
        self._insert_room = 0
        self._keys = []
        self._blocks = []
        self._ids = []
        self._allocated = 0
        self._free = -1
        self._created = False
        self._head = [-1, -1, -1, -1]
        self._tail = [-1, -1, -1, -1]
        self._size = [0, 0, 0, 0]
        empty = _filled(0, 0)
        self._prev = self._next = self._where = self._incoming = self._gone = empty
        self._marked = self._popped = self._victims = self._ops = empty
        self._nmarked = self._npopped = self._nplan = self._plan_room = 0
        self._count = [0, 0, 0, 0]
        self._cursor = [-1, -1, -1, -1]
        self._planned_p = 0.0
        self._steady = False
        self._by_id = False
        self._table = None
        self._node_of_id = self._refs = empty
        self._released = []
        self._nres = 0
        self._known = None
        self._known_ref = 0
        self._grow(max(INITIAL_NODES, min(2 * capacity + 8, MOST_NODES_AT_START)))

    # -- inspection ----------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def p(self) -> float:
        """The adaptive target for |T1|."""
        return self._p

    @property
    def resident(self) -> dict[OffloadKey, BlockStatus]:
        """T1's and T2's blocks by key (unordered): `ARCCachePolicy.get` is its `get`."""
        return self._resident

    @property
    def incoming_adapted(self) -> bool:
        """Whether `evict` adapted p to the keys announced since `on_store_miss`."""
        return self._incoming_adapted

    def keys_of(self, where: cython.int) -> list[OffloadKey]:
        """The keys of list `where` (0: T1, 1: T2, 2: B1, 3: B2), least recently used first."""
        out: list[OffloadKey] = []
        node: cython.int = self._head[where]
        while node >= 0:
            out.append(self._key_of(node))
            node = self._next[node]
        return out

    def _key_of(self, node: cython.int) -> OffloadKey:
        """The key of `node` (its id's key on ids)."""
        if self._by_id:
            key: OffloadKey = self._table.key_of(self._keys[node])  # type: ignore[attr-defined]
            return key
        return self._keys[node]

    def announced(self) -> list[OffloadKey]:
        """The announced keys not inserted yet, in order."""
        return [
            self._key_of(self._ann[i]) for i in range(self._nann) if self._incoming[self._ann[i]]
        ]

    def resident_count(self) -> int:
        """The blocks resident (T1's and T2's)."""
        return self._resident_count()

    def get(self, key: OffloadKey) -> BlockStatus | None:
        """The block of resident `key`, or None (on ids: through the table)."""
        if not self._by_id:
            return self._resident.get(key)
        ident: cython.Py_ssize_t = self._table.id_of(key)  # type: ignore[attr-defined]
        if ident < 0 or self._node_of_id[ident] < 0:
            return None
        node: cython.int = self._node_of_id[ident]
        if self._where[node] != T1 and self._where[node] != T2:
            return None
        return self._blocks[node]

    @property
    def on_ids(self) -> bool:
        """Whether the lists run on ids (`use_ids`)."""
        return self._by_id

    def use_ids(self, table: object) -> None:
        """Run on ids of `table` (a `KeyIds`) from now on, in the same state (the announced
        keys released first, as the next miss would): every key listed is interned and
        counted, the dicts emptied."""
        if self._by_id:
            return
        self._release_announced()
        self._table = table
        self._node_of_id = _filled(0, 0)
        table.register(self)  # type: ignore[attr-defined]
        where: cython.int
        node: cython.int
        ident: cython.Py_ssize_t
        for where in range(T1, B2 + 1):
            node = self._head[where]
            while node >= 0:
                found = table.intern_one(self._keys[node])  # type: ignore[attr-defined]
                ident = found
                self._keys[node] = found
                self._node_of_id[ident] = node
                self._refs[ident] += 1
                node = self._next[node]
        self._nres = len(self._resident)
        self._node.clear()
        self._resident.clear()
        self._by_id = True

    def use_keys(self) -> None:
        """Run on keys again, in the same state (the announced keys released first): every
        id's key back in the dicts, each id released, the table left."""
        if not self._by_id:
            return
        self._release_announced()
        table = self._table
        where: cython.int
        node: cython.int
        ident: cython.Py_ssize_t
        for where in range(T1, B2 + 1):
            node = self._head[where]
            while node >= 0:
                found = self._keys[node]
                ident = found  # type: ignore[assignment]
                key = table.key_of(ident)  # type: ignore[attr-defined]
                self._keys[node] = key
                self._node[key] = self._ids[node]
                if where in (T1, T2):
                    self._resident[key] = self._blocks[node]
                self._node_of_id[ident] = -1
                self._refs[ident] -= 1
                if self._refs[ident] == 0:
                    self._released.append(found)  # type: ignore[arg-type]
                node = self._next[node]
        self._nres = 0
        self._by_id = False
        table.unregister(self)  # type: ignore[attr-defined]
        self._table = None

    def resize_ids(self, refs: array[int], capacity: int, released: list[int]) -> None:
        """The table grew (`KeyIds.register`): its new counts, room for `capacity` ids."""
        self._refs = refs
        self._released = released
        if len(self._node_of_id) < capacity:
            self._node_of_id = grown_ids(self._node_of_id, capacity, -1)

    def entries(self) -> list[tuple[OffloadKey, BlockStatus]]:
        """T1's and then T2's (key, block), each least recently used first."""
        out: list[tuple[OffloadKey, BlockStatus]] = []
        where: cython.int
        node: cython.int
        for where in range(T1, T2 + 1):
            node = self._head[where]
            while node >= 0:
                out.append((self._key_of(node), self._blocks[node]))
                node = self._next[node]
        return out

    def clear(self) -> None:
        where: cython.int
        for where in range(T1, B2 + 1):
            while self._head[where] >= 0:
                self._drop(self._head[where])
        self._release_announced()
        self._resident.clear()
        self._nres = 0
        self._incoming_adapted = False
        self._insert_room = 0
        self._p = 0.0

    # -- nodes and lists -----------------------------------------------------------------

    @cython.cfunc
    def _grow(self, count: cython.int) -> cython.int:
        """Add `count` free nodes."""
        old: cython.int = self._allocated
        new: cython.int = old + count
        i: cython.int
        self._prev = grown_ids(self._prev, new, -1)
        self._next = grown_ids(self._next, new, -1)
        self._where = grown_ids(self._where, new, NOWHERE)
        self._incoming = grown_ids(self._incoming, new, 0)
        self._gone = grown_ids(self._gone, new, 0)
        self._marked = grown_ids(self._marked, new, 0)
        self._popped = grown_ids(self._popped, new, 0)
        # each list extended once: appends one by one reallocated (copied) them every
        # eighth of their length (docs/BENCHMARKS.md, "Policy cost, seventh round")
        self._keys.extend([_NO_KEY] * count)
        self._blocks.extend([_NO_BLOCK] * count)
        self._ids.extend(range(old, new))
        for i in range(old, new):  # chained onto the free list, lowest first
            self._next[i] = i + 1 if i + 1 < new else self._free
        self._free = old
        self._allocated = new
        return 0

    @cython.cfunc
    @cython.inline
    @cython.exceptval(check=False)
    def _link(self, node: cython.int, where: cython.int) -> cython.void:
        """Append `node` at the most recently used end of list `where`."""
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
    @cython.inline
    @cython.exceptval(check=False)
    def _move(self, node: cython.int, where: cython.int) -> cython.void:
        """Move `node` to the most recently used end of list `where`."""
        self._unlink(node)
        self._link(node, where)

    @cython.cfunc
    def _new_node(self, key: OffloadKey) -> cython.int:
        """A free node registered for `key` (which has none; on no list, NOWHERE)."""
        if self._free < 0:
            self._grow(self._allocated)
        node: cython.int = self._free
        ident: cython.Py_ssize_t
        self._free = self._next[node]
        self._keys[node] = key
        if self._by_id:
            ident = key  # type: ignore[assignment]
            self._node_of_id[ident] = node
            self._refs[ident] += 1
        else:
            self._node[key] = self._ids[node]
        return node

    @cython.cfunc
    def _node_of(self, key: OffloadKey) -> cython.int:
        """The node of `key`, or a free node registered for it (`_created` then says so; it
        is on no list, NOWHERE): one dict operation."""
        if self._free < 0:
            self._grow(self._allocated)
        node: cython.int = self._free
        if self._by_id:
            node = self._find(key)
            self._created = node < 0
            if self._created:
                node = self._new_node(key)
            return node
        ident = self._ids[node]
        found = self._node.setdefault(key, ident)
        self._created = found is ident
        if self._created:
            self._free = self._next[node]
            self._keys[node] = key
            return node
        return found

    @cython.cfunc
    @cython.inline
    def _find(self, key: OffloadKey) -> cython.int:
        """The node of `key` (on any list, or PENDING), or -1."""
        ident: cython.Py_ssize_t
        if self._by_id:
            ident = key  # type: ignore[assignment]
            return self._node_of_id[ident]  # type: ignore[no-any-return]
        node = self._node.get(key)
        if node is None:
            return -1
        return node

    @cython.cfunc
    @cython.inline
    def _resident_count(self) -> cython.Py_ssize_t:
        """The blocks resident (T1's and T2's)."""
        if self._by_id:
            return self._nres
        return len(self._resident)

    @cython.cfunc
    @cython.inline
    def _add_resident(self, key: OffloadKey, block: BlockStatus) -> cython.int:
        """`key` became resident with `block` (the dict's entry, or the count on ids)."""
        if self._by_id:
            self._nres += 1
        else:
            self._resident[key] = block
        return 0

    @cython.cfunc
    @cython.inline
    def _ref_cnt(self, node: cython.int) -> cython.int:
        """The reference count of a resident node's block: the one `access` or `store` read
        once if it is that call's block (a shadow's blocks all are; nothing a call runs
        writes a count), else read from the block (a ctypes field: about 200 instructions,
        5 % of `auto`'s, docs/BENCHMARKS.md, "Policy cost, seventh round")."""
        block = self._blocks[node]
        if block is self._known:
            return self._known_ref
        count: cython.int = block.ref_cnt
        return count

    @cython.cfunc
    def _join_t1(self, node: cython.int, block: BlockStatus) -> cython.int:
        """`node` (on no list: new or announced) joins T1 with `block`, out of the
        announced keys."""
        self._incoming[node] = 0
        self._blocks[node] = block
        self._link(node, T1)
        return 0

    @cython.cfunc
    def _free_node(self, node: cython.int) -> cython.int:
        """Forget `node`'s key (off every list already) and put it on the free list."""
        ident: cython.Py_ssize_t
        if self._by_id:
            ident = self._keys[node]  # type: ignore[assignment]
            self._node_of_id[ident] = -1
            self._refs[ident] -= 1
            if self._refs[ident] == 0:
                self._released.append(self._keys[node])  # type: ignore[arg-type]
        else:
            del self._node[self._keys[node]]
        self._keys[node] = _NO_KEY
        self._blocks[node] = _NO_BLOCK
        self._where[node] = NOWHERE
        self._next[node] = self._free
        self._free = node
        return 0

    @cython.cfunc
    def _drop(self, node: cython.int) -> cython.int:
        """Take `node` off its list and forget its key; an announced key keeps its node, on
        no list (PENDING), as it stays announced."""
        self._unlink(node)
        if self._incoming[node]:
            self._blocks[node] = _NO_BLOCK
            self._where[node] = PENDING
            return 0
        return self._free_node(node)

    @cython.cfunc
    def _release_announced(self) -> cython.int:
        """Forget the announced keys: each flag cleared, each node on no list freed."""
        i: cython.Py_ssize_t
        node: cython.int
        for i in range(self._nann):
            node = self._ann[i]
            if self._incoming[node]:
                self._incoming[node] = 0
                if self._where[node] == PENDING:
                    self._free_node(node)
        self._nann = self._ann_pos = 0
        return 0

    @cython.cfunc
    def _bound_ghosts(self) -> cython.int:
        """Trim the ghost lists to |T1|+|B1| <= c and |L1|+|L2| <= 2c, oldest first (a no-op
        while the paper's invariants hold)."""
        c: cython.Py_ssize_t = self._capacity
        while self._size[B1] and self._size[T1] + self._size[B1] > c:
            self._drop(self._head[B1])
        while (self._size[B1] or self._size[B2]) and (
            self._size[T1] + self._size[T2] + self._size[B1] + self._size[B2] > 2 * c
        ):
            self._drop(self._head[B2] if self._size[B2] else self._head[B1])
        return 0

    # -- the calls of a tier -------------------------------------------------------------

    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        """`key` (new, announced or a ghost) becomes resident with `block`."""
        self._insert(key, block)

    @cython.cfunc
    def _insert(self, key: OffloadKey, block: BlockStatus) -> cython.int:
        """`insert`'s steps."""
        node: cython.int = self._announced_node(key)
        where: cython.int = self._where[node]
        if where in (B1, B2):
            self.insert_many((key,), (block,))
            return 0
        if where in (T1, T2):
            raise BlockStateError(f"arc: key {key!r} is already resident")
        self._new_resident(key, node, block)
        return 0

    @cython.cfunc
    def _new_resident(self, key: OffloadKey, node: cython.int, block: BlockStatus) -> cython.int:
        """`key` (`node`, on no list) joins T1 with `block`; the ghost bound is applied once
        the joins `_make_insert_room` counted are used up."""
        self._join_t1(node, block)
        self._add_resident(key, block)
        if self._insert_room:
            self._insert_room -= 1
        else:
            self._make_insert_room()
        return 0

    @cython.cfunc
    def _announced_node(self, key: OffloadKey) -> cython.int:
        """The node of `key`: at hand when it is the next key announced (as a tier inserts
        them), else `_node_of`'s."""
        node: cython.int
        if self._ann_pos < self._nann:
            node = self._ann[self._ann_pos]
            if self._keys[node] is key:
                self._ann_pos += 1
                return node
        return self._node_of(key)

    @cython.cfunc
    def _make_insert_room(self) -> cython.int:
        """After a new key joined T1: apply the ghost bound if it trips, then count how many
        more new keys can join T1 before it could trip again (each adds one to |T1| and to
        |T1|+|T2|; the ghost counts stay)."""
        c: cython.Py_ssize_t = self._capacity
        b1n: cython.Py_ssize_t = self._size[B1]
        b2n: cython.Py_ssize_t = self._size[B2]
        rn: cython.Py_ssize_t = self._resident_count()
        if (b1n and self._size[T1] + b1n > c) or (rn + b1n + b2n > 2 * c and (b1n or b2n)):
            self._bound_ghosts()
            b1n, b2n = self._size[B1], self._size[B2]
        by_l1: cython.Py_ssize_t = c - self._size[T1] - b1n if b1n else c
        by_all: cython.Py_ssize_t = 2 * c - rn - b1n - b2n if (b1n or b2n) else c
        self._insert_room = min(by_l1, by_all)
        return 0

    def insert_many(self, keys: Sequence[OffloadKey], blocks: Sequence[BlockStatus]) -> None:
        """The keys (distinct, none resident: the caller checked) become resident with the
        blocks, in order, as `insert` would make each."""
        self._insert_room = 0
        if self._no_ghost_and_no_bound(keys):
            for key, block in zip(keys, blocks, strict=True):
                self._join_t1(self._node_of(key), block)
                self._add_resident(key, block)
            return
        for key, block in zip(keys, blocks, strict=True):
            self._insert_one(key, block)

    @cython.cfunc
    def _no_ghost_and_no_bound(self, keys: Sequence[OffloadKey]) -> cython.bint:
        """Whether `keys` are all new (no ghost) and never trip the ghost bound (only |T1|
        grows, so the last key is the first that could): a tier's usual batch, which
        changes nothing but T1."""
        c: cython.Py_ssize_t = self._capacity
        m: cython.Py_ssize_t = len(keys)
        t1n: cython.Py_ssize_t = self._size[T1]
        t2n: cython.Py_ssize_t = self._size[T2]
        b1n: cython.Py_ssize_t = self._size[B1]
        b2n: cython.Py_ssize_t = self._size[B2]
        node: cython.int
        if (b1n and t1n + m + b1n > c) or ((b1n or b2n) and t1n + m + t2n + b1n + b2n > 2 * c):
            return False
        for key in keys:
            node = self._find(key)
            if node >= 0 and (self._where[node] == B1 or self._where[node] == B2):
                return False
        return True

    @cython.cfunc
    def _insert_one(self, key: OffloadKey, block: BlockStatus) -> cython.int:
        """One key of a batch: a ghost hit adapts p (unless `evict` did for this announced
        key: cases II and III) and joins T2; a new key joins T1; then the ghost bound."""
        node: cython.int = self._find(key)
        c: cython.Py_ssize_t = self._capacity
        b1n: cython.Py_ssize_t = self._size[B1]
        b2n: cython.Py_ssize_t = self._size[B2]
        if node < 0 or (self._where[node] != B1 and self._where[node] != B2):
            self._join_t1(self._node_of(key), block)
        else:
            if not (self._incoming[node] and self._incoming_adapted):
                if self._where[node] == B1:  # case II: a B1 ghost hit grows T1's target
                    self._p = min(self._p + (1.0 if b1n >= b2n else b2n / b1n), float(c))
                else:  # case III: a B2 ghost hit shrinks it
                    self._p = max(self._p - (1.0 if b2n >= b1n else b1n / b2n), 0.0)
            self._incoming[node] = 0
            self._move(node, T2)
            self._blocks[node] = block
        self._add_resident(key, block)
        self._bound_ghosts()
        return 0

    def remove(self, key: OffloadKey) -> None:
        """Forget resident `key` (a failed store) without remembering it as a ghost."""
        if self._resident.pop(key, None) is None:
            raise BlockStateError(f"arc: key {key!r} is not resident")
        self._drop(self._find(key))  # resident: never an announced key

    def touch(self, keys: Sequence[OffloadKey]) -> None:
        """Hits, oldest last: a T2 block becomes T2's newest; a ready T1 block moves to T2
        (case I, its second access), a T1 block still being written stays in T1."""
        node: cython.int
        i: cython.Py_ssize_t
        for i in range(len(keys) - 1, -1, -1):
            node = self._find(keys[i])
            if node >= 0:
                self._touch_node(node)

    @cython.cfunc
    def _touch_node(self, node: cython.int) -> cython.bint:
        """A hit on `node` if it is resident (T1 or T2); whether it was."""
        where: cython.int = self._where[node]
        if where == T2:
            if self._tail[T2] != node:
                self._move(node, T2)
        elif where == T1:
            if self._ref_cnt(node) >= 0:
                self._move(node, T2)
            elif self._tail[T1] != node:
                self._move(node, T1)
        else:
            return False
        return True

    def access(self, keys: Sequence[OffloadKey], block: BlockStatus) -> int:
        """Accesses of `keys`, last first, as `simulate` makes them one by one (each the
        policy's `touch`, or `on_store_miss`, `evict(1)` when full and `insert` with
        `block`; not stored when no block can be evicted): what `auto` drives a shadow with,
        one call per request. Returns the hits.

        A miss takes the steps of those calls with nothing of theirs that a lone key does
        not need: its node is the one the look-up found (a ghost's) or a new one, announced
        alone; the eviction's plan is `evict`'s, applied without a list of victims; with a
        free slot the key joins T1 (new) or T2 (a ghost, p adapted) at once."""
        hits: cython.Py_ssize_t = 0
        i: cython.Py_ssize_t
        node: cython.int
        if len(self._ann) < 1:
            self._ann = _filled(1, 0)
        self._known_ref = block.ref_cnt
        self._known = block
        try:
            for i in range(len(keys) - 1, -1, -1):
                key = keys[i]
                node = self._find(key)
                if node >= 0 and self._touch_node(node):
                    hits += 1
                    continue
                self._miss(key, node, block)
        finally:
            self._known = None
        return hits

    def store(self, keys: Sequence[OffloadKey], block: BlockStatus) -> None:
        """Each of `keys` not resident, last first, stored with `block` as a miss of
        `access` stores it (what `auto`'s `on_store_move` does to a shadow: announced, one
        eviction when full, inserted): no hit, nothing touched."""
        i: cython.Py_ssize_t
        node: cython.int
        if len(self._ann) < 1:
            self._ann = _filled(1, 0)
        self._known_ref = block.ref_cnt
        self._known = block
        try:
            for i in range(len(keys) - 1, -1, -1):
                key = keys[i]
                node = self._find(key)
                if node < 0 or (self._where[node] != T1 and self._where[node] != T2):
                    self._miss(key, node, block)
        finally:
            self._known = None

    @cython.cfunc
    def _miss(self, key: OffloadKey, node: cython.int, block: BlockStatus) -> cython.int:
        """A miss of `access` on `key` (`node`: its node, or -1; `_ann` has room): see
        `access`."""
        if self._nann:
            self._release_announced()
            if node >= 0 and self._where[node] == NOWHERE:
                node = -1  # an announced key's node, freed with the announcement
        self._incoming_adapted = False
        if self._resident_count() < self._capacity:
            self._join_free(key, node, block)
            return 0
        if node < 0:
            node = self._new_node(key)
            self._where[node] = PENDING
            if self._steady_miss(key, node, block):
                return 0
        self._incoming[node] = 1
        self._ann[0] = node
        self._nann = 1
        if self._evict(1, (), None):
            self._insert(key, block)
        return 0

    @cython.cfunc
    def _steady_miss(self, key: OffloadKey, node: cython.int, block: BlockStatus) -> cython.bint:
        """A miss of new `key` (`node`: its new node, PENDING) on the steady path, when
        `_is_steady` holds for the lists as they are and T1 has a block that may be
        evicted: what `_evict(1)` and `_insert` would do (T1's first evictable block to the
        MRU end of B1, B1's oldest ghost deleted, the key joining T1; p, the announcement
        and every flag left as they would be), without planning it. False, nothing
        changed, when it does not hold (the general path then runs). Most misses of a
        shadow at a small capacity take it, and the plan and its application were most of
        their cost (docs/BENCHMARKS.md, "Policy cost, fourteenth round")."""
        t1n: cython.Py_ssize_t = self._size[T1]
        b1n: cython.Py_ssize_t = self._size[B1]
        c: cython.Py_ssize_t = self._capacity
        if not (b1n > 0 and self._p < t1n and t1n < c and c <= t1n + b1n):
            return False
        victim: cython.int = self._head[T1]
        while victim >= 0 and self._ref_cnt(victim) != 0:
            victim = self._next[victim]
        if victim < 0:
            return False
        ghost: cython.int = self._head[B1]
        # `_apply`: the victim to B1, then the ghost deleted (the plan's counts, p as was)
        if self._by_id:
            self._nres -= 1
        else:
            del self._resident[self._keys[victim]]
        self._move(victim, B1)
        self._blocks[victim] = _NO_BLOCK
        self._drop(ghost)
        self._incoming_adapted = True
        self._insert_room = 0
        self._bound_ghosts()
        # `_insert`: the key joins T1, announced and at hand as `_announced_node` finds it
        self._ann[0] = node
        self._nann = 1
        self._ann_pos = 1
        self._steady = True
        self._new_resident(key, node, block)
        return True

    @cython.cfunc
    def _join_free(self, key: OffloadKey, node: cython.int, block: BlockStatus) -> cython.int:
        """A miss on `key` (`node`: its ghost's, or -1) that a free slot serves, as
        `on_store_miss((key,))` then `insert(key, block)` would: a ghost adapts p (case II
        or III) and joins T2, then the ghost bound; a new key joins T1."""
        c: cython.Py_ssize_t = self._capacity
        b1n: cython.Py_ssize_t = self._size[B1]
        b2n: cython.Py_ssize_t = self._size[B2]
        if node >= 0:
            if self._where[node] == B1:  # case II: a B1 ghost hit grows T1's target
                self._p = min(self._p + (1.0 if b1n >= b2n else b2n / b1n), float(c))
            else:  # case III: a B2 ghost hit shrinks it
                self._p = max(self._p - (1.0 if b2n >= b1n else b1n / b2n), 0.0)
            self._move(node, T2)
            self._blocks[node] = block
            self._add_resident(key, block)
            self._insert_room = 0
            self._bound_ghosts()
            return 0
        self._new_resident(key, self._new_node(key), block)
        return 0

    def on_store_miss(self, keys: Sequence[OffloadKey]) -> None:
        """The keys that are not resident become the announced ones, in order and each
        once. Each is one dict operation: its node if it has one (a ghost's), else a new
        PENDING node registered for it."""
        for key in keys:
            hash(key)  # an unhashable key fails here, before anything changed
        self._release_announced()
        if len(keys) > len(self._ann):
            self._ann = _filled(len(keys), 0)
        for key in keys:
            self._announce(key)
        self._incoming_adapted = False

    @cython.cfunc
    def _announce(self, key: OffloadKey) -> cython.int:
        """Announce `key` unless it is resident or announced already (`_ann` has room)."""
        node: cython.int = self._node_of(key)
        where: cython.int = self._where[node]
        if self._created:
            self._where[node] = PENDING
        elif where in (T1, T2) or self._incoming[node]:
            return 0  # resident, or announced already
        self._incoming[node] = 1
        self._ann[self._nann] = node
        self._nann += 1
        return 0

    # -- evict: a plan, then the plan applied ----------------------------------------------

    def evict(
        self, n: cython.Py_ssize_t, protected: Collection[OffloadKey]
    ) -> list[tuple[OffloadKey, BlockStatus]] | None:
        """n >= 1 victims, or None changing nothing when n blocks cannot be evicted.

        Serves the announced keys in order as single requests, as the paper does: those
        before the last n fill free slots (only p adapts), each of the last n pays for one
        eviction (when fewer keys were announced, plain misses lead them). List sizes are
        tracked as the sequential algorithm would see them."""
        victims: list[tuple[OffloadKey, BlockStatus]] = []
        if self._evict(n, protected, victims):
            return victims
        return None

    @cython.cfunc
    def _evict(
        self,
        n: cython.Py_ssize_t,
        protected: Collection[OffloadKey],
        victims: list[tuple[OffloadKey, BlockStatus]] | None,
    ) -> cython.bint:
        """`evict`'s steps: whether the n victims were found (appended to `victims` unless
        None) and evicted."""
        i: cython.Py_ssize_t
        if n > self._plan_room:
            self._victims = _filled(n, 0)
            self._ops = _filled(n, 0)
            self._plan_room = n
        self._nplan = self._nmarked = self._npopped = 0
        try:
            if self._plan(n, protected):
                self._apply(victims)
                return True
            return False
        finally:
            for i in range(self._nmarked):
                self._gone[self._marked[i]] = 0
            self._nmarked = 0

    @cython.cfunc
    def _plan(self, n: cython.Py_ssize_t, protected: Collection[OffloadKey]) -> cython.bint:
        """Plan n evictions; False when n blocks cannot be evicted."""
        k: cython.Py_ssize_t = self._compact_announced()
        free_slots: cython.Py_ssize_t = k - n if k >= n else 0
        i: cython.Py_ssize_t
        self._start_plan()
        for i in range(free_slots):
            self._serve_free_slot(self._ann[i])
        self._steady = self._is_steady()
        # The n paying requests: `_ann[paying]` from free_slots on, led by n - k plain misses
        # (-1) when fewer than n keys were announced.
        paying: cython.Py_ssize_t = k - n
        node: cython.int
        while paying < k:
            node = self._ann[paying] if paying >= free_slots else -1
            if not self._serve_paying(node, protected):
                return False
            paying += 1
        return True

    @cython.cfunc
    def _compact_announced(self) -> cython.Py_ssize_t:
        """Leave in `_ann` only the keys still announced (in order) and return how many."""
        i: cython.Py_ssize_t
        k: cython.Py_ssize_t = 0
        node: cython.int
        for i in range(self._nann):
            node = self._ann[i]
            if self._incoming[node]:
                self._ann[k] = node
                k += 1
        self._nann = k
        self._ann_pos = 0
        return k

    @cython.cfunc
    def _start_plan(self) -> cython.int:
        """The plan's counts, p and cursors: the lists as they are."""
        where: cython.int
        for where in range(T1, B2 + 1):
            self._count[where] = self._size[where]
            self._cursor[where] = self._head[where]
        self._planned_p = self._p
        return 0

    @cython.cfunc
    def _is_steady(self) -> cython.bint:
        """Whether a new key now takes case IV.A with |T1| < c and |B1| > 0 (delete B1's
        LRU) and REPLACE from T1 (|T1| > p): it evicts T1's next block to B1 and joins T1,
        leaving every count and p as they were, so the next new key takes the same path."""
        t1n: cython.Py_ssize_t = self._count[T1]
        b1n: cython.Py_ssize_t = self._count[B1]
        c: cython.Py_ssize_t = self._capacity
        return b1n > 0 and self._planned_p < t1n and t1n < c and c <= t1n + b1n

    @cython.cfunc
    def _origin(self, node: cython.int) -> cython.int:
        """Where the planned request for `node` (-1: a key no announcement named) comes
        from. A ghost this plan already deleted, or one of a ghost list the plan emptied,
        is a new key: sequentially, it was deleted before its request came."""
        if node < 0 or self._gone[node]:
            return NEW
        if self._count[B1] > 0 and self._where[node] == B1:
            return FROM_B1
        if self._count[B2] > 0 and self._where[node] == B2:
            return FROM_B2
        return NEW

    @cython.cfunc
    def _adapt(self, node: cython.int, origin: cython.int) -> cython.int:
        """A ghost hit: p grows (case II, from B1) or shrinks (case III, from B2), and the
        ghost leaves its list (marked gone for the rest of the plan)."""
        b1n: cython.Py_ssize_t = self._count[B1]
        b2n: cython.Py_ssize_t = self._count[B2]
        c: cython.Py_ssize_t = self._capacity
        if origin == FROM_B1:
            self._planned_p = min(self._planned_p + (1.0 if b1n >= b2n else b2n / b1n), float(c))
        else:
            self._planned_p = max(self._planned_p - (1.0 if b2n >= b1n else b1n / b2n), 0.0)
        self._mark(node)
        return 0

    @cython.cfunc
    def _join_planned(self, origin: cython.int, is_key: cython.bint) -> cython.int:
        """The requested key joins T2 (a ghost hit) or T1 (a new key; a plain miss, no key,
        joins nothing), then the ghost bound as the step-by-step order applies it."""
        if origin == FROM_B1:
            self._count[T2] += 1
            self._count[B1] -= 1
        elif origin == FROM_B2:
            self._count[T2] += 1
            self._count[B2] -= 1
        elif is_key:
            self._count[T1] += 1
        self._trim()
        return 0

    @cython.cfunc
    def _serve_free_slot(self, node: cython.int) -> cython.int:
        """An announced key that a free slot serves: only p and the counts change."""
        origin: cython.int = self._origin(node)
        if origin != NEW:
            self._adapt(node, origin)
        self._join_planned(origin, True)
        return 0

    @cython.cfunc
    def _serve_paying(self, node: cython.int, protected: Collection[OffloadKey]) -> cython.bint:
        """A request (`node`, or -1: a plain miss) that pays for one eviction; False when
        no block can be evicted."""
        origin: cython.int = self._origin(node)
        if self._steady and node >= 0 and origin == NEW and self._steady_step(protected):
            return True
        if origin != NEW:
            self._adapt(node, origin)
        else:
            case = self._case_iv(node >= 0, protected)
            if case != TO_REPLACE:
                return case == SERVED
        if not self._replace(origin, protected):
            return False
        self._join_planned(origin, node >= 0)
        self._steady = self._is_steady()
        return True

    @cython.cfunc
    def _steady_step(self, protected: Collection[OffloadKey]) -> cython.bint:
        """A new key on the steady path (`_is_steady`): T1's next evictable block to B1 and
        B1's oldest ghost deleted; False (nothing planned) when T1 has no evictable block
        left, the general path then takes T2's."""
        victim: cython.int = self._next_evictable(T1, protected)
        if victim < 0:
            return False
        self._plan_victim(victim, EVICT_T1)
        self._pop_oldest(B1)
        return True

    @cython.cfunc
    def _case_iv(self, is_key: cython.bint, protected: Collection[OffloadKey]) -> cython.int:
        """Case IV, a new key: L1 full (IV.A) deletes B1's oldest ghost, or T1's LRU block
        when |T1| = c (the request is then served); the directory full (IV.B) deletes B2's."""
        c: cython.Py_ssize_t = self._capacity
        t1n: cython.Py_ssize_t = self._count[T1]
        b1n: cython.Py_ssize_t = self._count[B1]
        b2n: cython.Py_ssize_t = self._count[B2]
        if t1n + b1n >= c:
            if t1n >= c:
                return self._drop_from_full_t1(is_key, protected)
            if b1n > 0:
                self._pop_oldest(B1)
                self._count[B1] -= 1
        elif t1n + self._count[T2] + b1n + b2n >= 2 * c and b2n > 0:
            self._pop_oldest(B2)
            self._count[B2] -= 1
        return TO_REPLACE

    @cython.cfunc
    def _drop_from_full_t1(
        self, is_key: cython.bint, protected: Collection[OffloadKey]
    ) -> cython.int:
        """Case IV.A with |T1| = c: T1's LRU block is deleted unremembered; when T1's
        blocks are all pinned, REPLACE takes T2's instead."""
        victim: cython.int = self._next_evictable(T1, protected)
        if victim >= 0:
            self._plan_victim(victim, DROP_T1)
            self._count[T1] -= 1
        else:
            victim = self._next_evictable(T2, protected)
            if victim < 0:
                return STUCK
            self._plan_victim(victim, EVICT_T2)
            self._count[T2] -= 1
            self._count[B2] += 1
        if is_key:
            self._count[T1] += 1
        self._trim()
        self._steady = self._is_steady()
        return SERVED

    @cython.cfunc
    def _replace(self, origin: cython.int, protected: Collection[OffloadKey]) -> cython.bint:
        """REPLACE(x, p): T1's next evictable block to B1 while |T1| exceeds p (or equals
        it for a B2 hit), else T2's to B2; the other list's when the one chosen has none.
        False when neither has."""
        t1n: cython.Py_ssize_t = self._count[T1]
        p: cython.double = self._planned_p
        source: cython.int = T1 if t1n > 0 and (t1n > p or (origin == FROM_B2 and t1n == p)) else T2
        victim: cython.int = self._next_evictable(source, protected)
        if victim < 0:
            source = T2 if source == T1 else T1
            victim = self._next_evictable(source, protected)
            if victim < 0:
                return False
        if source == T1:
            self._plan_victim(victim, EVICT_T1)
            self._count[T1] -= 1
            self._count[B1] += 1
        else:
            self._plan_victim(victim, EVICT_T2)
            self._count[T2] -= 1
            self._count[B2] += 1
        return True

    @cython.cfunc
    def _next_evictable(self, where: cython.int, protected: Collection[OffloadKey]) -> cython.int:
        """Advance list `where`'s cursor past the next block that may be evicted (not
        pinned, not pending, not protected) and return its node (-1: none)."""
        node: cython.int = self._cursor[where]
        while node >= 0:
            self._cursor[where] = self._next[node]
            if self._ref_cnt(node) == 0 and self._keys[node] not in protected:
                return node
            node = self._cursor[where]
        return -1

    @cython.cfunc
    @cython.exceptval(check=False)
    def _mark(self, node: cython.int) -> cython.void:
        """Mark `node` gone for this plan (a ghost hit, or a ghost the plan deletes)."""
        self._gone[node] = 1
        self._marked[self._nmarked] = node
        self._nmarked += 1

    @cython.cfunc
    @cython.exceptval(check=False)
    def _pop_oldest(self, where: cython.int) -> cython.void:
        """Delete (in the plan) ghost list `where`'s oldest ghost not gone yet."""
        node: cython.int = self._cursor[where]
        while node >= 0:
            self._cursor[where] = self._next[node]
            if not self._gone[node]:
                self._mark(node)
                self._popped[self._npopped] = node
                self._npopped += 1
                return
            node = self._cursor[where]

    @cython.cfunc
    @cython.exceptval(check=False)
    def _plan_victim(self, node: cython.int, op: cython.int) -> cython.void:
        self._victims[self._nplan] = node
        self._ops[self._nplan] = op
        self._nplan += 1

    @cython.cfunc
    def _trim(self) -> cython.int:
        """`_bound_ghosts` on the plan's counts, as the step-by-step order applies it after
        a request."""
        c: cython.Py_ssize_t = self._capacity
        while self._count[B1] and self._count[T1] + self._count[B1] > c:
            self._pop_oldest(B1)
            self._count[B1] -= 1
        while (self._count[B1] or self._count[B2]) and (
            self._count[T1] + self._count[T2] + self._count[B1] + self._count[B2] > 2 * c
        ):
            if self._count[B2]:
                self._pop_oldest(B2)
                self._count[B2] -= 1
            else:
                self._pop_oldest(B1)
                self._count[B1] -= 1
        return 0

    @cython.cfunc
    def _apply(self, out: list[tuple[OffloadKey, BlockStatus]] | None) -> cython.int:
        """Apply the plan: the victims in order (appended to `out` unless None) to the MRU
        end of B1 or B2 (or dropped), then the ghosts it deleted; p as planned."""
        i: cython.Py_ssize_t
        node: cython.int
        op: cython.int
        for i in range(self._nplan):
            node = self._victims[i]
            op = self._ops[i]
            key = self._keys[node]
            if out is not None:
                out.append((key, self._blocks[node]))
            if self._by_id:
                self._nres -= 1
            else:
                del self._resident[key]
            if op == DROP_T1:
                self._drop(node)
            else:
                self._move(node, B1 if op == EVICT_T1 else B2)
                self._blocks[node] = _NO_BLOCK
        for i in range(self._npopped):
            self._drop(self._popped[i])
        self._p = self._planned_p
        self._incoming_adapted = True
        self._insert_room = 0
        self._bound_ghosts()
        return 0
