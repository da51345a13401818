"""The compiled bookkeeping core (issue 23, item 4): how it is selected (`kvtier.compiled`),
and, when `scripts/build-core` has built it, that it decides exactly as the pure-Python
source: the same hits, victims and final lists on the shipped trace and on random programs,
for the policies alone and through a `TierManager`. The two cores run in two processes (one
with KVTIER_PURE_PYTHON=1), since a process holds one of them."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from kvtier import compiled
from kvtier.blocks import BlockStatus
from kvtier.keys import OffloadKey, key_from_int

TESTS = Path(__file__).resolve().parent


def run_python(code: str, *, pure: bool) -> str:
    """Run `code` in a fresh interpreter with the compiled core allowed or not; its stdout."""
    env = dict(os.environ)
    env.pop(compiled.PURE_ENV, None)
    if pure:
        env[compiled.PURE_ENV] = "1"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


# -- selection ------------------------------------------------------------------------------


def test_the_environment_variable_forces_the_pure_python_core() -> None:
    out = run_python(
        "import kvtier.compiled as c, kvtier.policies.arc as m; print(c.core_status(), m.__file__)",
        pure=True,
    )
    assert out.startswith(f"pure Python ({compiled.PURE_ENV}=1)")
    assert out.endswith("arc.py")


def fake_build(tmp: Path, monkeypatch: pytest.MonkeyPatch, sources: dict[str, str]) -> None:
    """A manifest and (empty) extension files in `tmp`, which `kvtier.compiled` then reads."""
    suffix = compiled.extension_suffix()
    for module in compiled.CORE_MODULES:
        so = compiled.extension_path(module, suffix, tmp)
        so.parent.mkdir(parents=True, exist_ok=True)
        so.write_bytes(b"")
    manifest = {"compiler": "Cython test", "suffix": suffix, "sources": sources}
    (tmp / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setattr(compiled, "COMPILED_DIR", tmp)
    monkeypatch.setattr(compiled, "MANIFEST", tmp / "manifest.json")
    monkeypatch.delenv(compiled.PURE_ENV, raising=False)


def current_sources() -> dict[str, str]:
    return {m: compiled.source_digest(m) for m in compiled.CORE_MODULES}


def test_a_build_of_the_current_sources_is_selected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_build(tmp_path, monkeypatch, current_sources())
    paths, status = compiled._compiled_paths()
    assert status == f"compiled (Cython test), {len(compiled.CORE_MODULES)} modules"
    assert set(paths) == set(compiled.CORE_MODULES)
    assert all(path.is_relative_to(tmp_path) for path in paths.values())


def test_a_module_edited_since_the_build_runs_as_pure_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sources = current_sources()
    sources["kvtier.policies.arc"] = hashlib.sha256(b"an older arc.py").hexdigest()
    fake_build(tmp_path, monkeypatch, sources)
    paths, status = compiled._compiled_paths()
    assert set(paths) == set(compiled.CORE_MODULES) - {"kvtier.policies.arc"}
    assert "kvtier.policies.arc changed since the build: pure Python" in status


def test_a_core_of_another_python_or_without_its_files_is_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_build(tmp_path, monkeypatch, current_sources())
    for so in tmp_path.rglob("*" + compiled.extension_suffix()):
        so.unlink()
    assert compiled._compiled_paths() == (
        {},
        "pure Python (compiled core stale or incomplete: run scripts/build-core)",
    )
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    manifest["suffix"] = ".cpython-399-elsewhere.so"
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    paths, status = compiled._compiled_paths()
    assert paths == {} and "another Python" in status


def test_without_a_build_the_core_is_pure_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compiled, "MANIFEST", tmp_path / "manifest.json")
    monkeypatch.delenv(compiled.PURE_ENV, raising=False)
    assert compiled._compiled_paths() == (
        {},
        "pure Python (no compiled core: run scripts/build-core)",
    )


def test_a_built_core_is_what_the_core_modules_are() -> None:
    """With a build of the current sources (scripts/build-core), a fresh process imports
    every core module from it; the version line says so."""
    if not compiled_core_built():
        pytest.skip("no compiled core (scripts/build-core builds it)")
    code = "import importlib, kvtier.compiled as c; print(c.core_status()); print(" + (
        "[importlib.import_module(m).__file__ for m in c.CORE_MODULES])"
    )
    status, files = run_python(code, pure=False).splitlines()
    assert status.startswith("compiled (Cython")
    assert files.count(compiled.extension_suffix()) == len(compiled.CORE_MODULES)


# -- the decisions of both cores --------------------------------------------------------------


def random_program(name: str, seed: int) -> list[object]:
    """Every answer of a policy of `name` driven by a seeded random program of stores (with
    protected keys and pinned blocks), hits, failed stores and hints: what it returned and its
    final order."""
    from kvtier.policies import get_policy_class

    rng = random.Random(seed)
    capacity = rng.choice([1, 3, 8, 32])
    policy = get_policy_class(name)(capacity)
    keys = [key_from_int(i) for i in range(capacity * 4)]
    log: list[object] = []
    for _ in range(400):
        action = rng.random()
        resident = [key for key, _ in policy.items()]
        if action < 0.5:
            request = rng.sample(keys, rng.randint(1, min(len(keys), capacity + 2)))
            hits = [k for k in request if policy.get(k) is not None]
            misses = [k for k in request if policy.get(k) is None][:capacity]
            policy.touch(hits)
            policy.on_store_miss(misses)
            room = len(policy) + len(misses) - capacity
            evicted = policy.evict(max(room, 0), set(request))
            log.append(("store", hits, None if evicted is None else [k for k, _ in evicted]))
            if evicted is not None:
                blocks = [BlockStatus(i) for i in range(len(misses))]
                policy.insert_many(misses, blocks)
                for block in blocks:
                    block.ref_cnt = rng.choice([0, 0, 0, -1, 1])
        elif action < 0.6 and resident:
            key = rng.choice(resident)
            block = policy.get(key)
            assert block is not None
            block.ref_cnt = 0 if block.ref_cnt else rng.choice([1, -1])
        elif action < 0.7 and resident:
            key = rng.choice(resident)
            policy.remove(key)
            log.append(("remove", key))
        elif action < 0.8 and resident:
            policy.hint(rng.choice(resident), rng.choice(["never", "unlikely", "likely", None]))
        else:
            policy.touch(rng.sample(keys, rng.randint(1, 4)))
    log.append(("final", sorted(key for key, _ in policy.items())))
    lists = getattr(policy, "lists", None) or getattr(policy, "lru_order", None)
    if lists is not None:
        log.append(("order", lists()))
    return log


def trace_decisions(name: str, fraction: float, limit: int) -> list[object]:
    """A TierManager of policy `name` replaying the shipped trace's first `limit` requests:
    each request's hits and the victims and stored keys of its store, and the final order."""
    from kvtier.manager.tier import make_tier_manager
    from kvtier.workloads.traces import read_mooncake

    requests: list[list[OffloadKey]] = []
    for i, request in enumerate(read_mooncake()):
        if i >= limit:
            break
        requests.append([key_from_int(h) for h in dict.fromkeys(request.hash_ids)])
    distinct = len({k for keys in requests for k in keys})
    tier = make_tier_manager(max(1, int(fraction * distinct)), 16, "cpu", name)
    log: list[object] = []
    for keys in requests:
        hits = [k for k in keys if tier.lookup(k) is True]
        misses = [k for k in keys if k not in set(hits)]
        if hits:
            tier.prepare_load(hits)
            tier.touch(hits)
            tier.complete_load(hits)
        out = tier.prepare_store(misses) if misses else None
        if out is not None:
            tier.complete_store(out.keys_to_store)
            log.append((len(hits), out.evicted_keys, out.keys_to_store))
        else:
            log.append((len(hits), None))
    log.append([key for key, _ in tier.policy.items()])
    return log


