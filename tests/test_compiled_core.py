"""The compiled bookkeeping core (issue 23, item 4): how it is selected (`kvtier.compiled`),
and, when `scripts/build-core` has built it, that it decides exactly as the pure-Python
source: the same hits, victims and final lists on the shipped trace and on random programs,
for the policies alone and through a `TierManager`. The two cores run in two processes (one
with KVTIER_PURE_PYTHON=1), since a process holds one of them. ARC's core (`_arc_core.py`,
Cython's pure Python mode) and lct's (`_lct_core.py`, likewise) are also compared call by
call, in one process, compiled against their own text loaded as plain Python
(`pure_module`)."""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import json
import os
import random
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier import compiled
from kvtier.blocks import BlockStatus
from kvtier.keys import OffloadKey, key_from_int
from kvtier.policies import CachePolicy

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
    lists = (
        getattr(policy, "lists", None)
        or getattr(policy, "lru_order", None)
        or getattr(policy, "queues", None)
    )
    if lists is not None:
        log.append(("order", lists()))
    return log


def trace_requests(limit: int) -> list[list[OffloadKey]]:
    """The keys of the shipped trace's first `limit` requests (duplicates in one dropped)."""
    from kvtier_tools.workloads.traces import read_mooncake

    requests: list[list[OffloadKey]] = []
    for i, request in enumerate(read_mooncake()):
        if i >= limit:
            break
        requests.append([key_from_int(h) for h in dict.fromkeys(request.hash_ids)])
    return requests


def trace_decisions(name: str, fraction: float, limit: int) -> list[object]:
    """A TierManager of policy `name` replaying the shipped trace's first `limit` requests:
    each request's hits and the victims and stored keys of its store, and the final order."""
    from kvtier.manager.tier import make_tier_manager

    requests = trace_requests(limit)
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
    """One hash of every decision above, for LRU, ARC, S3-FIFO and lct (run in each core's
    process)."""
    log: list[object] = []
    for name in ("lru", "arc", "s3fifo", "lct"):
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


# -- ARC's compiled core against the pure-Python ARC, in one process ----------------------------


ARC_CORE = "kvtier.policies._arc_core"
LCT_CORE = "kvtier.policies._lct_core"


@functools.cache
def pure_module(module: str) -> ModuleType:
    """Core module `module` loaded from its `.py` as plain Python, whatever this process
    selected (under another name, beside the module itself)."""
    spec = importlib.util.spec_from_file_location(
        module + "_as_python", compiled.source_path(module)
    )
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


def is_compiled(module: ModuleType) -> bool:
    return str(module.__file__).endswith(compiled.extension_suffix())


def compiled_lct() -> type[CachePolicy]:
    """`LCTCachePolicy`, or a skip when its core (`_lct_core`) is not the compiled one."""
    from kvtier.policies import LCTCachePolicy, _lct_core

    if not is_compiled(_lct_core):
        pytest.skip("lct's compiled core is not selected (scripts/build-core builds it)")
    return LCTCachePolicy


def pure_lct() -> type[CachePolicy]:
    """`LCTCachePolicy` over `_lct_core.py` run as plain Python."""
    from kvtier.policies import LCTCachePolicy

    state = pure_module(LCT_CORE).LCTState
    return type("PythonLCT", (LCTCachePolicy,), {"state_class": state})


def compiled_arc() -> type[CachePolicy]:
    """`ARCCachePolicy`, or a skip when its core (`_arc_core`) is not the compiled one."""
    from kvtier.policies import ARCCachePolicy, _arc_core

    if not is_compiled(_arc_core):
        pytest.skip("ARC's compiled core is not selected (scripts/build-core builds it)")
    return ARCCachePolicy


def pure_arc() -> type[CachePolicy]:
    """`ARCCachePolicy` over `_arc_core.py` run as plain Python."""
    from kvtier.policies import ARCCachePolicy

    lists = pure_module(ARC_CORE).ARCLists
    return type("PythonARC", (ARCCachePolicy,), {"lists_class": lists})


def test_the_pure_arc_runs_the_core_as_python() -> None:
    policy = pure_arc()(4)
    core = policy._core  # type: ignore[attr-defined]
    assert type(core).__module__ == ARC_CORE + "_as_python"
    assert str(pure_module(ARC_CORE).__file__).endswith("_arc_core.py")
    assert not is_compiled(pure_module(ARC_CORE))


