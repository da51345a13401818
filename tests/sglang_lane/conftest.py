"""The SGLang lane's set-up (its own rootdir: see pytest.ini).

These tests need SGLang 0.5.23 (`scripts/setup.sh --sglang` builds .venv-sglang/). Where it
is missing they are skipped, saying how to install it, except with CI=true, where that is an
error: CI installs it, so a lane that cannot run must fail, not pass empty.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(Path(__file__).resolve().parent), str(TESTS)]

from cpu_shims import install_torchvision_stand_in  # noqa: E402
from lane_helpers import (  # noqa: E402
    fail_under_ci,
    figures,
    missing_release,
    skip_all,
    write_figures,
)

from kvtier.testing.keyed import AUTH_KEY_ENV, fixed_key_hex  # noqa: E402

os.environ.setdefault(AUTH_KEY_ENV, fixed_key_hex())

SGLANG = ("sglang", "0.5.23")
"""The distribution and release the lane is written for."""


def missing_sglang() -> str | None:
    """Why SGLang is not usable in this environment, or None."""
    name, release = SGLANG
    setup = "scripts/setup.sh --sglang builds .venv-sglang/"
    return missing_release(name, release, "SGLang", setup)


SGLANG_REASON = missing_sglang()
if SGLANG_REASON is None:
    install_torchvision_stand_in()
fail_under_ci("SGLang", SGLANG_REASON, "--sglang")

from redis_helpers import redis_clean, server  # noqa: E402, F401  (the Redis fixtures)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_all(items, SGLANG_REASON)


@pytest.fixture(scope="session")
def report(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Adds a line to the lane's closing summary (what SGLang and kvtier did)."""
    return figures(request.config).append


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    write_figures(terminalreporter, config, "SGLang's HiCache controller with kvtier")
