"""A fleet node for `test_fleet_e2e.py`: a kvtier `Hierarchy` (cpu -> disk) publishing its
KV events, driven over a control channel: one JSON request a line on stdin, one JSON answer
a line on stdout.

    {"op": "put", "keys": ["<hex>", ...]}        -> {"stored": n}
    {"op": "bulk", "puts": P, "blocks": B, "key_bytes": K, "seed": S}
                                                 -> {"stored": n}  (P puts of B fresh keys)
    {"op": "flush"}  the chain quiet (`drain`), every event it recorded sent
                     -> {"truth": {"<hex>": ["CPU", "DISK"], ...}}  what each tier holds,
                        asked of the tiers key by key (`has`) over every key ever put
    {"op": "stop"}   -> {"stopped": true}, then the process ends

The first line it prints is {"ready": true, "incarnation": n} once the hierarchy is open.
Run as `python tests/fleet_node.py '<json config>'` (see `node_config` in the test).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from pathlib import Path
from typing import Any

import torch

from kvtier import Hierarchy
from kvtier.fleet.events import wire_medium
from kvtier.keys import OffloadKey


def hierarchy_config(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "block_size": spec["block_size"],
        "tiers": [
            {"name": "cpu", "medium": "cpu", "capacity": spec["cpu"]},
            {"name": "disk", "medium": "disk", "capacity": spec["disk"], "path": spec["disk_dir"]},
        ],
        "events": {
            "enabled": True,
            "endpoint": f"tcp://127.0.0.1:{spec['pub_port']}",
            "replay_endpoint": f"tcp://127.0.0.1:{spec['replay_port']}",
            "replay_batches": spec["replay_batches"],
        },
    }


class Node:
    def __init__(self, h: Hierarchy, block_size: int, keys_file: Path) -> None:
        self.h = h
        self.block_size = block_size
        self.keys_file = keys_file
        self.known: dict[OffloadKey, None] = {}
        """Every key ever put, by this run or an earlier one (what `truth` asks the tiers
        about: a restarted node holds what its disk restored)."""
        if keys_file.exists():
            lines = keys_file.read_text().split()
            self.known.update(dict.fromkeys(OffloadKey(bytes.fromhex(line)) for line in lines))

    async def put(self, keys: list[OffloadKey]) -> int:
        new = [key for key in keys if key not in self.known]
        with self.keys_file.open("a") as file:
            file.write("".join(key.hex() + "\n" for key in new))
        self.known.update(dict.fromkeys(new))
        blocks = torch.zeros((len(keys), self.block_size), dtype=torch.uint8)
        return await self.h.put(keys, blocks)

    async def flush(self) -> dict[str, list[str]]:
        await self.h.drain()
        publisher = self.h._publisher  # the test node waits until its events went out
        while publisher is not None and publisher.pending:
            await asyncio.sleep(0.01)
        truth: dict[str, list[str]] = {}
        tiers = self.h.manager.tiers
        for key in self.known:
            media = sorted(wire_medium(str(t.medium)) for t in tiers if t.has(key) is True)
            if media:
                truth[key.hex()] = media
        return truth

    async def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request["op"]
        if op == "put":
            return {
                "stored": await self.put([OffloadKey(bytes.fromhex(k)) for k in request["keys"]])
            }
        if op == "bulk":
            rng = random.Random(request["seed"])
            stored = 0
            for _ in range(request["puts"]):
                keys = [
                    OffloadKey(rng.randbytes(request["key_bytes"]))
                    for _ in range(request["blocks"])
                ]
                stored += await self.put(keys)
            return {"stored": stored}
        if op == "flush":
            return {"truth": await self.flush()}
        raise ValueError(f"unknown op {op!r}")


async def main(spec: dict[str, Any]) -> None:
    async with Hierarchy.from_config(hierarchy_config(spec)) as h:
        node = Node(h, spec["block_size"], Path(spec["disk_dir"] + ".keys"))
        publisher = h._publisher
        incarnation = 0 if publisher is None else publisher.incarnation
        print(json.dumps({"ready": True, "incarnation": incarnation}), flush=True)
        while True:
            line = await asyncio.to_thread(sys.stdin.readline)
            if not line:
                return
            request = json.loads(line)
            if request["op"] == "stop":
                print(json.dumps({"stopped": True}), flush=True)
                return
            print(json.dumps(await node.answer(request)), flush=True)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
