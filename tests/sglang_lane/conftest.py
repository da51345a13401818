"""The SGLang lane's set-up (its own rootdir: see pytest.ini).

These tests need SGLang 0.5.23 (`scripts/setup.sh --sglang` builds .venv-sglang/). Where it
is missing they are skipped, saying how to install it, except with CI=true, where that is an
error: CI installs it, so a lane that cannot run must fail, not pass empty.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(Path(__file__).resolve().parent), str(TESTS)]

from cpu_shims import install_torchvision_stand_in  # noqa: E402

from kvtier.testing.keyed import AUTH_KEY_ENV, fixed_key_hex  # noqa: E402

os.environ.setdefault(AUTH_KEY_ENV, fixed_key_hex())

SGLANG = ("sglang", "0.5.23")
"""The distribution and release the lane is written for."""


def missing_sglang() -> str | None:
    """Why SGLang is not usable in this environment, or None."""
    name, release = SGLANG
    try:
        found = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return f"{name} is not installed here (scripts/setup.sh --sglang builds .venv-sglang/)"
    if found != release:
        return f"{name} {found} is installed; the SGLang lane is written for {release}"
    return None


SGLANG_REASON = missing_sglang()
if SGLANG_REASON is None:
    install_torchvision_stand_in()
if SGLANG_REASON is not None and os.environ.get("CI") == "true":
    raise RuntimeError(
        f"CI runs the SGLang lane, but {SGLANG_REASON}; scripts/test installs it with "
        "`scripts/setup.sh --sglang`"
    )

from redis_helpers import redis_clean, server  # noqa: E402, F401  (the Redis fixtures)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if SGLANG_REASON is None:
        return
    skip = pytest.mark.skip(reason=SGLANG_REASON)
    for item in items:
        item.add_marker(skip)


FIGURES = pytest.StashKey[list[str]]()


@pytest.fixture(scope="session")
def report(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Adds a line to the lane's closing summary (what SGLang and kvtier did)."""
    lines: list[str] = request.config.stash.setdefault(FIGURES, [])
    return lines.append


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    lines = config.stash.get(FIGURES, [])
    if lines:
        terminalreporter.section("SGLang's HiCache controller with kvtier")
        for line in lines:
            terminalreporter.write_line(line)
