"""`Block`: one paged-KV block as a sequence sees it (token ids, a physical block id, a hash).

A Block object belongs to one sequence; several Block objects may name the same physical block
(forks, or sequences with a common prefix under prefix caching), and the allocator counts those
references. Appending to a Block goes through its allocator: first copy-on-write if the
physical block is shared, then, once the block is full, promotion to an immutable cached block,
which may switch it to an equal physical block that already exists.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from kvtier.allocator.hashing import hash_packed_tokens, pack_token_ids
from kvtier.errors import BlockStateError, InvalidValueError

DEFAULT_LAST_ACCESSED = -1.0
"""`last_accessed` of a block nobody has marked accessed: older than any real time."""


class BlockHooks(Protocol):
    """What a Block asks of the allocator that owns it when token ids are appended."""

    def cow_block_if_not_appendable(self, block: Block) -> int:
        """The physical id the block may append into (a fresh copy if it is shared)."""
        ...

    def promote_to_immutable_block(self, block: Block) -> int:
        """The physical id of the now-full block (an existing equal block, if cached)."""
        ...


class Block:
    """A block of up to `block_size` token ids, linked to the block before it.

    Allocators create blocks; do not construct them directly. `block_id` is the global id of
    the physical block (None once freed or swapped out). `content_hash` is set when the block
    becomes full while the block before it has a hash (or it is the first block), and never
    changes after that: it names the whole prefix ending with this block.
    """

    __slots__ = (
        "_allocator",
        "_block_id",
        "_block_size",
        "_computed",
        "_content_hash",
        "_last_accessed",
        "_packed",
        "_prev_block",
        "_token_ids",
        "_tokens_before",
    )

    def __init__(
        self,
        allocator: BlockHooks,
        block_size: int,
        prev_block: Block | None = None,
        block_id: int | None = None,
    ) -> None:
        self._allocator = allocator
        self._block_size = block_size
        self._prev_block = prev_block
        self._block_id = block_id
        self._token_ids: list[int] = []
        self._packed = bytearray()
        self._content_hash: bytes | None = None
        self._computed = False
        self._last_accessed = DEFAULT_LAST_ACCESSED
        self._tokens_before = 0 if prev_block is None else prev_block.num_tokens_total

    # -- identity and contents --------------------------------------------------------------

    @property
    def block_id(self) -> int | None:
        """Global id of the physical block, or None when the block holds none (freed)."""
        return self._block_id

    @property
    def allocator(self) -> BlockHooks:
        """The allocator that owns this block (it changes when the block is swapped)."""
        return self._allocator

    @property
    def token_ids(self) -> tuple[int, ...]:
        """The token ids in the block, in order (a copy: blocks change only by appending)."""
        return tuple(self._token_ids)

    @property
    def num_token_ids(self) -> int:
        """How many token ids the block holds."""
        return len(self._token_ids)

    @property
    def block_size(self) -> int:
        """Capacity of the block in tokens."""
        return self._block_size

    @property
    def num_empty_slots(self) -> int:
        """How many more token ids fit."""
        return self._block_size - len(self._token_ids)

    @property
    def is_full(self) -> bool:
        """Whether the block holds `block_size` token ids (then it is immutable)."""
        return len(self._token_ids) == self._block_size

    @property
    def prev_block(self) -> Block | None:
        """The block before this one in its sequence, or None for the first block."""
        return self._prev_block

    @property
    def num_tokens_total(self) -> int:
        """Tokens in this block and every block before it: the length of the prefix it ends.

        The count before this block is taken when the block is created (a sequence only ever
        appends to its last block), so this is O(1)."""
        return self._tokens_before + len(self._token_ids)

    @property
    def content_hash(self) -> bytes | None:
        """The chained content hash (see `kvtier.allocator.hashing`), or None while the block
        is not full or follows a block without a hash."""
        return self._content_hash

    @property
    def computed(self) -> bool:
        """Whether the block's KV content is known to be computed (it was served from the
        prefix cache, or marked with `mark_blocks_as_computed` before it was handed out)."""
        return self._computed

    @computed.setter
    def computed(self, value: bool) -> None:
        self._computed = bool(value)

    @property
    def last_accessed(self) -> float:
        """When this block was last accessed, in the caller's clock (for a block manager's own
        per-sequence bookkeeping). The allocator's eviction order uses the per-physical-block
        time set by `mark_blocks_as_accessed`, which it copies here when it hands a block out."""
        return self._last_accessed

    @last_accessed.setter
    def last_accessed(self, value: float) -> None:
        self._last_accessed = float(value)

    # -- appending ---------------------------------------------------------------------------

    def append_token_ids(self, token_ids: Sequence[int]) -> None:
        """Append `token_ids`, copying the physical block first if it is shared (copy-on-write)
        and promoting the block to an immutable cached block once it is full.

        Nothing changes when the ids do not fit, are not valid token ids, or no block is free
        for the copy (InvalidValueError / NoFreeBlocksError).
        """
        if not token_ids:
            return
        if len(token_ids) > self.num_empty_slots:
            raise InvalidValueError(
                f"cannot append {len(token_ids)} token ids to block {self._block_id}: "
                f"it has {self.num_empty_slots} empty slots"
            )
        packed = pack_token_ids(token_ids)
        if self._block_id is not None:
            self._block_id = self._allocator.cow_block_if_not_appendable(self)
        self._fill(token_ids, packed)
        if self._block_id is not None and self._content_hash is not None:
            self._block_id = self._allocator.promote_to_immutable_block(self)

    # -- for allocators ----------------------------------------------------------------------

    def _fill(
        self, token_ids: Sequence[int], packed: bytes, content_hash: bytes | None = None
    ) -> None:
        """Append already validated and packed ids without asking the allocator anything; hash
        the block if that makes it full (`content_hash`, when the caller already knows it)."""
        self._token_ids.extend(token_ids)
        self._packed += packed
        if len(self._token_ids) == self._block_size:
            prev = self._prev_block
            if content_hash is not None:
                self._content_hash = content_hash
            elif prev is None:
                self._content_hash = hash_packed_tokens(None, bytes(self._packed))
            elif prev._content_hash is not None:
                self._content_hash = hash_packed_tokens(prev._content_hash, bytes(self._packed))

    def _clone(self, prev_block: Block | None) -> Block:
        """A copy naming the same physical block, linked after `prev_block` (for fork)."""
        twin = Block(self._allocator, self._block_size, prev_block, self._block_id)
        twin._token_ids = list(self._token_ids)
        twin._packed = bytearray(self._packed)
        twin._content_hash = self._content_hash
        twin._computed = self._computed
        twin._last_accessed = self._last_accessed
        twin._tokens_before = self._tokens_before
        return twin

    def __repr__(self) -> str:
        digest = self._content_hash.hex()[:12] if self._content_hash is not None else None
        return (
            f"{type(self).__name__}(block_id={self._block_id}, "
            f"tokens={len(self._token_ids)}/{self._block_size}, content_hash={digest})"
        )


class NullBlock(Block):
    """The placeholder for KV blocks dropped by a sliding window: one physical block that every
    sequence may point at, never written, never freed. See `allocate_or_get_null_block`."""

    __slots__ = ()

    def append_token_ids(self, token_ids: Sequence[int]) -> None:
        """Always raises BlockStateError: the null block holds no tokens."""
        raise BlockStateError(f"the null block (block {self._block_id}) cannot be appended to")
