"""A request's reuse hint through vLLM 0.33's own classes: `kv_transfer_params`
`{"kvtier_reuse": ..., "kvtier_reuse_ttl_s": ...}` reaches kvtier's tiers below vLLM's CPU
tier (`KvtierSecondaryTier`, driven by vLLM's `TieringOffloadingManager`) and kvtier's policy
of that CPU tier (`KvtierCachePolicy`, driven by vLLM's `CPUOffloadingManager`); a bad value
is a logged, counted ignore, never an error in the engine."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from vllm.v1.kv_offload.base import ReqContext
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec
from vllm_support import MODULE, Driver, disk_chain, key, kvtier_tier, pattern

from kvtier.errors import InvalidValueError
from kvtier.hints import ReuseHint
from kvtier.integrations.vllm import (
    KvtierCachePolicy,
    KvtierOffloadingSpec,
    KvtierSecondaryTier,
)
from kvtier.integrations.vllm.hints import hint_from_params
from kvtier.integrations.vllm.testing import offloading_config
from kvtier.keys import OffloadKey

CHUNK = 4096
PRIMARY = 8

# -- the keys --------------------------------------------------------------------------------


def test_hint_from_params_reads_the_two_keys() -> None:
    assert hint_from_params(None) is None
    assert hint_from_params({"other": 1}) is None
    assert hint_from_params({"kvtier_reuse": "never"}) == ReuseHint("never")
    given = {"kvtier_reuse": "likely", "kvtier_reuse_ttl_s": 30}
    assert hint_from_params(given) == ReuseHint("likely", 30.0)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"kvtier_reuse": "sometimes"}, "kvtier_reuse: reuse must be one of .*'sometimes'"),
        ({"kvtier_reuse": None}, "kvtier_reuse: reuse must be one of"),
        ({"kvtier_reuse": "likely", "kvtier_reuse_ttl_s": -5}, "kvtier_reuse_ttl_s: ttl_s"),
        ({"kvtier_reuse": "likely", "kvtier_reuse_ttl_s": "30"}, "kvtier_reuse_ttl_s: ttl_s"),
        ({"kvtier_reuse_ttl_s": 30}, "kvtier_reuse_ttl_s given without kvtier_reuse"),
    ],
)
def test_hint_from_params_names_the_bad_value(params: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidValueError, match=message):
        hint_from_params(params)


# -- kvtier's tiers below vLLM's CPU tier ----------------------------------------------------


@pytest.fixture
def tiering(tmp_path: Path) -> Iterator[tuple[Any, Driver, KvtierSecondaryTier]]:
    chain = disk_chain(tmp_path / "disk", 64, fsync=False)
    extra = {"cpu_bytes_to_use": PRIMARY * CHUNK, "secondary_tiers": [kvtier_tier(chain)]}
    spec = TieringOffloadingSpec(offloading_config(extra, block_bytes=CHUNK))
    manager = spec.get_manager()
    tier = manager.secondary_tiers[0]
    assert isinstance(tier, KvtierSecondaryTier)
    driver = Driver(manager)
    yield manager, driver, tier
    driver.close()
    manager.shutdown()


def store(manager: Any, driver: Driver, ids: range, params: dict[str, Any] | None) -> None:
    """One request, with `params` as its kv_transfer_params, storing chunks `ids`."""
    context = ReqContext(req_id=f"req-{ids.start}", kv_transfer_params=params)
    keys = [key(i) for i in ids]
    with manager.lock:
        manager.on_new_request(context)
        out = manager.prepare_store(keys, context)
        assert out is not None
        for chunk, k in zip(out.store_spec.block_ids, out.keys_to_store, strict=True):
            driver.rows[int(chunk)] = pattern(ids.start + keys.index(k), CHUNK)
        manager.complete_store(list(out.keys_to_store), context)
        manager.on_request_finished(context)
    driver.step()
    driver.settle()


def hints_in_kvtier(tier: KvtierSecondaryTier, ids: range) -> list[str | None]:
    def read(h: Any) -> list[str | None]:
        disk = h.manager.tiers[0]
        assert all(disk.has(OffloadKey(key(i))) is True for i in ids)
        held = [disk.hint_of(OffloadKey(key(i))) for i in ids]
        return [None if hint is None else hint.reuse for hint in held]

    result: list[str | None] = tier.hierarchy.call(read)
    return result


def test_a_requests_hint_reaches_kvtiers_tiers(tiering: Any) -> None:
    manager, driver, tier = tiering
    store(manager, driver, range(0, 2), {"kvtier_reuse": "never"})
    store(manager, driver, range(2, 4), {"kvtier_reuse": "likely", "kvtier_reuse_ttl_s": 60})
    store(manager, driver, range(4, 6), None)
    assert hints_in_kvtier(tier, range(0, 6)) == ["never"] * 2 + ["likely"] * 2 + [None] * 2
    assert (tier.hints.given, tier.hints.ignored) == (2, 0)


def test_a_bad_hint_is_logged_counted_and_ignored(
    tiering: Any, caplog: pytest.LogCaptureFixture
) -> None:
    manager, driver, tier = tiering
    with caplog.at_level(logging.WARNING, logger="kvtier.integrations.vllm"):
        store(manager, driver, range(0, 2), {"kvtier_reuse": "sometimes"})
        store(manager, driver, range(2, 4), {"kvtier_reuse": "never", "kvtier_reuse_ttl_s": 0})
    assert hints_in_kvtier(tier, range(0, 4)) == [None] * 4  # stored all the same
    assert (tier.hints.given, tier.hints.ignored) == (0, 2)
    warnings = [r.getMessage() for r in caplog.records if "reuse hint ignored" in r.getMessage()]
    assert len(warnings) == 2  # once per request, not per job or chunk
    assert "req-0" in warnings[0] and "'sometimes'" in warnings[0]


# -- kvtier's policy of vLLM's CPU tier ------------------------------------------------------


def cpu_tier(chunks: int = 4) -> CPUOffloadingManager:
    return CPUOffloadingManager(
        num_chunks=chunks, cache_policy="KvtierLRUCachePolicy", cache_policy_module_path=MODULE
    )


def store_cpu(m: CPUOffloadingManager, ids: range, params: Any = None) -> list[bytes]:
    """Store chunks as one request would; the chunks evicted for them."""
    context = ReqContext(req_id=f"r{ids.start}", kv_transfer_params=params)
    out = m.prepare_store([key(i) for i in ids], context)
    assert out is not None
    m.complete_store(out.keys_to_store, context)
    return list(out.evicted_keys)


def test_the_cpu_tier_policy_takes_the_storing_requests_hint() -> None:
    m = cpu_tier()
    store_cpu(m, range(0, 1), {"kvtier_reuse": "likely", "kvtier_reuse_ttl_s": 600})
    store_cpu(m, range(1, 2))
    store_cpu(m, range(2, 3), {"kvtier_reuse": "never"})
    store_cpu(m, range(3, 4))
    assert store_cpu(m, range(4, 5)) == [key(2)]  # "never" first, not the oldest
    assert store_cpu(m, range(5, 6)) == [key(1)]  # then LRU, skipping the "likely" 0
    policy = m._policy
    assert isinstance(policy, KvtierCachePolicy)
    assert (policy.hints.given, policy.hints.ignored) == (2, 0)


def test_the_cpu_tier_withdraws_a_likely_hint_at_its_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr("kvtier.integrations.vllm.policy.time.monotonic", lambda: now[0])
    m = cpu_tier(2)
    store_cpu(m, range(0, 1), {"kvtier_reuse": "likely", "kvtier_reuse_ttl_s": 5})
    store_cpu(m, range(1, 2))
    assert store_cpu(m, range(2, 3)) == [key(1)]  # 0 is kept while its hint holds
    now[0] += 6
    assert store_cpu(m, range(3, 4)) == [key(0)]  # expired: the least recently used goes


def test_the_cpu_tier_ignores_a_bad_hint() -> None:
    m = cpu_tier(2)
    store_cpu(m, range(0, 1), {"kvtier_reuse": 3})
    store_cpu(m, range(1, 2), "not a dict")  # not a mapping: no hint at all
    assert store_cpu(m, range(2, 3)) == [key(0)]
    policy = m._policy
    assert isinstance(policy, KvtierCachePolicy)
    assert (policy.hints.given, policy.hints.ignored) == (0, 1)


# -- the whole stack: KvtierOffloadingSpec ---------------------------------------------------


def test_under_the_spec_one_hint_reaches_the_cpu_tier_and_the_disk_once(tmp_path: Path) -> None:
    chain = {
        "tiers": [
            {"name": "host", "medium": "cpu", "capacity": 4, "policy": "lru"},
            {"name": "disk", "medium": "disk", "capacity": 16, "path": str(tmp_path / "d")},
        ]
    }
    spec = KvtierOffloadingSpec(offloading_config({"kvtier_config": chain}, block_bytes=CHUNK))
    manager = spec.get_manager()
    driver = Driver(manager)
    try:
        (tier,) = manager.secondary_tiers
        policy = manager.primary_tier._policy
        assert isinstance(tier, KvtierSecondaryTier) and isinstance(policy, KvtierCachePolicy)
        store(manager, driver, range(0, 1), {"kvtier_reuse": "likely", "kvtier_reuse_ttl_s": 600})
        store(manager, driver, range(1, 2), {"kvtier_reuse": "never"})
        store(manager, driver, range(2, 3), {"kvtier_reuse": "often"})  # bad: ignored
        store(manager, driver, range(3, 4), None)
        assert hints_in_kvtier(tier, range(0, 4)) == ["likely", "never", None, None]
        store(manager, driver, range(4, 6), None)  # the CPU tier is full: two chunks go
        assert set(policy._chunks) == {key(0), key(3), key(4), key(5)}  # "never" first
        # each request's hint was read once, by the tier below (it sees the request first)
        assert (tier.hints.given, tier.hints.ignored) == (2, 1)
        assert (policy.hints.given, policy.hints.ignored) == (0, 0)
    finally:
        driver.close()
        manager.shutdown()


# -- session hints ---------------------------------------------------------------------------


def test_session_from_params_reads_the_three_keys() -> None:
    from kvtier.integrations.vllm.hints import SessionParams, session_from_params

    assert session_from_params(None) is None
    assert session_from_params({"kvtier_reuse": "never"}) is None
    assert session_from_params({"kvtier_session": "t"}) == SessionParams("t")
    both = {"kvtier_session": "t", "kvtier_expect_within_s": 20, "kvtier_session_end": True}
    assert session_from_params(both) == SessionParams("t", True, 20.0)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"kvtier_session": 42}, "kvtier_session must be a non-empty string"),
        ({"kvtier_session_end": True}, "kvtier_session_end given without kvtier_session"),
        ({"kvtier_session": "t", "kvtier_session_end": 1}, "kvtier_session_end must be true"),
        ({"kvtier_session": "t", "kvtier_expect_within_s": -5}, "kvtier_expect_within_s"),
        ({"kvtier_session": "t", "kvtier_expect_within_s": 1e12}, "a week"),
        ({"kvtier_session": "t", "kvtier_expect_within_s": float("inf")}, "above 0"),
    ],
)
def test_session_from_params_names_the_bad_value(params: dict[str, Any], message: str) -> None:
    from kvtier.integrations.vllm.hints import session_from_params

    with pytest.raises(InvalidValueError, match=message):
        session_from_params(params)


def test_a_requests_session_reaches_kvtier_and_its_end_makes_its_blocks_never(
    tiering: Any,
) -> None:
    manager, driver, tier = tiering
    store(manager, driver, range(0, 2), {"kvtier_session": "a"})
    store(manager, driver, range(2, 4), {"kvtier_session": "b", "kvtier_expect_within_s": 30})

    def sessions(h: Any) -> tuple[list[Any], list[Any]]:
        return h._sessions.keys_of("a"), h._sessions.keys_of("b")

    a, b = tier.hierarchy.call(sessions)
    assert a == [OffloadKey(key(i)) for i in (0, 1)] and len(b) == 2
    store(manager, driver, range(4, 6), {"kvtier_session": "a", "kvtier_session_end": True})
    assert hints_in_kvtier(tier, range(0, 6)) == ["never"] * 2 + [None] * 2 + ["never"] * 2
    assert tier.hints.ignored == 0


def test_a_bad_session_hint_is_logged_counted_and_ignored(
    tiering: Any, caplog: pytest.LogCaptureFixture
) -> None:
    manager, driver, tier = tiering
    with caplog.at_level(logging.WARNING, logger="kvtier.integrations.vllm"):
        store(manager, driver, range(0, 2), {"kvtier_session": ["x"]})
    assert hints_in_kvtier(tier, range(0, 2)) == [None] * 2  # stored all the same
    assert tier.hints.ignored == 1
    assert any("session hint ignored" in r.getMessage() for r in caplog.records)
