"""The compiled bookkeeping core: the policies' and tier manager's hot modules built with
Cython, and the choice, at import, between them and the pure-Python source.

`scripts/build-core` (`python -m kvtier.build_core`) compiles `CORE_MODULES` into
`kvtier/_compiled/` (git-ignored) and writes a manifest there with the SHA-256 of each
module's source. Cython compiles the `.py` files as they are, with `annotation_typing` off:
annotations are not C types, so a compiled module keeps Python's semantics to the letter
(any hashable key, the same exceptions, interpreted subclasses, patched instances); the same
`.py` files are the fallback. ARC's state and steps, `kvtier/policies/_arc_core.py`, are
written in Cython's pure Python mode (a `cython:` line turns `annotation_typing` on for that
file alone: its annotations are C types, its lists int arrays, its class an extension type),
since compiling the ordered-dict ARC left its cost in ordered-dict and tuple operations
(issue 23); uncompiled it is plain Python, the same text (`tests/test_compiled_core.py`
compares the two). lct's per-access state and steps, `kvtier/policies/_lct_core.py`, are
written the same way (its solver stays lct.py's, compiled as it is, but for the curves'
loop), and so are S3-FIFO's queues and steps, `kvtier/policies/_s3fifo_core.py`
(`tests/test_compiled_s3fifo.py`), and
`auto`'s table of key ids and LRU's shadow order on ids, `kvtier/policies/_key_ids.py` and
`_lru_core.py` (`tests/test_shadow_ids.py`).
Two modules are written in Cython instead: `kvtier/_blocks_core.pyx`,
`BlockStatus`'s constructor in C, which `kvtier.blocks` installs when it is selected (a block
is made for every block stored; checked alike). And `kvtier/tiers/disk/_io_core.pyx`, a disk
write group's batches of system calls made without the GIL, which
`kvtier.tiers.disk.ops` runs when it is selected (the same outcomes as its Python loop;
`tests/test_disk_io_batch.py`), and a log part's bound checksums without the GIL, which
`kvtier.tiers.disk.log_format` calls when it is selected (`tests/test_disk_log_checksums.py`).
And `kvtier/tiers/disk/_plan_core.pyx`, the log index's look-ups for a batch of new records
in one compiled pass and its stores for them in one loop, the log lane's placing of a run of
records and a write call's columns, a part's header entries and a group's records as the
index takes them, which `kvtier.tiers.disk.log_index`, `log_commit`, `log_group`,
`log_calls` and `log_format` run when it is selected (the same results as their numpy paths;
`tests/test_disk_log_plan.py`, `tests/test_disk_log_calls.py`).
And `kvtier/embed/_copy_core.pyx`, a CPU paged-KV job's row copies in one call without the
GIL, which `kvtier.embed.paged_kv` runs when it is selected (the same bytes as its numpy
path; `tests/test_paged_kv.py`).
(mypyc was measured too and left: it enforces annotations at run time, so `simulate`'s int
keys, `InvalidValueError`s on bad arguments and interpreted subclasses of the policies broke.)

`select_core()`, run when `kvtier/__init__.py` imports this module (before any core module),
puts a finder in front of the import system that loads the compiled extension of each core
module whose source is unchanged since the build; a module edited since is its `.py` (the
status says which) until `scripts/build-core` runs again. `KVTIER_PURE_PYTHON=1` selects the
`.py` of every module. `core_status()` says what was chosen (`kvtier --version` prints it).
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

CORE_MODULES: tuple[str, ...] = (
    "kvtier._blocks_core",
    "kvtier.policies.base",
    "kvtier.policies._key_ids",
    "kvtier.policies._lru_core",
    "kvtier.policies.lru",
    "kvtier.policies.arc",
    "kvtier.policies._arc_core",
    "kvtier.policies.lct",
    "kvtier.policies._lct_core",
    "kvtier.policies.s3fifo",
    "kvtier.policies._s3fifo_core",
    "kvtier.manager.tier",
    "kvtier.tiers.disk._io_core",
    "kvtier.tiers.disk._plan_core",
    "kvtier.embed._copy_core",
)
"""The modules compiled: the hot paths of LRU, ARC (`_arc_core`: its lists and steps, in
Cython's pure Python mode), lct (`_lct_core`: its per-access state, likewise), S3-FIFO
(`_s3fifo_core`: its queues, likewise), `auto`'s shadows on ids (`_key_ids`, `_lru_core`,
likewise) and
`TierManager`, and their base class; and, with no `.py`, `BlockStatus`'s constructor in C
(`_blocks_core.pyx`: when it is not selected, `kvtier.blocks` keeps the Python
constructor); and a disk write group's system calls
without the GIL (`_io_core.pyx`; when it is not selected, `kvtier.tiers.disk.ops` makes
them one Python call at a time); and a log store's index look-ups for a batch of new records
and stores, its lane's placing of a run, a part's header entries and a group's records in
compiled loops (`_plan_core.pyx`; when it is not selected, `kvtier.tiers.disk.log_index`,
`log_commit`, `log_group` and `log_format` use numpy); and a CPU paged-KV job's row copies
without the GIL (`embed/_copy_core.pyx`; when it is not selected, `kvtier.embed.paged_kv`
copies with numpy)."""

PACKAGE_DIR = Path(__file__).resolve().parent
COMPILED_DIR = PACKAGE_DIR / "_compiled"
MANIFEST = COMPILED_DIR / "manifest.json"
PURE_ENV = "KVTIER_PURE_PYTHON"

_status = "pure Python (core not selected yet)"


def source_path(module: str) -> Path:
    """The source of a core module, inside this package: its `.py`, or its `.pyx` (a module
    written in Cython, which exists only compiled)."""
    base = PACKAGE_DIR.parent.joinpath(*module.split("."))
    py = base.with_suffix(".py")
    return py if py.is_file() else base.with_suffix(".pyx")


def source_digest(module: str) -> str:
    """SHA-256 of a core module's source, as the manifest records it."""
    return hashlib.sha256(source_path(module).read_bytes()).hexdigest()


