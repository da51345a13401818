"""`ChainCounters`: what a chain of tiers did, in blocks, since it was built.

One instance per `TieredManager`, shared by the parts that count: the manager (look-ups,
hits, misses), its planner (`planner.py`: promotions, demotions, cascades, hints, reserve
refills) and its job ledger (`ledger.py`: failed copies, dropped cascades, corrupt blocks).
`kvtier.chain.stats` snapshots it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class ChainCounters:
    """What the chain did since it was built (block counts)."""

    lookups: int = 0
    """Keys answered: each a hit of one tier or a miss of the chain (`lookups` = `misses` +
    sum of `hits`). A key answered "ask again" (being written, already being promoted) is
    counted when it is answered, or when a get serves it from its in-flight copy
    (`count_staged_hits`)."""
    hits: list[int] = field(default_factory=list)
    """Lookups answered from each tier: index 0 ready at the top, i > 0 found in tier i
    (a promotion started) or served from its copy on its way into tier i (a demotion's
    snapshot in the staging arena: `count_staged_hits`)."""
    misses: int = 0
    """Keys asked of every tier and held by none (`lookup_many`, `held_prefix`): a miss of
    each tier. Tier i's misses are these plus the hits of the tiers below it."""
    promotions: int = 0
    promotions_refused: int = 0
    partial_refused: int = 0
    """Partial blocks (`prepare_store(partial=...)`) not stored."""
    demoted: int = 0
    demotions_dropped: int = 0
    demotions_refused: int = 0
    """Victims the tier below did not admit (its admission filter or policy): dropped."""
    dropped_at_bottom: int = 0
    hint_dropped: int = 0
    """Victims hinted "never": dropped instead of demoted to the tier below."""
    hint_not_cascaded: int = 0
    """Blocks hinted "never" that a cascade did not copy down the chain: write-through as
    they were stored, or a flush (`plan_flush`)."""
    cascaded: int = 0
    cascades_dropped: int = 0
    copy_failures: int = 0
    corrupt_dropped: int = 0
    reserve_evicted: int = 0
    """Blocks evicted in the background to keep a tier's reserve of free slots."""
