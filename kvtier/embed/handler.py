"""`OffloadingHandler`: the worker-side half of an offloading spec, which copies the blocks
the manager planned.

The scheduler-side manager decides *what* moves (`LoadStoreSpec` pairs); a handler, in the
worker that owns the serving engine's KV caches, moves it, asynchronously: `transfer_async` starts a
job and returns at once, `get_finished` reports jobs that ended (each exactly once, in
submission order), `wait` blocks until given jobs ended. The vocabulary is vLLM's
`kv_offload` worker interface; the implementations are kvtier's (`embed/paged_kv.py`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection

from kvtier.specs.base import LoadStoreSpec

TransferSpec = tuple[LoadStoreSpec, LoadStoreSpec]
"""(source spec, destination spec) of one job."""

TransferResult = tuple[int, bool]
"""(job id, whether every block of the job arrived)."""


class OffloadingHandler(ABC):
    """Moves blocks between two media for one direction (e.g. GPU -> host)."""

    @abstractmethod
    def transfer_async(self, job_id: int, spec: TransferSpec) -> bool:
        """Start copying `spec`'s source blocks to its destination blocks; return at once.
        False when the job could not be started (it is then not reported by
        `get_finished`); a job started and failed is reported with success False."""

    @abstractmethod
    def get_finished(self) -> list[TransferResult]:
        """The jobs that ended since the last call, each once, in submission order."""

    @abstractmethod
    def wait(self, job_ids: Collection[int]) -> None:
        """Block until the given jobs ended (they are still reported by `get_finished`)."""

    def shutdown(self) -> None:
        """Finish or stop every job and release the handler's resources."""
        return
