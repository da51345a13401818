"""`kvtier bench` and the data-path benchmark behind it: what it reports, never how fast.

Also the data-path changes the benchmark led to: the host copy paths of `TensorCopier`
(per-run numpy copies, split across threads when large; a numpy gather-scatter for small
rows) and `DiskStore.read` splitting a large batch over its worker threads.
"""

from __future__ import annotations

import errno
import json
import math
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from kvtier.cli import main
from kvtier.keys import key_from_int
from kvtier.tiers import tensor_copy
from kvtier.tiers.disk import DiskStore
from kvtier.tiers.disk import reader as disk_reader
from kvtier.tiers.storage import ReadFailure
from kvtier.tiers.tensor_copy import TensorCopier
from kvtier_tools.bench import datapath, device


@pytest.mark.parametrize(
    ("row_bytes", "count", "scattered"),
    [
        (16, 300, True),  # small rows, scattered: one numpy gather-scatter
        (512, 40, True),
        (4096, 300, True),  # rows worth a loop: one copy per run
        (4096, 300, False),  # one run
        (64 << 10, 64, True),  # 4 MiB: in a worker thread
        (64 << 10, 100, False),  # one 6.25 MiB run: torch's copy_
    ],
)
async def test_host_copies_put_every_row_in_its_place(
    row_bytes: int, count: int, scattered: bool
) -> None:
    rng = np.random.default_rng(row_bytes + count)
    rows = 400
    src = torch.from_numpy(rng.integers(0, 256, (rows, row_bytes), dtype=np.uint8))
    dst = torch.zeros((rows, row_bytes), dtype=torch.uint8)
    if scattered:
        s = rng.choice(rows, count, replace=False)
        d = rng.choice(rows, count, replace=False)
    else:
        s, d = np.arange(10, 10 + count), np.arange(50, 50 + count)
    await TensorCopier().copy(src, s, dst, d)
    assert torch.equal(dst[torch.from_numpy(d)], src[torch.from_numpy(s)])
    untouched = np.setdiff1d(np.arange(rows), d)
    assert int(dst[torch.from_numpy(untouched)].sum()) == 0


async def test_large_host_copies_are_split_across_threads_and_stay_exact(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tensor_copy, "HOST_SPLIT_BYTES", 1 << 20)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    calls: list[int] = []
    real = tensor_copy._copy_host

    def counting(src: torch.Tensor, s: np.ndarray, dst: torch.Tensor, d: np.ndarray) -> None:
        calls.append(len(s))
        real(src, s, dst, d)

    monkeypatch.setattr(tensor_copy, "_copy_host", counting)
    rng = np.random.default_rng(7)
    src = torch.from_numpy(rng.integers(0, 256, (200, 64 << 10), dtype=np.uint8))
    dst = torch.zeros_like(src)
    s, d = rng.permutation(200)[:150], rng.permutation(200)[:150]
    await TensorCopier().copy(src, s, dst, d)
    assert sorted(calls) == [50, 50, 50]  # 9.4 MiB: three parts, one per "thread"
    assert torch.equal(dst[torch.from_numpy(d)], src[torch.from_numpy(s)])


async def test_a_long_host_run_is_one_part_copied_by_torch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []
    real = tensor_copy._copy_host

    def counting(src: torch.Tensor, s: np.ndarray, dst: torch.Tensor, d: np.ndarray) -> None:
        calls.append(len(s))
        real(src, s, dst, d)

    monkeypatch.setattr(tensor_copy, "_copy_host", counting)
    src = torch.arange(300, dtype=torch.int64).to(torch.uint8).repeat_interleave(64 << 10)
    src = src.reshape(300, 64 << 10)
    dst = torch.zeros_like(src)
    await TensorCopier().copy(src, np.arange(0, 290), dst, np.arange(5, 295))
    assert calls == [290]  # 18 MiB in one run: one thread, torch splits it itself
    assert torch.equal(dst[5:295], src[0:290])


async def test_a_host_copy_of_another_dtype_takes_torchs_path() -> None:
    src = torch.arange(40, dtype=torch.float32).reshape(10, 4)
    dst = torch.zeros_like(src)
    await TensorCopier().copy(src, [3, 1, 7], dst, [0, 5, 9])
    assert torch.equal(dst[[0, 5, 9]], src[[3, 1, 7]])


