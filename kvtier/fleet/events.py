"""vLLM's KV events, as kvtier writes them: the same msgspec classes, the same encoding.

These mirror `vllm.distributed.kv_events` of vLLM 0.33 field for field (names, order,
defaults, tagging), so a consumer built on vLLM's classes decodes kvtier's batches unchanged
(`tests/test_fleet_events.py` decodes them with vLLM's own). vLLM is not imported: it is an
optional extra, and a node may run kvtier alone.

What a chain event becomes (`to_wire`):

- a stored batch -> `BlockStored`: `block_hashes` the keys in the order stored (a put's
  prefix order), `parent_block_hash` None (the chain is not told a batch's parent),
  `token_ids` [] (the chain never sees tokens), `block_size` the `[events]`
  `wire_block_size` (tokens; 0 unknown), `medium` the tier's medium (`wire_medium`),
  `ownership` the tier's name (vLLM: "secondary offloading tier identifier");
- keys are kvtier's key bytes, or with `[events] block_hashes` the int vLLM's own events
  carry for the block ("vllm-int") or SGLang's ("sglang-int"), so a router that also reads
  the engine's events sees one key for one block;
- a removed batch -> `BlockRemoved` (keys, medium, ownership);
- the chain closed (and a publisher's first batch: what an earlier incarnation announced is
  void) -> `AllBlocksCleared`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from kvtier.keys import GROUP_IDX_BYTES, SGLANG_PAGE_TAG
from kvtier.manager.base import OffloadingEvent
from kvtier.manager.events import AllCleared, ChainEvent


class EventBatch(
    msgspec.Struct,
    array_like=True,
    omit_defaults=True,
    gc=False,
):
    """vLLM's `EventBatch`: when, and the events of one message."""

    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(
    msgspec.Struct,
    omit_defaults=True,
    gc=False,
    tag=True,
):
    """vLLM's base of every event (tagged by class name)."""


class BlockStored(KVCacheEvent):
    """Blocks became readable on one tier."""

    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


class BlockRemoved(KVCacheEvent):
    """Blocks left one tier."""

    block_hashes: list[bytes | int]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    """Every block of the node is gone."""


class KVEventBatch(EventBatch):
    """One message's payload."""

    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


WireEvent = BlockStored | BlockRemoved | AllBlocksCleared

_VLLM_MEDIA = {"gpu": "GPU", "cpu": "CPU"}


def wire_medium(medium: str) -> str:
    """A kvtier medium as the events name it: vLLM's "GPU" and "CPU" for those, the medium
    upper-cased for the others ("DISK", "REDIS", "SHARED-FS"), so a router can weigh tiers."""
    return _VLLM_MEDIA.get(medium, medium.upper())


_INT64 = (1 << 64) - 1


def vllm_int_hash(key: bytes) -> int:
    """The int vLLM's events carry for the block whose kvtier key is `key` (vLLM's
    `maybe_convert_block_hash` with `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`, its default: the
    block hash's low 64 bits; the key is the block hash then its group index)."""
    return int.from_bytes(key[:-GROUP_IDX_BYTES], "big") & _INT64


def sglang_int_hash(key: bytes) -> int:
    """The int64 SGLang's events carry for the page whose kvtier key is `key` (SGLang's
    `hash_str_to_int64`: the digest's first 8 bytes, signed). A key not made from a hex page
    hash (another tag) gets the same rule over its own digest: an int SGLang's decoder
    reads, which no SGLang event carries."""
    return int.from_bytes(key[len(SGLANG_PAGE_TAG) : len(SGLANG_PAGE_TAG) + 8], "big", signed=True)


_BLOCK_HASHES: dict[str, Callable[[bytes], bytes | int]] = {
    "bytes": bytes,
    "vllm-int": vllm_int_hash,
    "sglang-int": sglang_int_hash,
}


def to_wire(event: ChainEvent, block_size: int, block_hashes: str = "bytes") -> WireEvent:
    """`event` as vLLM's class (`block_size`: the tokens a block holds, 0 unknown;
    `block_hashes`: how keys are written, `EventsConfig.block_hashes`)."""
    if isinstance(event, AllCleared):
        return AllBlocksCleared()
    if not isinstance(event, OffloadingEvent):
        raise TypeError(f"not a chain event: {type(event).__name__}")
    convert = _BLOCK_HASHES[block_hashes]
    keys: list[bytes | int] = [convert(bytes(key)) for key in event.keys]
    medium = wire_medium(str(event.medium))
    if event.removed:
        return BlockRemoved(block_hashes=keys, medium=medium, ownership=event.tier)
    return block_stored(keys, medium, block_size=block_size, ownership=event.tier)


def block_stored(
    keys: Sequence[bytes | int],
    medium: str | None,
    *,
    block_size: int = 0,
    ownership: str | None = None,
) -> BlockStored:
    """A `BlockStored` of `keys` on `medium`, vLLM's fields that kvtier does not know (parent,
    token ids, LoRA) empty: what a node publishes, and what tests and benchmarks feed."""
    return BlockStored(
        block_hashes=list(keys),
        parent_block_hash=None,
        token_ids=[],
        block_size=block_size,
        lora_id=None,
        medium=medium,
        lora_name=None,
        ownership=ownership,
    )


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(KVEventBatch)


def encode_batch(batch: KVEventBatch) -> bytes:
    """The payload frame of one message."""
    return _ENCODER.encode(batch)


def decode_batch(payload: bytes) -> KVEventBatch:
    """A payload frame back (raises msgspec.DecodeError / ValidationError when malformed)."""
    return _DECODER.decode(payload)
