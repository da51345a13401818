"""What a serving engine embeds: kvtier as the offloading stack of an engine that owns paged
KV caches (vLLM's `kv_offload` vocabulary, no vLLM import).

- `handler.py`: `OffloadingHandler`, the worker-side interface that copies the blocks the
  scheduler-side manager planned (`transfer_async` / `get_finished` / `wait`).
- `paged_kv.py`: `PagedKVHandler`, copies between the serving engine's canonical paged KV
  caches and kvtier's host tier (every group and tensor; chunks of several GPU blocks).
- `offloading_spec.py`: `OffloadingSpec`, the bookkeeping for the engine's scheduler and the
  handlers for its workers, over an open `Hierarchy` whose top tier is host memory.

Nothing below this package (the chain, the transfer engine, the bookkeeping) imports it.
"""

from kvtier.embed.handler import OffloadingHandler, TransferResult, TransferSpec

__all__ = ["OffloadingHandler", "TransferResult", "TransferSpec"]
