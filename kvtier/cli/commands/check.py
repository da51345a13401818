"""`kvtier check`: verify every block of a disk store; `--repair` fixes what can be fixed.

A store is named by its directory (`kvtier check PATH`: a store directory `kvtier-<fp>`, or
a directory with stores up to SEARCH_DEPTH levels below it, such as `kvtier replay`'s
`--out`, whose stores are under `OUT/disk/<tier>/`) or by a config's disk tiers (`--config
FILE`). The store's own header file says how it was built
(block size, model id, capacity), so it is always checked as built, whatever a config says.

Without `--repair` nothing is changed or created: the store is opened to inspect
(`DiskStore(inspect=True)`) and `DiskStore.check` compares every index record with its slot's
header and bytes, every header with the index (a sound block with no record is a lost
record), and lists stray files. A missing or damaged index is reported, and so are a slab file
or in-flight log that is not a regular file, a header file cut short, and the blocks of an
interrupted write group. With `--repair` such files are moved aside first, then the store is
opened normally (a damaged or missing index is moved aside and rebuilt from the slab headers;
an interrupted write group's headers cleared; the records that cannot be served dropped, each
reported with its reason), bad records are dropped, lost ones indexed again and stray slab
files removed: a second check finds nothing. A config whose capacity differs from the store's
is reported, with the store's own settings; repair never resizes a store (its capacity is the
larger of what its header file and its slab files hold).

Exit status (also in `--help`): 0 sound (or nothing stored, or no disk tier); 1 problems
found and left in place; 2 bad options or config (one line); 3 problems found and repaired;
4 a store could not be checked (in use by a running kvtier, or not a kvtier store). Several
stores: the first of 4, 1, 3, 0 that applies.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import click

from kvtier.cli.commands.options import config_option
from kvtier.cli.console import out, progress
from kvtier.errors import InvalidValueError

if TYPE_CHECKING:
    from kvtier.config import HierarchyConfig
    from kvtier.tiers.disk.kind import DiskTierConfig

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_REPAIRED = 3
EXIT_UNCHECKED = 4

_PRECEDENCE = (EXIT_UNCHECKED, EXIT_PROBLEMS, EXIT_REPAIRED, EXIT_OK)


@dataclass
class TierCheck:
    """What checking one store found."""

    name: str
    path: Path
    status: int = EXIT_OK
    """The exit status this store alone would give."""
    records: int = 0
    problems: list[str] = field(default_factory=list)
    dropped: int = 0
    """Bad records dropped by `--repair` (or by the store itself when it opened)."""
    reindexed: int = 0
    """Lost records indexed again by `--repair`."""
    lines: list[str] = field(default_factory=list)
    """What to tell the user, in order."""


@dataclass(frozen=True)
class StoreShape:
    """How a store was built, read from its header file."""

    block_size: int
    model_id: str
    num_blocks: int

    def describe(self) -> str:
        return (
            f"block_size {self.block_size}, model_id {self.model_id!r}, capacity "
            f"{self.num_blocks:,} blocks"
        )


def _slab_slots(store_dir: Path, block_size: int, slots_per_file: object) -> int:
    """The slots the store's slab files hold (the last file's length counts): 0 when the
    layout record gives no slots per file."""
    if not isinstance(slots_per_file, int) or slots_per_file < 1:
        return 0
    slots = 0
    for path in store_dir.glob("slab-*.bin"):
        number = path.name.removeprefix("slab-").removesuffix(".bin")
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if number.isdigit() and stat.S_ISREG(info.st_mode):
            held = min(slots_per_file, info.st_size // block_size)
            slots = max(slots, int(number) * slots_per_file + held)
    return slots


def store_shape(store_dir: Path) -> StoreShape | None:
    """The shape recorded in a store directory's `headers.bin`, or None when it has none
    (not a kvtier store, or one written by a kvtier older than layout version 2). Its
    capacity is the most slots that `headers.bin` has entries for or its slab files hold:
    a cut header file must not make a repair shrink the store and drop the blocks of the
    slots past the cut (a slab file cut short loses only its own blocks either way)."""
    from kvtier.tiers.disk.layout import (
        FILE_HEADER_BYTES,
        HEADERS_FILE,
        slots_in_headers_file,
        unpack_file_header,
    )

    try:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # a FIFO: no wait
        fd = os.open(store_dir / HEADERS_FILE, flags)
    except OSError:
        return None
    try:
        layout = unpack_file_header(os.pread(fd, FILE_HEADER_BYTES, 0))
        slots = slots_in_headers_file(os.fstat(fd).st_size)
    except OSError:  # not a file (a directory): no shape to read
        return None
    finally:
        os.close(fd)
    if layout is None:
        return None
    block_size, model_id = layout.get("block_size"), layout.get("model_id")
    if not isinstance(block_size, int) or block_size < 1 or not isinstance(model_id, str):
        return None
    slots = max(slots, _slab_slots(store_dir, block_size, layout.get("slots_per_file")))
    return StoreShape(block_size, model_id, slots)


def _header_entries(store_dir: Path) -> int:
    """How many slots the store's `headers.bin` has entries for (by its length)."""
    from kvtier.tiers.disk.layout import HEADERS_FILE, slots_in_headers_file

    try:
        return slots_in_headers_file(os.lstat(store_dir / HEADERS_FILE).st_size)
    except OSError:
        return 0


