"""The command line's commands, one module each; `kvtier.cli` registers them on its group."""
