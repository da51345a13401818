"""What a vLLM user sees of kvtier, and what kvtier leaves behind: its log lines in vLLM's log,
its metrics on a port of their own, a closing line of figures, and vLLM's shared offload file
removed on every exit kvtier can reach.

- **Log lines**: vLLM configures the `vllm` logger only, so without this kvtier's INFO lines
  (which tiers opened, where; the figures at close) are lost under `vllm serve`.
  `join_vllm_logging` gives the `kvtier` logger vLLM's handlers and level when nothing else
  would show its lines (an embedder's logging set-up wins).
- **Metrics**: vLLM's `/metrics` is served by its API server process, which cannot see
  kvtier's counters (they live in the engine-core process, where vLLM's scheduler runs
  kvtier). `kvtier_metrics_port` in `kv_connector_extra_config` serves kvtier's Prometheus
  metrics (`kvtier_tier_hits_total` ...) from the engine-core process on that port.
- **The shared offload region** (`/dev/shm/vllm_offload_<engine id>.mmap`, as large as the
  host tier) is created by vLLM's `SharedOffloadRegion`, and unlinked by vLLM only in the
  cleanup of the process that created it. `remove_region_at_exit` removes it again when the
  process exits (an `atexit` hook: a normal exit, `SystemExit` from vLLM's SIGINT / SIGTERM
  handlers, an exception), so an interrupted engine leaves no file; only a SIGKILL (or a crash
  of the interpreter) can, and then `rm /dev/shm/vllm_offload_*.mmap` (with no vLLM running)
  frees the memory.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from typing import Any

from kvtier.chain.stats import HierarchyStats

log = logging.getLogger("kvtier.integrations.vllm")

REGION_DIRECTORY = "/dev/shm"
"""Where vLLM's `SharedOffloadRegion` puts its file."""

_REGIONS: set[str] = set()
"""Region files this process removes at exit."""
_REGIONS_LOCK = threading.Lock()


def region_path(engine_id: str) -> str:
    """The file of vLLM's shared offload region of the engine `engine_id` (the name vLLM's
    `SharedOffloadRegion` gives it)."""
    return f"{REGION_DIRECTORY}/vllm_offload_{engine_id}.mmap"


def remove_region(path: str) -> bool:
    """Unlink the region file at `path` if it is still there (the mappings of the processes
    that have it open stay valid; the memory is freed once the last one unmaps it). True
    when this call removed it."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    except OSError as error:
        log.warning("could not remove vLLM's offload region %s: %s", path, error)
        return False
    log.info("removed vLLM's offload region %s", path)
    return True


def _remove_regions_at_exit() -> None:
    with _REGIONS_LOCK:
        paths = sorted(_REGIONS)
        _REGIONS.clear()
    for path in paths:
        remove_region(path)


_hook_registered = False


def remove_region_at_exit(engine_id: str) -> str:
    """Have this process remove the region file of `engine_id` when it exits (see the
    module's docstring); returns the path."""
    global _hook_registered
    path = region_path(engine_id)
    with _REGIONS_LOCK:
        _REGIONS.add(path)
        if not _hook_registered:
            atexit.register(_remove_regions_at_exit)
            _hook_registered = True
    return path


def join_vllm_logging() -> None:
    """Route the `kvtier` logger's lines to vLLM's log handlers, at vLLM's level, when nothing
    else would show them: the `kvtier` logger has no handlers of its own and the root logger
    none either (an embedder's or a test runner's logging set-up wins)."""
    ours = logging.getLogger("kvtier")
    theirs = logging.getLogger("vllm")
    if ours.handlers or logging.getLogger().handlers or not theirs.handlers:
        return
    for handler in theirs.handlers:
        ours.addHandler(handler)
    if ours.level == logging.NOTSET:
        ours.setLevel(theirs.getEffectiveLevel())


def metrics_port(value: Any) -> int | None:
    """`kvtier_metrics_port` from `kv_connector_extra_config`: None, or a port number."""
    from kvtier.errors import ConfigError

    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise ConfigError(
            [f"kvtier_metrics_port: a TCP port number (1-65535), got {value!r}"],
            source="kv_connector_extra_config",
        )
    return value


def closing_line(stats: HierarchyStats) -> str:
    """kvtier's figures at close, one line: per tier, the lookups it answered (hits), the
    keys it was asked and lacked, the blocks stored in it, those rejected by their checksum,
    and the blocks it holds."""
    held = {tier.name: tier.used for tier in stats.tiers}
    parts = [
        f"{tier.name}: {tier.hits} hits, {tier.misses} misses, {tier.stored} stored, "
        f"{tier.corrupt} corrupt, {held.get(tier.name, 0)} held"
        for tier in stats.activity
    ]
    return "; ".join(parts) or "no tiers"


def close_quietly(resource: Any, what: str) -> None:
    """`resource.close()`, a failure logged (shutting down must go on)."""
    try:
        resource.close()
    except Exception as error:
        log.warning("could not close %s: %r", what, error)