SEARCH_DEPTH = 4
"""How many directory levels below PATH `kvtier check PATH` looks for stores: enough for
`kvtier replay --out OUT` (its stores are OUT/disk/<tier>/kvtier-<fingerprint>, three levels
down) and a directory of such outputs."""

_STORE_NAME = re.compile(r"kvtier-(log-)?[0-9a-f]{20}")


def store_dirs_at(path: Path, depth: int = SEARCH_DEPTH) -> list[Path]:
    """The stores at `path`: the store directory itself, or the store directories below it,
    up to `depth` levels down (a store's own subdirectories are not searched, nor symbolic
    links). A store directory holds a `headers.bin` or is named `kvtier-<fingerprint>` (a
    log store: `kvtier-log-<fingerprint>`)."""
    from kvtier.tiers.disk.layout import HEADERS_FILE

    if (path / HEADERS_FILE).exists():
        return [path]
    found: list[Path] = []
    level = [path]
    for _ in range(depth):
        below: list[Path] = []
        for folder in level:
            try:
                children = sorted(folder.iterdir())
            except OSError:
                continue
            for child in children:
                if child.is_symlink() or not child.is_dir():
                    continue
                if _STORE_NAME.fullmatch(child.name) or (child / HEADERS_FILE).exists():
                    found.append(child)
                else:
                    below.append(child)
        level = below
    return sorted(found)