def decisions_digest() -> str:
    """One hash of every decision above, for LRU, ARC and lct (run in each core's process)."""
    log: list[object] = []
    for name in ("lru", "arc", "lct"):
        log += [random_program(name, seed) for seed in range(40)]
        log += [trace_decisions(name, fraction, 3000) for fraction in (0.01, 0.1)]
    return hashlib.sha256(repr(log).encode()).hexdigest()


def compiled_core_built() -> bool:
    out = run_python("import kvtier.compiled as c; print(c.core_is_compiled())", pure=False)
    return out.endswith("True")


@pytest.mark.slow
def test_the_compiled_core_decides_as_the_pure_python_one() -> None:
    if not compiled_core_built():
        pytest.skip("no compiled core (scripts/build-core builds it)")
    code = f"import sys; sys.path.insert(0, {str(TESTS)!r}); import test_compiled_core as t; "
    code += "print(t.decisions_digest())"
    assert run_python(code, pure=False) == run_python(code, pure=True)


@pytest.mark.slow
def test_the_digest_sees_a_different_decision() -> None:
    """The comparison above can fail: one decision changed changes the digest."""
    baseline = repr(random_program("arc", 0))
    assert random_program("arc", 0) == random_program("arc", 0)
    assert repr(random_program("arc", 1)) != baseline
    assert repr(random_program("lru", 0)) != baseline
