"""One life of an SGLang node's HiCache storage side with kvtier's backend, as a process of
its own (the SGLang lane's restart, damage and shared-tier tests start it): a restart or a
second node is a new process, as in production.

    python tests/sglang_lane/sglang_node.py store|serve CONFIG.json OUT.json

CONFIG.json is the kvtier chain. `store`: fills the host pool's first PAGES pages with
seeded random KV and backs them up through SGLang's `HiCacheController` (its backup thread).
`serve`: a fresh host pool; SGLang's hit query for the same tokens, then its page transfer
into other host pages, and the loaded bytes compared with what `store` backed up. Then the
controller detaches (kvtier's chain closes). OUT.json: the pages backed up / found / loaded,
whether the loaded bytes equal the stored ones, the tier holding each page before the read,
and kvtier's per-tier counters (hits, stored, corrupt).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from cpu_shims import install_torchvision_stand_in  # noqa: E402

install_torchvision_stand_in()

from controller_kit import (  # noqa: E402
    attached,
    back_up,
    hierarchy,
    hit_query,
    host_pages,
    page_keys,
    transfer,
)
from sglang_pages import PAGE, FakeHostPool  # noqa: E402

from kvtier.integrations.sglang.store import page_key  # noqa: E402
from kvtier.testing.keyed import AUTH_KEY_ENV, fixed_key_hex  # noqa: E402

PAGES = 6
SEED = 7
LOAD_AT = 8
"""The host page the serve loads into (the stored pages are 0 .. PAGES - 1)."""
TOKENS = list(range(100, 100 + PAGES * PAGE))


def stored_pool() -> FakeHostPool:
    """The host pool `store` backs up (deterministic: `serve` rebuilds it to compare)."""
    pool = FakeHostPool()
    pool.fill(SEED)
    return pool


def counters(controller: Any) -> dict[str, dict[str, int]]:
    """kvtier's counters per tier."""
    stats = hierarchy(controller).stats()
    return {
        tier.name: {
            "hits": tier.hits,
            "stored": tier.stored,
            "corrupt": tier.corrupt,
            "problems": sum(tier.problems.values()) if tier.problems else 0,
        }
        for tier in stats.activity
    }


def store(config: dict[str, Any]) -> dict[str, Any]:
    pool = stored_pool()
    with attached(pool, config) as controller:
        done = back_up(controller, TOKENS, list(range(PAGES)))
        chain = hierarchy(controller)
        chain.drain()
        held = [chain.where(page_key(key)) for key in page_keys(TOKENS)]
        activity = counters(controller)
    return {"backed_up_tokens": done, "held_on": held, "activity": activity}


def serve(config: dict[str, Any]) -> dict[str, Any]:
    pool = FakeHostPool()
    with attached(pool, config) as controller:
        found, hit_tokens = hit_query(controller, "serve", TOKENS)
        chain = hierarchy(controller)
        held = [chain.where(page_key(key)) for key in page_keys(TOKENS)]
        loaded = transfer(controller, "serve", TOKENS, list(range(LOAD_AT, LOAD_AT + PAGES)))
        activity = counters(controller)
    expected = host_pages(stored_pool(), 0, PAGES)
    got = host_pages(pool, LOAD_AT, PAGES)
    equal = [
        bool(got[:, :, p * PAGE : (p + 1) * PAGE].equal(expected[:, :, p * PAGE : (p + 1) * PAGE]))
        for p in range(PAGES)
    ]
    untouched = [not bool(got[:, :, p * PAGE : (p + 1) * PAGE].any()) for p in range(PAGES)]
    return {
        "found_pages": len(found),
        "hit_tokens": hit_tokens,
        "held_before_read": held,
        "loaded_pages": loaded,
        "equal": equal,
        "untouched": untouched,
        "activity": activity,
    }


def main(argv: list[str]) -> int:
    role, config_path, out_path = argv
    os.environ.setdefault(AUTH_KEY_ENV, fixed_key_hex())
    config = json.loads(Path(config_path).read_text())
    result = store(config) if role == "store" else serve(config)
    Path(out_path).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