def check_store(
    name: str, store_dir: Path, repair: bool, expected: StoreShape | None = None
) -> TierCheck:
    """Check (and with `repair`, repair) the store in `store_dir`; `expected` is what a
    config says it should be (a difference is reported, never acted on)."""
    from kvtier.errors import DiskLockedError, DiskTierError
    from kvtier.tiers.disk import DiskStore
    from kvtier.tiers.disk.files import move_aside_odd_files, odd_files

    if store_dir.name.startswith("kvtier-log-"):
        return check_log_store(name, store_dir, repair)
    result = TierCheck(name, store_dir)
    shape = store_shape(store_dir)
    if shape is None:
        result.status = EXIT_UNCHECKED
        result.lines.append(
            f"cannot check: {store_dir} has no readable headers.bin (not a kvtier store, or "
            "one made by a kvtier before layout version 2)"
        )
        return result
    if expected is not None and expected != shape:
        result.lines.append(
            f"note: the config says {expected.describe()}; this store was built with "
            f"{shape.describe()}. It is checked as built; opening it with this config would "
            "resize it. Use the config that built it, or another directory for the new one."
        )
    moved: list[str] = []
    entries = _header_entries(store_dir)
    if entries < shape.num_blocks:
        moved.append(
            f"headers.bin is cut short: entries for {entries:,} of the store's "
            f"{shape.num_blocks:,} slots"
            + (
                " (repaired: its length restored; the cut entries are empty, their blocks "
                "served by their index records)"
                if repair
                else ""
            )
        )
    if repair:
        # A slab file or in-flight log that is a directory (a symlink, a FIFO, ...) makes an
        # open fail: moved aside, the store opens with a fresh file there (and drops the
        # records of that slab file's slots).
        try:
            moved += move_aside_odd_files(store_dir)
        except OSError as error:
            result.status = EXIT_UNCHECKED
            result.lines.append(f"cannot repair: {error}")
            return result
    else:
        moved += [
            f"{path.name} {odd}: --repair moves it aside" for path, odd in odd_files(store_dir)
        ]
    try:
        store = DiskStore(
            store_dir.parent,
            block_size=shape.block_size,
            num_blocks=shape.num_blocks,
            model_id=shape.model_id,
            direct_io=False,
            max_workers=1,
            inspect=not repair,
        )
    except DiskLockedError:
        result.status = EXIT_UNCHECKED
        result.lines.append(
            f"cannot check: {store_dir} is in use (a running kvtier holds its lock); "
            "stop it and check again"
        )
        return result
    except DiskTierError as error:
        if repair or "--repair" not in str(error):
            result.status = EXIT_UNCHECKED
            result.lines.append(f"cannot check: {error}")
        else:  # a missing or damaged index: a problem that --repair fixes
            result.status = EXIT_PROBLEMS
            result.problems.append(str(error))
        return result
    try:
        with progress(f"checking {name}: {len(store):,} blocks", max(1, len(store))) as step:
            report = store.check(repair)
            step(max(1, len(store)))
        dropped_at_open = store.stats.dropped_at_open
        rebuilt = store.rebuilt_index
    finally:
        store.close()
    result.records = report.records
    result.lines.append(
        f"{report.records:,} index records checked ({store_dir}, {shape.describe()})"
    )
    result.problems.extend(moved)
    if rebuilt is not None:
        result.problems.append(f"{rebuilt}: moved aside and rebuilt from the slab headers")
    result.problems.extend(report.opened)
    if dropped_at_open:
        result.dropped += dropped_at_open
    result.problems.extend(str(problem) for problem in report.problems)
    result.lines.extend(f"note: {note}" for note in report.notes)
    result.dropped += report.repaired
    result.reindexed = report.reindexed
    if result.problems:
        result.status = EXIT_REPAIRED if repair else EXIT_PROBLEMS
    return result


def check_log_store(name: str, store_dir: Path, repair: bool) -> TierCheck:
    """Check (and with `repair`, repair) the log store (`layout = "log"`) in `store_dir`:
    opened by the geometry its `layout.json` records, every block read back and verified,
    what its open dropped reported; `repair` forgets the bad blocks and writes a checkpoint
    without them, else nothing is written."""
    from kvtier.errors import DiskLockedError, DiskTierError
    from kvtier.tiers.disk.log_store import LAYOUT_FILE, read_layout
    from kvtier.tiers.disk.open_checks import open_recorded_log_store

    result = TierCheck(name, store_dir)
    shape = read_layout(store_dir)
    try:
        store = open_recorded_log_store(store_dir, inspect=not repair, max_workers=1)
    except DiskLockedError:
        result.status = EXIT_UNCHECKED
        result.lines.append(f"cannot check: {store_dir} is in use; stop it and check again")
        return result
    except DiskTierError as error:
        result.status = EXIT_UNCHECKED
        result.lines.append(f"cannot check: {error}")
        return result
    if store is None or shape is None:
        result.status = EXIT_UNCHECKED
        result.lines.append(f"cannot check: {store_dir} has no readable {LAYOUT_FILE}")
        return result
    try:
        report = store.check(repair)
        dropped_at_open = store.stats.dropped_at_open
    finally:
        store.close()
    result.records = report.records
    result.lines.append(
        f"{report.records:,} blocks checked ({store_dir}, log of {store.num_regions} regions "
        f"of {store.region_bytes:,} bytes, {shape['block_size']:,}-byte blocks)"
    )
    result.problems.extend(report.opened)
    result.problems.extend(str(problem) for problem in report.problems)
    result.dropped += dropped_at_open + report.repaired
    if result.problems:
        result.status = EXIT_REPAIRED if repair else EXIT_PROBLEMS
    return result


