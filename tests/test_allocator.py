"""The paged-KV block allocators: the shared contract on both, prefix caching (sharing,
promotion, revival, LRU eviction, the eviction listener), the device-aware allocator, the
hashes, the evictor, and the hypothesis state machine."""

from __future__ import annotations

import hashlib
import struct
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, settings

from kvtier.allocator import (
    BLOCK_HASH_BYTES,
    AllocatorType,
    Block,
    BlockAllocator,
    CpuGpuBlockAllocator,
    Device,
    LRUEvictor,
    NaiveBlockAllocator,
    PrefixCachingBlockAllocator,
    common_prefix,
    hash_block_tokens,
    hash_token_blocks,
    pack_token_ids,
)
from kvtier.allocator.refcount import CopyOnWriteTracker, RefCounter
from kvtier.errors import (
    AllocationError,
    BlockStateError,
    DoubleFreeError,
    InvalidValueError,
    KvtierError,
    NoFreeBlocksError,
)
from kvtier.testing.allocator import BlockAllocatorTests, PrefixCachingAllocatorMachine, snapshot

# -- the shared contract --------------------------------------------------------------------


class TestNaiveAllocator(BlockAllocatorTests):
    def make_allocator(self, num_blocks: int, block_size: int) -> BlockAllocator:
        return NaiveBlockAllocator(num_blocks, block_size)

    def test_equal_blocks_do_not_share(self) -> None:
        allocator = self.new()
        a = allocator.allocate_immutable_block(None, self.tokens(0))
        b = allocator.allocate_immutable_block(None, self.tokens(0))
        assert a.block_id != b.block_id and a.content_hash == b.content_hash

    def test_prefix_caching_methods_report_nothing_cached(self) -> None:
        allocator = self.new()
        block = allocator.allocate_immutable_block(None, self.tokens(0))
        assert block.block_id is not None and block.content_hash is not None
        allocator.mark_blocks_as_accessed([block.block_id], 1.0)
        allocator.mark_blocks_as_computed([block.block_id])
        assert allocator.block_is_computed(block.block_id) is False
        assert allocator.find_cached_blocks_prefix([block.content_hash]) == []
        assert allocator.get_common_computed_block_ids([[1, 2], [1]]) == []

    def test_freed_full_blocks_are_not_kept(self) -> None:
        allocator = self.new(1)
        block = allocator.allocate_immutable_block(None, self.tokens(0))
        allocator.free(block)
        again = allocator.allocate_immutable_block(None, self.tokens(0))
        assert again.computed is False and allocator.get_num_free_blocks() == 0


class TestPrefixCachingAllocator(BlockAllocatorTests):
    def make_allocator(self, num_blocks: int, block_size: int) -> BlockAllocator:
        return PrefixCachingBlockAllocator(num_blocks, block_size)


# -- prefix caching -----------------------------------------------------------------------------

BS = 4


def tokens(start: int) -> list[int]:
    return list(range(start, start + BS))


def tokens_hash(token_ids: list[int]) -> bytes:
    return hash_block_tokens(None, token_ids)


def bid(block: Block) -> int:
    """`block.block_id`, which the test knows is set."""
    if block.block_id is None:
        raise AssertionError(f"{block!r} holds no block")
    return block.block_id


def hash_of(block: Block) -> bytes:
    """`block.content_hash`, which the test knows is set."""
    if block.content_hash is None:
        raise AssertionError(f"{block!r} has no content hash")
    return block.content_hash


def prefix_allocator(num_blocks: int = 4) -> PrefixCachingBlockAllocator:
    return PrefixCachingBlockAllocator(num_blocks, BS)


def cached_and_freed(
    allocator: PrefixCachingBlockAllocator, chunks: list[list[int]], now: float = -1.0
) -> list[Block]:
    """Allocate a chain, mark it computed (and accessed at `now`), free it: it stays cached."""
    blocks = allocator.allocate_immutable_blocks(None, chunks)
    ids = [b.block_id for b in blocks if b.block_id is not None]
    allocator.mark_blocks_as_computed(ids)
    if now >= 0:
        allocator.mark_blocks_as_accessed(ids, now)
    for block in blocks:
        allocator.free(block)
    return blocks


