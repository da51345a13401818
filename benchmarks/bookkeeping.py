"""Bookkeeping throughput of kvtier's TierManager against vLLM 0.33.0's CPU offloading manager.

    python benchmarks/bookkeeping.py [--quick] [--json [PATH]] [--repeats K] ...

A thin entry point: the benchmark lives in `kvtier.bench.bookkeeping` (see its docstring for
the method). Install the vLLM reference with `benchmarks/install-vllm-reference.sh`.
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    from kvtier.bench.bookkeeping import main
except ModuleNotFoundError:  # run from a checkout without kvtier installed
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from kvtier.bench.bookkeeping import main

if __name__ == "__main__":
    raise SystemExit(main())
