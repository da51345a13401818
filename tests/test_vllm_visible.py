"""What a vLLM user sees of kvtier and what kvtier leaves behind (issue 35, item 5): vLLM's
shared offload file in /dev/shm removed on every exit kvtier can reach (a clean close, an
interrupted process), kvtier's log lines in vLLM's log, its metrics on a port of their own,
and a closing line of figures. No engine is served: vLLM's offloading classes are driven
directly (an interrupted engine is a child process that exits without closing anything)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest
from ports import free_port

from kvtier.errors import ConfigError
from kvtier.integrations.vllm import KvtierOffloadingSpec
from kvtier.integrations.vllm.testing import offloading_config
from kvtier.integrations.vllm.visible import region_path

BLOCK = 4096

pytestmark = pytest.mark.skipif(
    not Path("/dev/shm").is_dir(), reason="vLLM's shared offload region lives in /dev/shm"
)


def chain(tmp_path: Path) -> dict[str, Any]:
    return {
        "tiers": [
            {"name": "host", "medium": "cpu", "capacity": 4},
            {
                "name": "disk",
                "medium": "disk",
                "capacity": 16,
                "path": str(tmp_path / "d"),
                "fsync": False,
            },
        ]
    }


def make_spec(extra: dict[str, Any]) -> KvtierOffloadingSpec:
    config = offloading_config(
        extra, block_bytes=BLOCK, engine_id=f"kvtier-visible-{uuid.uuid4().hex[:12]}"
    )
    return KvtierOffloadingSpec(config)


def test_a_clean_close_leaves_no_region_file(tmp_path: Path) -> None:
    spec = make_spec({"kvtier_config": chain(tmp_path)})
    manager = spec.get_manager()
    path = Path(region_path(spec._engine_id))
    assert path.exists()  # vLLM's scheduler-side region, as large as the host tier
    assert path.stat().st_size == 4 * BLOCK
    manager.shutdown()
    assert not path.exists()


INTERRUPTED = textwrap.dedent(
    """
    import os, signal, sys, uuid
    from kvtier.integrations.vllm import KvtierOffloadingSpec
    from kvtier.integrations.vllm.testing import offloading_config
    from kvtier.integrations.vllm.visible import region_path

    config = offloading_config(
        {{"kvtier_config": {chain!r}}}, block_bytes={block},
        engine_id="kvtier-interrupted-" + uuid.uuid4().hex[:12],
    )
    spec = KvtierOffloadingSpec(config)
    manager = spec.get_manager()  # never shut down: the engine is interrupted
    path = region_path(spec._engine_id)
    assert os.path.exists(path)
    print(path, flush=True)
    if sys.argv[1] == "sigint":
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C: KeyboardInterrupt
    raise SystemExit(3)  # what vLLM's SIGTERM / SIGINT handlers raise in its engine core
    """
)


@pytest.mark.parametrize("how", ["sigint", "system_exit"])
def test_an_interrupted_engine_leaves_no_region_file(tmp_path: Path, how: str) -> None:
    script = INTERRUPTED.format(chain=chain(tmp_path), block=BLOCK)
    done = subprocess.run(
        [sys.executable, "-c", script, how],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    printed = done.stdout.strip().splitlines()
    assert printed and printed[-1].startswith("/dev/shm/vllm_offload_"), done.stderr[-2000:]
    expected = -signal.SIGINT if how == "sigint" else 3
    # KeyboardInterrupt unhandled: Python exits with status 1 (and a traceback); since 3.8 a
    # SIGINT re-raised at exit can also show as -SIGINT: either way, interrupted.
    assert done.returncode in ((expected, 1) if how == "sigint" else (expected,))
    assert not Path(printed[-1]).exists()


SERVED = textwrap.dedent(
    """
    import urllib.request, uuid
    from vllm.config.logging import LoggingConfig
    from vllm.logger import configure_logging

    configure_logging(LoggingConfig())  # what vLLM's engine core does as it starts
    from kvtier.integrations.vllm import KvtierOffloadingSpec
    from kvtier.integrations.vllm.testing import offloading_config

    config = offloading_config(
        {{"kvtier_config": {chain!r}, "kvtier_metrics_port": {port}}}, block_bytes={block},
        engine_id="kvtier-logged-" + uuid.uuid4().hex[:12],
    )
    manager = KvtierOffloadingSpec(config).get_manager()
    (tier,) = manager.secondary_tiers
    scraped = urllib.request.urlopen(tier.metrics_server.url, timeout=10).read().decode()
    print("SCRAPED", [line for line in scraped.splitlines() if "tier_hits_total{{" in line])
    url = tier.metrics_server.url
    manager.shutdown()
    try:
        urllib.request.urlopen(url, timeout=10)
        print("METRICS STILL SERVED")
    except OSError:
        print("METRICS CLOSED")
    """
)


def test_kvtier_lines_join_vllms_log_with_metrics_and_figures_at_close(tmp_path: Path) -> None:
    """A process set up as `vllm serve` sets it up (vLLM's logging only): kvtier's lines at
    start and close appear in vLLM's log, and its metrics are served on their own port."""
    port = free_port()
    script = SERVED.format(chain=chain(tmp_path), port=port, block=BLOCK)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=240, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert (
        'SCRAPED [\'kvtier_tier_hits_total{hierarchy="KvtierSecondaryTier",tier="disk"} 0.0\']'
        in output
    )
    lines = [line for line in output.splitlines() if "kvtier secondary tier" in line]
    assert len(lines) == 2, output[-3000:]
    opened, closed = lines
    assert "INFO" in opened and "[secondary.py" in opened  # vLLM's format
    assert opened.endswith(f"; metrics at http://127.0.0.1:{port}/metrics")
    assert closed.endswith(
        "kvtier secondary tier 'KvtierSecondaryTier' closed: "
        "disk: 0 hits, 0 misses, 0 stored, 0 corrupt, 0 held"
    )
    assert "METRICS CLOSED" in output  # shutdown stopped the metrics server


@pytest.mark.parametrize("port", [0, 70000, "9400", True])
def test_a_bad_metrics_port_is_one_line_naming_it(tmp_path: Path, port: Any) -> None:
    with pytest.raises(ConfigError, match="kvtier_metrics_port: a TCP port number") as raised:
        make_spec({"kvtier_config": chain(tmp_path), "kvtier_metrics_port": port})
    assert repr(port) in str(raised.value)


def test_region_path_is_vllms(tmp_path: Path) -> None:
    spec = make_spec({"kvtier_config": chain(tmp_path)})
    manager = spec.get_manager()
    try:
        assert manager.primary_tier._mmap_region.mmap_path == region_path(spec._engine_id)
    finally:
        manager.shutdown()
    assert os.path.basename(region_path("e")) == "vllm_offload_e.mmap"


def test_one_cpu_worker_then_the_scheduler_unlinks_the_file_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An engine's order (its worker maps the region as its KV caches are registered, then the
    scheduler): with one worker both processes have it mapped, so the name goes at once and
    no exit, a SIGKILL included, can leave the file; the bytes stay shared."""
    import torch
    from vllm.v1.kv_offload.base import (
        CanonicalKVCacheRef,
        CanonicalKVCaches,
        CanonicalKVCacheTensor,
    )

    spec = make_spec({"kvtier_config": chain(tmp_path)})
    gpu = torch.zeros(8, BLOCK, dtype=torch.int8)
    caches = CanonicalKVCaches(
        tensors=[CanonicalKVCacheTensor(gpu, BLOCK)],
        group_data_refs=[[CanonicalKVCacheRef(0, BLOCK)]],
    )
    worker = spec.get_worker(caches)
    path = Path(region_path(spec._engine_id))
    assert path.exists()
    manager = spec.get_manager()
    try:
        assert not path.exists()
        worker._region.base_tensor[5] = 7  # the worker's mapping and the scheduler's: one
        assert int(manager.primary_tier._mmap_region.base_tensor[5]) == 7
    finally:
        worker.shutdown()
        manager.shutdown()
    assert not [r for r in caplog.records if "Failed to unlink" in r.getMessage()]