def test_the_pure_lct_runs_the_core_as_python() -> None:
    policy = pure_lct()(4)
    core = policy._core  # type: ignore[attr-defined]
    assert type(core).__module__ == LCT_CORE + "_as_python"
    assert str(pure_module(LCT_CORE).__file__).endswith("_lct_core.py")
    assert not is_compiled(pure_module(LCT_CORE))


def test_without_a_compiled_core_the_policies_run_their_sources() -> None:
    out = run_python(
        "from kvtier.policies import _lct_core, _arc_core; "
        "print(_lct_core.__file__, _arc_core.__file__)",
        pure=True,
    )
    assert out.endswith("_arc_core.py") and "_lct_core.py " in out


def test_with_a_compiled_core_the_policies_run_their_extensions() -> None:
    if not compiled_core_built():
        pytest.skip("no compiled core (scripts/build-core builds it)")
    out = run_python(
        "from kvtier.policies import _lct_core, _arc_core; "
        "print(_lct_core.__file__, _arc_core.__file__)",
        pure=False,
    )
    lct_file, arc_file = out.split()
    assert lct_file.endswith(compiled.extension_suffix())
    assert arc_file.endswith(compiled.extension_suffix())


@pytest.mark.parametrize("name", ["arc", "lct", "s3fifo"])
def test_the_cores_run_without_cython_installed(name: str) -> None:
    """Where Cython is not installed, `_arc_core`, `_lct_core` and `_s3fifo_core` import
    `_cython_shim` instead and decide as they do with Cython's own shadow module."""
    code = f"import sys; sys.path.insert(0, {str(TESTS)!r}); import test_compiled_core as t; "
    code += f"import hashlib; log = repr([t.random_program({name!r}, s) for s in range(5)]); "
    code += "print(hashlib.sha256(log.encode()).hexdigest())"
    without = run_python("import sys; sys.modules['cython'] = None; " + code, pure=True)
    assert without == run_python(code, pure=True)
    shim = run_python(
        "import sys; sys.modules['cython'] = None; "
        f"import kvtier.policies._{name}_core as m; print(m.cython.__name__)",
        pure=True,
    )
    assert shim == "kvtier.policies._cython_shim"


def arc_state(policy: CachePolicy) -> tuple[object, ...]:
    """What an ARC shows: its lists, p, resident count and blocks, and the keys announced and
    not inserted yet (in order) with whether p adapted to them."""
    lists = policy.lists()  # type: ignore[attr-defined]
    blocks = sorted((key, block.block_id, block.ref_cnt) for key, block in policy.items())
    core = policy._core  # type: ignore[attr-defined]
    announced = (core.announced(), core.incoming_adapted)
    return (lists, policy.target_t1_size, len(policy), blocks, announced)  # type: ignore[attr-defined]


class TwinARC:
    """The pure and the compiled ARC driven by the same calls; each call's answers (values or
    exception types) and the states after it must be equal."""

    def __init__(self, capacity: int, *, check_states: bool = True) -> None:
        self.check_states = check_states
        self.fast: CachePolicy = compiled_arc()(capacity)
        self.pure: CachePolicy = pure_arc()(capacity)
        self.calls = 0

    def call(self, method: str, *args: object, blocks: Sequence[object] = ()) -> object:
        """`method(*args)` on both (blocks, if given, are each policy's own copies: appended
        last); returns the pure answer."""
        answers = []
        for policy, copies in ((self.pure, 0), (self.fast, 1)):
            extra = (blocks[copies],) if blocks else ()
            try:
                answer: object = getattr(policy, method)(*args, *extra)
            except Exception as exc:  # the same exception type is the same answer
                answer = type(exc)
            if isinstance(answer, list) and all(isinstance(a, tuple) for a in answer):
                answer = [
                    (k, (b.block_id, b.ref_cnt)) if isinstance(b, BlockStatus) else (k, b)
                    for k, b in answer
                ]
            answers.append(answer)
        self.calls += 1
        assert answers[0] == answers[1], f"call {self.calls}: {method}{args}"
        if self.check_states:
            self.check(f"call {self.calls}: {method}")
        return answers[0]

    def check(self, where: str) -> None:
        assert arc_state(self.pure) == arc_state(self.fast), where

    def pin(self, key: OffloadKey, ref_cnt: int) -> None:
        for policy in (self.pure, self.fast):
            block = policy.get(key)
            assert block is not None
            block.ref_cnt = ref_cnt


