"""What every serving-engine adapter checks in a kvtier config it is given: no kvtier tier may
sit where the engine's own GPU memory already is."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvtier.errors import ConfigError


def refuse_gpu_tiers(data: Mapping[str, Any], source: str, engine: str, above: str) -> None:
    """Raise ConfigError naming every `medium = "gpu"` tier of the raw config `data`: under
    `engine`, `above` (the engine's own memory) sits above kvtier's tiers."""
    tiers = data.get("tiers")
    if not isinstance(tiers, list):
        return
    gpu = [
        str(tier.get("name", index))
        for index, tier in enumerate(tiers)
        if isinstance(tier, Mapping) and tier.get("medium") == "gpu"
    ]
    if gpu:
        raise ConfigError(
            [
                f"tier {name!r}: medium 'gpu' cannot be used under {engine} ({above} "
                "above kvtier's tiers); remove it"
                for name in gpu
            ],
            source=source,
        )
