"""The policies by the name a config file uses, and the lookup that names the valid ones."""

from kvtier.errors import UnknownPolicyError
from kvtier.policies.arc import ARCCachePolicy
from kvtier.policies.auto import AutoCachePolicy
from kvtier.policies.base import CachePolicy
from kvtier.policies.lct import LCTCachePolicy
from kvtier.policies.lru import LRUCachePolicy
from kvtier.policies.s3fifo import S3FIFOCachePolicy

POLICIES: dict[str, type[CachePolicy]] = {
    LRUCachePolicy.name: LRUCachePolicy,
    ARCCachePolicy.name: ARCCachePolicy,
    LCTCachePolicy.name: LCTCachePolicy,
    S3FIFOCachePolicy.name: S3FIFOCachePolicy,
    AutoCachePolicy.name: AutoCachePolicy,
}
"""Policy classes by the name a config file uses."""


def get_policy_class(name: str) -> type[CachePolicy]:
    """The policy class registered as `name`; UnknownPolicyError lists the valid names."""
    try:
        return POLICIES[name]
    except (KeyError, TypeError):
        raise UnknownPolicyError(str(name), list(POLICIES)) from None
