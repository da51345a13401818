"""Session hints through kvtier's SGLang page store (`kvtier.integrations.sglang.store`, no
SGLang needed): the keys of vLLM's `kv_transfer_params`, read from the `extra_info` dict of
the `HiCacheStorageExtraInfo` SGLang passes to `batch_get_v1` / `batch_set_v1`."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from sglang_pages import FakeHostPool, chain, hashes, indices

from kvtier.errors import UnknownSessionError
from kvtier.integrations.sglang.store import PageStore, ShardIdentity, page_key
from kvtier.testing.keyed import AUTH_KEY_ENV, fixed_key_hex

os.environ.setdefault(AUTH_KEY_ENV, fixed_key_hex())

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[PageStore]:
    pool = FakeHostPool()
    pool.fill(1)
    page_store = PageStore(chain(tmp_path, cpu_blocks=8), ShardIdentity("llama"), timeout_s=5.0)
    page_store.attach(pool)
    yield page_store
    page_store.close()


def extra(**params: Any) -> SimpleNamespace:
    """What SGLang passes: a HiCacheStorageExtraInfo, its request metadata in `extra_info`."""
    return SimpleNamespace(prefix_keys=None, extra_info=params)


def top_tier(store: PageStore, what: str, key: str) -> Any:
    hierarchy = store.hierarchy
    assert hierarchy is not None
    tier = hierarchy.call(lambda h: h.manager.tiers[0])
    if what == "rank":
        return tier.rank_of(page_key(key))
    held = tier.hint_of(page_key(key))
    return None if held is None else held.reuse


def test_pages_are_named_by_their_session_read_again_and_ended(store: PageStore) -> None:
    keys = hashes(3)
    expected = extra(kvtier_session="task-1", kvtier_expect_within_s=600)
    assert store.set_pages(keys[:2], indices([0, 1]), expected) == [True, True]
    rank = top_tier(store, "rank", keys[0])
    assert rank is not None and rank[0] == 1  # expected: after every idle session's
    # the next request reads the prefix: named again, idle now (no expectation)
    assert store.get_pages(keys[:2], indices([4, 5]), extra(kvtier_session="task-1")) == [
        True,
        True,
    ]
    assert top_tier(store, "rank", keys[0])[0] == 0
    last = {"kvtier_session": "task-1", "kvtier_session_end": True}  # a plain mapping too
    assert store.set_pages(keys[2:], indices([2]), last) == [True]
    assert [top_tier(store, "hint", key) for key in keys] == ["never"] * 3
    assert store.session_hints_given == 3 and store.session_hints_ignored == 0
    hierarchy = store.hierarchy
    assert hierarchy is not None
    with pytest.raises(UnknownSessionError):
        hierarchy.end_session("task-1")  # ended by the last request's pages


def test_no_session_in_extra_info_stores_as_before(store: PageStore) -> None:
    keys = hashes(2)
    assert store.set_pages(keys[:1], indices([0]), None) == [True]
    assert store.set_pages(keys[1:], indices([1]), SimpleNamespace(extra_info=None)) == [True]
    assert [top_tier(store, "rank", key) for key in keys] == [None, None]
    assert store.session_hints_given == 0 and store.session_hints_ignored == 0


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"kvtier_session": 5}, "kvtier_session"),
        ({"kvtier_session": ""}, "kvtier_session"),
        ({"kvtier_session": "t", "kvtier_expect_within_s": -1}, "kvtier_expect_within_s"),
        ({"kvtier_session": "t", "kvtier_expect_within_s": 1e12}, "kvtier_expect_within_s"),
        ({"kvtier_session": "t", "kvtier_session_end": "yes"}, "kvtier_session_end"),
        ({"kvtier_expect_within_s": 5}, "without kvtier_session"),
    ],
)
def test_a_bad_session_hint_is_one_line_and_the_pages_are_stored_without_it(
    store: PageStore, caplog: pytest.LogCaptureFixture, params: dict[str, Any], named: str
) -> None:
    key = hashes(1)
    with caplog.at_level(logging.WARNING, logger="kvtier.integrations.sglang"):
        assert store.set_pages(key, indices([0]), extra(**params)) == [True]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and named in warnings[0] and "\n" not in warnings[0]
    assert top_tier(store, "rank", key[0]) is None  # stored, unranked: nothing else changed
    assert store.session_hints_ignored == 1 and store.session_hints_given == 0


def test_the_backend_hands_sglangs_extra_info_to_the_store() -> None:
    pytest.importorskip("sglang")
    from kvtier.integrations.sglang.backend import KvtierHiCacheStorage

    calls: list[tuple[str, object]] = []
    fake = SimpleNamespace(
        get_pages=lambda keys, at, info: calls.append(("get", info)) or [True],
        set_pages=lambda keys, at, info: calls.append(("set", info)) or [True],
    )
    backend = object.__new__(KvtierHiCacheStorage)
    backend.store = fake  # type: ignore[assignment]
    info = extra(kvtier_session="t")
    assert backend.batch_set_v1(["k"], indices([0]), info) == [True]
    assert backend.batch_get_v1(["k"], indices([0]), info) == [True]
    assert calls == [("set", info), ("get", info)]
