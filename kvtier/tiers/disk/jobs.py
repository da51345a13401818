"""The calls a disk store queues on its write lane (lane.py): a `WriteJob` per `write`, a
`ForgetJob` per `forget`, and how their futures are settled once their group is done."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from kvtier.keys import OffloadKey
from kvtier.tiers.storage import HostBuffer

Results = list[OSError | None]


@dataclass(eq=False, slots=True)
class WriteJob:
    """One `write` call (validated); its future (None for `write_now`) gets one result per
    block."""

    keys: list[OffloadKey]
    slots: list[int]
    buffers: list[HostBuffer]
    future: asyncio.Future[Results] | None


@dataclass(eq=False, slots=True)
class ForgetJob:
    """One `forget` call (validated, keys distinct)."""

    keys: list[OffloadKey]
    future: asyncio.Future[None]


Job = WriteJob | ForgetJob
Settlement = tuple["asyncio.Future[Any]", Any, BaseException | None]


def settle(settlements: list[Settlement]) -> None:
    """Resolve the futures of a group (on their event loop); a caller that was cancelled
    meanwhile has a done future, which is left alone."""
    for future, result, error in settlements:
        if future.done():
            continue
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
