"""`kvtier_tools.bench.log_timeline`: what it reports (each block size's events, the device's
busy and idle time, the raw baselines), that it puts back every function it wraps, and how it
finds the device's idle gaps; never how fast."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtier.tiers.disk import jobs, log_group, log_lane
from kvtier.tiers.disk.log_files import LogFiles
from kvtier.tiers.disk.log_group import Pending
from kvtier.tiers.disk.log_lane import LogLane
from kvtier_tools.bench import log_timeline

pytestmark = pytest.mark.timeout(120)


def test_log_timeline_reports_every_figure_and_unwraps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wrapped = [
        (LogLane, "_run_group"), (LogLane, "_close"), (LogLane, "_finish"), (Pending, "wait"),
        (LogFiles, "sync"), (LogFiles, "_write_batch"), (LogFiles, "write_here"),
        (log_group, "bound_checksums"), (log_lane, "settle_by_loop"), (jobs, "settle"),
    ]  # fmt: skip
    before = [getattr(owner, name) for owner, name in wrapped]
    log_timeline.main(
        ["--dir", str(tmp_path), "--block-sizes", "16KiB,64KiB", "--call-bytes", "1MiB",
         "--calls", "3", "--events"]
    )  # fmt: skip
    out = capsys.readouterr().out
    for size, blocks in (("16 KiB", 64), ("64 KiB", 16)):
        assert f"{size} blocks, {blocks} a call of 1 MiB" in out
    for event in ("job queued (1)", "payload write (1)", "fdatasync (1)", "head: checksums (1)"):
        assert out.count(event) == 2, event
    assert out.count("loop: futures settled (1)") == 2
    assert out.count("device busy (writes, fdatasync)") == 2
    assert out.count("raw one call: written") == 2 and out.count("the median call's events") == 2
    assert [getattr(owner, name) for owner, name in wrapped] == before
    assert list(tmp_path.iterdir()) == []  # its stores and raw files removed


def test_idle_gaps_are_the_spans_without_a_write_or_sync() -> None:
    ms = 1e-3
    events: list[log_timeline.Event] = [
        ("payload write", "w", 1 * ms, 4 * ms, 1),
        ("payload write", "w", 1.5 * ms, 2 * ms, 1),  # inside the one before: no gap at 2 ms
        ("head write", "h", 3 * ms, 5 * ms, 1),  # overlaps: no gap at 4 ms
        ("lane: group", "l", 0, 9 * ms, 0),  # not I/O: ignored
        ("fdatasync", "s", 6 * ms, 7 * ms, 0),
    ]
    gaps = log_timeline.idle_gaps(0.0, 8 * ms, events)
    assert [line.split(":")[0].strip() for line in gaps] == ["0.00 ms", "5.00 ms", "7.00 ms"]
    assert "idle  1.00 ms, after the call, before payload write" in gaps[0]
    assert "after head write, before fdatasync" in gaps[1]
    assert "after fdatasync, to the caller" in gaps[2]
    summary = log_timeline.summarize([(0.0, 8 * ms, events)])
    assert summary["busy_ms"] == pytest.approx(5.0)  # 1-5 and 6-7
    assert summary["idle_ms"] == pytest.approx(3.0)
    assert summary["tail_ms"] == pytest.approx(4.0)  # the last payload byte at 4 ms


def test_log_timeline_store_bytes_fills_the_store_and_writes_over_it_in_turn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--store-bytes`: a store of that size, filled whole before the timed calls, each call
    writing over the next call's worth of its slots (the replay's lone calls)."""
    from kvtier.tiers.disk.log_store import LogStore

    calls: list[list[int]] = []
    write = LogStore.write

    async def recorded(
        store: LogStore, keys: list[object], slots: list[int], rows: object
    ) -> object:
        calls.append(list(slots))
        return await write(store, keys, slots, rows)  # type: ignore[arg-type]

    monkeypatch.setattr(LogStore, "write", recorded)
    log_timeline.main(
        ["--dir", str(tmp_path), "--block-sizes", "64KiB", "--call-bytes", "1MiB",
         "--store-bytes", "4MiB", "--calls", "3"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert "64 KiB blocks, 16 a call of 1 MiB" in out and "a store of 64 blocks" in out
    fill, timed = calls[:3], calls[3:]
    assert [slots[0] for slots in fill] == [0, 16, 32] and all(len(s) == 16 for s in calls)
    assert [slots[0] for slots in timed] == [48, 0, 16]  # the oldest slots next, in turn
    assert list(tmp_path.iterdir()) == []


def test_the_probes_regions_pattern_writes_each_part_and_header_at_its_place(
    tmp_path: Path,
) -> None:
    """The device probe's `regions` pattern writes each part's pieces and then its header
    where a store would: every byte of the stream once, in parts at distinct slots."""
    import numpy as np

    from kvtier_tools.bench.log_device_probe import HEAD, PIECE, Probe

    probe = Probe(tmp_path / "probe.bin", 3 * PIECE)  # two parts: two pieces, then one
    try:
        probe.source[:] = np.arange(probe.source.size, dtype=np.uint64).view(np.uint8)[
            : probe.source.size
        ]
        probe.small[:] = 9
        assert probe.regions() > 0
        data = np.fromfile(tmp_path / "probe.bin", dtype=np.uint8)
        headed = [
            slot
            for slot in range(probe.parts + 4)
            if (data[slot * probe.slot : slot * probe.slot + probe.small.size] == 9).all()
        ]
        assert len(headed) == probe.parts == 2
        written = [data[s * probe.slot + HEAD : (s + 1) * probe.slot] for s in headed]
        stream = bytes(probe.source)
        found = sorted(stream.find(bytes(part[:4096])) for part in written)
        assert found == [0, 2 * PIECE]  # each part's first page is where its bytes begin
        whole = {stream.find(bytes(part[:4096])): part for part in written}
        assert bytes(whole[0]) == stream[: 2 * PIECE]
        assert bytes(whole[2 * PIECE][:PIECE]) == stream[2 * PIECE :]
    finally:
        probe.close()


def test_log_device_probe_reports_every_figure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvtier_tools.bench import log_device_probe

    log_device_probe.main(["--dir", str(tmp_path), "--stream-bytes", "4MiB", "--rounds", "1"])
    out = capsys.readouterr().out
    assert "fdatasync issued at 4 ms returned at" in out
    for where in ("below", "inside", "above"):
        assert f"an 8 KiB write {where} the stream" in out
    for name in ("one call", "1 MiB x 16", "4 MiB x 4", "regions"):
        assert f"  {name:10}: " in out
    assert list(tmp_path.iterdir()) == []  # its file removed
    with pytest.raises(SystemExit, match="multiple of 4 MiB"):
        log_device_probe.main(["--dir", str(tmp_path), "--stream-bytes", "6MiB"])


def test_log_timeline_in_bench_times_the_bench_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvtier.tiers.disk.log_store import LogStore

    write = LogStore.write
    log_timeline.main(
        ["--dir", str(tmp_path), "--block-sizes", "64KiB", "--call-bytes", "1MiB",
         "--calls", "3", "--in-bench"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert "64 KiB blocks, the bench's `cpu -> disk (log layout)` row:" in out
    assert out.count("its store calls") == 1 and out.count("payload write (1)") == 1
    assert "device busy (writes, fdatasync)" in out
    assert LogStore.write is write
    assert list(tmp_path.iterdir()) == []