@pytest.mark.gpu
async def test_scattered_copies_between_gpu_and_pinned_host_land_every_row() -> None:
    """Both directions through pinned staging: the host half never touches the staging buffer
    before the device half's event (a non_blocking D2H followed at once by a host scatter
    would read it too early)."""
    rng = np.random.default_rng(11)
    count, row = 256, 1 << 20
    gpu = torch.randint(0, 256, (count, row), dtype=torch.uint8, device="cuda")
    host = torch.zeros((count, row), dtype=torch.uint8, pin_memory=True)
    s, d = rng.permutation(count), rng.permutation(count)
    await TensorCopier().copy(gpu, s, host, d)
    assert torch.equal(host[torch.from_numpy(d)], gpu[torch.from_numpy(s)].cpu())
    back = torch.zeros_like(gpu)
    await TensorCopier().copy(host, d, back, s)
    assert torch.equal(back, gpu)


def test_runs_of_ascending_ids_and_when_they_are_few() -> None:
    ids = np.array([2, 3, 4, 9, 10, 10, 40], dtype=np.int64)  # a repeat breaks a run
    assert tensor_copy._runs(ids) == [(0, 2, 3), (3, 9, 2), (5, 10, 1), (6, 40, 1)]
    assert tensor_copy._runs(np.arange(5, 9, dtype=np.int64)) == [(0, 5, 4)]
    assert tensor_copy._few(tensor_copy.DIRECT_RUNS_MAX, 10_000)
    assert tensor_copy._few(100, 400) and not tensor_copy._few(101, 400)


def _scattered_slots(case: str, count: int, rng: np.random.Generator) -> np.ndarray:
    """Host rows for a GPU <-> host copy of `count` rows out of 4 * count: every row once in
    a shuffled order ("permutation" of the first `count`), shuffled stretches of 8 rows
    ("stretches": few runs once sorted), or every fourth row ("sparse": as many runs as
    rows, through staging)."""
    if case == "permutation":
        return rng.permutation(count)
    if case == "stretches":
        starts = rng.permutation(count // 8) * 32
        return (starts[:, None] + np.arange(8)).reshape(-1)
    return rng.permutation(np.arange(count) * 4)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["permutation", "stretches", "sparse"])
@pytest.mark.parametrize("pinned", [True, False])
async def test_scattered_gpu_host_copies_of_every_shape_land_every_row(
    case: str, pinned: bool
) -> None:
    """Both directions, whichever way the rows are grouped once sorted (direct DMAs per run,
    or staging), into pinned and pageable host tensors, with a source row read twice."""
    rng = np.random.default_rng(len(case) + pinned)
    count, row = 64, 4096
    gpu = torch.randint(0, 256, (count, row), dtype=torch.uint8, device="cuda")
    host = torch.zeros((4 * count, row), dtype=torch.uint8, pin_memory=pinned)
    slots = _scattered_slots(case, count, rng)
    order = rng.permutation(count)
    await TensorCopier().copy(gpu, order, host, slots)
    assert torch.equal(host[torch.from_numpy(slots)], gpu[torch.from_numpy(order)].cpu())
    untouched = np.setdiff1d(np.arange(4 * count), slots)
    assert not host[torch.from_numpy(untouched)].any()
    back = torch.zeros_like(gpu)
    sources = slots.copy()
    sources[1] = sources[0]  # one host row copied to two device rows
    await TensorCopier().copy(host, sources, back, order)
    assert torch.equal(back.cpu(), host[torch.from_numpy(sources)][np.argsort(order)])


async def test_a_large_disk_read_is_split_over_the_workers_and_stays_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(disk_reader, "READ_SPLIT_BYTES", 4 * 4096)
    store = await DiskStore.open_async(
        tmp_path, block_size=4096, num_blocks=100, max_workers=3, direct_io=False
    )
    try:
        rng = np.random.default_rng(3)
        slots = [int(s) for s in rng.choice(100, 40, replace=False)]
        keys = [key_from_int(i) for i in range(40)]
        blocks = rng.integers(0, 256, (40, 4096), dtype=np.uint8)
        assert not any(await store.write(keys, slots, list(blocks)))
        assert len(disk_reader.read_parts(slots, 4096, 3)) == 3
        # Rot one stored block and ask for one key that was never stored.
        slab, offset = store.slot_location(slots[7])
        with open(slab, "r+b") as file:
            file.seek(offset + 100)
            file.write(bytes([blocks[7][100] ^ 0xFF]))
        asked = [*keys, key_from_int(999)]
        spare = next(s for s in range(100) if s not in slots)
        out = np.zeros((41, 4096), dtype=np.uint8)
        results = await store.read(asked, [*slots, spare], list(out))
    finally:
        await store.aclose()
    assert results[7] == ReadFailure.CHECKSUM
    assert results[40] == ReadFailure.NOT_INDEXED
    assert all(result is None for i, result in enumerate(results[:40]) if i != 7)
    good = [i for i in range(40) if i != 7]
    assert np.array_equal(out[good], blocks[good])


