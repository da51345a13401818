"""The `kvtier` command line: the operator's commands (`check`, `keys`) and its console output.

Tooling around the store: nothing in the core (`kvtier.hierarchy`, tiers, policies, manager)
imports it. The workloads' and benchmarks' commands (`replay`, `simulate`, `bench`, `demo`)
are kvtier-tools' (`kvtier_tools.cli`), added through entry points. `main` is the console
script's entry point.
"""

from kvtier.cli.app import main

__all__ = ["main"]