def pair_of_blocks(block_id: int, ref_cnt: int) -> tuple[BlockStatus, BlockStatus]:
    pair = (BlockStatus(block_id), BlockStatus(block_id))
    for block in pair:
        block.ref_cnt = ref_cnt
    return pair


def policy_steps(
    capacity: int, *extra: st.SearchStrategy[tuple[object, ...]]
) -> st.SearchStrategy[tuple[object, ...]]:
    """One call of a policy program over keys 0 .. 3c+2, with the `extra` kinds of call a
    policy has besides; stores (which evict, and hit ghosts when a key comes back) are the
    most frequent."""
    universe = st.integers(0, 3 * capacity + 2)
    store = st.tuples(
        st.just("store"),
        st.lists(universe, max_size=capacity + 2, unique=True),
        st.sampled_from([0, 0, 0, 0, 0, 0, -1, 1]),
        st.booleans(),
    )
    return st.one_of(
        store,
        store,
        store,
        store,
        st.tuples(st.just("touch"), st.lists(universe, max_size=6)),
        st.tuples(st.just("pin"), universe, st.sampled_from([0, 1, -1])),
        st.tuples(st.just("remove"), universe),
        st.tuples(st.just("insert"), universe, st.sampled_from([0, -1])),
        st.tuples(st.just("evict"), st.integers(0, capacity + 1), st.lists(universe, max_size=4)),
        st.tuples(st.just("announce"), st.lists(universe, max_size=capacity + 2)),
        *extra,
        st.tuples(
            st.just("hint"), universe, st.sampled_from(["never", "unlikely", "likely", None])
        ),
        st.tuples(st.just("clear")),
    )


def lct_steps(capacity: int) -> st.SearchStrategy[tuple[object, ...]]:
    """`policy_steps` with lct's own calls: moves from the tier above, and admissions."""
    keys = st.lists(st.integers(0, 3 * capacity + 2), max_size=capacity + 2)
    return policy_steps(
        capacity, st.tuples(st.just("move"), keys), st.tuples(st.just("admit"), keys)
    )


@st.composite
def arc_programs(draw: st.DrawFn) -> tuple[int, list[tuple[object, ...]]]:
    """A capacity and a random program of ARC calls."""
    capacity = draw(st.integers(1, 12))
    return capacity, draw(st.lists(policy_steps(capacity), min_size=20, max_size=150))


CALLS = {"touch": "touch", "announce": "on_store_miss", "move": "on_store_move", "admit": "admit"}
"""The program steps that call a policy method with a list of keys."""


def run_twin_program(
    capacity: int, program: list[tuple[object, ...]], twin_class: type[TwinARC] | None = None
) -> None:
    """Run `program` on a twin (`TwinARC` by default). A store is what a tier does with a
    request: the hits touched, the misses announced, admitted (a policy that does not admit
    all), room made, then inserted one by one or as one batch."""
    twin = (twin_class or TwinARC)(capacity)
    for number, step in enumerate(program):
        kind = step[0]
        if kind == "store":
            _, ids, ref_cnt, one_by_one = step
            keys = [key_from_int(i) for i in ids]  # type: ignore[attr-defined]
            hits = [k for k in keys if twin.pure.get(k) is not None]
            twin.call("touch", hits)
            misses = [k for k in keys if twin.pure.get(k) is None]
            twin.call("on_store_miss", misses)
            if not twin.pure.admits_all:
                admitted = twin.call("admit", misses)
                misses = [k for k, ok in zip(misses, admitted, strict=True) if ok]  # type: ignore[call-overload]
            room = len(twin.pure) + len(misses) - capacity
            if room > 0 and twin.call("evict", room, set(keys)) is None:
                continue
            pairs = [pair_of_blocks(number * 100 + i, ref_cnt) for i in range(len(misses))]  # type: ignore[operator]
            if one_by_one:
                for key, pair in zip(misses, pairs, strict=True):
                    twin.call("insert", key, blocks=pair)
            else:
                twin.call(
                    "insert_many", misses, blocks=([p[0] for p in pairs], [p[1] for p in pairs])
                )
        elif kind in CALLS:
            twin.call(CALLS[kind], [key_from_int(i) for i in step[1]])  # type: ignore[index,attr-defined]
        elif kind == "pin":
            key = key_from_int(step[1])  # type: ignore[arg-type]
            if twin.pure.get(key) is not None:
                twin.pin(key, step[2])  # type: ignore[arg-type]
        elif kind == "remove":
            twin.call("remove", key_from_int(step[1]))  # type: ignore[arg-type]
        elif kind == "insert":
            twin.call("insert", key_from_int(step[1]), blocks=pair_of_blocks(number, step[2]))  # type: ignore[arg-type]
        elif kind == "evict":
            protected = {key_from_int(i) for i in step[2]}  # type: ignore[attr-defined]
            twin.call("evict", step[1], protected)
        elif kind == "hint":
            twin.call("hint", key_from_int(step[1]), step[2])  # type: ignore[arg-type]
        else:
            twin.call("clear")