def extension_suffix() -> str:
    """This interpreter's suffix of a compiled module (e.g. `.cpython-311-x86_64-linux-gnu.so`)."""
    return importlib.machinery.EXTENSION_SUFFIXES[0]


def extension_path(module: str, suffix: str, root: Path | None = None) -> Path:
    """Where the build puts the extension of `module` (under `root`, default `COMPILED_DIR`)."""
    parts = module.split(".")
    return (root or COMPILED_DIR).joinpath(*parts[:-1], parts[-1] + suffix)


class _CoreFinder(importlib.abc.MetaPathFinder):
    """Finds the compiled extension of each selected core module."""

    def __init__(self, paths: dict[str, Path]) -> None:
        self.paths = paths

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        so = self.paths.get(fullname)
        if so is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(so))
        return importlib.machinery.ModuleSpec(fullname, loader, origin=str(so))


def _compiled_paths() -> tuple[dict[str, Path], str]:
    """The extension of each core module to load (none: pure Python), and why."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return {}, f"pure Python ({PURE_ENV}=1)"
    if not MANIFEST.is_file():
        return {}, "pure Python (no compiled core: run scripts/build-core)"
    try:
        manifest = json.loads(MANIFEST.read_text())
        sources: dict[str, str] = manifest["sources"]
        suffix: str = manifest["suffix"]
        compiler: str = manifest["compiler"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}, "pure Python (unreadable compiled-core manifest: run scripts/build-core)"
    if suffix != extension_suffix():
        return {}, f"pure Python (core compiled for another Python: {suffix})"
    paths: dict[str, Path] = {}
    stale: list[str] = []
    for module in CORE_MODULES:
        so = extension_path(module, suffix)
        if module not in sources or not so.is_file() or source_digest(module) != sources[module]:
            stale.append(module)
        else:
            paths[module] = so
    if not paths:
        return {}, "pure Python (compiled core stale or incomplete: run scripts/build-core)"
    if stale:  # said by the status only: a note on stderr would change every command's output
        return paths, (
            f"compiled ({compiler}), {len(paths)} of {len(CORE_MODULES)} modules "
            f"({', '.join(stale)} changed since the build: pure Python)"
        )
    return paths, f"compiled ({compiler}), {len(paths)} modules"


def select_core() -> str:
    """Choose the compiled or pure-Python core modules for this process (idempotent; a core
    module imported before kvtier stays what it is) and return `core_status()`."""
    global _status
    if any(isinstance(f, _CoreFinder) for f in sys.meta_path):
        return _status
    paths, _status = _compiled_paths()
    early = [m for m in paths if m in sys.modules]
    if early:
        _status = "pure Python (core modules imported before kvtier)"
        return _status
    if paths:
        sys.meta_path.insert(0, _CoreFinder(paths))
    return _status


def core_status() -> str:
    """What runs the bookkeeping: "compiled (Cython ...), ..." or "pure Python (why)"."""
    return _status


def core_is_compiled() -> bool:
    """Whether some of this process's core modules are the compiled ones."""
    return _status.startswith("compiled")


select_core()  # at import: `kvtier/__init__.py` imports this module before any other
