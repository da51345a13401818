"""Types of the compiled lct (`_lct_core.pyx`) for mypy: the pure-Python lct's interface and
the inspection methods the compiled class adds."""

from kvtier.keys import OffloadKey
from kvtier.policies.lct import History, PureLCTCachePolicy

class LCTCachePolicy(PureLCTCachePolicy):
    def queues(self) -> list[list[OffloadKey]]: ...
    def ghosts(self) -> list[tuple[OffloadKey, History]]: ...
