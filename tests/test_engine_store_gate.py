"""A serving engine's own stores (`Hierarchy.prepare_engine_store`, what
`embed/offloading_spec.py` calls) do not pass the `PutGate` (why: `kvtier/chain/gate.py`):
the engine awaits them inside its step, so they go in while the gate is full of the
embedder's puts or closed by a get waiting for room, take no place in it and are not counted
as admission waits."""

from __future__ import annotations

import asyncio
from pathlib import Path

from hierarchy_helpers import chain_config, key

from kvtier import Hierarchy


async def test_an_engine_store_goes_in_while_the_gate_is_closed(tmp_path: Path) -> None:
    config = chain_config(tmp_path, gpu=None, cpu=4, disk=16, reserve=False)
    async with Hierarchy.from_config(config) as h:
        gate = h.chain.gate
        for _ in range(gate.limit):
            assert await gate.enter(None)  # the embedder's puts hold every place
        with gate.load_waiting():  # and a get waits for room at the top
            assert not gate.open_now()
            out = await asyncio.wait_for(h.prepare_engine_store([key(0)]), 10)
        assert out is not None and out.keys_to_store == [key(0)]
        h.manager.complete_store([key(0)], success=False)  # the engine's copy failed
        assert gate.in_flight == gate.limit and gate.waits == 0
        assert h.stats().calls.put_admission_waits == 0
        for _ in range(gate.limit):
            gate.leave()
        await h.drain()
        assert h.where(key(0)) is None