# -- kvtier bench ----------------------------------------------------------------------------

TINY = (
    "--block-sizes",
    "4KiB,8KiB",
    "--copy-size",
    "256KiB",
    "--disk-size",
    "64KiB",
    "--gpu-size",
    "256KiB",
    "--repeats",
    "1",
)
PAIRS = (
    "cpu -> cpu (scattered)",
    "cpu -> cpu (contiguous)",
    "cpu -> disk",
    "cpu -> disk (serial)",
    "cpu -> disk (concurrent)",
    "disk -> cpu",
    "disk -> cpu (serial)",
    "disk -> cpu (concurrent)",
)
DISK_CASES = {  # (pair, case): (blocks per call, queue depth)
    ("cpu -> disk", "serial"): (20, 1),
    ("cpu -> disk", "concurrent"): (20, 16),
    ("disk -> cpu", "serial"): (16, 1),
    ("disk -> cpu", "concurrent"): (16, 16),
}


def bench(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["bench", *args])
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.slow
def test_bench_prints_a_row_per_pair_and_block_size(tmp_path: Path) -> None:
    code, stdout, stderr = bench(*TINY, "--pairs", "cpu,disk,gpu", "--dir", str(tmp_path))
    assert code == 0, stdout + stderr
    lines = stdout.splitlines()
    for pair in PAIRS:
        for size in ("4KiB", "8KiB"):
            assert any(pair in line and size in line for line in lines), (pair, size)
    for column in ("kvtier GB/s", "kvtier blocks/s", "baseline GB/s", "qd", "ratio", ">= 80%?"):
        assert column in stdout
    baselines = stdout[stdout.index("Baselines:") :].splitlines()
    for pair in PAIRS[2:]:  # every disk baseline is listed with its queue depth
        line = next(line for line in baselines if line.startswith(f"  {pair}: "))
        depth = 16 if "concurrent" in pair else 1
        assert f"(queue depth {depth})" in line, line
    assert "os.pwritev, O_DIRECT, + os.fdatasync of 20-block batches" in stdout
    assert "os.preadv, O_DIRECT, of 16-block runs" in stdout
    assert "batches per fsync" in stdout.lower()
    assert "median of 1 repeat;" in stdout
    assert "of device" in stdout and "Device: the raw disk alone" in stdout
    assert "of device row" in stdout  # the old figure beside the paired one
    explained = " ".join(stdout.split())
    assert "the median over repeats of kvtier GB/s / the device's write GB/s in the same " in (
        explained
    )
    assert "timed right before or after kvtier's call, alternating" in explained
    assert "warmed up past their first pass over their files" in explained
    for size in ("4KiB", "8KiB"):
        cells = ([cell.strip() for cell in line.split("│")][1:3] for line in lines)
        assert ["device", size] in cells, size
    assert "sequential os.pwrite, O_DIRECT, of " in stdout
    if torch.cuda.is_available():
        assert "cpu -> gpu" in stdout and "gpu -> cpu" in stdout
    else:
        assert "gpu rows skipped:" in stdout and "CUDA" in stdout
        assert "-> gpu" not in stdout and "gpu ->" not in stdout
    assert f"Disk files: {tmp_path}" in stdout and "removed afterwards" in stdout
    assert list(tmp_path.iterdir()) == []  # the bench's directory is gone
    assert "WRONG BYTES" not in stdout and "Traceback" not in stdout + stderr


