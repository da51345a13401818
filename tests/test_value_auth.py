"""Authenticated values of the shared tiers (issue 19, items 1 and 3): the keyed frame, its
keys (files, variables, derivation, rotation, tenants), what a reader refuses and how it
counts and logs it, encryption, the `kvtier keys` command, the config's auth fields and the
open's refusal without a key, and the bounded zstd decode. The stores themselves are attacked
by the conformance suites (`KeyedStorageTests`, shared = True) in test_redis_tier.py and
test_sharedfs_tier.py; the chains here use real files and a real Redis."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hierarchy_helpers import BLOCK, blocks_of, key
from hypothesis import given, settings
from hypothesis import strategies as st
from redis_helpers import PASSWORD_ENV, Server
from test_sharedfs_tier import fill

from kvtier import Hierarchy
from kvtier.config import parse_config
from kvtier.errors import ConfigError, KvtierError
from kvtier.keys import OffloadKey
from kvtier.namespaces import block_namespace
from kvtier.testing.keyed import fixed_key, fixed_key_hex, forgeries, keyed_auth, v1_value
from kvtier.tiers.codec import BlockCodec, Codec, CodecError
from kvtier.tiers.shared.auth import (
    ValueAuth,
    ValueKey,
    derive_tenant_key,
    hkdf_sha256,
    load_key_env,
    load_key_file,
    write_key_file,
)
from kvtier.tiers.shared.value import (
    FLAG_ENCRYPTED,
    FLAG_MAC,
    HEADER_BYTES,
    ProblemLog,
    ValueCodec,
    ValueProblem,
)
from kvtier.tiers.sharedfs.storage import SharedFSStorage
from kvtier.tiers.storage import ReadFailure

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parent.parent
NS = block_namespace("auth-model", BLOCK)
KEY_ENV = "KVTIER_TEST_VALUE_AUTH_KEY"


def block(seed: int = 1, compressible: bool = False) -> np.ndarray[Any, np.dtype[np.uint8]]:
    rng = np.random.default_rng(seed)
    if compressible:
        return np.repeat(rng.integers(0, 4, BLOCK // 64, dtype=np.uint8), 64)
    return rng.integers(0, 256, BLOCK, dtype=np.uint8)


def codec(auth: ValueAuth | None, compression: str = "none", namespace: str = NS) -> ValueCodec:
    return ValueCodec(namespace, BLOCK, BlockCodec(compression), auth)  # type: ignore[arg-type]


def decode(values: ValueCodec, k: OffloadKey, value: bytes) -> tuple[Any, Any, bytes]:
    out = np.full(BLOCK, 0xAB, dtype=np.uint8)
    failure, problem = values.decode_into(k, value, out)
    return failure, problem, out.tobytes()


# --------------------------------------------------------------------------------------------
# The frame
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["unkeyed", "mac", "encrypted"])
@pytest.mark.parametrize("compression", ["none", "zstd"])
@pytest.mark.parametrize("compressible", [False, True])
def test_round_trip_in_every_mode(mode: str, compression: str, compressible: bool) -> None:
    auth = None if mode == "unkeyed" else keyed_auth(NS, encrypt=mode == "encrypted")
    values = codec(auth, compression)
    data = block(2, compressible)
    value = values.encode(key(1), data)
    assert len(value) <= values.max_value_bytes(len(key(1)))
    assert decode(values, key(1), value) == (None, None, data.tobytes())
    flags = int.from_bytes(value[6:8], "little")
    assert flags == {"unkeyed": 0, "mac": FLAG_MAC, "encrypted": FLAG_MAC | FLAG_ENCRYPTED}[mode]
    assert value[12:20] == (bytes(8) if auth is None else fixed_key(0).key_id)
    into = bytearray(values.max_value_bytes(len(key(1))))
    view = values.encode_into(key(1), data, into)
    assert decode(values, key(1), bytes(view)) == (None, None, data.tobytes())


def test_the_header_is_96_bytes_and_bounds_the_value() -> None:
    values = codec(keyed_auth(NS, encrypt=True))
    value = values.encode(key(1), block())
    assert HEADER_BYTES == 96
    assert (
        len(value) == HEADER_BYTES + len(key(1)) + BLOCK + 16 == values.max_value_bytes(len(key(1)))
    )


def test_an_encrypted_value_holds_none_of_the_blocks_bytes() -> None:
    data = block(3)
    value = codec(keyed_auth(NS, encrypt=True)).encode(key(1), data)
    plain = data.tobytes()
    assert all(plain[i : i + 16] not in value for i in range(0, BLOCK, 512))
    # Two encryptions of one block differ (a fresh nonce each).
    assert value != codec(keyed_auth(NS, encrypt=True)).encode(key(1), data)


def test_encrypted_values_are_read_by_every_holder_of_the_key() -> None:
    """`encrypt` decides how a node writes; any node with the key reads both kinds, so
    encryption can be turned on one node at a time."""
    data = block(4)
    encrypted = codec(keyed_auth(NS, encrypt=True)).encode(key(1), data)
    plain = codec(keyed_auth(NS)).encode(key(1), data)
    for reader in (codec(keyed_auth(NS)), codec(keyed_auth(NS, encrypt=True))):
        assert decode(reader, key(1), encrypted)[:2] == (None, None)
        assert decode(reader, key(1), plain)[:2] == (None, None)


def test_forgeries_are_counted_forged_and_never_served() -> None:
    reader = codec(keyed_auth(NS))
    evil = block(5)
    for what, value in forgeries(reader, key(1), evil).items():
        failure, problem, out = decode(reader, key(1), value)
        assert failure is not None and out != evil.tobytes(), what
        expected = ValueProblem.FOREIGN if what.startswith("version 1") else ValueProblem.FORGED
        assert problem is expected, what


def test_every_changed_byte_of_header_and_key_is_a_miss() -> None:
    for auth in (None, keyed_auth(NS), keyed_auth(NS, encrypt=True)):
        values = codec(auth)
        value = values.encode(key(1), block(6))
        positions = [*range(HEADER_BYTES + len(key(1))), len(value) - 1, len(value) // 2]
        for position in positions:
            for flip in (0x01, 0x80):
                changed = bytearray(value)
                changed[position] ^= flip
                failure, problem, _ = decode(values, key(1), bytes(changed))
                assert failure is not None and problem is not None, (auth, position, flip)


@settings(max_examples=300, deadline=None)
@given(
    mode=st.sampled_from(["unkeyed", "mac", "encrypted"]),
    cut=st.integers(0, HEADER_BYTES + 40),
    tail=st.binary(max_size=200),
    flips=st.lists(st.tuples(st.integers(0, 2 * HEADER_BYTES), st.integers(1, 255)), max_size=4),
)
def test_no_bytes_make_decode_raise_or_serve(
    mode: str, cut: int, tail: bytes, flips: list[tuple[int, int]]
) -> None:
    """Any prefix of a valid value, any bytes after it, any changed bytes: a miss or the
    block itself, never an exception and never other bytes."""
    auth = None if mode == "unkeyed" else keyed_auth(NS, encrypt=mode == "encrypted")
    values = codec(auth, "zstd")
    data = block(14, compressible=True)
    value = bytearray(values.encode(key(1), data)[:cut] + tail)
    for position, flip in flips:
        if position < len(value):
            value[position] ^= flip
    failure, problem, out = decode(values, key(1), bytes(value))
    if failure is None:
        assert problem is None and out == data.tobytes()
    else:
        assert problem is not None


def test_a_value_is_bound_to_its_key_and_namespace() -> None:
    writer = codec(keyed_auth(NS))
    value = writer.encode(key(1), block(7))
    assert decode(writer, key(2), value)[1] is ValueProblem.FOREIGN
    other = block_namespace("auth-model", BLOCK, tenant="t")
    assert decode(codec(keyed_auth(other), namespace=other), key(1), value)[1] is (
        ValueProblem.FOREIGN
    )
    # The same namespace digest with another namespace (a collision, or a forged digest):
    # the tag covers the namespace itself, and its key is derived from it.
    impostor = codec(keyed_auth(other), namespace=other)
    impostor.namespace = writer.namespace
    assert decode(impostor, key(1), value)[1] is ValueProblem.FORGED


def test_readers_accept_only_what_they_can_verify() -> None:
    unkeyed = codec(None).encode(key(1), block(8))
    keyed = codec(keyed_auth(NS)).encode(key(1), block(8))
    assert decode(codec(keyed_auth(NS)), key(1), unkeyed)[1] is ValueProblem.FORGED
    assert decode(codec(None), key(1), keyed)[1] is ValueProblem.FOREIGN
    assert decode(codec(None), key(1), unkeyed)[:2] == (None, None)
    assert decode(codec(None), key(1), v1_value(NS, key(1), block(8).tobytes()))[1] is (
        ValueProblem.FOREIGN
    )
    damaged = bytearray(unkeyed)
    damaged[-1] ^= 1
    assert decode(codec(None), key(1), bytes(damaged))[1] is ValueProblem.DAMAGED
    assert decode(codec(None), key(1), unkeyed[:-1])[1] is ValueProblem.DAMAGED


def test_key_rotation_reads_both_keys_and_writes_the_new_one() -> None:
    old, rotated = codec(keyed_auth(NS, 0)), codec(keyed_auth(NS, 1, previous=[0]))
    written_before = old.encode(key(1), block(9))
    assert decode(rotated, key(1), written_before)[:2] == (None, None)
    written_after = rotated.encode(key(2), block(10))
    assert written_after[12:20] == fixed_key(1).key_id != fixed_key(0).key_id
    assert decode(old, key(2), written_after)[1] is ValueProblem.FORGED
    assert decode(codec(keyed_auth(NS, 1)), key(1), written_before)[1] is ValueProblem.FORGED


def test_tenant_keys_derived_from_one_fleet_key_are_apart() -> None:
    fleet = fixed_key(3)
    keys = {t: ValueKey(derive_tenant_key(fleet, t), t) for t in ("a", "b")}
    assert len({keys["a"].key_id, keys["b"].key_id, fleet.key_id}) == 3
    assert derive_tenant_key(fleet, "a") == derive_tenant_key(fixed_key(3), "a")
    ns_a = block_namespace("auth-model", BLOCK, "a")
    a = codec(ValueAuth.for_namespace(ns_a, keys["a"]), namespace=ns_a)
    # What tenant b's nodes make for a's namespace, with the only key they hold.
    b_for_a = codec(ValueAuth.for_namespace(ns_a, keys["b"]), namespace=ns_a)
    assert decode(a, key(1), b_for_a.encode(key(1), block(11)))[1] is ValueProblem.FORGED
    assert decode(a, key(1), a.encode(key(1), block(11)))[:2] == (None, None)


# --------------------------------------------------------------------------------------------
# Keys
# --------------------------------------------------------------------------------------------


def test_hkdf_matches_rfc_5869_test_case_1() -> None:
    okm = hkdf_sha256(bytes([0x0B] * 22), bytes(range(13)), bytes(range(0xF0, 0xFA)), 42)
    assert okm.hex() == (
        "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"
    )


def test_derived_keys_differ_by_namespace_and_purpose() -> None:
    a = ValueAuth.for_namespace(NS, fixed_key(0), encrypt=True).current
    b = ValueAuth.for_namespace(block_namespace("x", BLOCK), fixed_key(0)).current
    assert a.key_id == b.key_id == fixed_key(0).key_id
    assert len({a.mac_key, b.mac_key, a.encryption_key, b.encryption_key}) == 4
    assert fixed_key(0).key_id not in bytes.fromhex(fixed_key_hex(0))


def test_no_repr_or_error_shows_key_bytes(tmp_path: Path) -> None:
    secret = fixed_key_hex(4)
    key_obj = ValueKey(bytes.fromhex(secret), "test")
    auth = ValueAuth.for_namespace(NS, key_obj, [fixed_key(5)], encrypt=True)
    shown = " ".join([repr(key_obj), str(key_obj), repr(auth), repr(auth.current)])
    for material in (secret, fixed_key_hex(5), auth.current.mac_key.hex()):
        assert material[:16] not in shown
    path = tmp_path / "k"
    path.write_text(secret + "\n")
    path.chmod(0o644)
    with pytest.raises(ConfigError) as caught:
        load_key_file(path)
    assert secret[:16] not in str(caught.value)
    path.chmod(0o600)
    path.write_text("zz" + secret)
    with pytest.raises(ConfigError, match="not a key") as caught:
        load_key_file(path)
    assert secret[:16] not in str(caught.value)


def test_key_files_are_checked(tmp_path: Path) -> None:
    good = tmp_path / "good.key"
    made = write_key_file(good, bytes(range(32)))
    assert good.stat().st_mode & 0o777 == 0o600
    assert load_key_file(good).key_id == made.key_id
    with pytest.raises(FileExistsError):
        write_key_file(good, bytes(32))
    with pytest.raises(ConfigError, match=r"does not exist.*kvtier keys new"):
        load_key_file(tmp_path / "none.key")
    loose = tmp_path / "loose.key"
    loose.write_text(bytes(32).hex())
    loose.chmod(0o640)
    named = re.escape(str(loose))
    with pytest.raises(ConfigError, match=f"{named}.*chmod 600 {named}"):
        load_key_file(loose)
    link = tmp_path / "link.key"
    link.symlink_to(good)
    with pytest.raises(ConfigError, match="symlink"):
        load_key_file(link)
    with pytest.raises(ConfigError, match="not a regular file"):
        load_key_file(tmp_path)
    short = tmp_path / "short.key"
    write_key_file_raw(short, bytes(16).hex())
    with pytest.raises(ConfigError, match="at least 32 bytes"):
        load_key_file(short)


def write_key_file_raw(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(text)


def test_key_from_a_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(ConfigError, match=f"\\${KEY_ENV}.*not set"):
        load_key_env(KEY_ENV)
    monkeypatch.setenv(KEY_ENV, "not hex")
    with pytest.raises(ConfigError, match="not a key"):
        load_key_env(KEY_ENV)
    monkeypatch.setenv(KEY_ENV, fixed_key_hex(0))
    assert load_key_env(KEY_ENV).key_id == fixed_key(0).key_id


# --------------------------------------------------------------------------------------------
# Config and open
# --------------------------------------------------------------------------------------------


def sharedfs_chain(path: Path, **options: Any) -> dict[str, Any]:
    tier = {
        "name": "shared",
        "medium": "shared-fs",
        "capacity": 64,
        "path": str(path),
        "sweep_interval_s": None,
        **options,
    }
    return {
        "block_size": BLOCK,
        "model_id": "auth-model",
        "tiers": [{"name": "cpu", "medium": "cpu", "capacity": 4}, tier],
    }


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"auth_key_file": "/k", "auth_key_env": "K"}, "not both"),
        ({"auth_previous_key_env": "K"}, "needs a current one"),
        ({"authenticate": False, "auth_key_env": "K"}, "authenticate = false uses no key"),
        ({"authenticate": False, "encrypt": True}, "encrypt = true needs a key"),
        ({"auth_key_env": "abc def"}, "must name an environment variable"),
        ({"auth_key": fixed_key_hex()}, "auth_key"),  # no field holds a key itself
    ],
)
def test_config_auth_fields_are_validated(
    tmp_path: Path, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(sharedfs_chain(tmp_path, **options))


def test_the_redis_config_has_the_same_auth_fields() -> None:
    config = {
        "block_size": BLOCK,
        "model_id": "m",
        "tiers": [
            {"name": "cpu", "medium": "cpu", "capacity": 4},
            {
                "name": "fleet",
                "medium": "redis",
                "capacity": 8,
                "url": "redis://127.0.0.1:1/0",
                "auth_key_file": "~/fleet.key",
                "auth_previous_key_env": "OLD",
                "encrypt": True,
            },
        ],
    }
    tier = parse_config(config).tiers[1]
    assert tier.auth_key_file == Path.home() / "fleet.key"  # type: ignore[attr-defined]
    assert tier.auth_previous_key_env == "OLD"  # type: ignore[attr-defined]


async def test_a_shared_tier_without_a_key_is_refused_at_open(tmp_path: Path) -> None:
    config = sharedfs_chain(tmp_path / "nfs")
    config["strict"] = True
    with pytest.raises(KvtierError) as caught:
        async with Hierarchy.from_config(config):
            pass
    message = str(caught.value)
    assert "\n" not in message
    assert all(part in message for part in ("auth_key_file", "auth_key_env", "kvtier keys new"))
    assert not (tmp_path / "nfs").exists()  # nothing created without the key
    config["strict"] = False
    async with Hierarchy.from_config(config) as h:
        assert "auth_key_file" in h.disabled_tiers["shared"]


async def test_authenticate_false_warns_and_writes_unkeyed_values(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="kvtier.tiers.shared"):
        async with Hierarchy.from_config(sharedfs_chain(tmp_path / "nfs", authenticate=False)) as h:
            keys = await fill(h, range(12))
            assert torch.equal(await h.get(keys), blocks_of(keys))
            storage = h.storages[-1]
            assert isinstance(storage, SharedFSStorage)
            on_disk = [storage.path_of(k) for k in keys if storage.path_of(k).exists()]
    assert on_disk and all(p.read_bytes()[6:8] == b"\0\0" for p in on_disk)
    assert any(
        "authenticate = false" in r.message and "forged" in r.message for r in caplog.records
    )


async def test_an_encrypted_shared_fs_chain(tmp_path: Path) -> None:
    path = tmp_path / "fleet.key"
    write_key_file(path, fixed_key(0).material())
    config = sharedfs_chain(tmp_path / "nfs", auth_key_file=str(path), encrypt=True)
    async with Hierarchy.from_config(config) as h:
        keys = await fill(h, range(12))
        storage = h.storages[-1]
        assert isinstance(storage, SharedFSStorage)
        files = [(k, storage.path_of(k)) for k in keys if storage.path_of(k).exists()]
        assert len(files) >= 8
        for k, file in files:
            value = file.read_bytes()
            assert value[6:8] == (FLAG_MAC | FLAG_ENCRYPTED).to_bytes(2, "little")
            assert blocks_of([k])[0].numpy().tobytes()[:64] not in value
        assert torch.equal(await h.get(keys), blocks_of(keys))


def test_encryption_without_cryptography_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "cryptography.hazmat.primitives.ciphers.aead", None)
    with pytest.raises(ConfigError, match=r"pip install 'kvtier\[encrypt\]'"):
        codec(keyed_auth(NS, encrypt=True))


async def test_forged_files_are_counted_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    storage = SharedFSStorage(
        tmp_path / "nfs",
        block_size=BLOCK,
        num_blocks=64,
        namespace=NS,
        max_size=1 << 30,
        sweep_interval_s=None,
        auth=keyed_auth(NS),
    )
    try:
        evil = block(12)
        wrong = codec(keyed_auth(NS, 9))
        ids = range(100, 120)
        for i in ids:
            path = storage.path_of(key(i))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(wrong.encode(key(i), evil))
        out = [np.zeros(BLOCK, dtype=np.uint8) for _ in ids]
        with caplog.at_level(logging.WARNING, logger="kvtier.tiers.shared"):
            results = await storage.read([key(i) for i in ids], [0] * len(ids), out)
        assert all(result is not None for result in results)
        assert storage.stats.problems == {"forged": len(ids)}
        logged = [r for r in caplog.records if "forged" in r.message]
        assert len(logged) == 1  # one line per interval, not one per value
    finally:
        await storage.aclose()


def test_the_problem_log_is_rate_limited_with_counts(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    problems = ProblemLog(interval_s=60.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="kvtier.tiers.shared"):
        for _ in range(100):
            problems.note("tier 'x'", ValueProblem.FORGED, key(1))
        problems.note("tier 'x'", ValueProblem.DAMAGED, key(1))  # its own interval
        now[0] = 61.0
        problems.note("tier 'x'", ValueProblem.FORGED, key(1))
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3
    assert "forged" in messages[0] and "damaged" in messages[1]
    assert "99 more since the last report" in messages[2]


# --------------------------------------------------------------------------------------------
# A real Redis: encrypted values, forged ones counted
# --------------------------------------------------------------------------------------------


async def test_an_encrypted_redis_chain(server: Server) -> None:
    server.start()
    os.environ[KEY_ENV] = fixed_key_hex(0)
    tier = {
        "name": "fleet",
        "medium": "redis",
        "capacity": 256,
        "url": server.url,
        "password_env": PASSWORD_ENV,
        "auth_key_env": KEY_ENV,
        "encrypt": True,
        "key_prefix": "enc:",
    }
    config = {
        "block_size": BLOCK,
        "model_id": "auth-model",
        "strict": True,
        "tiers": [{"name": "cpu", "medium": "cpu", "capacity": 4}, tier],
    }
    async with Hierarchy.from_config(config) as h:
        keys = await fill(h, range(16))
        with server.client() as client:
            names = client.keys("enc:*")
            assert len(names) >= 8
            for name in names:
                value = client.get(name)
                assert value[6:8] == (FLAG_MAC | FLAG_ENCRYPTED).to_bytes(2, "little")
        assert torch.equal(await h.get(keys), blocks_of(keys))


# --------------------------------------------------------------------------------------------
# Bounded zstd decode (the disk tier's codec, which the shared tiers use too)
# --------------------------------------------------------------------------------------------


def traced_peak(work: Any) -> int:
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("declared", [True, False])
def test_a_zstd_bomb_is_refused_without_allocating_it(declared: bool) -> None:
    from kvtier.testing.keyed import zstd_bomb

    bomb = zstd_bomb(64 << 20, declared)
    assert len(bomb) < BLOCK
    out = np.zeros(BLOCK, dtype=np.uint8)

    def run() -> None:
        with pytest.raises(CodecError):
            BlockCodec("zstd").decode_into(Codec.ZSTD, bomb, out)

    assert traced_peak(run) < 1 << 20


def test_zstd_frames_of_the_wrong_size_are_refused_and_good_ones_decode() -> None:
    import zstandard

    blocks = BlockCodec("zstd")
    good = block(13, compressible=True)
    codec_id, frame = blocks.encode(good)
    assert codec_id is Codec.ZSTD
    out = np.zeros(BLOCK, dtype=np.uint8)
    blocks.decode_into(codec_id, frame, out)
    assert np.array_equal(out, good)
    short = zstandard.ZstdCompressor(write_content_size=True).compress(good.tobytes()[:-1])
    undeclared = zstandard.ZstdCompressor(write_content_size=False).compress(good.tobytes() + b"x")
    for bad in (short, undeclared, b"\x28\xb5\x2f\xfd garbage", b""):
        with pytest.raises(CodecError):
            blocks.decode_into(Codec.ZSTD, bad, out)


# --------------------------------------------------------------------------------------------
# `kvtier keys`
# --------------------------------------------------------------------------------------------


def kvtier(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvtier.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.slow
def test_kvtier_keys_new_derive_and_id(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.key"
    done = kvtier("keys", "new", str(fleet))
    assert done.returncode == 0, done.stderr
    assert fleet.stat().st_mode & 0o777 == 0o600
    material = fleet.read_text().strip()
    assert len(bytes.fromhex(material)) == 32 and material not in done.stdout
    again = kvtier("keys", "new", str(fleet))
    assert again.returncode == 2 and "never overwritten" in again.stderr
    assert fleet.read_text().strip() == material

    tenant = tmp_path / "acme.key"
    done = kvtier("keys", "derive", "--from", str(fleet), "--tenant", "acme", str(tenant))
    assert done.returncode == 0, done.stderr
    expected = derive_tenant_key(load_key_file(fleet), "acme")
    assert load_key_file(tenant).material() == expected
    assert expected.hex() not in done.stdout + done.stderr and material not in done.stdout
    assert tenant.stat().st_mode & 0o777 == 0o600

    done = kvtier("keys", "id", str(tenant))
    assert done.returncode == 0 and done.stdout.strip() == load_key_file(tenant).key_id.hex()
    fleet.chmod(0o644)
    done = kvtier("keys", "derive", "--from", str(fleet), "--tenant", "x", str(tmp_path / "x"))
    assert done.returncode == 2 and "chmod 600" in done.stderr
    assert not (tmp_path / "x").exists()


def test_a_key_file_from_kvtier_keys_opens_a_tier(tmp_path: Path) -> None:
    path = tmp_path / "fleet.key"
    assert kvtier("keys", "new", str(path)).returncode == 0

    async def run() -> None:
        config = sharedfs_chain(tmp_path / "nfs", auth_key_file=str(path))
        config["strict"] = True
        async with Hierarchy.from_config(config) as h:
            assert not h.disabled_tiers

    asyncio.run(run())


def test_a_key_file_of_another_owner_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 31, item 12.2: a key file another user owns could be swapped or read by them."""
    path = tmp_path / "other.key"
    write_key_file(path, bytes(range(32)))
    secret = bytes(range(32)).hex()
    user = os.geteuid()
    other = 4242 if user != 4242 else 4243
    if user != 0:
        pytest.skip("chown to another user needs root")
    os.chown(path, other, -1)
    with pytest.raises(ConfigError) as caught:
        load_key_file(path)
    message = str(caught.value)
    assert f"owned by uid {other}" in message and f"chown {user} {path}" in message
    assert secret[:16] not in message
    # Owned by root, mode 0600, read by a node of another user: accepted.
    os.chown(path, 0, -1)
    monkeypatch.setattr(os, "geteuid", lambda: other)
    assert load_key_file(path).key_id == ValueKey(bytes(range(32)), "k").key_id
    # Root's file readable by its group: the mode rule is the one that fails, and says so.
    path.chmod(0o640)
    with pytest.raises(ConfigError, match=r"readable or writable by others.*chmod 600"):
        load_key_file(path)


