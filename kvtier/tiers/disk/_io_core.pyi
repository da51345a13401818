"""Types of the compiled batch of system calls (`_io_core.pyx`) for mypy."""

from kvtier.tiers.disk.ops import Op

def run_batch(ops: list[Op], iov_max: int) -> None: ...
def page_aligned(buffers: list[object], page: int) -> list[bool]: ...
def has_checksums() -> bool: ...
def checksum_function() -> str | None: ...
def bound_checksums(
    namespace: bytes,
    keys: list[bytes],
    slots: list[int],
    lengths: list[int],
    codecs: list[int],
    seqs: list[int],
    stored: list[object],
) -> list[int]: ...