def seeded_program(seed: int) -> tuple[int, list[tuple[object, ...]]]:
    """A longer program of mostly stores (the shape of `tests/test_arc_paper.py`'s), where
    keys come back after their eviction: many ghost hits, in B1 and in B2."""
    rng = random.Random(seed)
    capacity = rng.choice([1, 2, 4, 8, 16])
    universe = 3 * capacity + 2
    program: list[tuple[object, ...]] = []
    for _ in range(300):
        action = rng.random()
        if action < 0.6:
            ids = rng.sample(range(universe), rng.randint(1, min(universe, capacity + 2)))
            program.append(("store", ids, rng.choice([0] * 8 + [-1, 1]), rng.random() < 0.5))
        elif action < 0.75:
            program.append(("touch", [rng.randrange(universe) for _ in range(rng.randint(1, 6))]))
        elif action < 0.85:
            program.append(("pin", rng.randrange(universe), rng.choice([0, 0, 1, -1])))
        elif action < 0.9:
            program.append(("remove", rng.randrange(universe)))
        elif action < 0.95:
            program.append(("evict", rng.randint(0, capacity), [rng.randrange(universe)]))
        else:
            program.append(("hint", rng.randrange(universe), rng.choice(["never", "likely", None])))
    return capacity, program


def test_compiled_arc_keeps_an_announced_ghost_announced_when_the_bound_drops_it() -> None:
    """A ghost announced (key 1 in B1), then dropped from B1 by the ghost bound while keys
    not announced are inserted: arc.py keeps it announced (a new key now), so the compiled
    core must keep its node (on no list) rather than free it for the next key."""
    compiled_arc()
    run_twin_program(
        2,
        [
            ("store", [0], 0, True),
            ("store", [0], 0, True),  # 0 to T2
            ("store", [1], 0, True),
            ("store", [2], 0, True),  # 1 to B1
            ("announce", [1, 7]),
            ("insert", 4, 0),  # |T1| + |B1| > c: 1 leaves B1, still announced
            ("insert", 5, 0),
            ("insert", 6, 0),  # the free nodes reused
            ("evict", 3, []),
            ("insert", 1, 0),
            ("store", [1, 7, 8], 0, False),
        ],
    )


@pytest.mark.slow
def test_compiled_arc_decides_as_the_pure_one_on_seeded_programs() -> None:
    for seed in range(60):
        run_twin_program(*seeded_program(seed))


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(arc_programs())
def test_compiled_arc_decides_as_the_pure_one_on_random_programs(
    program: tuple[int, list[tuple[object, ...]]],
) -> None:
    run_twin_program(*program)


@pytest.mark.slow
@pytest.mark.parametrize("fraction", [0.01, 0.1])
def test_compiled_arc_decides_as_the_pure_one_on_the_trace(fraction: float) -> None:
    """The loop driver of `kvtier_tools.bench.policy_speed` over the shipped trace's first 3,000
    requests: every hit, victim and insert alike, the lists every 100 requests."""
    compiled_arc()
    run_twin_trace(TwinARC, fraction, every=100)