def test_equal_prefixes_share_one_physical_block() -> None:
    allocator = prefix_allocator()
    a = allocator.allocate_immutable_blocks(None, [tokens(0), tokens(4)])
    b = allocator.allocate_immutable_blocks(None, [tokens(0), tokens(4)])
    assert [x.block_id for x in a] == [x.block_id for x in b]
    assert all(allocator.refcount(x.block_id) == 2 for x in a if x.block_id is not None)
    assert allocator.get_num_free_blocks() == 2
    c = allocator.allocate_immutable_blocks(None, [tokens(1), tokens(4)])  # other prefix
    assert c[1].block_id != a[1].block_id
    allocator.check()


def test_promotion_switches_to_the_cached_block() -> None:
    allocator = prefix_allocator()
    cached = allocator.allocate_immutable_block(None, tokens(0))
    block = allocator.allocate_mutable_block(None)
    own = block.block_id
    assert own is not None
    block.append_token_ids(tokens(0)[:2])
    block.append_token_ids(tokens(0)[2:])  # full: equal to `cached`
    assert block.block_id == cached.block_id and allocator.refcount(own) == 0
    assert allocator.get_num_free_blocks() == 3
    fresh = allocator.allocate_mutable_block(None)
    fresh.append_token_ids(tokens(8))  # full, new content: cached under its own id
    assert fresh.block_id is not None
    assert allocator.cached_block_id(tokens_hash(tokens(8))) == fresh.block_id
    assert allocator.promote_to_immutable_block(fresh) == fresh.block_id  # idempotent
    allocator.check()


def test_revival_of_an_evicted_but_cached_block() -> None:
    allocator = prefix_allocator()
    (old,) = cached_and_freed(allocator, [tokens(0)])
    assert old.block_id is None and allocator.get_num_free_blocks() == 4
    assert allocator.get_num_evictable_blocks() == 1
    revived = allocator.allocate_immutable_block(None, tokens(0))
    assert revived.block_id == allocator.cached_block_id(tokens_hash(tokens(0)))
    assert revived.computed is True  # its KV is still there: prefill can skip it
    assert allocator.get_num_evictable_blocks() == 0 and allocator.num_evictions == 0
    assert allocator.get_num_free_blocks() == 3
    allocator.check()


def test_a_cached_block_never_computed_is_not_kept() -> None:
    allocator = prefix_allocator()
    block = allocator.allocate_immutable_block(None, tokens(0))
    allocator.free(block)
    assert allocator.get_num_evictable_blocks() == 0
    assert allocator.cached_block_id(tokens_hash(tokens(0))) is None
    assert allocator.allocate_immutable_block(None, tokens(0)).computed is False
    allocator.check()


def test_eviction_is_lru_then_longest_prefix_first() -> None:
    allocator = prefix_allocator(4)
    chain = cached_and_freed(allocator, [tokens(0), tokens(4), tokens(8)], now=5.0)
    (older,) = cached_and_freed(allocator, [tokens(20)], now=1.0)
    evicted: list[tuple[bytes, int]] = []
    allocator.on_evict = lambda content_hash, block_id: evicted.append((content_hash, block_id))
    for _ in range(3):
        allocator.allocate_mutable_block(None)
    hashes = [hash_of(b) for b in chain]
    # the oldest first, then the chain from its tail (most tokens) towards its head
    assert [h for h, _ in evicted] == [older.content_hash, hashes[2], hashes[1]]
    assert allocator.num_evictions == 3
    assert allocator.find_cached_blocks_prefix(hashes) == hashes[:1]
    allocator.check()


def test_marking_an_evictable_block_accessed_moves_it_in_the_lru_order() -> None:
    allocator = prefix_allocator(2)
    cached_and_freed(allocator, [tokens(0)], now=1.0)
    (b,) = cached_and_freed(allocator, [tokens(4)], now=2.0)
    a_id = allocator.cached_block_id(tokens_hash(tokens(0)))
    assert a_id is not None
    allocator.mark_blocks_as_accessed([a_id], 3.0)
    evicted: list[bytes] = []
    allocator.on_evict = lambda content_hash, block_id: evicted.append(content_hash)
    allocator.allocate_mutable_block(None)
    assert evicted == [b.content_hash]


