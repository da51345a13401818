"""Cache policies (LRU, ARC, S3-FIFO, lct, auto), their registry, and `simulate`."""

from kvtier.policies.admission import ADMISSIONS, SecondSightingAdmission, with_admission
from kvtier.policies.arc import ARCCachePolicy
from kvtier.policies.auto import AutoCachePolicy
from kvtier.policies.base import CachePolicy
from kvtier.policies.lct import LCTCachePolicy
from kvtier.policies.lru import LRUCachePolicy
from kvtier.policies.registry import POLICIES, get_policy_class
from kvtier.policies.s3fifo import S3FIFOCachePolicy
from kvtier.policies.simulate import SimulationResult, partial_block_flags, simulate

__all__ = [
    "ADMISSIONS",
    "POLICIES",
    "ARCCachePolicy",
    "AutoCachePolicy",
    "CachePolicy",
    "LCTCachePolicy",
    "LRUCachePolicy",
    "S3FIFOCachePolicy",
    "SecondSightingAdmission",
    "SimulationResult",
    "get_policy_class",
    "partial_block_flags",
    "simulate",
    "with_admission",
]