def test_an_encrypting_reader_counts_or_refuses_unencrypted_values() -> None:
    """Issue 31, item 12.5: an `encrypt = true` node served a key holder's MAC-only value
    uncounted; now it counts it, and `require_encrypted` makes it a miss."""
    value = codec(keyed_auth(NS)).encode(key(1), block(3))
    reader = codec(keyed_auth(NS, encrypt=True))
    failure, problem, out = decode(reader, key(1), value)
    assert (failure, problem, out) == (None, None, block(3).tobytes())
    assert reader.unencrypted_served == 1
    strict_auth = ValueAuth.for_namespace(NS, fixed_key(0), encrypt=True, require_encrypted=True)
    strict = codec(strict_auth)
    assert decode(strict, key(1), value)[:2] == (ReadFailure.NOT_INDEXED, ValueProblem.UNENCRYPTED)
    encrypted = reader.encode(key(2), block(4))
    assert decode(strict, key(2), encrypted)[:2] == (None, None)
    assert decode(reader, key(2), encrypted)[:2] == (None, None)
    assert strict.unencrypted_served == 0 and reader.unencrypted_served == 1


def test_require_encrypted_needs_encrypt(tmp_path: Path) -> None:
    config = sharedfs_chain(tmp_path, auth_key_env="K", require_encrypted=True)
    with pytest.raises(ConfigError, match=r"tiers\[1\]: require_encrypted = true .*encrypt = true"):
        parse_config(config)
    config["tiers"][1]["encrypt"] = True
    assert parse_config(config).tiers[1].require_encrypted  # type: ignore[attr-defined]
