"""What every serving-engine adapter does with the kvtier config it is given: read it (a TOML
path, a dict, or the embedded default without its gpu tier), and check that no kvtier tier
sits where the engine's own GPU memory already is."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvtier.config import default_config_path, read_config_file
from kvtier.errors import ConfigError, InvalidValueError

ConfigSource = str | os.PathLike[str] | Mapping[str, Any] | None
"""A kvtier TOML file path, a dict of the same schema, or None for the embedded default."""


def read_engine_config(config: ConfigSource, engine: str, what: str) -> tuple[dict[str, Any], str]:
    """The raw config data and where it came from (for messages). None is the embedded
    default config without its gpu tier (the engine's GPU memory is above kvtier's tiers).
    `engine` names the serving engine, `what` the option that gave the config."""
    if config is None:
        path = default_config_path()
        data = read_config_file(path)
        tiers = [tier for tier in data.get("tiers", []) if tier.get("medium") != "gpu"]
        return {**data, "tiers": tiers}, f"{path} (without its gpu tier)"
    if isinstance(config, Mapping):
        return dict(config), f"the kvtier config given to {engine}"
    if isinstance(config, str | os.PathLike):
        path = Path(os.path.expandvars(os.path.expanduser(os.fspath(config))))
        return read_config_file(path), str(path)
    raise InvalidValueError(
        f"{what} must be a TOML file path or a dict of the same schema, got {type(config).__name__}"
    )


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
