"""kvtier.arrays: numpy's `unique` without its lazy `numpy.ma` import, and a serving path
that never imports it (the first disk hit after an engine start waited 13-15 ms for it)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from kvtier.arrays import has_duplicates, sorted_unique

INTS = hnp.arrays(
    dtype=st.sampled_from([np.int64, np.int32, np.uint8]),
    shape=hnp.array_shapes(min_dims=1, max_dims=2, min_side=0, max_side=40),
    elements=st.integers(0, 30),
)


@given(INTS)
def test_sorted_unique_is_numpys_unique(values: np.ndarray) -> None:
    got = sorted_unique(values)
    assert got.dtype == values.dtype
    assert np.array_equal(got, np.unique(values))


@given(INTS)
def test_has_duplicates_says_whether_a_value_repeats(values: np.ndarray) -> None:
    assert has_duplicates(values) == (np.unique(values).size != values.size)


def test_a_list_and_the_edges() -> None:
    assert sorted_unique([3, 1, 3, 2]).tolist() == [1, 2, 3]
    assert sorted_unique(np.array([], dtype=np.int64)).tolist() == []
    assert sorted_unique([7]).tolist() == [7]
    assert not has_duplicates([]) and not has_duplicates([5]) and has_duplicates([5, 5])


def test_a_put_a_restart_and_a_disk_hit_never_import_numpy_ma(tmp_path: Path) -> None:
    """A fresh process stores blocks with rows (the lane indexes them), restarts and loads
    them into rows from the disk tier: `numpy.ma` stays unimported (numpy 2.3's plain
    `np.unique` imports it on first use, holding the GIL on the event loop's path)."""
    code = textwrap.dedent(
        f"""
        import asyncio, sys
        from pathlib import Path
        import torch
        from kvtier import Hierarchy
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from hierarchy_helpers import blocks_of, chain_config, key

        async def main() -> None:
            config = chain_config(Path({str(tmp_path)!r}), gpu=None, cpu=4, disk=64)
            keys = [key(i) for i in range(24)]
            buffer = torch.zeros(30, config["block_size"], dtype=torch.uint8)
            rows = list(range(29, 5, -1))
            buffer[rows] = blocks_of(keys)
            async with Hierarchy.from_config(config) as h:
                assert await h.put(keys, buffer, rows=rows) == len(keys)
                await h.drain()
            async with Hierarchy.from_config(config) as h:
                into = torch.zeros(30, config["block_size"], dtype=torch.uint8)
                assert await h.get_into(keys, into, rows) == len(keys)
                assert torch.equal(into[rows], blocks_of(keys))
            print("numpy.ma" in sys.modules)

        asyncio.run(main())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "False"
