"""Write path: what a serving engine waits for when it offloads (put latency into a full CPU
tier, get latency of disk-resident blocks under a write stream, demotion throughput).

    python benchmarks/writepath.py [--quick] [--json] [--put-rate 100] [--dir /mnt/nvme] ...

A thin entry point: it runs `kvtier bench --write-path` (the same code and options, see
`--help`); the method is in the docstring of `kvtier.bench.writepath`.
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
    main(["bench", "--write-path", *sys.argv[1:]], prog_name="benchmarks/writepath.py")
