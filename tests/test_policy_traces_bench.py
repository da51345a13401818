"""`kvtier_tools.bench.policy_traces`: Belady's optimum is the most hits any choice of evictions
and bypasses gives (checked exhaustively on small sequences), bounds every policy, and the
benchmark prints a table over a public trace."""

from __future__ import annotations

import functools
import random
import struct
from collections.abc import Hashable, Sequence
from pathlib import Path

import pytest

from kvtier.errors import InvalidValueError
from kvtier.policies import POLICIES, simulate
from kvtier_tools.bench.policy_traces import belady_hits, main


def best_hits(accesses: Sequence[Hashable], capacity: int, partial: Sequence[bool]) -> int:
    """The most hits over every policy: at each miss, bypass or store (evicting any one key
    when full), by exhaustive search."""

    @functools.cache
    def best(index: int, resident: frozenset[Hashable]) -> int:
        if index == len(accesses):
            return 0
        key = accesses[index]
        if key in resident:
            return 1 + best(index + 1, resident)
        options = [best(index + 1, resident)]  # bypass
        if not partial[index]:
            if len(resident) < capacity:
                options.append(best(index + 1, resident | {key}))
            else:
                options.extend(
                    best(index + 1, (resident - {victim}) | {key}) for victim in resident
                )
        return max(options)

    return best(0, frozenset())


@pytest.mark.parametrize("seed", range(60))
def test_belady_is_the_optimum_of_every_eviction_and_bypass_choice(seed: int) -> None:
    rng = random.Random(seed)
    accesses = [rng.randrange(rng.randrange(2, 7)) for _ in range(rng.randrange(1, 14))]
    partial = [rng.random() < 0.15 for _ in accesses]
    capacity = rng.randrange(1, 4)
    assert belady_hits(accesses, capacity, partial) == best_hits(accesses, capacity, partial)
    assert belady_hits(accesses, capacity) == best_hits(accesses, capacity, [False] * len(accesses))


@pytest.mark.parametrize("capacity", [1, 10, 100])
def test_belady_bounds_every_policy(capacity: int) -> None:
    rng = random.Random(capacity)
    accesses = [int(rng.paretovariate(0.7)) % 500 for _ in range(1_500)]
    optimum = belady_hits(accesses, capacity)
    for name in POLICIES:
        assert simulate(name, capacity, accesses).hits <= optimum, name


def test_belady_on_a_loop_keeps_a_fixed_part() -> None:
    # a loop of 5 keys, 4 passes, 2 slots: LRU gets nothing, the optimum 2 hits a pass
    loop = list(range(5)) * 4
    assert simulate("lru", 2, loop).hits == 0
    assert belady_hits(loop, 2) == best_hits(loop, 2, [False] * len(loop)) == 6
    assert belady_hits(loop, 5) == 15  # only the first pass misses
    with pytest.raises(InvalidValueError, match="capacity"):
        belady_hits(loop, 0)


@pytest.mark.slow
def test_the_table_covers_a_public_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random(3)
    keys = [min(int(rng.paretovariate(0.8)), 3_000) for _ in range(4_000)]
    # named as the public trace; read by its magic bytes (none: uncompressed)
    (tmp_path / "web12.trace.xz").write_bytes(b"".join(struct.pack(">i", key) for key in keys))
    markdown = tmp_path / "table.md"
    assert (
        main(["--trace-dir", str(tmp_path), "--workloads", "web12", "--markdown", str(markdown)])
        == 0
    )
    printed = capsys.readouterr().out
    for policy in ("arc", "lru", "s3fifo", "lct", "auto", "belady"):
        assert "web12" in printed and f" {policy} " in printed
    table = markdown.read_text()
    assert table.count("| web12 (4,000,") == 1 and table.count("\n") == 2 + 6


def test_a_known_trace_asked_for_but_missing_says_where_to_fetch_it(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"^oltp: OLTP\.lis not found in .*curl -LO https://"):
        main(["--trace-dir", str(tmp_path), "--workloads", "oltp"])
    with pytest.raises(SystemExit, match=r"no --trace-dir"):
        main(["--workloads", "p3"])


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_the_arc_papers_format_is_read_from_the_trace_dir_of_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random(4)
    lines = [f"{rng.randrange(400)} {rng.randrange(1, 9)} 0 {i}\n" for i in range(600)]
    (tmp_path / "OLTP.lis").write_text("".join(lines))
    monkeypatch.setenv("KVTIER_TRACE_DIR", str(tmp_path))
    keys_out = tmp_path / "keys"
    argv = ["--workloads", "oltp", "--policies", "lru", "arc", "--keys-out", str(keys_out)]
    assert main(argv) == 0
    expected = [
        start + i
        for start, count in (map(int, ln.split()[:2]) for ln in lines)
        for i in range(count)
    ]
    assert (keys_out / "oltp.txt").read_text().split() == [str(key) for key in expected]
    rows = [line.split()[:4] for line in capsys.readouterr().out.splitlines()]
    for policy in ("lru", "arc", "belady"):
        assert ["oltp", str(len(expected)), str(len(set(expected))), policy] in rows
