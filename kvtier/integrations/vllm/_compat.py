"""The vLLM release this adapter is written against, checked once at import.

vLLM's offloading interfaces (`SecondaryTierManager`, `CachePolicy`, `OffloadingSpec`) change
between releases; an adapter that silently half-fits a newer one would be worse than a clear
refusal, so any version other than the pinned one is an ImportError naming both.
"""

from __future__ import annotations

import os

SUPPORTED_VLLM = "0.33"
"""The vLLM release line whose offloading interfaces this adapter implements."""


def check_vllm_version() -> str:
    """vLLM's version, or ImportError when vLLM is missing or not the supported release.
    `KVTIER_VLLM_ANY_VERSION=1` lets another version through (at the user's risk)."""
    try:
        import vllm
    except ImportError as error:
        raise ImportError(
            "kvtier.integrations.vllm needs vLLM "
            f"{SUPPORTED_VLLM}: `pip install 'kvtier[vllm]'` ({error})"
        ) from error
    found = str(getattr(vllm, "__version__", "unknown"))
    if found.split("+")[0].rsplit(".", 1)[0] != SUPPORTED_VLLM and os.environ.get(
        "KVTIER_VLLM_ANY_VERSION"
    ) != "1":
        raise ImportError(
            f"kvtier.integrations.vllm is written for vLLM {SUPPORTED_VLLM}.x, found {found}; "
            "install vllm==0.33.0, or set KVTIER_VLLM_ANY_VERSION=1 to try anyway"
        )
    return found
