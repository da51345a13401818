# cython: annotation_typing=True, boundscheck=False, wraparound=False, initializedcheck=False
"""S3-FIFO's state and steps, `S3FIFOQueues`: the one source of the algorithm that
`kvtier.policies.s3fifo.S3FIFOCachePolicy` runs, compiled or as plain Python.

The algorithm and its departures for a tier are s3fifo.py's docstring. Every key the queues
hold (resident in S or M, or a ghost in G) has a node, an int: one dict maps the key to its
node, and S, M and G are intrusive doubly linked FIFO lists over int arrays of node numbers
(oldest at the head), beside each node's 2-bit counter, its key and its block in arrays and
lists. A hit is one dict look-up and a counter raised; a miss is its look-up, the eviction's
relinks (a block moved from S to M or reinserted in M is two relinks, no dict operation),
the victim's delete from the resident dict, and the new key's two dict writes (its block,
its node; a ghost's node is reused as it comes back to M). The resident blocks are a dict of
their own besides, which `S3FIFOCachePolicy.get` reads with no Python frame. Every step is
O(1) amortized (a block in M is reinserted at most 3 times per hit it had). `access` is a
whole request's accesses of a shadow at once (`auto` drives its shadows so): per key, what
`simulate` does with one access, with no Python call per key when compiled.

(Before issue 34's third round S, M and G were ordered dicts of keys and the counters a
dict: a miss cost about a dozen dict operations; docs/BENCHMARKS.md, "Policy cost, third
round", has the figures.)

A shadow of `auto` runs on ids (`use_ids`: `kvtier.policies._key_ids`): a key is then its
int id in the table `auto` shares among its shadows, each id's node is in an int array
indexed by the id (no `_node` dict), the resident blocks are counted (no `_blocks` dict),
and a node made or freed counts its id up or down in the table; `access` and `store` take
ids, the inspection (`keys_of`, `frequency`, `get`, `entries`) reads keys through the
table, and `use_keys` goes back. The steps are the same text either way: only `_find`,
`_new_node`, `_free_node` and the resident count look at the mode.

Written in Cython's pure Python mode, as `_arc_core.py` is: `scripts/build-core` compiles
this file with its annotations as C types (the class an extension type, its counts C
integers, its arrays typed memoryviews, its `@cython.cfunc` methods C functions); without a
build it runs as the Python it is (`cython` is Cython's shadow module, or `_cython_shim`).
Both take the same decisions (`tests/test_compiled_s3fifo.py` runs this file's text both
ways in one process and compares every answer and state). mypy cannot read a typed
memoryview or a C array: they are declared with `cython.declare`, each with a `type:
ignore`, and are `Any` to mypy (as in `_arc_core.py`).
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

MAX_FREQ = cython.declare(cython.int, 3)
"""The counter's ceiling: two bits."""

