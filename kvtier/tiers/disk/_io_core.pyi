"""Types of the compiled batch of system calls (`_io_core.pyx`) for mypy."""

from kvtier.tiers.disk.ops import Op

def run_batch(ops: list[Op], iov_max: int) -> None: ...
