"""Cache policies (LRU, ARC, ...), their registry, and `simulate`."""

from kvtier.errors import UnknownPolicyError
from kvtier.policies.admission import ADMISSIONS, SecondSightingAdmission, with_admission
from kvtier.policies.arc import ARCCachePolicy
from kvtier.policies.base import CachePolicy
from kvtier.policies.lct import LCTCachePolicy
from kvtier.policies.lru import LRUCachePolicy
from kvtier.policies.simulate import SimulationResult, partial_block_flags, simulate

POLICIES: dict[str, type[CachePolicy]] = {
    LRUCachePolicy.name: LRUCachePolicy,
    ARCCachePolicy.name: ARCCachePolicy,
    LCTCachePolicy.name: LCTCachePolicy,
}
"""Policy classes by the name a config file uses."""


def get_policy_class(name: str) -> type[CachePolicy]:
    """The policy class registered as `name`; UnknownPolicyError lists the valid names."""
    try:
        return POLICIES[name]
    except (KeyError, TypeError):
        raise UnknownPolicyError(str(name), list(POLICIES)) from None


__all__ = [
    "ADMISSIONS",
    "POLICIES",
    "ARCCachePolicy",
    "CachePolicy",
    "LCTCachePolicy",
    "LRUCachePolicy",
    "SecondSightingAdmission",
    "SimulationResult",
    "get_policy_class",
    "partial_block_flags",
    "simulate",
    "with_admission",
]