def test_mark_blocks_as_accessed_validates() -> None:
    allocator = prefix_allocator()
    with pytest.raises(InvalidValueError, match="now"):
        allocator.mark_blocks_as_accessed([0], float("nan"))
    with pytest.raises(InvalidValueError, match="now"):
        allocator.mark_blocks_as_accessed([0], "soon")  # type: ignore[arg-type]
    with pytest.raises(BlockStateError, match="block 0 is free"):
        allocator.mark_blocks_as_accessed([0], 1.0)
    with pytest.raises(BlockStateError, match="block 0 is free"):
        allocator.mark_blocks_as_computed([0])


def test_the_eviction_listener_sees_the_block_before_reuse_and_may_refuse() -> None:
    allocator = prefix_allocator(1)
    (block,) = cached_and_freed(allocator, [tokens(0)])
    cached_id = allocator.cached_block_id(tokens_hash(tokens(0)))

    def refuse(content_hash: bytes, block_id: int) -> None:
        assert content_hash == block.content_hash and block_id == cached_id
        assert allocator.cached_block_id(content_hash) == block_id  # still readable
        raise RuntimeError("tier full")

    allocator.on_evict = refuse
    assert allocator.on_evict is refuse
    before = snapshot(allocator)
    with pytest.raises(RuntimeError, match="tier full"):
        allocator.allocate_mutable_block(None)
    assert snapshot(allocator) == before and allocator.num_evictions == 0
    assert allocator.find_cached_blocks_prefix([tokens_hash(tokens(0))]) != []
    with pytest.raises(InvalidValueError, match="callable"):
        allocator.on_evict = 3  # type: ignore[assignment]
    allocator.check()


def test_a_refusing_listener_undoes_a_multi_block_allocation() -> None:
    allocator = prefix_allocator(3)
    cached_and_freed(allocator, [tokens(0)])
    cached_and_freed(allocator, [tokens(9), tokens(13)])

    def refuse(content_hash: bytes, block_id: int) -> None:
        raise RuntimeError("no")

    allocator.on_evict = refuse
    before = snapshot(allocator)
    with pytest.raises(RuntimeError):  # the hit is revived, then the miss needs an eviction
        allocator.allocate_immutable_blocks(None, [tokens(0), tokens(4)])
    assert snapshot(allocator) == before
    allocator.check()


def test_hits_are_taken_before_misses_evict() -> None:
    allocator = prefix_allocator(2)
    cached_and_freed(allocator, [tokens(0)], now=1.0)  # the LRU victim, were it not a hit
    cached_and_freed(allocator, [tokens(30)], now=2.0)
    blocks = allocator.allocate_immutable_blocks(None, [tokens(0), tokens(4)])
    assert blocks[0].computed is True and blocks[1].computed is False
    assert allocator.cached_block_id(tokens_hash(tokens(30))) is None  # evicted instead
    allocator.check()


def test_find_cached_blocks_prefix_stops_at_the_first_miss() -> None:
    allocator = prefix_allocator(4)
    chain = allocator.allocate_immutable_blocks(None, [tokens(0), tokens(4), tokens(8)])
    hashes = hash_token_blocks(tokens(0) + tokens(4) + tokens(8), BS)
    assert [b.content_hash for b in chain] == hashes
    assert allocator.find_cached_blocks_prefix(hashes) == []  # cached, not computed yet
    allocator.mark_blocks_as_computed([b.block_id for b in chain[:2] if b.block_id is not None])
    assert allocator.find_cached_blocks_prefix(hashes) == hashes[:2]
    assert allocator.find_cached_blocks_prefix([hashes[1], hashes[0]]) == [hashes[1], hashes[0]]
    assert allocator.find_cached_blocks_prefix([b"\x00" * 16, hashes[0]]) == []
    with pytest.raises(InvalidValueError, match=r"block_hashes\[0\] must be bytes"):
        allocator.find_cached_blocks_prefix(["abc"])  # type: ignore[list-item]


def test_get_common_computed_block_ids() -> None:
    allocator = prefix_allocator()
    assert allocator.get_common_computed_block_ids([[1, 2, 3], [1, 2], [1, 2, 4]]) == [1, 2]
    assert allocator.get_common_computed_block_ids([[1, 2]]) == [1, 2]
    assert allocator.get_common_computed_block_ids([[1], []]) == []
    assert allocator.get_common_computed_block_ids([]) == []
    assert common_prefix([[5, 6], [5, 7]]) == [5]