def run_twin_trace(twin_class: type[TwinARC], fraction: float, every: int) -> None:
    """The shipped trace's first 3,000 requests through a twin at `fraction` of their
    distinct blocks, as the loop driver of `kvtier_tools.bench.policy_speed` runs them (admitting
    where the policy does not admit all); the states compared every `every` requests (every
    call would be slow) and at the end."""
    requests = trace_requests(3000)
    capacity = max(1, int(fraction * len({k for keys in requests for k in keys})))
    twin = twin_class(capacity, check_states=False)
    slot = 0
    for number, keys in enumerate(requests):
        if number % every == 0:
            twin.check(f"request {number}")
        hits = [k for k in keys if twin.pure.get(k) is not None]
        assert hits == [k for k in keys if twin.fast.get(k) is not None]
        twin.call("touch", hits)
        misses = [k for k in keys if twin.pure.get(k) is None]
        if not misses:
            continue
        twin.call("on_store_miss", misses)
        if not twin.pure.admits_all:
            admitted = twin.call("admit", misses)
            misses = [k for k, ok in zip(misses, admitted, strict=True) if ok]  # type: ignore[call-overload]
        room = len(twin.pure) + len(misses) - capacity
        if room > 0 and twin.call("evict", room, set(keys)) is None:
            continue
        for key in misses:
            slot += 1
            twin.call("insert", key, blocks=pair_of_blocks(slot, 0))
    twin.check("the end")


# -- lct's compiled core against its text run as Python, in one process -------------------------


def lct_state(policy: CachePolicy) -> tuple[object, ...]:
    """What an lct shows: its queues, what it remembers of each key (resident or not), the
    learned limits, shares, credits, horizon and expectations, the clock, and its blocks."""
    from kvtier.policies import LCTCachePolicy

    lct = policy
    assert isinstance(lct, LCTCachePolicy)
    queues, ghosts = lct.queues(), lct.ghosts()
    histories = [lct._seen(key) for queue in queues for key in queue]
    blocks = sorted((key, block.block_id, block.ref_cnt) for key, block in policy.items())
    learned = (lct.limits, lct.shares, lct._credit, lct.horizon, lct.expected, lct.refused)
    statistics = (lct._reuse, lct._arrivals, list(lct._epochs), lct._older, lct._since_solve)
    return (queues, histories, ghosts, learned, statistics, lct._clock, len(policy), blocks)


class TwinLCT(TwinARC):
    """The lct over its core run as Python and over the compiled core, driven by the same
    calls (see `TwinARC`)."""

    def __init__(self, capacity: int, *, check_states: bool = True) -> None:
        self.check_states = check_states
        self.pure = pure_lct()(capacity)
        self.fast = compiled_lct()(capacity)
        self.calls = 0

    def check(self, where: str) -> None:
        assert lct_state(self.pure) == lct_state(self.fast), where


@st.composite
def lct_programs(draw: st.DrawFn) -> tuple[int, list[tuple[object, ...]]]:
    """A capacity and a random program of lct calls."""
    capacity = draw(st.integers(1, 12))
    return capacity, draw(st.lists(lct_steps(capacity), min_size=20, max_size=200))


def seeded_lct_program(seed: int) -> tuple[int, list[tuple[object, ...]]]:
    """A long program of mostly stores over a small universe (keys come back often, so
    classes 2 to 4, limits, refusals and horizon moves all occur), with hits, pins, failed
    stores, announcements of resident keys, moves and hints."""
    rng = random.Random(seed)
    capacity = rng.choice([1, 2, 4, 8, 16])
    universe = 4 * capacity + 2
    program: list[tuple[object, ...]] = []
    for _ in range(600):
        action = rng.random()
        if action < 0.6:
            ids = rng.sample(range(universe), rng.randint(1, min(universe, capacity + 2)))
            program.append(("store", ids, rng.choice([0] * 8 + [-1, 1]), rng.random() < 0.5))
        elif action < 0.72:
            program.append(("touch", [rng.randrange(universe) for _ in range(rng.randint(1, 6))]))
        elif action < 0.8:
            program.append(("pin", rng.randrange(universe), rng.choice([0, 0, 1, -1])))
        elif action < 0.84:
            program.append(("remove", rng.randrange(universe)))
        elif action < 0.88:
            program.append(("evict", rng.randint(0, capacity), [rng.randrange(universe)]))
        elif action < 0.92:
            program.append(("announce", [rng.randrange(universe) for _ in range(3)]))
        elif action < 0.95:
            program.append(("move", [rng.randrange(universe) for _ in range(3)]))
        else:
            program.append(("hint", rng.randrange(universe), rng.choice(["never", "likely", None])))
    return capacity, program