def check_disk_tier(tier: DiskTierConfig, config: HierarchyConfig, repair: bool) -> TierCheck:
    """Check (and with `repair`, repair) the store of one disk tier of `config`."""
    from kvtier.tiers.disk import layout_fingerprint
    from kvtier.tiers.disk.log_format import log_fingerprint

    if tier.layout == "log":
        fingerprint = log_fingerprint(config.block_size, config.model_id)
        store_dir = tier.path / f"kvtier-log-{fingerprint}"
    else:
        fingerprint = layout_fingerprint(config.block_size, config.model_id)
        store_dir = tier.path / f"kvtier-{fingerprint}"
    if not store_dir.exists():
        other = _other_layout_store(tier, config)
        if other is not None:  # checked as built; the tier's open would refuse it
            result = check_store(tier.name, other, repair)
            result.lines.insert(
                0,
                f'note: the config says layout = "{tier.layout}" but {other} is a store of the '
                f"other layout, which opening this tier refuses: set the layout back, or "
                f"`kvtier migrate {other}` to convert it",
            )
            return result
        older = _older_log_store(tier, config)
        if older is not None:  # the tier's open refuses it; this kvtier cannot read it
            result = TierCheck(tier.name, store_dir, EXIT_UNCHECKED)
            result.lines.append(f"cannot check: {older}")
            return result
        result = TierCheck(tier.name, store_dir)
        result.lines.append(f"nothing stored yet: {store_dir} does not exist")
        return result
    if not store_dir.is_dir() or store_dir.is_symlink():
        result = TierCheck(tier.name, store_dir, EXIT_UNCHECKED)
        result.lines.append(f"cannot check: {store_dir} is not a directory")
        return result
    expected = StoreShape(config.block_size, config.model_id, tier.num_blocks)
    return check_store(tier.name, store_dir, repair, expected)


def _older_log_store(tier: DiskTierConfig, config: HierarchyConfig) -> str | None:
    """The line refusing a log tier over a log store of another format, when there is one."""
    from kvtier.tiers.disk.open_checks import older_log_store_line

    if tier.layout != "log" or not tier.path.is_dir():
        return None
    return older_log_store_line(tier.path, config.block_size, config.model_id)


def _other_layout_store(tier: DiskTierConfig, config: HierarchyConfig) -> Path | None:
    """The store of the layout `tier` does not name, when its directory holds one."""
    from kvtier.tiers.disk.open_checks import store_dir_of

    other: Literal["slots", "log"] = "slots" if tier.layout == "log" else "log"
    store_dir = store_dir_of(tier.path, other, config.block_size, config.model_id)
    return store_dir if store_dir.is_dir() and not store_dir.is_symlink() else None


def _shown(store: Path, path: Path) -> str:
    """A store found under PATH, as the user can name it: PATH/relative/kvtier-<fp>."""
    return store.name if store == path else str(path / store.relative_to(path))


def _print(title: str, result: TierCheck) -> None:
    out.print(title, markup=False)
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
    if result.reindexed:
        plural = "" if result.reindexed == 1 else "s"
        out.print(f"  indexed {result.reindexed:,} lost record{plural} again", markup=False)
    if result.status == EXIT_OK and result.records:
        out.print("  all sound", markup=False)


def _config_tiers(config_path: Path, repair: bool) -> list[tuple[str, TierCheck]]:
    from kvtier.config import load_config
    from kvtier.tiers.disk.kind import DiskTierConfig
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
    checked: list[tuple[str, TierCheck]] = []
    for tier in tiers:
        if isinstance(tier, DiskTierConfig):
            result = check_disk_tier(tier, config, repair)
        else:
            result = TierCheck(tier.name, Path(), EXIT_UNCHECKED)
            result.lines.append(
                f"cannot check: a {tier.medium} tier is not a kvtier disk store "
                "(kvtier check reads only those)"
            )
        disabled = "" if tier.enabled is True else f" (enabled = {tier.enabled!r} in the config)"
        checked.append((f"{tier.medium} tier {tier.name!r}{disabled}:", result))
    return checked


