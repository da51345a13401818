"""What `auto` (`kvtier.policies.auto`) shows of itself: the candidate serving, its instance
and the shadows', their hit ratios so far, the tier's recency order. A mixin of
`AutoCachePolicy`, apart from it to keep `auto.py` under the module limit; it reads the
state `AutoCachePolicy` keeps and changes nothing."""

from __future__ import annotations

from kvtier.blocks import BlockStatus
from kvtier.keys import OffloadKey
from kvtier.policies.base import CachePolicy


class AutoView:
    """Inspection of an `AutoCachePolicy` (see its module doc)."""

    candidates: tuple[str, ...]
    serving_index: int
    total_hits: list[int]
    accesses: int
    _serving: CachePolicy
    _policies: list[CachePolicy]
    _resident: dict[OffloadKey, BlockStatus]

    @property
    def serving(self) -> str:
        """The name of the candidate serving now."""
        return self.candidates[self.serving_index]

    @property
    def policy(self) -> CachePolicy:
        """The policy serving now (for inspection; drive `auto` itself)."""
        return self._serving

    def shadow(self, name: str) -> CachePolicy:
        """The instance of candidate `name`: a shadow, or the live policy if it serves."""
        return self._policies[self.candidates.index(name)]

    def shadow_hit_ratios(self) -> dict[str, float]:
        """Per candidate, its hit ratio over every access so far (the serving ones' live)."""
        return {
            name: hits / self.accesses if self.accesses else 0.0
            for name, hits in zip(self.candidates, self.total_hits, strict=True)
        }

    def lru_order(self) -> list[OffloadKey]:
        """Resident keys, least recently used first."""
        return list(self._resident)
