"""Shared test set-up: GPU-only tests are skipped, with the reason, where CUDA is absent."""

from __future__ import annotations

import pytest


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (marked gpu); none is present")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
