# cython: annotation_typing=True, boundscheck=False, wraparound=False, initializedcheck=False
"""`KeyIds`: the keys `auto`'s shadows (and lct serving) remember, each interned once into a
small int id, so that they share one look-up per access (issue 34's cost target; docs/
BENCHMARKS.md, "Policy cost, fifth round"; lct serving on ids: "ninth round").

Every full-size shadow used to keep its own dict of the same keys (LRU's ordered dict, ARC's
and S3-FIFO's node and resident dicts): an access cost each of them a probe of a large dict,
mostly cache misses. Here one table maps each key to its id (compiled, not a dict: below); a
shadow on ids (LRU's, ARC's and S3-FIFO's cores, `use_ids`) keeps each id's node in an int
array indexed by the id and no dict at all. An id lives while some shadow remembers its key
(resident or ghost): every shadow adds one to the id's count in `refs` when it makes a node
for it and takes one away when it forgets it, appending the id to `released` when the count
falls to 0; `intern` recycles those ids (deletes their keys) before it interns the next
request, so the table holds no more keys than the shadows remember (plus one request's). An
id says nothing about a key but which it is: no decision depends on its value.

An id's int object (the dict's value, which the shadows on ids keep as their key) is made
when the id is given out, not ahead for every id the arrays have room for: making a growth's
ints ahead (and a list of them) wrote them all cold, a large part of what the table's growth
cost when lct serving makes it hold every key lct remembers (docs/BENCHMARKS.md, "Policy
cost, tenth round"). The ids never given out lie past `_used`, on no list.

A shadow reads the count array through its own typed view of it; when the table grows it
makes a new array and hands it to every shadow registered (`register`) with the new size
and the released list (`resize_ids(refs, capacity, released)`), before any id beyond the
old size is given out.

Compiled, the keys are found through a table of its own instead of a dict (`_find`): an
open-addressing array of 8-byte slots, each 31 bits of the key's hash and its id + 1 (0:
empty), linear probing at most half full, a key's slot emptied by shifting the slots after it
back (no tombstone, so no rebuild but the doubling). The dict's deletions and insertions, one
of each per key the shadows forget and meet again, left holes that it compacted by rebuilding
itself (its index and its 24-byte entries) every so many insertions, and each growth rebuilt
both too: a third of `auto`'s last-level misses at 1 % of the shipped trace, a lookup touching
the index, the entry, the key and the id's int object (docs/BENCHMARKS.md, "Policy cost,
fifteenth round"). A look-up here touches a slot (eight to a line), the key list's item and
the key; the id's int object is made as it is returned. As plain Python the dict stays (a
table probed by Python code would be slower); both give the same ids in the same order.

Written in Cython's pure Python mode, as `_arc_core.py` is (compiled by `scripts/
build-core`; plain Python without a build).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kvtier.keys import OffloadKey

if TYPE_CHECKING:  # mypy checks this module against what runs without Cython
    from kvtier.policies import _cython_shim as cython
else:
    try:
        import cython
    except ImportError:  # no Cython: the module runs as the plain Python it is
        from kvtier.policies import _cython_shim as cython

INITIAL_IDS = 64
INITIAL_SLOTS = 128
"""The compiled table's first slots (a power of two; doubled past half full)."""
HASH_BITS = cython.declare(cython.longlong, 0x7FFFFFFF)
"""The bits of a key's hash its slot keeps (the slots are at most 2**31)."""
ID_BITS = cython.declare(cython.longlong, 0xFFFFFFFF)
"""A slot's bits that hold its id + 1 (a C constant: the literal is a Python int)."""

_NO_KEY = OffloadKey(b"")  # the key of a free id: never looked up, never returned


def grown_ids(old: Any, capacity: int, value: int) -> array[int]:
    """A new int array of `capacity` items: `old`'s (an int array, or a typed view of one),
    then copies of `value`; what a user's per-id array becomes when the table grows
    (`resize_ids`), and a core's node array when it adds nodes (ARC's, S3-FIFO's `_grow`).
    Filled once and `old` copied into it once: `bytes(old)`, an array of
    those bytes and the two arrays concatenated wrote the old items three times
    (docs/BENCHMARKS.md, "Policy cost, tenth round")."""
    grown = array("i", [value]) * capacity
    memoryview(grown)[: len(old)] = memoryview(old)
    return grown