@click.command()
@click.argument("path", required=False, type=click.Path(path_type=Path))
@config_option("The tier chain (TOML) whose disk tiers to check (instead of PATH).")
@click.option(
    "--repair",
    is_flag=True,
    help="Drop bad records, index lost blocks again, rebuild a damaged index (durably).",
)
def check(path: Path | None, config_path: Path | None, repair: bool) -> None:
    """Verify every block of a disk store, named by its directory (PATH) or by a config.

    PATH is a store directory (kvtier-<fingerprint>) or a directory with stores up to 4
    levels below it, such as `kvtier replay`'s --out (its stores are under OUT/disk/<tier>):
    each store found is checked. The store's header file says how it was built, so it is
    always checked as built.

    For each store: every index record against its slot's header and bytes (slot in range
    and not claimed twice, the same key and sequence number, a possible length and codec,
    the file long enough, the checksum that binds the bytes to their key, and that they
    decode), every slot header against the index (a sound block without a record is a lost
    record), and stray files. Prints each problem as key, slot and what is wrong.

    Without --repair nothing is changed or created. --repair drops the bad records (their
    blocks become misses), indexes lost blocks again, moves a damaged or missing index aside
    and rebuilds it from the slab headers, removes stray slab files, moves aside a slab file
    or in-flight log that is not a regular file (that slab file's blocks are lost) and
    clears the headers an interrupted write group left (blocks never stored). It never resizes a
    store: a config whose capacity differs from the store's is reported with the settings
    the store was built with. A store opened by a running kvtier is locked and cannot be
    checked until it stops.

    \b
    Exit status:
      0  every store is sound (or nothing is stored, or the config has no disk tier)
      1  problems found and left in place (run again with --repair)
      2  bad options or config (one line on stderr)
      3  problems found and repaired (--repair)
      4  a store could not be checked (in use by a running kvtier, or not a kvtier store)
    With several stores the status is the first of 4, 1, 3, 0 that applies.

    \b
    Examples:
      kvtier check kvtier-out
      kvtier check kvtier-out/disk/disk
      kvtier check --config configs/default.toml
      kvtier check --config my-chain.toml --repair
    """
    checked: list[tuple[str, TierCheck]]
    if path is not None and config_path is not None:
        raise InvalidValueError(
            "name one thing to check: a store directory (kvtier check PATH) or a config "
            "(kvtier check --config FILE), not both"
        )
    if config_path is not None:
        checked = _config_tiers(config_path, repair)
        if not checked:
            out.print(f"{config_path}: no disk tier, nothing to check", markup=False)
            return
        again: list[Any] = ["--config", config_path]
    elif path is not None:
        if not path.exists():
            raise InvalidValueError(f"{path} does not exist")
        if not path.is_dir():
            raise InvalidValueError(f"{path} is not a directory (a store directory is)")
        stores = store_dirs_at(path)
        if not stores:
            out.print(
                f"{path}: no kvtier store here or up to {SEARCH_DEPTH} levels below, nothing "
                "to check",
                markup=False,
            )
            return
        checked = [
            (f"store {_shown(store, path)}:", check_store(store.name, store, repair))
            for store in stores
        ]
        again = [path]
    else:
        raise InvalidValueError(
            "name what to check: a store directory (kvtier check PATH) or --config FILE"
        )
    for title, result in checked:
        _print(title, result)
    statuses = {result.status for _, result in checked}
    status = next(code for code in _PRECEDENCE if code in statuses)
    if status == EXIT_PROBLEMS:
        command = " ".join(str(part) for part in ["kvtier check", *again, "--repair"])
        out.print(f"problems found; `{command}` repairs them", markup=False)
    sys.exit(status)