# The queue a node is on (`_where`), indexes of `_head`, `_tail` and `_size`.
SMALL = cython.declare(cython.int, 0)
MAIN = cython.declare(cython.int, 1)
GHOST = cython.declare(cython.int, 2)
NOWHERE = cython.declare(cython.int, 3)  # a free node

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
class S3FIFOQueues:
    """S3-FIFO's state (S, M, G, the blocks and their counters) and steps, each one of
    `S3FIFOCachePolicy`'s calls once the policy has checked its arguments."""

    _capacity: cython.Py_ssize_t
    _small_target: cython.Py_ssize_t
    _ghost_capacity: cython.Py_ssize_t
    _move_threshold: cython.int
    _blocks: dict[OffloadKey, BlockStatus]  # the resident blocks (S and M)
    _node: dict[OffloadKey, int]  # every key on a queue (S, M or G) -> its node
    # Per node: the neighbours (-1: none), the queue, the counter, its key, its block
    # (`_NO_BLOCK` on G or free), its number as a Python int (the `_node` dict's values).
    _prev = cython.declare(cython.int[::1])  # type: ignore[misc]
    _next = cython.declare(cython.int[::1])  # type: ignore[misc]
    _where = cython.declare(cython.int[::1])  # type: ignore[misc]
    _freq = cython.declare(cython.int[::1])  # type: ignore[misc]
    _keys: list[OffloadKey]
    _block_of: list[BlockStatus]
    _ids: list[int]
    _allocated: cython.int
    _free: cython.int  # the first free node, chained through `_next` (-1: none)
    # Per queue (S, M, G): its oldest and newest node (-1: empty), its length.
    _head = cython.declare(cython.int[3])  # type: ignore[misc,valid-type]
    _tail = cython.declare(cython.int[3])  # type: ignore[misc,valid-type]
    _size = cython.declare(cython.int[3])  # type: ignore[misc,valid-type]
    # On ids (`use_ids`): a key is its id in `_table` (a `KeyIds`), `_keys` holds the id's
    # int object, `_node_of_id` each id's node (-1: none) instead of the `_node` dict, and
    # `_nres` counts the resident blocks instead of the `_blocks` dict; `_refs` and
    # `_released` are the table's counts and released ids.
    _by_id: cython.bint
    _table: object
    _node_of_id = cython.declare(cython.int[::1])  # type: ignore[misc]
    _refs = cython.declare(cython.int[::1])  # type: ignore[misc]
    _released: list[int]
    _nres: cython.Py_ssize_t
    # During `access` and `store`: the call's block and its count, read once (`_evictable`).
    _known: object
    _known_ref: cython.int

    def __init__(
        self,
        capacity: cython.Py_ssize_t,
        small_target: cython.Py_ssize_t,
        ghost_capacity: cython.Py_ssize_t,
        move_threshold: cython.int,
    ) -> None:
        self._capacity = capacity
        self._small_target = small_target
        self._ghost_capacity = ghost_capacity
        self._move_threshold = move_threshold
        self._blocks = {}
        self._node = {}
        self._keys = []
        self._block_of = []
        self._ids = []
        self._allocated = 0
        self._free = -1
        self._head = [-1, -1, -1]
        self._tail = [-1, -1, -1]
        self._size = [0, 0, 0]
        empty = _filled(0, 0)
        self._prev = self._next = self._where = self._freq = empty
        self._by_id = False
        self._table = None
        self._node_of_id = self._refs = empty
        self._released = []
        self._nres = 0
        self._known = None
        self._known_ref = 0
        most = capacity + max(ghost_capacity, 0) + 1
        self._grow(max(INITIAL_NODES, min(most, MOST_NODES_AT_START)))

    # -- inspection ------------------------------------------------------------------------

    @property
    def small_target(self) -> int:
        """S's share, in blocks: evictions take from S while it holds at least this many."""
        return self._small_target

    @property
    def ghost_capacity(self) -> int:
        return self._ghost_capacity

    @property
    def move_threshold(self) -> int:
        return self._move_threshold

    @property
    def blocks(self) -> dict[OffloadKey, BlockStatus]:
        """The resident blocks by key (unordered): `S3FIFOCachePolicy.get` is its `get`."""
        return self._blocks

    @property
    def small(self) -> list[OffloadKey]:
        """S's keys, oldest first."""
        return self.keys_of(SMALL)

    @property
    def main(self) -> list[OffloadKey]:
        """M's keys, oldest first."""
        return self.keys_of(MAIN)

    @property
    def ghost(self) -> list[OffloadKey]:
        """G's keys, oldest first."""
        return self.keys_of(GHOST)

    def keys_of(self, where: cython.int) -> list[OffloadKey]:
        """The keys of queue `where` (0: S, 1: M, 2: G), oldest first."""
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

    def resident_count(self) -> int:
        """The blocks resident (in S and M)."""
        return self._resident_count()

    @cython.cfunc
    @cython.exceptval(-1)
    @cython.inline
    def _resident_count(self) -> cython.Py_ssize_t:
        if self._by_id:
            return self._nres
        return len(self._blocks)

    def get(self, key: OffloadKey) -> BlockStatus | None:
        """The block of resident `key`, or None (on ids: through the table)."""
        if not self._by_id:
            return self._blocks.get(key)
        ident: cython.Py_ssize_t = self._table.id_of(key)  # type: ignore[attr-defined]
        if ident < 0 or self._node_of_id[ident] < 0:
            return None
        node: cython.int = self._node_of_id[ident]
        if self._where[node] == GHOST:
            return None
        return self._block_of[node]

    def entries(self) -> list[tuple[OffloadKey, BlockStatus]]:
        """The resident (key, block), S's then M's, oldest first."""
        out: list[tuple[OffloadKey, BlockStatus]] = []
        where: cython.int
        node: cython.int
        for where in range(SMALL, MAIN + 1):
            node = self._head[where]
            while node >= 0:
                out.append((self._key_of(node), self._block_of[node]))
                node = self._next[node]
        return out

    @property
    def on_ids(self) -> bool:
        """Whether the queues run on ids (`use_ids`)."""
        return self._by_id

    def use_ids(self, table: object) -> None:
        """Run on ids of `table` (a `KeyIds`) from now on, in the same state: every key
        held is interned and counted, the dicts emptied."""
        if self._by_id:
            return
        self._table = table
        self._node_of_id = _filled(0, 0)
        table.register(self)  # type: ignore[attr-defined]
        where: cython.int
        node: cython.int
        ident: cython.Py_ssize_t
        for where in range(SMALL, GHOST + 1):
            node = self._head[where]
            while node >= 0:
                found = table.intern_one(self._keys[node])  # type: ignore[attr-defined]
                ident = found
                self._keys[node] = found
                self._node_of_id[ident] = node
                self._refs[ident] += 1
                node = self._next[node]
        self._nres = len(self._blocks)
        self._node.clear()
        self._blocks.clear()
        self._by_id = True

    def resize_ids(self, refs: array[int], capacity: int, released: list[int]) -> None:
        """The table grew (`KeyIds.register`): its new counts, room for `capacity` ids."""
        self._refs = refs
        self._released = released
        if len(self._node_of_id) < capacity:
            self._node_of_id = grown_ids(self._node_of_id, capacity, -1)

    def use_keys(self) -> None:
        """Run on keys again, in the same state: every id's key back in the dicts, each id
        released, the table left."""
        if not self._by_id:
            return
        table = self._table
        where: cython.int
        node: cython.int
        ident: cython.Py_ssize_t
        for where in range(SMALL, GHOST + 1):
            node = self._head[where]
            while node >= 0:
                found = self._keys[node]
                ident = found  # type: ignore[assignment]
                key = table.key_of(ident)  # type: ignore[attr-defined]
                self._keys[node] = key
                self._node[key] = self._ids[node]
                if where != GHOST:
                    self._blocks[key] = self._block_of[node]
                self._node_of_id[ident] = -1
                self._refs[ident] -= 1
                if self._refs[ident] == 0:
                    self._released.append(found)  # type: ignore[arg-type]
                node = self._next[node]
        self._nres = 0
        self._by_id = False
        table.unregister(self)  # type: ignore[attr-defined]
        self._table = None

    def frequency(self, key: OffloadKey) -> int:
        """The counter of resident `key` (0 if absent)."""
        node: cython.int
        ident: cython.Py_ssize_t
        if self._by_id:
            ident = self._table.id_of(key)  # type: ignore[attr-defined]
            if ident < 0 or self._node_of_id[ident] < 0:
                return 0
            node = self._node_of_id[ident]
        else:
            found = self._node.get(key)
            if found is None:
                return 0
            node = found
        if self._where[node] == GHOST:
            return 0
        count: cython.int = self._freq[node]
        return count

    # -- nodes and queues ------------------------------------------------------------------

    @cython.cfunc
    @cython.exceptval(-1)
    def _grow(self, count: cython.int) -> cython.int:
        """Add `count` free nodes."""
        old: cython.int = self._allocated
        new: cython.int = old + count
        i: cython.int
        self._prev = grown_ids(self._prev, new, -1)
        self._next = grown_ids(self._next, new, -1)
        self._where = grown_ids(self._where, new, NOWHERE)
        self._freq = grown_ids(self._freq, new, 0)
        # each list extended once (as `_arc_core.ARCLists._grow`)
        self._keys.extend([_NO_KEY] * count)
        self._block_of.extend([_NO_BLOCK] * count)
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
        """Append `node` at the newest end of queue `where`."""
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
        """Take `node` off its queue (it is then NOWHERE)."""
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
    def _requeue(self, node: cython.int, where: cython.int) -> cython.void:
        """Move `node` to the newest end of queue `where`."""
        self._unlink(node)
        self._link(node, where)

    @cython.cfunc
    @cython.exceptval(-1)
    def _new_node(self, key: OffloadKey) -> cython.int:
        """A free node registered for `key` (not on any queue)."""
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
    @cython.exceptval(-1)
    def _free_node(self, node: cython.int) -> cython.int:
        """Forget `node`'s key (off every queue already) and put it on the free list."""
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
        self._block_of[node] = _NO_BLOCK
        self._where[node] = NOWHERE
        self._next[node] = self._free
        self._free = node
        return 0

    @cython.cfunc
    @cython.exceptval(-1, check=True)
    @cython.inline
    def _find(self, key: OffloadKey) -> cython.int:
        """The node of `key` (on S, M or G), or -1."""
        ident: cython.Py_ssize_t
        if self._by_id:
            ident = key  # type: ignore[assignment]
            return self._node_of_id[ident]  # type: ignore[no-any-return]
        node = self._node.get(key)
        if node is None:
            return -1
        return node

    # -- steps -----------------------------------------------------------------------------

    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        node: cython.int = self._find(key)
        if node >= 0 and self._where[node] != GHOST:
            raise BlockStateError(f"s3fifo: key {key!r} is already resident")
        self._insert(key, node, block)

    def insert_many(self, keys: Sequence[OffloadKey], blocks: Sequence[BlockStatus]) -> None:
        """Insert every key (the policy checked the batch)."""
        i: cython.Py_ssize_t
        for i in range(len(keys)):
            key = keys[i]
            self._insert(key, self._find(key), blocks[i])

    @cython.cfunc
    @cython.exceptval(-1)
    def _insert(self, key: OffloadKey, node: cython.int, block: BlockStatus) -> cython.int:
        """`key` (not resident; `node` its ghost's node, or -1) becomes resident with
        `block`: into M when it was a ghost (it comes back), else into S."""
        if self._by_id:
            self._nres += 1
        else:
            self._blocks[key] = block
        if node >= 0:  # a ghost: its node leaves G for M
            self._requeue(node, MAIN)
        else:
            node = self._new_node(key)
            self._link(node, SMALL)
        self._freq[node] = 0
        self._block_of[node] = block
        return 0

    def place(self, key: OffloadKey, block: BlockStatus, to_main: bool, count: int) -> None:
        """Append resident `key` (not held yet) at the newest end of M (`to_main`) or S
        with counter `count`: `S3FIFOCachePolicy.adopted` builds a state so."""
        node: cython.int = self._find(key)
        if node >= 0:
            raise BlockStateError(f"s3fifo: key {key!r} is already held")
        node = self._new_node(key)
        self._link(node, MAIN if to_main else SMALL)
        self._freq[node] = count
        self._block_of[node] = block
        self._blocks[key] = block

    def remember(self, key: OffloadKey) -> None:
        """Append `key` (not held) as G's newest ghost (its oldest falls out when full)."""
        if self._find(key) >= 0:
            raise BlockStateError(f"s3fifo: key {key!r} is already held")
        if self._ghost_capacity <= 0:
            return
        node: cython.int = self._new_node(key)
        self._link(node, GHOST)
        self._trim_ghosts()

    def remove(self, key: OffloadKey) -> None:
        if self._blocks.pop(key, None) is None:
            raise BlockStateError(f"s3fifo: key {key!r} is not resident")
        node: cython.int = self._find(key)
        self._unlink(node)
        self._free_node(node)

    def touch(self, keys: Sequence[OffloadKey]) -> None:
        """Hits: each resident key's counter goes up by one, to `MAX_FREQ` at most."""
        for key in keys:
            self._touch(self._find(key))

    @cython.cfunc
    @cython.exceptval(-1)
    @cython.inline
    def _touch(self, node: cython.int) -> cython.bint:
        """A hit on `node` (-1: none) if resident; whether it was."""
        if node < 0 or self._where[node] == GHOST:
            return False
        if self._freq[node] < MAX_FREQ:
            self._freq[node] += 1
        return True

    def access(self, keys: Sequence[OffloadKey], block: BlockStatus) -> int:
        """Accesses of `keys`, last first, as `simulate` makes them one by one: a hit
        touches the key; a miss stores it with `block`, evicting one block when full (not
        stored when every block is pinned). Returns the hits. (S3-FIFO admits every key and
        ignores announcements; hints are the policy's, which `auto` never gives a shadow.)"""
        hits: cython.Py_ssize_t = 0
        i: cython.Py_ssize_t
        node: cython.int
        self._known_ref = block.ref_cnt
        self._known = block
        try:
            for i in range(len(keys) - 1, -1, -1):
                key = keys[i]
                node = self._find(key)
                if self._touch(node):
                    hits += 1
                    continue
                self._miss(key, node, block)
        finally:
            self._known = None
        return hits

    def store(self, keys: Sequence[OffloadKey], block: BlockStatus) -> None:
        """Each of `keys` not resident, last first, stored with `block` as a miss of
        `access` stores it (what `auto`'s `on_store_move` does to a shadow; S3-FIFO ignores
        the announcement): no hit, nothing touched."""
        i: cython.Py_ssize_t
        node: cython.int
        self._known_ref = block.ref_cnt
        self._known = block
        try:
            for i in range(len(keys) - 1, -1, -1):
                key = keys[i]
                node = self._find(key)
                if node < 0 or self._where[node] == GHOST:
                    self._miss(key, node, block)
        finally:
            self._known = None

    @cython.cfunc
    @cython.exceptval(-1)
    def _miss(self, key: OffloadKey, node: cython.int, block: BlockStatus) -> cython.int:
        """A miss of `access` on `key` (`node`: its ghost's, or -1): stored with `block`
        after one eviction when full (not stored when every block is pinned)."""
        if self._resident_count() >= self._capacity:
            if not self._can_evict(1, ()):
                return 0
            self._evict_one((), None)
            if node >= 0 and self._where[node] == NOWHERE:
                node = -1  # its ghost fell out of G during the eviction
        self._insert(key, node, block)
        return 0

    def evict(
        self, n: cython.Py_ssize_t, protected: Collection[OffloadKey]
    ) -> list[tuple[OffloadKey, BlockStatus]] | None:
        """n >= 1 victims (n at most the resident count), or None changing nothing when n
        blocks cannot be evicted."""
        if n > self._resident_count() or not self._can_evict(n, protected):
            return None
        victims: list[tuple[OffloadKey, BlockStatus]] = []
        done: cython.Py_ssize_t = 0
        while done < n:
            self._evict_one(protected, victims)
            done += 1
        return victims

    @cython.cfunc
    @cython.exceptval(-1)
    def _evictable(self, node: cython.int, protected: Collection[OffloadKey]) -> cython.bint:
        """Whether resident `node`'s block is ready, unpinned and unprotected. Its count is
        the one `access` or `store` read once if it is that call's block (as
        `_arc_core.ARCLists._ref_cnt`)."""
        block = self._block_of[node]
        if block is self._known:
            if self._known_ref != 0:
                return False
        elif block.ref_cnt != 0:
            return False
        return len(protected) == 0 or self._keys[node] not in protected

    @cython.cfunc
    @cython.exceptval(-1)
    def _can_evict(self, n: cython.Py_ssize_t, protected: Collection[OffloadKey]) -> cython.bint:
        """Whether `n` resident blocks are ready, unpinned and unprotected."""
        found: cython.Py_ssize_t = 0
        node: cython.int
        where: cython.int
        for where in range(SMALL, MAIN + 1):
            node = self._head[where]
            while node >= 0:
                if self._evictable(node, protected):
                    found += 1
                    if found == n:
                        return True
                node = self._next[node]
        return False

    @cython.cfunc
    @cython.exceptval(-1)
    def _evict_one(
        self,
        protected: Collection[OffloadKey],
        victims: list[tuple[OffloadKey, BlockStatus]] | None,
    ) -> cython.int:
        """One eviction, the paper's (appended to `victims` unless None); some block is
        evictable (`_can_evict`)."""
        # Blocks put back since the last progress in each queue: a queue all of whose
        # blocks were put back has no evictable one, and the other queue is walked instead.
        stuck_small: cython.Py_ssize_t = 0
        stuck_main: cython.Py_ssize_t = 0
        node: cython.int
        use_small: cython.bint
        while True:
            use_small = self._size[SMALL] > 0 and stuck_small < self._size[SMALL]
            if (
                use_small
                and self._size[SMALL] < self._small_target
                and self._size[MAIN] > 0
                and stuck_main < self._size[MAIN]
            ):
                use_small = False
            if use_small:
                node = self._head[SMALL]
                if not self._evictable(node, protected):
                    self._requeue(node, SMALL)
                    stuck_small += 1
                    continue
                stuck_small = 0
                if self._freq[node] >= self._move_threshold:
                    self._freq[node] = 0
                    self._requeue(node, MAIN)
                    stuck_main = 0  # M has an evictable block again
                    continue
                self._evicted(node, victims)
                if self._ghost_capacity > 0:
                    self._requeue(node, GHOST)
                    self._block_of[node] = _NO_BLOCK
                    self._trim_ghosts()
                else:
                    self._unlink(node)
                    self._free_node(node)
                return 0
            node = self._head[MAIN]
            if not self._evictable(node, protected):
                self._requeue(node, MAIN)
                stuck_main += 1
                continue
            if self._freq[node] > 0:
                self._freq[node] -= 1
                self._requeue(node, MAIN)
                stuck_main = 0
                continue
            self._evicted(node, victims)
            self._unlink(node)
            self._free_node(node)
            return 0

    @cython.cfunc
    @cython.exceptval(-1)
    def _evicted(
        self, node: cython.int, victims: list[tuple[OffloadKey, BlockStatus]] | None
    ) -> cython.int:
        """Resident `node` is evicted: out of the blocks (and into `victims` unless None)."""
        key = self._keys[node]
        if self._by_id:
            self._nres -= 1
        else:
            del self._blocks[key]
        if victims is not None:
            victims.append((key, self._block_of[node]))
        self._freq[node] = 0
        return 0

    @cython.cfunc
    @cython.exceptval(-1)
    def _trim_ghosts(self) -> cython.int:
        """G's oldest ghosts fall out while G holds more than its capacity."""
        node: cython.int
        while self._size[GHOST] > self._ghost_capacity:
            node = self._head[GHOST]
            self._unlink(node)
            self._free_node(node)
        return 0

    def clear(self) -> None:
        where: cython.int
        node: cython.int
        for where in range(SMALL, GHOST + 1):
            while self._head[where] >= 0:
                node = self._head[where]
                self._unlink(node)
                self._free_node(node)
        self._blocks.clear()
        self._nres = 0
