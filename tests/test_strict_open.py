"""Misconfiguration is loud (issue 19, item 6): `strict` defaults to true, so a tier that
cannot be opened (a mistyped disk path, a locked or damaged store) stops the open with a
KvtierError naming the tier and why, instead of leaving a memory-only chain behind without a
word. `strict = false` keeps "start without it", and then every `stats()` snapshot logs the
disabled tiers (at most once per `DISABLED_LOG_INTERVAL_S`)."""

from __future__ import annotations

import logging
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hierarchy_helpers import BLOCK, LAYOUTS, blocks_of, chain_config, key, store_class, tier_store

import kvtier.hierarchy
from kvtier import Hierarchy, HierarchyConfig
from kvtier.config import load_config, parse_config
from kvtier.errors import DiskLockedError, DiskTierError, KvtierError
from kvtier.tiers.disk.facade import StoreFacade

ROOT = Path(__file__).resolve().parent.parent


def mistyped(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    """cpu -> disk, the disk path's parent mistyped (it does not exist)."""
    config = chain_config(tmp_path, gpu=None, cpu=8, disk=16)
    config["tiers"][1]["path"] = str(tmp_path / "mnt-typo" / "kvtier")
    config.update(extra)
    return config


def test_strict_is_the_default() -> None:
    config = parse_config(
        {"block_size": BLOCK, "tiers": [{"name": "c", "medium": "cpu", "capacity": 4}]}
    )
    assert config.strict is True
    assert HierarchyConfig.model_fields["strict"].default is True


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.toml")), ids=lambda p: p.name)
def test_no_shipped_config_turns_strict_off(path: Path) -> None:
    """Copied as a start, a shipped config must not teach the silent memory-only fallback."""
    assert tomllib.loads(path.read_text()).get("strict", True) is True


def test_the_embedded_default_is_strict() -> None:
    assert load_config(ROOT / "configs" / "default.toml").strict is True


async def test_a_mistyped_disk_path_stops_the_open_naming_the_tier_and_why(
    tmp_path: Path,
) -> None:
    h = Hierarchy.from_config(mistyped(tmp_path))
    with pytest.raises(DiskTierError) as raised:
        await h.open()
    message = str(raised.value)
    assert message.startswith("tier 'disk' (disk) could not be opened: ")
    assert "mnt-typo" in message and "does not exist" in message
    assert "strict = false" in message  # says how to start without it
    assert isinstance(raised.value.__cause__, DiskTierError)
    assert h.closed
    assert not (tmp_path / "mnt-typo").exists()  # nothing grown on a typo


@pytest.mark.parametrize("layout", LAYOUTS)
async def test_a_locked_tier_keeps_its_error_class_and_names_the_tier(
    tmp_path: Path, layout: str
) -> None:
    config = chain_config(tmp_path, gpu=None, cpu=8, disk=16, layout=layout)
    holder = tier_store(layout, tmp_path / "disk", 16)
    try:
        with pytest.raises(
            DiskLockedError,
            match=r"^tier 'disk' \(disk\) could not be opened: "
            r"the (disk tier|log store) at .* is (already open|open in another process)",
        ):
            await Hierarchy.from_config(config).open()
    finally:
        holder.close()


@pytest.mark.parametrize("layout", LAYOUTS)
async def test_an_error_of_another_class_becomes_a_kvtier_error_naming_the_tier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    def no_memory(self: StoreFacade) -> Any:
        raise MemoryError("no memory for the restore (test)")

    monkeypatch.setattr(store_class(layout), "restore", no_memory)
    monkeypatch.setattr(store_class(layout), "restore_cold", no_memory)  # what a chain calls
    config = chain_config(tmp_path, gpu=None, cpu=8, disk=16, layout=layout)
    with pytest.raises(KvtierError) as raised:
        await Hierarchy.from_config(config).open()
    assert str(raised.value).startswith(
        "tier 'disk' (disk) could not be opened: MemoryError: no memory for the restore (test)"
    )
    assert isinstance(raised.value.__cause__, MemoryError)


async def test_not_strict_starts_without_the_tier_and_stats_keep_saying_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    with caplog.at_level(logging.WARNING, logger="kvtier"):
        async with Hierarchy.from_config(mistyped(tmp_path, strict=False)) as h:
            assert [tier.name for tier in h.tiers] == ["cpu"]
            ks = [key(i) for i in range(4)]
            assert await h.put(ks, blocks_of(ks)) == 4
            opened = [r.getMessage() for r in caplog.records]
            assert sum("tier 'disk' disabled" in line for line in opened) == 1
            caplog.clear()
            for _ in range(10):  # a dashboard polling stats()
                reason = h.stats().disabled_tiers["disk"]
            assert "does not exist" in reason
            lines = [r.getMessage() for r in caplog.records if "serving without" in r.getMessage()]
            assert len(lines) == 1
            assert "'disk'" in lines[0] and "does not exist" in lines[0]
            monkeypatch.setattr(kvtier.hierarchy, "DISABLED_LOG_INTERVAL_S", 0.0)
            caplog.clear()
            h.stats()
            h.stats()
            assert sum("serving without" in r.getMessage() for r in caplog.records) == 2


async def test_stats_log_nothing_while_every_tier_serves(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kvtier.hierarchy, "DISABLED_LOG_INTERVAL_S", 0.0)
    with caplog.at_level(logging.DEBUG, logger="kvtier.hierarchy"):
        async with Hierarchy.from_config(chain_config(tmp_path, gpu=None)) as h:
            for _ in range(3):
                assert h.stats().disabled_tiers == {}
    assert not any("serving without" in r.getMessage() for r in caplog.records)
