"""The commands of kvtier-tools: `kvtier replay`, `simulate`, `bench` and `demo`, and charts.

Each joins the product's `kvtier` command through the `kvtier.commands` entry-point group
(tools/pyproject.toml), so `kvtier replay` works as before wherever kvtier-tools is
installed; `kvtier.cli.app` loads them by that group, never by importing this package.
"""
