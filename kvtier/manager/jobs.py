"""Transfer jobs: the chained manager's decisions, as plain data for the transfer engine.

A job is an ordered list of copy steps between tiers. Order matters and is part of the
decision: a block evicted from a tier is copied down (demoted) *before* the slot it leaves is
rewritten, so a job that demotes a victim and then writes into its old slot lists the demotion
first. The engine runs the steps of one job in order and reports which (tier, key) pairs
failed; the manager then completes the bookkeeping in one call (`complete_job`).
`slot_ids` reads the slots a tier's spec names, as the steps hold them.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from kvtier.blocks import BlockStatus
from kvtier.errors import BlockStateError
from kvtier.keys import OffloadKey
from kvtier.specs import BlockIDsLoadStoreSpec, LoadStoreSpec

_job_ids = itertools.count(1)


def slot_ids(spec: LoadStoreSpec) -> npt.NDArray[np.int64]:
    """The slot ids of a slot-addressed spec (every tier kvtier builds has one)."""
    if not isinstance(spec, BlockIDsLoadStoreSpec):
        raise BlockStateError(f"expected a slot-addressed spec, got {type(spec).__name__}")
    return spec.block_ids


class JobKind(enum.Enum):
    """Why a job exists; the engine runs PROMOTE and DEMOTE jobs before CASCADE jobs."""

    PROMOTE = "promote"
    """Copy a block up from the lower tier that holds it to the top tier (for a read)."""
    DEMOTE = "demote"
    """Copy blocks evicted from a tier down to the next tier (before a store reuses slots)."""
    CASCADE = "cascade"
    """Write-through: copy newly stored blocks down the chain. May be dropped under load."""


@dataclass(frozen=True, slots=True)
class CopyStep:
    """Copy `keys` from slots `src_ids` of tier `src` to slots `dst_ids` of tier `dst`."""

    keys: tuple[OffloadKey, ...]
    src: int
    src_ids: npt.NDArray[np.int64]
    dst: int
    dst_ids: npt.NDArray[np.int64]

    def __post_init__(self) -> None:
        if not len(self.keys) == len(self.src_ids) == len(self.dst_ids):
            raise BlockStateError(
                f"a copy of {len(self.keys)} blocks from {len(self.src_ids)} slots of tier "
                f"{self.src} to {len(self.dst_ids)} slots of tier {self.dst}"
            )

    def __len__(self) -> int:
        return len(self.keys)


@dataclass(slots=True)
class TransferJob:
    """Steps to run in order, and the bookkeeping to complete when they are done.

    `pins`: (tier, keys) pinned for reading until the job completes.
    `pending`: (tier, keys) being written by the job; they become readable (or are dropped)
    when it completes.
    `promoted`: the keys a PROMOTE job brings to the top tier (empty if it cannot reach it).
    `drain`: (tier, blocks) evicted by a background demotion whose slots stay out of the free
    list until the job has read them (`TieredManager.release_sources`).
    `background`: a demotion planned to keep a tier's reserve of free slots (no caller waits).
    `source`: a PROMOTE job's tier it reads its blocks from.
    """

    kind: JobKind
    steps: list[CopyStep] = field(default_factory=list)
    pins: list[tuple[int, tuple[OffloadKey, ...]]] = field(default_factory=list)
    pending: list[tuple[int, tuple[OffloadKey, ...]]] = field(default_factory=list)
    promoted: tuple[OffloadKey, ...] = ()
    drain: list[tuple[int, list[BlockStatus]]] = field(default_factory=list)
    background: bool = False
    source: int | None = None
    sources_released: bool = False
    """Set once the job no longer reads its sources: pins and drained slots given back."""
    id: int = field(default_factory=lambda: next(_job_ids))

    def pending_pairs(self) -> set[tuple[int, OffloadKey]]:
        """Every (tier, key) the job is writing."""
        return {(tier, key) for tier, keys in self.pending for key in keys}

    @property
    def num_blocks(self) -> int:
        """Block copies the job makes."""
        return sum(len(step) for step in self.steps)

    def __repr__(self) -> str:
        moves = ", ".join(f"{len(s)}x {s.src}->{s.dst}" for s in self.steps)
        return f"TransferJob(#{self.id} {self.kind.value}: {moves or 'no copies'})"


@dataclass(eq=False, slots=True)
class PromotionHold:
    """A reader's claim on the blocks a PROMOTE job brings to the top tier.

    When the job completes, each held key that arrived is pinned at the top for the reader
    (`granted`), in the same step that makes it readable, so no other store or promotion can
    evict it before the reader copies it out. The reader must `complete_load(granted)`.
    """

    job_id: int
    keys: tuple[OffloadKey, ...]
    granted: list[OffloadKey] | None = None
    """None while the job runs; then the keys pinned for the reader."""
    slots: npt.NDArray[np.int64] | None = None
    """The top-tier slots of `granted`, in the same order."""
    source: int | None = None
    """The tier the job reads its blocks from: where a reader that joined it found them."""


def failed_pairs_of(
    job: TransferJob, failed: set[tuple[int, OffloadKey]]
) -> set[tuple[int, OffloadKey]]:
    """`failed` closed over the job's steps: a copy whose source failed fails too.

    The engine uses this to skip steps whose bytes never arrived (a block that failed its
    checksum on disk must not be copied on up the chain)."""
    closed = set(failed)
    for step in job.steps:
        for key in step.keys:
            if (step.src, key) in closed:
                closed.add((step.dst, key))
    return closed