def test_get_num_full_blocks_touched_counts_what_takes_a_slot() -> None:
    source = prefix_allocator(8)
    chain = source.allocate_immutable_blocks(None, [tokens(0), tokens(4), tokens(8)])
    tail = source.allocate_mutable_block(chain[-1])
    tail.append_token_ids([1])
    target = prefix_allocator(8)
    live = target.allocate_immutable_block(None, tokens(0))  # a live hit: no slot
    cached_and_freed(target, [tokens(0), tokens(4)])  # tokens(4) chained: evictable hit
    assert live.block_id is not None
    assert target.get_num_full_blocks_touched([*chain, tail]) == 2  # evictable + miss
    (twin,) = source.fork(chain[0])[:1]
    assert target.get_num_full_blocks_touched([chain[0], twin, *chain[1:]]) == 2


def test_swap_in_shares_blocks_cached_on_the_target() -> None:
    source, target = prefix_allocator(), prefix_allocator()
    blocks = source.allocate_immutable_blocks(None, [tokens(0), tokens(4)])
    source.mark_blocks_as_computed([b.block_id for b in blocks if b.block_id is not None])
    resident = target.allocate_immutable_block(None, tokens(0))
    source.swap_out(blocks)
    assert all(b.computed for b in blocks)  # what the source knew travels with the blocks
    target.swap_in(blocks)
    assert blocks[0].block_id == resident.block_id
    assert target.refcount(bid(resident)) == 2
    assert all(target.block_is_computed(bid(b)) for b in blocks)
    hashes = [hash_of(b) for b in blocks]
    assert target.find_cached_blocks_prefix(hashes) == hashes
    target.check()
    source.check()


def test_check_finds_corrupted_bookkeeping() -> None:
    naive = NaiveBlockAllocator(2, BS)
    block = naive.allocate_mutable_block(None)
    naive._free.append(bid(block))  # corrupt: in use and free
    with pytest.raises(BlockStateError, match=r"NaiveBlockAllocator: .*both free and in use"):
        naive.check()
    cached = prefix_allocator()
    cached_and_freed(cached, [tokens(0)])
    cached._computed.clear()  # corrupt: an evictable block that is not computed
    with pytest.raises(BlockStateError, match="evictable block 0 is not cached and computed"):
        cached.check()
    other = prefix_allocator()
    other._free.append(other._free.popleft())  # harmless reorder: still consistent
    other.check()
    other._free.pop()  # corrupt: a block vanished
    with pytest.raises(BlockStateError, match=r"3 free \+ 0 evictable \+ 0 in use != 4"):
        other.check()


def test_no_free_blocks_error_is_a_kvtier_allocation_error() -> None:
    assert issubclass(NoFreeBlocksError, AllocationError)
    assert issubclass(NoFreeBlocksError, KvtierError)


def test_block_ids_are_validated() -> None:
    with pytest.raises(InvalidValueError, match="duplicates"):
        NaiveBlockAllocator(2, 4, [1, 1])
    with pytest.raises(InvalidValueError, match="got 1 block ids"):
        NaiveBlockAllocator(2, 4, [1])
    with pytest.raises(InvalidValueError, match="every block id"):
        NaiveBlockAllocator(1, 4, [-1])
    allocator = PrefixCachingBlockAllocator(2, 4, [20, 10])
    assert allocator.get_physical_block_id(10) == 0 and allocator.get_physical_block_id(20) == 1


def test_fork_keeps_the_null_block_in_the_chain() -> None:
    allocator = prefix_allocator()
    null = allocator.allocate_or_get_null_block()
    after = allocator.allocate_mutable_block(null)
    forked = allocator.fork(after)
    assert forked[0] is null and forked[1].prev_block is null
    assert allocator.refcount(bid(null)) == 1
    assert allocator.refcount(bid(after)) == 2


# -- the device-aware allocator --------------------------------------------------------------


def device_allocator(
    kind: AllocatorType = "prefix_caching", gpu: int = 4, cpu: int = 4
) -> CpuGpuBlockAllocator:
    return CpuGpuBlockAllocator.create(kind, gpu, cpu, BS)