@cython.final
@cython.cclass
class KeyIds:
    """Keys interned into ids, each id counted by the shadows that remember its key."""

    _ids: dict[Any, int]  # key -> its id (the int object shadows keep as their key)
    _keys: list[Any]  # id -> its key (`_NO_KEY` while free)
    # Recycled ids (the int objects released), the next one last; ids from `_used` up were
    # never given out and are handed out in order once none is recycled.
    _free: list[int]
    _used: cython.Py_ssize_t
    _refs = cython.declare(cython.int[::1])  # type: ignore[misc]
    # Per id, how many shadows remember its key (the array behind every shadow's view).
    _refs_array: Any
    # Ids whose count fell to 0 (appended by the shadows), and the ids `intern` gave out
    # since the last `intern` (a key no shadow stored is released so too).
    _released: list[int]
    _capacity: cython.Py_ssize_t
    _users: list[Any]
    # Compiled, instead of `_ids` (module doc): the slots, (hash bits << 32) | (id + 1) each
    # (0: empty), their count - 1 (a power of two less one), the keys they hold; and the
    # empty slot where the last `_find` that missed stopped.
    _slots = cython.declare(cython.longlong[::1])  # type: ignore[misc]
    _slots_array: Any
    _mask: cython.Py_ssize_t
    _count: cython.Py_ssize_t
    _hole: cython.Py_ssize_t

    def __init__(self) -> None:
        self._ids = {}
        self._slots_array = array("q", [0]) * INITIAL_SLOTS
        self._slots = self._slots_array
        self._mask = INITIAL_SLOTS - 1
        self._count = 0
        self._hole = -1
        self._keys = []
        self._free = []
        self._used = 0
        self._refs_array = array("i")
        self._refs = self._refs_array
        self._released = []
        self._capacity = 0
        self._users = []
        self._grow()

    @property
    def capacity(self) -> int:
        """How many ids the arrays have room for."""
        return self._capacity

    def __len__(self) -> int:
        """The keys interned now."""
        if cython.compiled:
            return self._count
        return len(self._ids)

    def count(self, ident: cython.Py_ssize_t) -> int:
        """How many shadows remember the key of id `ident`."""
        count: cython.int = self._refs[ident]
        return count

    def register(self, user: Any) -> None:
        """Call `user.resize_ids(refs, capacity, released)` now and whenever the table
        grows."""
        self._users.append(user)
        user.resize_ids(self._refs_array, self._capacity, self._released)

    def unregister(self, user: Any) -> None:
        """Stop resizing `user` (a shadow dropped, its ids released)."""
        self._users = [u for u in self._users if u is not user]

    def key_of(self, ident: cython.Py_ssize_t) -> Any:
        """The key of id `ident`."""
        return self._keys[ident]

    def id_of(self, key: Any) -> int:
        """The id of `key`, or -1 when it has none."""
        if cython.compiled:
            return self._find(key, hash(key))
        found = self._ids.get(key)
        if found is None:
            return -1
        return found

    def intern(self, keys: Sequence[Any]) -> list[int]:
        """The ids of `keys`, in order (a new key gets a free id), after recycling the ids
        released since the last call."""
        if self._released:
            self._collect()
        out: list[int] = []
        ident: cython.Py_ssize_t
        if cython.compiled:
            for key in keys:
                ident = self._find(key, hash(key))
                if ident < 0:
                    out.append(self._new_id(key))
                else:
                    out.append(ident)
            return out
        ids = self._ids
        for key in keys:
            found = ids.get(key)
            if found is None:
                found = self._new_id(key)
            out.append(found)
        return out

    def intern_one(self, key: Any) -> int:
        """The id of `key` (a new one if it has none); nothing recycled."""
        if cython.compiled:
            ident: cython.Py_ssize_t = self._find(key, hash(key))
            if ident < 0:
                return self._new_id(key)
            return ident
        found = self._ids.get(key)
        if found is None:
            found = self._new_id(key)
        return found

    @cython.cfunc
    @cython.exceptval(-2)
    def _find(self, key: Any, hashed: cython.Py_ssize_t) -> cython.Py_ssize_t:
        """Compiled: the id of `key` (whose hash is `hashed`), or -1 with `_hole` the empty
        slot its probe ended at (where it would go)."""
        bits: cython.longlong = hashed & HASH_BITS
        i: cython.Py_ssize_t = bits & self._mask
        slot: cython.longlong
        ident: cython.Py_ssize_t
        while True:
            slot = self._slots[i]
            if slot == 0:
                self._hole = i
                return -1
            if (slot >> 32) == bits:
                ident = (slot & ID_BITS) - 1
                stored = self._keys[ident]
                if stored is key or stored == key:
                    return ident
            i = (i + 1) & self._mask

    @cython.cfunc
    @cython.exceptval(-1)
    def _put(self, key: Any, ident: cython.Py_ssize_t) -> cython.int:
        """Compiled: `key` (absent, `_find` just missed it: `_hole`) gets a slot for
        `ident`; the slots doubled first when half full."""
        bits: cython.longlong = hash(key) & HASH_BITS
        if 2 * (self._count + 1) > self._mask + 1:
            self._grow_slots()
            self._find(key, bits)
        self._slots[self._hole] = (bits << 32) | (ident + 1)
        self._count += 1
        return 0

    @cython.cfunc
    @cython.exceptval(-1)
    def _unput(self, key: Any, ident: cython.Py_ssize_t) -> cython.int:
        """Compiled: empty the slot of `key` (id `ident`), each slot after it up to an empty
        one moved back into the hole when its home is not between them (linear probing's
        deletion: every key stays reachable from its home with no tombstone)."""
        mask: cython.Py_ssize_t = self._mask
        bits: cython.longlong = hash(key) & HASH_BITS
        wanted: cython.longlong = (bits << 32) | (ident + 1)
        i: cython.Py_ssize_t = bits & mask
        j: cython.Py_ssize_t
        home: cython.Py_ssize_t
        slot: cython.longlong
        while self._slots[i] != wanted:
            i = (i + 1) & mask
        j = i
        while True:
            j = (j + 1) & mask
            slot = self._slots[j]
            if slot == 0:
                break
            home = (slot >> 32) & mask
            if (j - home) & mask >= (j - i) & mask:  # home at or before the hole: movable
                self._slots[i] = slot
                i = j
        self._slots[i] = 0
        self._count -= 1
        return 0

    @cython.cfunc
    @cython.exceptval(-1)
    def _grow_slots(self) -> cython.int:
        """Compiled: twice the slots, every key put back from its home."""
        old = cython.declare(cython.longlong[::1], self._slots_array)  # type: ignore[misc]
        size: cython.Py_ssize_t = 2 * (self._mask + 1)
        mask: cython.Py_ssize_t = size - 1
        k: cython.Py_ssize_t
        i: cython.Py_ssize_t
        slot: cython.longlong
        self._slots_array = array("q", [0]) * size
        self._slots = self._slots_array
        for k in range(size // 2):
            slot = old[k]
            if slot != 0:
                i = (slot >> 32) & mask
                while self._slots[i] != 0:
                    i = (i + 1) & mask
                self._slots[i] = slot
        self._mask = mask
        return 0

    @cython.cfunc
    def _new_id(self, key: Any) -> int:
        """A free id for `key` (released until some shadow counts it)."""
        ident: cython.Py_ssize_t
        if self._free:
            found = self._free.pop()
            ident = found
        else:
            if self._used == self._capacity:
                self._grow()
            ident = self._used
            self._used += 1
            found = ident  # its int object made now, not at the growth (module doc)
        if cython.compiled:
            self._put(key, ident)
        else:
            self._ids[key] = found
        self._keys[ident] = key
        self._released.append(found)
        return found

    @cython.cfunc
    @cython.exceptval(-1)
    def _collect(self) -> cython.int:
        """Recycle every released id no shadow counts: its key forgotten, the id free."""
        released = self._released
        i: cython.Py_ssize_t
        ident: cython.Py_ssize_t
        for i in range(len(released)):
            found = released[i]
            ident = found
            if self._refs[ident] == 0 and self._keys[ident] is not _NO_KEY:
                if cython.compiled:
                    self._unput(self._keys[ident], ident)
                else:
                    del self._ids[self._keys[ident]]
                self._keys[ident] = _NO_KEY
                self._free.append(found)
        del released[:]
        return 0

    @cython.cfunc
    @cython.exceptval(-1)
    def _grow(self) -> cython.int:
        """Double the room (a new count array, handed to every user)."""
        old: cython.Py_ssize_t = self._capacity
        new: cython.Py_ssize_t = max(INITIAL_IDS, 2 * old)
        self._refs_array = grown_ids(self._refs_array, new, 0)
        self._refs = self._refs_array
        # each list extended once: appends one by one reallocated (copied) them every
        # eighth of their length (docs/BENCHMARKS.md, "Policy cost, seventh round"); the new
        # ids are past `_used`, on no list, and get their int objects as they are given out
        self._keys.extend([_NO_KEY] * (new - old))
        self._capacity = new
        for user in self._users:
            user.resize_ids(self._refs_array, new, self._released)
        return 0
