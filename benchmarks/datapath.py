"""Data-path throughput: kvtier's copies and disk I/O next to this machine's own limits.

    python benchmarks/datapath.py [--quick] [--json] [--block-sizes 64KiB,256KiB,2MiB] ...

A thin entry point: it runs `kvtier bench` (the same code and options, see `--help`); the
method is in the docstring of `kvtier.bench.datapath`.
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    from kvtier.cli import main
except ModuleNotFoundError:  # run from a checkout without kvtier installed
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from kvtier.cli import main

if __name__ == "__main__":
    main(["bench", *sys.argv[1:]], prog_name="benchmarks/datapath.py")