@pytest.mark.parametrize("kind", ["naive", "prefix_caching"])
def test_devices_have_disjoint_global_ids(kind: AllocatorType) -> None:
    allocator = device_allocator(kind, gpu=3, cpu=2)
    assert allocator.allocator("gpu").all_block_ids == frozenset(range(3))
    assert allocator.allocator(Device.CPU).all_block_ids == frozenset({3, 4})
    assert allocator.all_block_ids == frozenset(range(5))
    gpu_block = allocator.allocate_mutable_block(None, Device.GPU)
    cpu_block = allocator.allocate_immutable_block(None, tokens(0), "cpu")
    assert allocator.device_of(bid(gpu_block)) is Device.GPU
    assert allocator.device_of(bid(cpu_block)) is Device.CPU
    assert allocator.get_physical_block_id("cpu", 4) == 1
    assert allocator.get_num_free_blocks("gpu") == 2 and allocator.get_num_total_blocks("cpu") == 2
    blocks = allocator.allocate_immutable_blocks(None, [tokens(0), tokens(4)], "gpu")
    assert len(blocks) == 2 and allocator.block_size == BS
    with pytest.raises(InvalidValueError, match="on no device"):
        allocator.device_of(5)
    with pytest.raises(InvalidValueError, match="unknown device 'disk'"):
        allocator.allocator("disk")
    allocator.check()


def test_device_parse() -> None:
    assert Device.parse("GPU") is Device.GPU and Device.parse(Device.CPU) is Device.CPU
    with pytest.raises(InvalidValueError, match="valid devices: 'gpu', 'cpu'"):
        Device.parse(3)  # type: ignore[arg-type]


def test_free_and_fork_find_the_device_of_the_block() -> None:
    allocator = device_allocator()
    block = allocator.allocate_mutable_block(None, "cpu")
    block.append_token_ids([1])
    (twin,) = allocator.fork(block)
    twin.append_token_ids([2])  # copy-on-write on the CPU
    (pair,) = allocator.clear_copy_on_writes()
    assert allocator.device_of(pair[0]) is Device.CPU is allocator.device_of(pair[1])
    allocator.free(block)
    allocator.free(twin)
    with pytest.raises(DoubleFreeError):
        allocator.free(twin)
    foreign = NaiveBlockAllocator(1, BS).allocate_mutable_block(None)
    with pytest.raises(InvalidValueError, match="belongs to no device"):
        allocator.free(foreign)
    assert allocator.get_num_free_blocks("cpu") == 4


def test_mark_methods_route_by_global_id() -> None:
    allocator = device_allocator()
    gpu = allocator.allocate_immutable_block(None, tokens(0), "gpu")
    cpu = allocator.allocate_immutable_block(None, tokens(0), "cpu")
    ids = [bid(gpu), bid(cpu)]
    allocator.mark_blocks_as_computed(ids)
    allocator.mark_blocks_as_accessed(ids, 2.0)
    hashes = [hash_of(gpu)]
    assert allocator.find_cached_blocks_prefix(hashes) == hashes
    assert allocator.find_cached_blocks_prefix(hashes, "cpu") == hashes
    assert allocator.get_common_computed_block_ids([[1, 2], [1]]) == [1]
    with pytest.raises(InvalidValueError, match="on no device"):
        allocator.mark_blocks_as_computed([99])


def test_null_block_comes_from_the_gpu_and_is_unique() -> None:
    allocator = device_allocator()
    null = allocator.allocate_or_get_null_block()
    assert allocator.allocate_or_get_null_block() is null
    assert allocator.device_of(bid(null)) is Device.GPU
    allocator.free(null)
    assert allocator.get_num_free_blocks("gpu") == 3


class KVMemory:
    """A stand-in for device memory: global block id -> bytes; copies by a swap mapping."""

    def __init__(self) -> None:
        self.rows: dict[int, bytes] = {}

    @staticmethod
    def kv_of(block: Block) -> bytes:
        return hashlib.sha256(repr(block.token_ids).encode()).digest()

    def write(self, blocks: list[Block]) -> None:
        for block in blocks:
            assert block.block_id is not None
            self.rows[block.block_id] = self.kv_of(block)

    def copy(self, mapping: dict[int, int]) -> None:
        for src, dst in mapping.items():
            self.rows[dst] = self.rows[src]