@pytest.mark.slow
def test_compiled_lct_decides_as_the_pure_one_on_seeded_programs() -> None:
    for seed in range(40):
        run_twin_program(*seeded_lct_program(seed), TwinLCT)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(lct_programs())
def test_compiled_lct_decides_as_the_pure_one_on_random_programs(
    program: tuple[int, list[tuple[object, ...]]],
) -> None:
    run_twin_program(*program, TwinLCT)


def test_the_lct_twin_sees_a_different_state() -> None:
    """The comparison can fail: a twin whose compiled lct learned one access more differs."""
    twin = TwinLCT(4)
    twin.call("on_store_miss", [key_from_int(1)])
    twin.fast.on_store_miss([key_from_int(2)])
    with pytest.raises(AssertionError):
        twin.check("one access more")


@pytest.mark.slow
@pytest.mark.parametrize("fraction", [0.01, 0.1])
def test_compiled_lct_decides_as_the_pure_one_on_the_trace(fraction: float) -> None:
    """The loop driver of `kvtier_tools.bench.policy_speed` over the shipped trace's first 3,000
    requests: every hit, admission, victim and insert alike, the whole state every 300
    requests and at the end (limits, shares, horizon, statistics, queues, ghosts)."""
    compiled_lct()
    run_twin_trace(TwinLCT, fraction, every=300)


# -- BlockStatus's compiled constructor (`_blocks_core.pyx`) --------------------------------

BLOCK_CASES = """
import ctypes
import numpy as np
from kvtier.blocks import BlockStatus, COMPILED_INIT, pending_blocks

class Index:
    def __index__(self):
        return 7

cases = [0, 5, -1, 2**31, 2**63 - 1, 2**63, 2**64 + 3, -2**63, -2**64 - 1, True,
         np.int64(9), np.int32(-4), Index(), 1.5, np.float64(2.0), "x", None, b"1", 3 + 0j]
print(COMPILED_INIT, type(BlockStatus.__init__).__name__)
for case in cases:
    try:
        block = BlockStatus(case)
        print(block.ref_cnt, block.block_id, bytes(block).hex(), block.is_ready)
    except Exception as exc:
        print(type(exc).__name__, exc)
for kwargs in ({"block_id": 4}, {}, {"slot": 4}):
    try:
        print(BlockStatus(**kwargs))
    except TypeError:
        print("TypeError")
block = BlockStatus(3)
block.ref_cnt = 2
block.__init__(8)
print(block)
print(pending_blocks(iter(range(3))), pending_blocks([]))
"""


def test_block_status_is_made_alike_by_both_constructors() -> None:
    """The same fields, bytes and errors from `BlockStatus(...)` with the compiled
    constructor as with the Python one (in a fresh process each), for integers in and out of
    range, `__index__` objects and values that are not integers."""
    pure_flag, *pure = run_python(BLOCK_CASES, pure=True).splitlines()
    assert pure_flag == "False function"
    assert pure[0] == "-1 0 ffffffff" + "00" * 4 + "00" * 8 + " False"
    assert pure[-2] == "BlockStatus(block_id=8, ref_cnt=-1)"
    if not compiled_core_built():
        pytest.skip("no compiled core (scripts/build-core builds it)")
    compiled_flag, *built = run_python(BLOCK_CASES, pure=False).splitlines()
    assert compiled_flag == "True cython_function_or_method"
    assert built == pure


def test_the_compiled_constructor_is_not_installed_on_another_layout() -> None:
    if not compiled_core_built():
        pytest.skip("no compiled core (scripts/build-core builds it)")
    out = run_python(
        "import ctypes, kvtier.blocks, kvtier._blocks_core as core\n"
        "class Swapped(ctypes.Structure):\n"
        "    _fields_ = [('block_id', ctypes.c_int64), ('ref_cnt', ctypes.c_int32)]\n"
        "    def __init__(self, block_id):\n"
        "        self.ref_cnt, self.block_id = -1, block_id\n"
        "python_init = Swapped.__init__\n"
        "print(core.install(Swapped), Swapped.__init__ is python_init, Swapped(5).block_id)",
        pure=False,
    )
    assert out == "False True 5"
