"""`kvtier check`: verify every block of a config's disk tiers; `--repair` drops the bad ones.

Each disk tier of the config is opened as a hierarchy would open it and checked with
`DiskStore.check`: every index record against the slab files (slot in range and not shared,
a sane length and codec, the file long enough, the xxh3 checksum of the stored bytes, and
that they decode). Nothing is created: a tier whose directory does not exist holds nothing
yet, and a store whose slab files do not match the config's capacity is not opened (opening
would resize it) unless `--repair` is given.

Exit status (also in `--help`): 0 sound (or nothing stored, or no disk tier); 1 problems
found and left in place; 2 bad options or config (one line); 3 problems found and all bad
records dropped; 4 a tier could not be checked (in use by a running kvtier, or not
openable). Several tiers: the first of 4, 1, 3, 0 that applies.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import click

from kvtier.commands.options import config_option
from kvtier.console import out, progress

if TYPE_CHECKING:
    from kvtier.config import DiskTierConfig, HierarchyConfig

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_REPAIRED = 3
EXIT_UNCHECKED = 4

_PRECEDENCE = (EXIT_UNCHECKED, EXIT_PROBLEMS, EXIT_REPAIRED, EXIT_OK)


@dataclass
class TierCheck:
    """What checking one disk tier found."""

    name: str
    path: Path
    status: int = EXIT_OK
    """The exit status this tier alone would give."""
    records: int = 0
    problems: list[str] = field(default_factory=list)
    dropped: int = 0
    """Bad records dropped (by `--repair`, or by the store itself when it opened)."""
    lines: list[str] = field(default_factory=list)
    """What to tell the user, in order."""


def _slab_bytes(store_dir: Path) -> int | None:
    """Total size of the store's slab files, None when there are none."""
    sizes = [path.stat().st_size for path in store_dir.glob("slab-*.bin") if path.is_file()]
    return sum(sizes) if sizes else None


def check_disk_tier(tier: DiskTierConfig, config: HierarchyConfig, repair: bool) -> TierCheck:
    """Check (and with `repair`, repair) the store of one disk tier of `config`."""
    from kvtier.errors import DiskLockedError, DiskTierError
    from kvtier.tiers.disk import DiskStore, layout_fingerprint

    store_dir = tier.path / f"kvtier-{layout_fingerprint(config.block_size, config.model_id)}"
    result = TierCheck(tier.name, store_dir)
    if not store_dir.exists():
        result.lines.append(f"nothing stored yet: {store_dir} does not exist")
        return result
    if not store_dir.is_dir():
        result.status = EXIT_UNCHECKED
        result.lines.append(f"cannot check: {store_dir} is not a directory")
        return result
    wanted = tier.num_blocks * config.block_size
    found = _slab_bytes(store_dir)
    if found is not None and found != wanted and not repair:
        result.status = EXIT_PROBLEMS
        result.problems.append(
            f"the slab files hold {found // config.block_size:,} blocks, the config's tier "
            f"{tier.num_blocks:,}: not opened, since opening resizes the store and drops the "
            "blocks that no longer fit; check it with the config that wrote it, or --repair "
            "to resize it to this one"
        )
        return result
    try:
        store = DiskStore.from_config(tier, config.block_size, config.model_id, max_workers=1)
    except DiskLockedError:
        result.status = EXIT_UNCHECKED
        result.lines.append(
            f"cannot check: {store_dir} is in use (a running kvtier holds its lock); "
            "stop it and check again"
        )
        return result
    except DiskTierError as error:
        result.status = EXIT_UNCHECKED
        result.lines.append(f"cannot check: {error}")
        return result
    try:
        mode = "O_DIRECT" if store.direct_io_active else "buffered"
        dropped_at_open = store.stats.dropped_at_open
        with progress(f"checking {tier.name}: {len(store):,} blocks", max(1, len(store))) as step:
            report = store.check(repair)
            step(max(1, len(store)))
    finally:
        store.close()
    result.records = report.records
    result.lines.append(f"{report.records:,} index records checked ({store_dir}, {mode} reads)")
    if found is not None and found != wanted:
        result.problems.append(
            f"the slab files held {found // config.block_size:,} blocks, the config's tier "
            f"{tier.num_blocks:,}: resized to the config (--repair)"
        )
    if dropped_at_open:
        result.problems.append(
            f"{dropped_at_open:,} records dropped when the store opened (slots beyond the slab "
            "files or beyond this config's capacity, or a slot claimed by a newer record)"
        )
        result.dropped += dropped_at_open
    result.problems.extend(str(problem) for problem in report.problems)
    result.dropped += report.repaired
    if result.problems:
        result.status = EXIT_REPAIRED if repair or not report.problems else EXIT_PROBLEMS
    return result