@pytest.mark.slow
def test_bench_json_is_json_only_with_every_field(tmp_path: Path) -> None:
    code, stdout, stderr = bench(*TINY, "--json", "--dir", str(tmp_path))
    assert code == 0, stdout + stderr
    document = json.loads(stdout)
    assert document["format"] == "kvtier_tools.bench.datapath/1"
    assert document["target_ratio"] == 0.8
    assert document["settings"]["block_sizes"] == [4096, 8192]
    rows = document["rows"]
    seen = {(row["pair"], row["case"], row["block_size"]) for row in rows}
    expected = {
        (pair, case, size)
        for pair, case in (
            ("cpu -> cpu", "scattered"),
            ("cpu -> cpu", "contiguous"),
            ("cpu -> disk", ""),
            ("disk -> cpu", ""),
            *DISK_CASES,
        )
        for size in (4096, 8192)
    }
    assert expected <= seen
    for row in rows:
        for name in ("blocks", "nbytes", "kvtier_gbps", "baseline_gbps", "ratio", "baseline"):
            assert name in row
        assert row["verified"] is True
        assert len(row["kvtier_s"]) == len(row["baseline_s"]) == 1
        for name in ("kvtier_gbps", "baseline_gbps", "ratio", "kvtier_blocks_per_s"):
            assert math.isfinite(row[name]) and row[name] > 0, (name, row)
        assert row["target_met"] == (row["ratio"] >= 0.8)
        assert row["nbytes"] == row["blocks"] * row["block_size"]
        assert row["kvtier_blocks_per_s"] == pytest.approx(
            row["kvtier_gbps"] * 1e9 / row["block_size"]
        )
        per_call, depth = DISK_CASES.get((row["pair"], row["case"]), (row["blocks"], 1))
        assert (row["blocks_per_batch"], row["queue_depth"]) == (per_call, depth), row
        assert row["blocks"] % (per_call * depth) == 0  # every lane has whole calls
        if row["pair"] in ("cpu -> disk", "disk -> cpu"):
            assert f"(queue depth {depth})" in row["baseline"]
    if torch.cuda.is_available():
        assert any(row["pair"] == "gpu -> cpu" for row in rows)
    else:
        assert not any("gpu" in row["pair"] for row in rows)
        assert "CUDA" in document["skipped"]["gpu"]
    books = document["bookkeeping"]
    assert {(book["policy"], book["fraction"]) for book in books} == {
        (policy, fraction) for policy in ("lru", "arc") for fraction in (0.01, 0.1, 0.5)
    }
    assert all(book["mops"] > 0 and book["requests"] == 2000 for book in books)
    # the device row: one per block size, sane figures; every disk row's share of it
    devices = {row["block_size"]: row for row in document["device"]}
    assert set(devices) == {4096, 8192}
    for size, dev in devices.items():
        assert dev["nbytes"] == 64 << 10 and dev["nbytes"] % size == 0
        assert dev["queue_depth"] == 16 and dev["write_chunk"] == 64 << 10
        assert len(dev["write_s"]) == len(dev["read_s"]) == 1
        for name in ("write_gbps", "read_gbps"):
            assert math.isfinite(dev[name]) and dev[name] > 0, (name, dev)
        assert isinstance(dev["direct_write"], bool) and isinstance(dev["direct_read"], bool)
        assert "fdatasync" in dev["method"] and "random os.preadv" in dev["method"]
    for row in rows:
        if row["pair"] not in ("cpu -> disk", "disk -> cpu"):
            assert row["device_gbps"] is None and row["of_device"] is None, row
            assert row["of_device_row"] is None and row["of_device_method"] is None, row
            continue
        dev = devices[row["block_size"]]
        want = dev["write_gbps"] if row["pair"] == "cpu -> disk" else dev["read_gbps"]
        assert row["device_gbps"] == want, row
        assert row["of_device_row"] == pytest.approx(row["kvtier_gbps"] / want)
        if row["pair"] == "cpu -> disk" and row["case"] not in ("serial", "concurrent"):
            # the one-batch writes: the device's write timed beside each call, paired
            assert row["of_device_method"] == "paired", row
            assert len(row["device_s"]) == len(row["kvtier_s"]) == 1
            paired = row["device_s"][0] / row["kvtier_s"][0]
            assert row["of_device"] == row["of_device_paired"] == pytest.approx(paired)
            assert row["device_paired_gbps"] == pytest.approx(
                row["nbytes"] / row["device_s"][0] / 1e9
            )
            assert row["warmup_calls"] >= 1 and row["first_pass_bytes"] >= 0
        else:
            assert row["of_device_method"] == "device row", row
            assert row["device_s"] == [] and row["of_device_paired"] is None
            assert row["of_device"] == row["of_device_row"]
    env = document["environment"]
    assert env["directory"].startswith(str(tmp_path)) and env["filesystem"]
    assert set(env["disk_direct_io"]) == {"4KiB", "8KiB"}
    # the serving rows move about --disk-size, but at least one batch per lane: 16 lanes of
    # one 20-block write; reads of the first 16 lanes of one 16-block run
    serving = [row for row in rows if row["case"] in ("serial", "concurrent")]
    assert {(row["pair"], row["blocks"]) for row in serving} == {
        ("cpu -> disk", 320),
        ("disk -> cpu", 256),
    }
    for row in serving:
        if row["pair"] == "cpu -> disk":
            counters = row["store_counters"]
            assert counters["write_calls"] == 2 * 320 // 20  # warm-up + 1 repeat
            per_fsync = row["batches_per_fsync"]
            assert per_fsync is None or (math.isfinite(per_fsync) and per_fsync > 0)


