"""How a candidate's shadow takes over a tier's blocks when `auto` switches to it
(`take_over`), and how a shadow stores a key (`store_in_shadow`).

A switch takes over warm: the winner's shadow becomes the live policy, its state (its
order, its lists, its counters, its ghosts where the policy allows) for every block the
tier holds, with the tier's blocks in it; a block the tier holds that the shadow had let go
comes first in line for eviction (it was already gone, for the winner). The policy that
stops serving goes on as a shadow with what it held (block references, no bytes; a block
the tier pins meanwhile is skipped by its evictions, as the live policy's would be).
  - LRU: the shadow's recency order;
  - ARC: T1 then T2 in the shadow's order (the T2 blocks touched again), ghosts and target
    start afresh (`ARCLists` keeps them private);
  - S3-FIFO: its queues, counters and ghosts (`S3FIFOCachePolicy.adopted`), and the keys
    the shadow held that the tier lacks as its newest ghosts, so that they come back to M
    where the shadow kept them (a switch on cloudPhysics at 10 % lost 0.005 more without);
  - lct: the shadow itself, each block removed (remembered as a ghost with its history)
    and inserted again with the tier's block, oldest access first: its statistics, limits,
    horizon and every key's class carry over.

A shadow of LRU, ARC or S3-FIFO runs on the ids of `auto`'s `KeyIds` table
(`kvtier.policies._key_ids`; `shadow_on_ids`), so that every shadow shares one dict look-up
per access; its inspection (`lru_order`, `lists`, `queues`, `frequency`, `items`) reads through the
table, so `take_over` reads it as it reads a shadow on keys and builds the live policy on
keys. A live policy that stops serving is put on ids in its state; a shadow that took over
goes back on keys, its ids released (`shadow_on_keys`). lct is the other way round: it
serves on the table's ids (`live_on_ids`: the look-up its shadows need serves it too) and
is a shadow on keys (its calls one by one, `CachePolicy.access`).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvtier.blocks import BlockStatus
from kvtier.keys import OffloadKey
from kvtier.policies._key_ids import KeyIds
from kvtier.policies.arc import ARCCachePolicy
from kvtier.policies.base import CachePolicy
from kvtier.policies.lct import LCTCachePolicy
from kvtier.policies.lru import LRUCachePolicy
from kvtier.policies.s3fifo import S3FIFOCachePolicy


def store_in_shadow(policy: CachePolicy, key: OffloadKey, block: BlockStatus) -> None:
    """Store `key` in a shadow if admitted, evicting one block if it is full (skipped when
    every block is pinned: a former live policy may hold the tier's pinned blocks)."""
    if not policy.admits_all and not policy.admit((key,))[0]:
        return
    if len(policy) >= policy.cache_capacity and not policy.evict(1):
        return
    policy.insert(key, block)


def store_moved(policy: CachePolicy, keys: Sequence[OffloadKey], block: BlockStatus) -> None:
    """A tier's move (`on_store_move`) in a shadow on keys: each of `keys` it lacks, tail
    first, announced and stored as the tier stores it (`store_in_shadow`); nothing touched."""
    get = policy.getter()
    for key in reversed(keys):
        if get(key) is None:
            policy.on_store_move((key,))
            store_in_shadow(policy, key, block)


def _lct_order(policy: LCTCachePolicy) -> list[OffloadKey]:
    """lct's resident keys, oldest last access first."""
    last: dict[OffloadKey, int] = {}
    for key, _ in policy.items():
        seen = policy._seen(key)
        last[key] = seen[1] if seen is not None else 0
    return sorted(last, key=last.__getitem__)


def _lct_takes_over(
    shadow: LCTCachePolicy,
    entries: Sequence[tuple[OffloadKey, BlockStatus]],
    blocks: dict[OffloadKey, BlockStatus],
) -> LCTCachePolicy:
    """`take_over` of an lct shadow: the shadow itself, with the tier's blocks."""
    order = _lct_order(shadow)
    for key in order:
        shadow.remove(key)  # remembered as a ghost, its history kept
    _fill(shadow, order, entries, blocks)
    return shadow


def _fill(
    policy: CachePolicy,
    order: Sequence[OffloadKey],
    entries: Sequence[tuple[OffloadKey, BlockStatus]],
    blocks: dict[OffloadKey, BlockStatus],
) -> None:
    """Insert the tier's blocks into `policy`: those the shadow does not hold (`order`)
    first, so they go first, then the shadow's held ones in its order."""
    held = set(order)
    for key, block in entries:
        if key not in held:
            policy.insert(key, block)
    for key in order:
        if key in blocks:
            policy.insert(key, blocks[key])


def shadow_on_ids(policy: CachePolicy, table: KeyIds) -> bool:
    """Put `policy`, a shadow from now on, on the ids of `table` if its policy can run so
    (LRU, ARC, S3-FIFO; in its state, a no-op if it does already): whether it does. lct's
    shadow goes on keys (it was on ids while it served: `live_on_ids`)."""
    if isinstance(policy, (S3FIFOCachePolicy, ARCCachePolicy, LRUCachePolicy)):
        policy.use_ids(table)
        return True
    if isinstance(policy, LCTCachePolicy):
        policy.use_keys()
    return False


def live_on_ids(policy: CachePolicy, table: KeyIds) -> bool:
    """Put `policy`, serving from now on, on the ids of `table` if it can serve so (lct,
    whose `*_ids` calls then take the ids its driver interned for the shadows, in its
    state): whether it does."""
    if isinstance(policy, LCTCachePolicy):
        policy.use_ids(table)
        return True
    return False


def shadow_on_keys(policy: CachePolicy) -> None:
    """Put a shadow on ids back on keys, in its state, its ids released: `auto` drops it
    (it took over: `take_over` built the live policy anew)."""
    if isinstance(policy, (S3FIFOCachePolicy, ARCCachePolicy, LRUCachePolicy)):
        policy.use_keys()


def copyable(shadow: CachePolicy) -> bool:
    """Whether `take_over` leaves `shadow` as it was (it builds a new policy), so that a
    copy of it can be tried from the tier's blocks; lct's takeover is the shadow itself."""
    return isinstance(shadow, (S3FIFOCachePolicy, ARCCachePolicy, LRUCachePolicy))


def take_over(
    shadow: CachePolicy, entries: Sequence[tuple[OffloadKey, BlockStatus]]
) -> CachePolicy:
    """The live policy made of `shadow`: exactly the blocks of `entries` ((key, block),
    least recently used first, what the tier holds), in the shadow's state; the keys the
    shadow does not hold first in line for eviction (see the module doc)."""
    if isinstance(shadow, S3FIFOCachePolicy):
        return shadow.adopted(entries)
    blocks = dict(entries)
    if isinstance(shadow, LCTCachePolicy):
        return _lct_takes_over(shadow, entries, blocks)
    live = type(shadow)(shadow.cache_capacity)
    if isinstance(shadow, ARCCachePolicy):
        lists = shadow.lists()
        order, frequent = lists["t1"] + lists["t2"], lists["t2"]
    elif isinstance(shadow, LRUCachePolicy):
        order, frequent = shadow.lru_order(), []
    else:
        order, frequent = [key for key, _ in shadow.items()], []
    _fill(live, order, entries, blocks)
    for key in frequent:
        if key in blocks:
            live.touch((key,))
    return live
