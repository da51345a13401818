"""Compile the bookkeeping core (`kvtier.compiled.CORE_MODULES`) with Cython.

    python -m kvtier.build_core [--if-needed]

Writes the extensions (of each `.py`, and of `_blocks_core.pyx`, `tiers/disk/_io_core.pyx`,
`tiers/disk/_plan_core.pyx` and `embed/_copy_core.pyx`; compiled in parallel on every CPU) and a
manifest (each source's SHA-256, this interpreter's extension suffix) into
`kvtier/_compiled/`, replacing an older build only once the new one is complete. Needs
Cython and setuptools (kvtier's `test` and `core` extras) and a C compiler; when any is
missing or the build fails it prints one line saying so and exits 1, and kvtier keeps
running its pure-Python bookkeeping (the same `.py` files, ARC's `_arc_core.py`, lct's
`_lct_core.py`, S3-FIFO's `_s3fifo_core.py`, `_key_ids.py` and `_lru_core.py` among them,
`BlockStatus`'s Python constructor and the disk lane's system calls one Python call at a
time).
`--if-needed`: do nothing when a build of the current sources is already there.
`scripts/setup.sh` runs it so; `scripts/build-core` runs it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from kvtier.compiled import (
    COMPILED_DIR,
    CORE_MODULES,
    MANIFEST,
    PACKAGE_DIR,
    extension_path,
    extension_suffix,
    source_digest,
    source_path,
)


@contextlib.contextmanager
def _working_directory(path: Path) -> Iterator[None]:
    old = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def is_current() -> bool:
    """Whether `kvtier/_compiled/` holds a build of the current sources for this Python."""
    try:
        manifest = json.loads(MANIFEST.read_text())
        return bool(
            manifest["suffix"] == extension_suffix()
            and manifest["sources"] == {m: source_digest(m) for m in CORE_MODULES}
        )
    except (OSError, ValueError, KeyError, TypeError):
        return False


DIRECTIVES = {"language_level": 3, "annotation_typing": False, "binding": True}
"""Cython's directives: annotations are not C types (the `.py` semantics, see
`kvtier.compiled`), except in a file whose `# cython:` line says otherwise (ARC's
`_arc_core.py`, lct's `_lct_core.py`, S3-FIFO's `_s3fifo_core.py`, `_key_ids.py` and
`_lru_core.py`, written for it);
`binding`: functions introspect as Python's do."""


def build() -> str:
    """Compile the core into `kvtier/_compiled/`; returns the compiler's name and version.
    Raises whatever Cython, setuptools or the C compiler raised."""
    from Cython.Build import cythonize
    from setuptools import setup

    root = PACKAGE_DIR.parent
    digests = {m: source_digest(m) for m in CORE_MODULES}  # before: an edit mid-build is stale
    compiler = f"Cython {importlib.metadata.version('cython')}"
    with tempfile.TemporaryDirectory(prefix="kvtier-core-") as tmp, _working_directory(root):
        staging = Path(tmp) / "lib"
        paths = [str(source_path(m).relative_to(root)) for m in CORE_MODULES]
        extensions = cythonize(
            paths, build_dir=str(Path(tmp) / "c"), compiler_directives=DIRECTIVES, quiet=True
        )
        setup(
            name="kvtier-core",
            ext_modules=extensions,
            packages=[],  # the extensions only: no discovery of the project's packages
            py_modules=[],
            script_args=[
                "-q",
                "build_ext",
                "--build-lib",
                str(staging),
                "--build-temp",
                tmp,
                "--parallel",
                str(os.cpu_count() or 1),
            ],
        )
        suffix = extension_suffix()
        missing = [m for m in CORE_MODULES if not extension_path(m, suffix, staging).is_file()]
        if missing:
            raise FileNotFoundError(f"the build made no extension of {', '.join(missing)}")
        manifest = {"compiler": compiler, "suffix": suffix, "sources": digests}
        (staging / MANIFEST.name).write_text(json.dumps(manifest, indent=1) + "\n")
        old = COMPILED_DIR.with_name(COMPILED_DIR.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if COMPILED_DIR.exists():
            COMPILED_DIR.rename(old)
        shutil.move(str(staging), COMPILED_DIR)
        shutil.rmtree(old, ignore_errors=True)
    return compiler


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--if-needed", action="store_true", help="skip when the current sources are built"
    )
    args = ap.parse_args(argv)
    if args.if_needed and is_current():
        return 0
    print("kvtier: compiling the bookkeeping core with Cython (about a minute)", file=sys.stderr)
    try:
        compiler = build()
    except (Exception, SystemExit) as exc:  # Cython, setuptools and cc fail in many ways
        reason = str(exc).strip().splitlines()[-1:] or [type(exc).__name__]
        print(
            f"kvtier: compiled core not built ({type(exc).__name__}: {reason[0]}); "
            "kvtier keeps the core it had (pure Python if none)",
            file=sys.stderr,
        )
        return 1
    print(f"kvtier: compiled core built ({compiler}) in {COMPILED_DIR}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
