"""The `kvtier` command line: its commands, console output and charts.

Tooling around the store: nothing in the core (`kvtier.hierarchy`, tiers, policies, manager)
imports it. `main` is the console script's entry point.
"""

from kvtier.cli.app import main

__all__ = ["main"]