@click.command()
@config_option("The tier chain (TOML) whose disk tiers to check.", required=True)
@click.option(
    "--repair",
    is_flag=True,
    help="Drop every bad index record (its block becomes a miss), durably.",
)
def check(config_path: Path, repair: bool) -> None:
    """Verify every block stored in the disk tiers of a config.

    For each disk tier: every index record against the slab files (slot in range and not
    claimed twice, a possible length and codec, the file long enough, the xxh3 checksum of
    the stored bytes, and that they decode). Prints each problem as key, slot and what is
    wrong. --repair drops the bad records, so their blocks read as misses instead of being
    found bad on every read.

    Nothing is created: a tier whose directory does not exist holds nothing yet. A store
    whose slab files do not match the tier's capacity in the config is left alone (opening
    it would resize it) unless --repair is given. A store opened by a running kvtier is
    locked and cannot be checked until it stops.

    \b
    Exit status:
      0  every disk tier is sound (or holds nothing, or the config has no disk tier)
      1  problems found and left in place (run again with --repair)
      2  bad options or config (one line on stderr)
      3  problems found and every bad record dropped (--repair)
      4  a tier could not be checked (in use by a running kvtier, or cannot be opened)
    With several tiers the status is the first of 4, 1, 3, 0 that applies.

    \b
    Examples:
      kvtier check --config configs/default.toml
      kvtier check --config my-chain.toml --repair
    """
    from kvtier.config import DiskTierConfig, load_config
    from kvtier.tiers.registry import TierAccess

    config = load_config(config_path)
    # The tiers whose blocks kvtier itself keeps in slots across restarts.
    tiers = [
        tier
        for tier in config.tiers
        if not tier.kind.volatile
        and tier.kind.access is TierAccess.HOST_BUFFERS
        and not tier.kind.owns_index
    ]
    if not tiers:
        out.print(f"{config_path}: no disk tier, nothing to check", markup=False)
        return
    results: list[TierCheck] = []
    for tier in tiers:
        if isinstance(tier, DiskTierConfig):
            result = check_disk_tier(tier, config, repair)
        else:
            result = TierCheck(tier.name, Path(), EXIT_UNCHECKED)
            result.lines.append(
                f"cannot check: a {tier.medium} tier is not a kvtier disk store "
                "(kvtier check reads only those)"
            )
        results.append(result)
        disabled = "" if tier.enabled is True else f" (enabled = {tier.enabled!r} in the config)"
        out.print(f"{tier.medium} tier {tier.name!r}{disabled}:", markup=False)
        for line in result.lines:
            out.print(f"  {line}", markup=False)
        if result.problems:
            count = len(result.problems)
            out.print(f"  {count:,} problem{'' if count == 1 else 's'}:", markup=False)
            for problem in result.problems:
                out.print(f"    {problem}", markup=False)
        if result.dropped:
            plural = "" if result.dropped == 1 else "s"
            out.print(f"  dropped {result.dropped:,} bad record{plural}", markup=False)
        elif result.status == EXIT_OK and result.records:
            out.print("  all sound", markup=False)
    statuses = {result.status for result in results}
    status = next(code for code in _PRECEDENCE if code in statuses)
    if status == EXIT_PROBLEMS:
        out.print(
            f"problems found; `kvtier check --config {config_path} --repair` drops the bad records",
            markup=False,
        )
    sys.exit(status)