@pytest.mark.parametrize("pairs", ["cpu", "disk"])
@pytest.mark.slow
def test_bench_exits_1_when_a_pair_moves_wrong_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pairs: str
) -> None:
    monkeypatch.setattr(datapath, "_rows_match", lambda *args: False)
    code, stdout, _ = bench(
        *TINY, "--pairs", pairs, "--block-sizes", "4KiB", "--dir", str(tmp_path)
    )
    assert code == 1
    assert "WRONG BYTES" in stdout and "ERROR:" in stdout
    if pairs == "disk":
        for pair in PAIRS[2:]:
            assert any(pair in line and "WRONG BYTES" in line for line in stdout.splitlines())


@pytest.mark.slow
async def test_each_serving_row_is_verified_by_its_own_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bytes are checked twice after timing: concurrent writes read back serially, then
    serial writes read back concurrently. A failure of the second check marks exactly the
    serial write row and the concurrent read row."""
    checks: list[bool] = []
    real = datapath._rows_match

    def second_check_fails(*args: object) -> bool:
        checks.append(real(*args))  # type: ignore[arg-type]
        return checks[-1] and len(checks) != 2

    monkeypatch.setattr(datapath, "_rows_match", second_check_fails)
    rows, info = await datapath.measure_disk_serving(
        4096, 64 << 10, 1, tmp_path, np.random.default_rng(0)
    )
    assert checks == [True, True]  # the real comparisons passed
    verified = {(row.pair, row.case): row.verified for row in rows}
    assert verified == {
        ("cpu -> disk", "serial"): False,
        ("cpu -> disk", "concurrent"): True,
        ("disk -> cpu", "serial"): True,
        ("disk -> cpu", "concurrent"): False,
    }
    assert info["raw_write"] in ("O_DIRECT", "buffered")
    assert list(tmp_path.iterdir()) == []  # the store's directory and raw file are gone


@pytest.mark.slow
async def test_the_steady_state_log_row_writes_each_call_over_the_oldest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a store `store_calls` batches large, the store is filled first and each timed
    write goes to the next batch's slots in turn; the rows are verified and named so."""
    from kvtier.tiers.disk.log_store import LogStore

    written: list[tuple[int, int]] = []
    real = LogStore.write

    async def recording(self: LogStore, keys: object, slots: list[int], buffers: object) -> object:
        written.append((min(slots), self.num_blocks))
        return await real(self, keys, slots, buffers)  # type: ignore[arg-type]

    monkeypatch.setattr(LogStore, "write", recording)
    rows, _ = await datapath.measure_disk(
        4096, 16 << 10, 2, tmp_path, np.random.default_rng(0), layout="log", store_calls=3
    )
    assert {(row.pair, row.case) for row in rows} == {
        ("cpu -> disk", "log layout, 3 calls stored"),
        ("disk -> cpu", "log layout, 3 calls stored"),
    }
    assert all(row.verified for row in rows)
    # 2 fill writes, the warm-ups, 2 timed, the check's: batches 1, 2, 0, 1, 2, ... then 0
    warmups = rows[0].warmup_calls
    assert warmups >= 1
    assert written[:-1] == [(4 * ((i + 1) % 3), 12) for i in range(2 + warmups + 2)]
    assert written[-1] == (0, 12)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_raw_baselines_fall_back_to_buffered_where_o_direct_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not datapath._O_DIRECT:
        pytest.skip("no O_DIRECT on this platform")
    real_open = os.open

    def refusing(path: object, flags: int, *args: int, **kwargs: object) -> int:
        name = Path(str(path)).name
        if flags & datapath._O_DIRECT and name.startswith(("raw-", "device-")):
            raise OSError(errno.EINVAL, "O_DIRECT refused (test)")
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", refusing)
    code, stdout, stderr = bench(
        *TINY, "--pairs", "disk", "--block-sizes", "4KiB", "--dir", str(tmp_path)
    )
    assert code == 0, stdout + stderr
    baselines = stdout[stdout.index("Baselines:") :].splitlines()
    for pair in ("cpu -> disk", "cpu -> disk (serial)", "cpu -> disk (concurrent)"):
        line = next(line for line in baselines if line.startswith(f"  {pair}: "))
        assert "buffered (O_DIRECT not available)" in line and "queue depth" in line
    assert "The raw disk baselines ran buffered for 4KiB blocks" in stdout
    assert "The device row ran buffered for 4KiB blocks:" in stdout
    assert "buffered (O_DIRECT refused)" in stdout


