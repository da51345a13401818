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