@pytest.mark.parametrize("kind", ["naive", "prefix_caching"])
def test_swap_round_trip_preserves_content(kind: AllocatorType) -> None:
    allocator = device_allocator(kind, gpu=4, cpu=4)
    memory = KVMemory()
    chain = allocator.allocate_immutable_blocks(None, [tokens(0), tokens(4)], "gpu")
    tail = allocator.allocate_mutable_block(chain[-1], "gpu")
    tail.append_token_ids([7, 8])
    forked = allocator.fork(tail)
    fork_tail = forked[-1]
    blocks = [*chain, tail, *forked]
    memory.write(blocks)
    allocator.mark_blocks_as_computed([bid(b) for b in chain])
    gpu_ids = [b.block_id for b in blocks]

    assert allocator.get_num_full_blocks_touched(blocks, "cpu") == 2
    to_cpu = allocator.swap(blocks, "gpu", "cpu")
    memory.copy(to_cpu)
    cpu = allocator.allocator("cpu")
    computed = [cpu.block_is_computed(bid(b)) for b in chain]
    assert computed == [kind == "prefix_caching"] * 2  # the computed state moved along
    assert set(to_cpu) == set(gpu_ids) and len(to_cpu) == 3  # the fork shares its source
    assert all(allocator.device_of(bid(b)) is Device.CPU for b in blocks)
    assert tail.block_id == fork_tail.block_id  # still shared after the move
    assert all(memory.rows[bid(b)] == memory.kv_of(b) for b in blocks)
    allocator.check()

    back = allocator.swap(blocks, Device.CPU, Device.GPU)
    memory.copy(back)
    assert all(allocator.device_of(bid(b)) is Device.GPU for b in blocks)
    assert all(memory.rows[bid(b)] == memory.kv_of(b) for b in blocks)
    assert allocator.get_num_free_blocks("cpu") == 4
    fork_tail.append_token_ids([9])  # still copy-on-write after two moves
    assert allocator.clear_copy_on_writes() != []
    allocator.check()


def test_swap_is_all_or_nothing() -> None:
    allocator = device_allocator(gpu=4, cpu=1)
    blocks = allocator.allocate_immutable_blocks(None, [tokens(0), tokens(4)], "gpu")
    ids = [b.block_id for b in blocks]
    before = (snapshot(allocator.allocator("gpu")), snapshot(allocator.allocator("cpu")))
    with pytest.raises(NoFreeBlocksError):
        allocator.swap(blocks, "gpu", "cpu")
    after = (snapshot(allocator.allocator("gpu")), snapshot(allocator.allocator("cpu")))
    assert after == before and [b.block_id for b in blocks] == ids
    assert not any(b.computed for b in blocks)
    with pytest.raises(InvalidValueError, match="to itself"):
        allocator.swap(blocks, "gpu", "gpu")
    with pytest.raises(InvalidValueError, match="not on 'cpu'"):
        allocator.swap(blocks, "cpu", "gpu")
    allocator.check()


def test_device_aware_construction_is_validated() -> None:
    with pytest.raises(InvalidValueError, match="collide"):
        CpuGpuBlockAllocator(NaiveBlockAllocator(2, BS), NaiveBlockAllocator(2, BS))
    with pytest.raises(InvalidValueError, match="block sizes differ"):
        CpuGpuBlockAllocator(NaiveBlockAllocator(1, BS), NaiveBlockAllocator(1, 8, [5]))
    shared = NaiveBlockAllocator(1, BS)
    with pytest.raises(InvalidValueError, match="two objects"):
        CpuGpuBlockAllocator(shared, shared)
    with pytest.raises(InvalidValueError, match="unknown allocator_type 'lru'"):
        CpuGpuBlockAllocator.create("lru", 1, 1, BS)  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="prefix_caching"):
        CpuGpuBlockAllocator.create("naive", 1, 1, BS, on_gpu_evict=lambda h, i: None)
    seen: list[int] = []
    allocator = CpuGpuBlockAllocator.create(
        "prefix_caching", 1, 1, BS, on_gpu_evict=lambda h, i: seen.append(i)
    )
    block = allocator.allocate_immutable_block(None, tokens(0), "gpu")
    allocator.mark_blocks_as_computed([bid(block)])
    allocator.free(block)
    allocator.allocate_mutable_block(None, "gpu")
    assert seen == [0]


# -- hashes ---------------------------------------------------------------------------------------