@pytest.mark.timeout(60)
def test_the_device_row_writes_then_reads_every_block_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sequential writes cover the file front to back (one fdatasync each run), random reads
    cover every block once, in an order that is not the file's; the file is removed."""
    writes: list[tuple[int, int]] = []
    reads: list[int] = []
    syncs: list[int] = []
    real_write, real_read, real_sync = device.pwritev_all, device.preadv_all, device.PLAIN_IO.fsync

    def write(fd: int, buffers: list[memoryview], offset: int) -> None:
        writes.append((offset, len(buffers[0])))
        real_write(fd, buffers, offset)

    def read(fd: int, buffers: list[memoryview], offset: int) -> None:
        reads.append(offset)
        real_read(fd, buffers, offset)

    def sync(fd: int) -> None:
        syncs.append(fd)
        real_sync(fd)

    monkeypatch.setattr(device, "pwritev_all", write)
    monkeypatch.setattr(device, "preadv_all", read)
    monkeypatch.setattr(device.PLAIN_IO, "fsync", sync)
    block, total = 16 << 10, 3 << 20
    row = device.measure_device(block, total, 2, tmp_path, np.random.default_rng(0), 4)
    assert (row.nbytes, row.write_chunk, row.queue_depth) == (total, 1 << 20, 4)
    runs = 3  # a warm-up and two timed runs of each
    assert sorted(writes) == sorted([(i << 20, 1 << 20) for i in range(3)] * runs)
    assert len(syncs) == runs
    blocks = total // block
    assert sorted(reads) == sorted([i * block for i in range(blocks)] * runs)
    assert reads[:blocks] != sorted(reads[:blocks])  # at random, not front to back
    assert len(row.write_s) == len(row.read_s) == 2
    assert row.write_gbps > 0 and row.read_gbps > 0
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("nbytes", "block", "expected"),
    [
        (1 << 20, 64 << 10, 1 << 20),
        (1000, 64 << 10, 64 << 10),  # at least one block
        ((1 << 20) + 5, 1000, 1_024_000),  # whole blocks of 1000 B and whole pages
    ],
)
def test_the_device_file_is_whole_blocks_and_pages(nbytes: int, block: int, expected: int) -> None:
    assert device.device_bytes(nbytes, block) == expected


def test_group_commit_counters_are_read_where_the_store_has_them() -> None:
    class Before:  # a store whose stats have no group-commit counters
        stats = SimpleNamespace(blocks_written=5)

    class After:  # one that counts them, behind a stats() method
        def stats(self) -> SimpleNamespace:
            return SimpleNamespace(write_groups=3, write_batches=12, fsyncs=4, index_commits=3)

    assert datapath._group_commit_counters(Before()) == {}
    assert datapath._group_commit_counters(After()) == {
        "write_groups": 3,
        "write_batches": 12,
        "fsyncs": 4,
        "index_commits": 3,
    }


