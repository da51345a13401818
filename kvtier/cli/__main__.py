"""`python -m kvtier.cli`: the `kvtier` command."""

from kvtier.cli.app import main

main()
