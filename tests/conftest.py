"""Shared test set-up: GPU-only tests are skipped, with the reason, where CUDA is absent;
the vLLM adapter's tests (tests/test_vllm_*.py) run where vLLM 0.33 is installed (always in
CI, where a missing vLLM is an error) and are left out, said once, elsewhere."""

from __future__ import annotations

import importlib.util
import os

import pytest
from redis_helpers import redis_clean, server  # noqa: F401  (fixtures of the Redis tests)


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


if not _cuda():
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # before a test module imports vLLM

VLLM_MISSING = importlib.util.find_spec("vllm") is None
if VLLM_MISSING and os.environ.get("CI") == "true":
    raise RuntimeError(
        "CI runs the vLLM adapter's tests, but vLLM is not installed: scripts/test installs "
        "it with `scripts/setup.sh --vllm`"
    )
collect_ignore_glob = ["test_vllm_*.py"] if VLLM_MISSING else []
# The engine lane (tests/engine/: vLLM's CPU build serving a model) runs in an environment of
# its own, with its own pytest.ini (scripts/test runs it after this suite); never here.
# The SGLang lane (tests/sglang_lane/: SGLang's own HiCache controller driving kvtier) too.
collect_ignore = ["engine", "sglang_lane"]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if VLLM_MISSING:
        terminalreporter.write_line(
            "vLLM is not installed: the vLLM adapter's tests (tests/test_vllm_*.py) did not "
            "run; `scripts/setup.sh --vllm` installs it"
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (marked gpu); none is present")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