@pytest.mark.parametrize(
    ("counters", "per_fsync"),
    [
        ({"write_calls": 32}, None),  # the store counts nothing
        ({"write_calls": 32, "write_batches": 32, "fsyncs": 8}, 4.0),
        ({"write_calls": 32, "write_groups": 16}, 2.0),  # no fsyncs counter: groups
        ({"write_calls": 32, "fsyncs": 0}, None),
    ],
)
def test_batches_per_fsync_comes_from_the_store_counters(
    counters: dict[str, int], per_fsync: float | None
) -> None:
    row = datapath.Row(
        "cpu -> disk",
        "concurrent",
        4096,
        320,
        320 * 4096,
        (1.0,),
        (1.0,),
        "b",
        True,
        batch_blocks=20,
        queue_depth=16,
        store_counters=counters,
    )
    assert row.batches_per_fsync == per_fsync
    report = datapath.Report(datapath.Settings(), rows=[row])
    text = " ".join(str(getattr(item, "plain", "")) for item in datapath.render(report))
    if per_fsync is None:
        assert "Batches per fsync: not reported" in text
    else:
        assert f"cpu -> disk (concurrent), 4KiB: {per_fsync:.2f} batches per fsync" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--block-sizes", "lots"), "--block-sizes"),
        (("--block-sizes", "64KiB,"), "--block-sizes"),
        (("--repeats", "0"), "--repeats"),
        (("--repeats", "many"), "--repeats"),
        (("--copy-size", "1MiB,2MiB"), "--copy-size"),
        (("--pairs", "cpu,warp"), "warp"),
        (("--dir", "/nonexistent/kvtier-bench"), "not a directory"),
        (("--no-such-option",), "--no-such-option"),
    ],
)
def test_bench_bad_input_is_one_line_exit_2(args: tuple[str, ...], message: str) -> None:
    code, stdout, stderr = bench(*args)
    assert code == 2, stdout + stderr
    assert stderr.count("\n") == 1 and stderr.startswith("kvtier: error:")
    assert message in stderr
    assert stdout == ""


def test_a_row_pairs_each_repeat_with_its_baseline() -> None:
    row = datapath.Row(
        "cpu -> cpu", "", 4096, 10, 10**9, (1.0, 2.0, 4.0), (1.0, 1.0, 2.0), "b", True
    )
    assert row.kvtier_gbps == pytest.approx(0.5)  # median time 2 s
    assert row.baseline_gbps == pytest.approx(1.0)
    assert row.ratio == pytest.approx(0.5)  # per repeat: 1.0, 0.5, 0.5
    assert not row.target_met
    assert row.label == "cpu -> cpu"


def test_help_shows_examples_and_exit_status() -> None:
    code, stdout, _ = bench("--help")
    assert code == 0
    assert "kvtier bench --quick" in stdout and "Exit status" in stdout


def test_the_paired_share_of_the_device_is_taken_per_repeat() -> None:
    """`of_device` of a row with the device timed beside it: the median over repeats of the
    device's seconds over kvtier's in the same repeat, not a ratio of the two medians; the
    device row's figure stays beside it as `of_device_row`."""
    row = datapath.Row(
        "cpu -> disk",
        "log layout",
        4096,
        10,
        10**9,
        (1.0, 2.0, 4.0),
        (1.0, 1.0, 1.0),
        "b",
        True,
        device_gbps=2.0,
        device_s=(1.0, 0.5, 4.0),
    )
    # per repeat: 1.0, 0.25, 1.0 -> 1.0; the medians' ratio would be 1.0 / 2.0
    assert row.of_device_paired == pytest.approx(1.0)
    assert row.of_device == row.of_device_paired
    assert row.device_paired_gbps == pytest.approx(1.0)  # 10**9 B in the median 1.0 s
    assert row.of_device_row == pytest.approx(0.25)  # kvtier 0.5 GB/s over the row's 2.0
    data = row.to_dict()
    assert data["device_s"] == [1.0, 0.5, 4.0] and data["of_device_method"] == "paired"
    assert data["of_device_row"] == pytest.approx(0.25)
    unpaired = datapath.Row(
        "disk -> cpu", "", 4096, 10, 10**9, (2.0,), (1.0,), "b", True, device_gbps=1.0
    )
    assert unpaired.of_device_paired is None and unpaired.device_paired_gbps is None
    assert unpaired.of_device == unpaired.of_device_row == pytest.approx(0.5)
    assert unpaired.to_dict()["of_device_method"] == "device row"


async def test_the_device_is_timed_right_beside_each_call_on_alternating_sides() -> None:
    order: list[str] = []

    async def kvtier() -> float:
        order.append("k")
        return 1.0

    def baseline() -> float:
        order.append("b")
        return 2.0

    def write() -> float:
        order.append("d")
        return 3.0

    times = await datapath._paired_with_device(kvtier, baseline, write, 4)
    assert times == ((1.0,) * 4, (2.0,) * 4, (3.0,) * 4)
    assert "".join(order) == "kbd" + "bkd" + "dkb" + "bkd" + "dkb"