def test_content_hash_is_a_stable_documented_digest() -> None:
    first = hash_block_tokens(None, [1, 2, 3, 4])
    layout = b"\x00" + struct.pack("<4Q", 1, 2, 3, 4)
    expected = hashlib.blake2b(layout, digest_size=16, person=b"kvtier.block.v1").digest()
    assert first == expected and len(first) == BLOCK_HASH_BYTES
    assert first.hex() == "c64be5a121991668c80839a89e50a3af"  # never changes across releases
    second = hash_block_tokens(first, [5, 6, 7, 8])
    assert second.hex() == "47f3a37ee089e5e59595aeccec388e3f"


def test_content_hash_is_the_same_in_another_process() -> None:
    code = "from kvtier.allocator import hash_block_tokens as h; print(h(None, [1, 2]).hex())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == hash_block_tokens(None, [1, 2]).hex()


def test_hash_token_blocks_chains_full_blocks_only() -> None:
    token_ids = list(range(10))
    hashes = hash_token_blocks(token_ids, 4)
    assert len(hashes) == 2
    assert hashes[1] == hash_block_tokens(hash_block_tokens(None, token_ids[:4]), token_ids[4:8])
    assert hash_token_blocks(token_ids[4:8], 4, prev_block_hash=hashes[0]) == hashes[1:]
    assert hash_token_blocks([1], 4) == []
    with pytest.raises(InvalidValueError, match="block_size"):
        hash_token_blocks(token_ids, 0)
    with pytest.raises(InvalidValueError, match="16 bytes"):
        hash_block_tokens(b"short", [1])


def test_pack_token_ids_names_the_bad_id() -> None:
    assert pack_token_ids([1, 2]) == struct.pack("<2Q", 1, 2)
    with pytest.raises(InvalidValueError, match=r"token_ids\[2\] must be in"):
        pack_token_ids([0, 1, 1 << 64])
    with pytest.raises(InvalidValueError, match=r"token_ids\[0\] must be an int, got bool"):
        pack_token_ids([True, 1, None])  # type: ignore[list-item]


# -- evictor, ref counts, CoW log ------------------------------------------------------------------


def test_evictor_order_update_and_remove() -> None:
    evictor = LRUEvictor()
    evictor.add(1, b"a", 4, 1.0)
    evictor.add(2, b"b", 8, 1.0)  # same time, longer prefix: first
    evictor.add(3, b"c", 4, 0.5)  # older: before both
    assert 2 in evictor and len(evictor) == evictor.num_blocks == 3
    assert evictor.peek() == (3, b"c")
    evictor.update(3, 2.0)
    assert evictor.evict() == (2, b"b")
    assert evictor.remove(1) == (b"a", 1.0)
    assert evictor.evict() == (3, b"c")
    with pytest.raises(BlockStateError, match="empty"):
        evictor.evict()
    with pytest.raises(BlockStateError, match="not in the evictor"):
        evictor.update(3, 1.0)
    evictor.add(4, b"d", 4, 0.0)
    with pytest.raises(BlockStateError, match="already"):
        evictor.add(4, b"d", 4, 0.0)


def test_evictor_heap_stays_bounded_under_updates() -> None:
    evictor = LRUEvictor()
    for block_id in range(10):
        evictor.add(block_id, bytes([block_id]), 1, 0.0)
    for step in range(10_000):
        evictor.update(step % 10, float(step))
    assert len(evictor._heap) <= 2 * 10 + 64
    assert [evictor.evict()[0] for _ in range(10)] == list(range(10))


def test_refcounter_and_cow_tracker() -> None:
    refs = RefCounter([0, 1])
    assert refs.incr(0) == 1 and refs.get(0) == 1 and refs.decr(0) == 0
    with pytest.raises(DoubleFreeError, match="block 0"):
        refs.decr(0)
    with pytest.raises(InvalidValueError, match="block id 5 is not in this pool"):
        refs.incr(5)
    cows = CopyOnWriteTracker()
    cows.record(1, 2)
    assert len(cows) == 1 and cows.clear() == [(1, 2)] and cows.clear() == []


# -- the state machine ---------------------------------------------------------------------------

TestPrefixCachingMachine = PrefixCachingAllocatorMachine.TestCase
TestPrefixCachingMachine.pytestmark = [pytest.mark.slow]
TestPrefixCachingMachine.settings = settings(
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
