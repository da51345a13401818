"""A write group's batches of system calls (kvtier/tiers/disk/ops.py): the compiled batch
(`_io_core.pyx`, one call without the GIL) gives every op the outcome the Python loop gives
it, bytes on disk included; an op's failure stays its own; a `FileIO` that overrides a
system call sees every call."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
from disk_parts import blocks, k, open_parts

from kvtier.compiled import core_status
from kvtier.tiers.disk import files as files_module
from kvtier.tiers.disk import lane as lane_module
from kvtier.tiers.disk import ops as ops_module
from kvtier.tiers.disk.io import IOV_MAX, PLAIN_IO, FaultyIO, FileIO, IOBuffer
from kvtier.tiers.disk.ops import Op, StatOp, SyncOp, WriteOp, run_batch, run_in_python

ROOT = Path(__file__).resolve().parents[1]

Runner = Callable[[Sequence[Op]], None]


def python_runner(ops: Sequence[Op]) -> None:
    run_in_python(PLAIN_IO, ops)


def compiled_runner(ops: Sequence[Op]) -> None:
    core = ops_module._io_core
    if core is None:
        pytest.skip("the compiled core is not built (scripts/build-core)")
    core.run_batch(list(ops), IOV_MAX)


RUNNERS = pytest.mark.parametrize("runner", [python_runner, compiled_runner], ids=["py", "c"])


def pattern(size: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


def buffers_of_every_kind(seed: int) -> list[IOBuffer]:
    """bytes, bytearray, a memoryview of a numpy row (as the lane passes), an empty buffer
    and a slice of a memoryview."""
    rows = pattern(3 * 4096, seed).reshape(3, 4096)
    return [
        pattern(100, seed + 1).tobytes(),
        bytearray(pattern(37, seed + 2).tobytes()),
        rows[1].data,
        b"",
        memoryview(pattern(5000, seed + 3).tobytes())[17:4017],
    ]


def joined(buffers: Sequence[IOBuffer]) -> bytes:
    return b"".join(bytes(memoryview(buffer).cast("B")) for buffer in buffers)


def outcome(op: Op) -> tuple[object, ...]:
    error = None if op.error is None else (type(op.error), op.error.errno)
    return (error, op.stat) if isinstance(op, StatOp) else (error,)


def a_batch(tmp_path: Path, name: str) -> tuple[list[Op], int, int]:
    """A batch with writes, syncs and stats, some of which fail: a closed descriptor, a
    read-only one, a missing path, a symlink (its own identity, not its target's)."""
    path = tmp_path / f"{name}.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    readonly = os.open(path, os.O_RDONLY)
    closed = os.open(path, os.O_RDONLY)
    os.close(closed)
    (tmp_path / f"{name}.link").symlink_to(path)
    batch: list[Op] = [
        WriteOp(fd, buffers_of_every_kind(1), 8192, len(joined(buffers_of_every_kind(1)))),
        WriteOp(readonly, [b"refused"], 0, 7),
        SyncOp(closed),
        WriteOp(fd, [b"after the failures"], 0, 18, plain=True),
        SyncOp(fd),
        SyncOp(fd, plain=True),
        StatOp(fd),
        StatOp(path=str(path)),
        StatOp(path=str(tmp_path / f"{name}.link")),
        StatOp(path=str(tmp_path / "missing" / "file")),
        StatOp(path=str(path / "not-a-directory")),
        StatOp(closed),
    ]
    return batch, fd, readonly


@RUNNERS
def test_every_op_gets_its_own_outcome_and_the_bytes_land(tmp_path: Path, runner: Runner) -> None:
    batch, fd, readonly = a_batch(tmp_path, "one")
    try:
        runner(batch)
        errors = [None if op.error is None else op.error.errno for op in batch]
        assert errors == [
            None,
            errno.EBADF,
            errno.EBADF,
            None,
            None,
            None,
            None,
            None,
            None,
            errno.ENOENT,
            errno.ENOTDIR,
            errno.EBADF,
        ]
        assert isinstance(batch[9].error, FileNotFoundError)  # as os.stat raises it
        data = joined(buffers_of_every_kind(1))
        assert os.pread(fd, len(data), 8192) == data
        assert os.pread(fd, 18, 0) == b"after the failures"
        info = os.fstat(fd)
        link = os.lstat(tmp_path / "one.link")
        assert [op.stat for op in batch[6:9]] == [
            (info.st_dev, info.st_ino, info.st_nlink),
            (info.st_dev, info.st_ino, info.st_nlink),
            (link.st_dev, link.st_ino, link.st_nlink),
        ]
        assert link.st_ino != info.st_ino
    finally:
        os.close(fd)
        os.close(readonly)


def test_the_compiled_batch_and_the_python_loop_agree_op_by_op(tmp_path: Path) -> None:
    if ops_module._io_core is None:
        pytest.skip("the compiled core is not built (scripts/build-core)")
    outcomes = []
    contents = []
    for name, runner in (("py", python_runner), ("c", compiled_runner)):
        batch, fd, readonly = a_batch(tmp_path, name)
        try:
            runner(batch)
            outcomes.append([outcome(op)[0] for op in batch])
            contents.append(os.pread(fd, 1 << 16, 0))
        finally:
            os.close(fd)
            os.close(readonly)
    assert outcomes[0] == outcomes[1]
    assert contents[0] == contents[1]


def test_a_write_of_more_buffers_than_one_call_takes_is_whole(tmp_path: Path) -> None:
    core = ops_module._io_core
    if core is None:
        pytest.skip("the compiled core is not built (scripts/build-core)")
    fd = os.open(tmp_path / "many", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        buffers: list[IOBuffer] = [pattern(size, size).tobytes() for size in range(1, 40)]
        op = WriteOp(fd, buffers, 5, len(joined(buffers)))
        core.run_batch([op], 3)  # thirteen calls of three buffers
        assert op.error is None
        assert os.pread(fd, 1 << 16, 0) == bytes(5) + joined(buffers)
    finally:
        os.close(fd)


_PARTIAL = textwrap.dedent(
    """
    import os, resource, signal, sys
    sys.path.insert(0, {root!r})
    from kvtier.tiers.disk import ops
    from kvtier.tiers.disk.io import IOV_MAX, PLAIN_IO
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (6000, resource.RLIM_INFINITY))
    fd = os.open({path!r}, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    op = ops.WriteOp(fd, [b"a" * 4096, b"b" * 4096], 0, 8192)
    if {compiled!r}:
        ops._io_core.run_batch([op], IOV_MAX)
    else:
        ops.run_in_python(PLAIN_IO, [op])
    print(op.error.errno, os.fstat(fd).st_size)
    """
)


@RUNNERS
def test_a_write_cut_short_is_resumed_and_its_error_kept(tmp_path: Path, runner: Runner) -> None:
    """A file size limit lets the first call write 6,000 of 8,192 bytes; the resumed call
    fails with EFBIG, which is the op's error (in a child: the limit is per process)."""
    compiled = runner is compiled_runner
    if compiled and ops_module._io_core is None:
        pytest.skip("the compiled core is not built (scripts/build-core)")
    code = _PARTIAL.format(root=str(ROOT), path=str(tmp_path / "cut"), compiled=compiled)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.split() == [str(errno.EFBIG), "6000"]
    assert (tmp_path / "cut").read_bytes() == b"a" * 4096 + b"b" * (6000 - 4096)


def test_a_file_io_that_overrides_a_call_sees_every_call_but_the_plain_ones(
    tmp_path: Path,
) -> None:
    io = FaultyIO()  # the real calls, counted: it overrides `pwritev` and `fsync`
    fd = os.open(tmp_path / "counted", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        run_batch(
            io,
            [
                WriteOp(fd, [b"x"], 0, 1),
                WriteOp(fd, [b"y"], 1, 1, plain=True),
                SyncOp(fd),
                SyncOp(fd, plain=True),
                StatOp(fd),
            ],
        )
        assert io.calls == Counter({"pwritev": 1, "fsync": 1})
        assert os.pread(fd, 2, 0) == b"xy"
    finally:
        os.close(fd)


def test_an_injected_fault_fails_its_op_only(tmp_path: Path) -> None:
    io = FaultyIO()
    path = tmp_path / "slab-00000.bin"
    fd = io.open(str(path), os.O_RDWR | os.O_CREAT)
    try:
        io.inject("pwritev", errno.ENOSPC, offset=4096, times=1)
        io.inject("fsync", errno.EIO, times=1)
        batch: list[Op] = [
            WriteOp(fd, [b"a" * 10], 0, 10),
            WriteOp(fd, [b"b" * 10], 4090, 10),
            SyncOp(fd),
            WriteOp(fd, [b"c" * 10], 8192, 10),
            SyncOp(fd),
        ]
        run_batch(io, batch)
        assert [None if op.error is None else op.error.errno for op in batch] == [
            None,
            errno.ENOSPC,
            errno.EIO,
            None,
            None,
        ]
        assert os.pread(fd, 10, 8192) == b"c" * 10
    finally:
        io.close(fd)


def test_an_empty_batch_makes_no_call() -> None:
    io = FaultyIO()
    run_batch(io, [])
    assert io.calls == Counter()


def test_the_compiled_batch_is_selected_with_the_compiled_core() -> None:
    status = core_status()
    if not status.startswith("compiled") or "_io_core" in status:
        pytest.skip(f"the compiled batch is not built or is stale: {status}")
    assert ops_module.compiled_batches()


def test_a_write_group_makes_its_system_calls_in_two_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The in-flight log and the runs in one batch; the header entries, the syncs and the
    ground check in another: every system call of the group (none outside a batch), and the
    bytes, headers and records it wrote."""
    batches: list[list[str]] = []

    def counting(io: FileIO, ops: Sequence[Op]) -> None:
        batches.append([type(op).__name__ for op in ops])
        run_batch(io, ops)

    monkeypatch.setattr(lane_module, "run_batch", counting)
    monkeypatch.setattr(files_module, "run_batch", counting)
    io = FaultyIO()  # counts the calls made through the store's FileIO
    parts = open_parts(tmp_path, io=io)
    try:
        before = dict(io.calls)
        ids = [1, 2, 3, 4, 5]
        slots = [0, 1, 2, 9, 17]  # three runs in three slab files
        results = parts.lane.write_now([k(i) for i in ids], slots, blocks(ids))
        assert results == [None] * 5
        assert batches == [
            ["WriteOp"] * 4,  # the log, three runs
            ["WriteOp"] * 3 + ["SyncOp"] * 4 + ["StatOp"] * 7,
        ]
        calls = {name: io.calls[name] - before.get(name, 0) for name in ("pwritev", "fsync")}
        assert calls == {"pwritev": 3, "fsync": 3}  # the slab files' (the rest are plain)
        for i, slot in zip(ids, slots, strict=True):
            assert parts.catalog.get(k(i)) is not None
            assert parts.read([i], [slot])[1][0].tobytes() == blocks([i])[0].tobytes()
    finally:
        parts.close()