def _reports_holes(directory: Path) -> bool:
    """Whether `directory`'s filesystem reports a sparse file's hole (`SEEK_HOLE` at 0)."""
    if not hasattr(os, "SEEK_HOLE"):
        return False
    path = directory / "probe.bin"
    with open(path, "wb") as file:
        file.truncate(1 << 20)
        hole = os.lseek(file.fileno(), 0, os.SEEK_HOLE)
    path.unlink()
    return hole == 0


def test_never_written_bytes_counts_holes(tmp_path: Path) -> None:
    """A sparse file's holes are never-written bytes; written ones are not."""
    path = tmp_path / "sub" / "sparse.bin"
    path.parent.mkdir()
    if not _reports_holes(tmp_path):
        pytest.skip("this filesystem does not report holes (SEEK_HOLE)")
    with open(path, "wb") as file:
        file.truncate(1 << 20)
    assert device.never_written_bytes(tmp_path) == 1 << 20
    with open(path, "r+b") as file:
        file.seek(256 << 10)
        file.write(b"x" * (64 << 10))
        file.flush()
        os.fsync(file.fileno())
    assert device.never_written_bytes(tmp_path) == (1 << 20) - (64 << 10)


async def test_the_store_is_warmed_up_until_a_call_writes_little_new_space(
    tmp_path: Path,
) -> None:
    """Warm-up calls go on while a call writes at least `threshold` bytes never written
    before (here a 1 MiB sparse file filled 256 KiB a call, then rewritten), and stop at the
    limit otherwise."""
    if not _reports_holes(tmp_path):
        pytest.skip("this filesystem does not report holes (SEEK_HOLE)")
    path = tmp_path / "data.bin"
    with open(path, "wb") as file:
        file.truncate(1 << 20)
    calls = [0]

    async def write() -> None:
        with open(path, "r+b") as file:
            file.seek((calls[0] % 4) * (256 << 10))
            file.write(b"y" * (256 << 10))
            file.flush()
            os.fsync(file.fileno())
        calls[0] += 1

    # four calls fill the file, the fifth is the first to write nothing new
    assert await datapath._warm_up_store(write, tmp_path, 16, 4096) == 5
    assert device.never_written_bytes(tmp_path) == 0
    calls[0] = 0
    with open(path, "wb") as file:
        file.truncate(1 << 20)
    assert await datapath._warm_up_store(write, tmp_path, 2, 4096) == 2  # the limit


@pytest.mark.slow
async def test_the_one_batch_log_rows_time_no_first_pass_over_a_region(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A log store a call large has more regions than a call fills: its first calls write
    never-written (preallocated) space. The row warms the store up past them, so its timed
    calls (and every call after the warm-up) write only space written before, as the raw
    baseline's and the device's timed writes do; the row reports the warm-up."""
    from kvtier.tiers.disk.log_store import LogStore

    if not _reports_holes(tmp_path):
        pytest.skip("this filesystem does not report holes (SEEK_HOLE)")
    new_space: list[int] = []
    real = LogStore.write

    async def recording(self: LogStore, keys: object, slots: list[int], buffers: object) -> object:
        before = device.never_written_bytes(self.directory)
        result = await real(self, keys, slots, buffers)  # type: ignore[arg-type]
        new_space.append(before - device.never_written_bytes(self.directory))
        return result

    monkeypatch.setattr(LogStore, "write", recording)
    rows, _ = await datapath.measure_disk(
        64 << 10, 4 << 20, 2, tmp_path, np.random.default_rng(0), layout="log"
    )
    if new_space[0] == 0:  # e.g. tmpfs: preallocated pages read as data
        pytest.skip("this filesystem does not report preallocated space as unwritten")
    write_row = next(row for row in rows if row.pair == "cpu -> disk")
    warmups = write_row.warmup_calls
    assert new_space[1] > 0  # one warm-up call would leave the first timed call a first pass
    assert warmups >= 3
    assert new_space[warmups - 1 :] == [0] * (len(new_space) - warmups + 1)
    assert write_row.first_pass_bytes == 0
    assert len(write_row.device_s) == 2 and all(row.verified for row in rows)
    assert list(tmp_path.iterdir()) == []
