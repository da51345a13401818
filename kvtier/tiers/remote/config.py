"""The `[[tiers]]` tables of the remote tiers (importable without their client libraries,
so a config is validated before anything connects).

    [[tiers]]
    name = "fleet"
    medium = "redis"
    capacity = 65536              # keys kvtier remembers; Redis's maxmemory bounds the store
    url = "redis://10.0.0.5:6379/0"
    password_env = "KVTIER_REDIS_PASSWORD"
    auth_key_file = "/etc/kvtier/fleet.key"   # `kvtier keys new /etc/kvtier/fleet.key`

Both shared tiers authenticate every value with a key of their own (`SharedTierConfig`): the
config names where the key is (a file or an environment variable), never the key.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator

from kvtier.config import BaseTierConfig, _error, _expand_path, parse_size

_HOST_PORT = re.compile(r"^[A-Za-z0-9_.:\[\]-]+:\d{1,5}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _key_file(field: str, value: object) -> Path | None:
    """A key file path as configured, "~" and $VARS expanded."""
    if value is None:
        return None
    if not isinstance(value, str | Path) or str(value) == "" or "\0" in str(value):
        raise _error(field, "expected a file path")
    try:
        return _expand_path(value)
    except ValueError as error:
        raise _error(field, str(error)) from None


def _has_credentials(url: str) -> bool:
    """Whether a Redis URL carries a login: any "@" (`user:pass@host`; a password holding
    "/", "?" or "#" moves where a parser thinks the host ends, so no "@" is allowed anywhere),
    or a `password` / `username` query parameter (redis-py reads both)."""
    if "@" in url:
        return True
    query = url.partition("?")[2].partition("#")[0]
    names = {part.partition("=")[0].strip().lower() for part in re.split("[&;]", query)}
    return bool(names & {"password", "username"})


class SharedTierConfig(BaseTierConfig):
    """What both shared tiers (redis, shared-fs) have: the key that authenticates their
    values (`kvtier.tiers.remote.auth`). Whoever can write the store (the Redis server, the
    shared directory) could otherwise write a valid block for any key; with a key, a value
    not made with it is a miss counted as forged. Only where the key is (a file, or the NAME
    of an environment variable) is configured, never the key itself."""

    authenticate: bool = True
    """Every value carries a keyed MAC (BLAKE3) checked on read. false: an unkeyed checksum
    only (catches accidents, not forgeries; the open logs the risk)."""
    encrypt: bool = False
    """Values are AES-256-GCM encrypted (`pip install 'kvtier[encrypt]'`): the store sees
    no KV bytes. A random 96-bit nonce per value: rotate the key before about 2**32 values
    of a namespace (1 PiB of 256 KiB blocks; a day and a half at 8 GB/s of writes)."""
    auth_key_file: Path | None = None
    """File holding the key (hex, at least 32 bytes; `kvtier keys new PATH`): a regular file,
    not a symlink, readable by its owner only (chmod 600)."""
    auth_key_env: str | None = None
    """NAME of the environment variable holding the key (hex), instead of a file."""
    auth_previous_key_file: Path | None = None
    """The key before a rotation: values it made are still read (writes use the current)."""
    auth_previous_key_env: str | None = None

    @field_validator("auth_key_file", "auth_previous_key_file", mode="before")
    @classmethod
    def _expand_key_file(cls, value: object, info: ValidationInfo) -> Path | None:
        return _key_file(info.field_name or "auth_key_file", value)

    @field_validator("auth_key_env", "auth_previous_key_env")
    @classmethod
    def _check_key_env(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and _ENV_NAME.fullmatch(value) is None:
            raise _error(
                info.field_name or "auth_key_env",
                "the NAME of an environment variable holding the key, not the key",
            )
        return value

    @model_validator(mode="after")
    def _check_keys(self) -> SharedTierConfig:
        if self.auth_key_file is not None and self.auth_key_env is not None:
            raise _error("auth_key", "set one of auth_key_file and auth_key_env, not both")
        if self.auth_previous_key_file is not None and self.auth_previous_key_env is not None:
            raise _error(
                "auth_previous_key",
                "set one of auth_previous_key_file and auth_previous_key_env, not both",
            )
        has_key = self.auth_key_file is not None or self.auth_key_env is not None
        has_previous = (
            self.auth_previous_key_file is not None or self.auth_previous_key_env is not None
        )
        if has_previous and not has_key:
            raise _error(
                "auth_previous_key",
                "a previous key needs a current one (auth_key_file or auth_key_env)",
            )
        if not self.authenticate and (has_key or has_previous):
            raise _error(
                "authenticate",
                "authenticate = false uses no key: remove auth_key_* or set authenticate = true",
            )
        if self.encrypt and not self.authenticate:
            raise _error(
                "encrypt", "encrypt = true needs a key: set authenticate = true (the default)"
            )
        return self


class RedisTierConfig(SharedTierConfig):
    """A tier of blocks in Redis (standalone or Redis Cluster), shared by many nodes."""

    model_config = ConfigDict(hide_input_in_errors=True)  # a url may hold a password

    medium: Literal["redis"]
    url: str | None = None
    """`redis://host:port/db` or `rediss://...` (TLS) of a standalone server, without a user
    or password (refused: they would be printed wherever the url is; see `username` and
    `password_env`)."""
    cluster_nodes: tuple[str, ...] | None = None
    """`host:port` of some nodes of a Redis Cluster (instead of `url`)."""
    tls_ca_file: Path | None = None
    """CA certificate that signed the server's (TLS, `rediss://`); default: the system's."""
    tls_cert_file: Path | None = None
    """Client certificate, for a server that authenticates clients by certificate."""
    tls_key_file: Path | None = None
    tls: bool = False
    """TLS to the nodes of a Redis Cluster (a standalone server says `rediss://`)."""
    username: str | None = None
    password_env: str | None = None
    """Name of the environment variable holding the password (never the password itself)."""
    timeout_ms: int = Field(default=500, ge=1, le=600_000)
    """Longest wait for one round trip; past it the operation is a miss or a failed store."""
    max_connections: int = Field(default=32, ge=1, le=4096)
    max_in_flight: int = Field(default=8, ge=1, le=1024)
    """Round trips of this tier running at once (reads, writes and lookups together)."""
    batch_keys: int = Field(default=32, ge=1, le=4096)
    """Keys per pipelined round trip."""
    key_prefix: str | None = None
    """Prefix of every key, always followed by the namespace's fingerprint and ":"
    (default prefix: `kvtier:`)."""
    ttl_s: int | None = Field(default=None, ge=1)
    """Expire values after this many seconds (default: never; Redis's maxmemory evicts)."""
    compression: Literal["none", "zstd"] = "none"
    zstd_level: int = Field(default=3, ge=1, le=22)
    breaker_failures: int = Field(default=5, ge=1, le=10_000)
    """Consecutive failed round trips that open the circuit breaker (fail fast)."""
    breaker_cooldown_s: float = Field(default=2.0, gt=0, le=3600)
    """How long an open breaker fails fast before one round trip is tried again."""
    negative_ttl_ms: int = Field(default=200, ge=0, le=3_600_000)
    """How long "absent" answers of lookups are cached (another node may store it any
    moment)."""

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.startswith(("redis://", "rediss://", "unix://")):
            raise _error("url", "must start with redis://, rediss:// (TLS) or unix://")
        if _has_credentials(value):
            # Never echoed (the error kind is in kvtier.config's _NO_VALUE_SHOWN).
            raise _error(
                "url_credentials",
                "must not hold a user or password (user:password@ or ?password=): set "
                "username, and password_env to the NAME of an environment variable holding "
                "the password",
            )
        return value

    @field_validator("cluster_nodes", mode="before")
    @classmethod
    def _check_nodes(cls, value: object) -> object:
        if isinstance(value, list):
            value = tuple(value)
        if isinstance(value, tuple):
            for node in value:
                if not isinstance(node, str) or _HOST_PORT.fullmatch(node) is None:
                    raise _error("cluster_nodes", f"entries are 'host:port', got {node!r}")
            if not value:
                raise _error("cluster_nodes", "must name at least one node")
        return value

    @field_validator("password_env")
    @classmethod
    def _check_env(cls, value: str | None) -> str | None:
        if value is not None and _ENV_NAME.fullmatch(value) is None:
            raise _error(
                "password_env",
                "the NAME of an environment variable holding the password, not the password",
            )
        return value

    @field_validator("tls_ca_file", "tls_cert_file", "tls_key_file", mode="before")
    @classmethod
    def _expand_file(cls, value: object) -> Path | None:
        if value is None:
            return None
        if not isinstance(value, str | Path) or str(value) == "":
            raise _error("tls_file", "expected a file path")
        try:
            return _expand_path(value)
        except ValueError as error:
            raise _error("tls_file", str(error)) from None

    @property
    def uses_tls(self) -> bool:
        return self.tls or (self.url is not None and self.url.startswith("rediss://"))

    @model_validator(mode="after")
    def _one_address(self) -> RedisTierConfig:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise _error("tls_client", "set both tls_cert_file and tls_key_file, or neither")
        if (self.url is None) == (self.cluster_nodes is None):
            raise _error(
                "redis_address", "set exactly one of url (a server) and cluster_nodes (a cluster)"
            )
        return self

    def password(self) -> str | None:
        """The password from `password_env` (read now), or None without one; ValueError
        naming the variable when it is unset."""
        if self.password_env is None:
            return None
        value = os.environ.get(self.password_env)
        if value is None:
            raise ValueError(
                f"tier {self.name!r}: password_env names ${self.password_env}, which is not set"
            )
        return value


class SharedFSTierConfig(SharedTierConfig):
    """A tier of one file per block under a directory many hosts mount."""

    medium: Literal["shared-fs"]
    path: Path
    """The shared directory ("~" and $VARS expanded); the tier uses a subdirectory per
    namespace (model, block size)."""
    max_size: int | str | None = None
    """Bytes the namespace's files may take (an int or "500GiB"); the sweeper removes the
    least recently used past it. Default: `capacity` blocks."""
    sweep_interval_s: float | None = Field(default=10.0, gt=0)
    """Seconds between sweeps (None: this node never sweeps, neither periodically nor on its
    own writes; another node must)."""
    sweep_low_watermark: float = Field(default=0.9, gt=0, le=1)
    """A sweep brings the files down to this fraction of `max_size`."""
    group: str | int | None = None
    """A group (name or gid) whose members share the tree: its directories are created 2770
    and its files 0640 with that group, and directories of that group are trusted. Default:
    only this user (0700 directories, 0600 files); see `kvtier.tiers.remote.sharedfs`."""
    fsync: bool = False
    """fsync each file (and its directory) before a store counts as done."""
    compression: Literal["none", "zstd"] = "none"
    zstd_level: int = Field(default=3, ge=1, le=22)
    max_workers: int = Field(default=8, ge=1, le=256)
    """Threads doing this tier's file I/O."""
    negative_ttl_ms: int = Field(default=200, ge=0, le=3_600_000)

    @field_validator("path", mode="before")
    @classmethod
    def _expand(cls, value: object) -> Path:
        if not isinstance(value, str | Path) or str(value) == "" or "\0" in str(value):
            raise _error("path", "expected a directory path")
        try:
            return _expand_path(value)
        except ValueError as error:
            raise _error("path", str(error)) from None

    @field_validator("max_size")
    @classmethod
    def _check_size(cls, value: int | str | None) -> int | str | None:
        if value is not None:
            try:
                parse_size(value)
            except (ValueError, TypeError) as error:
                raise _error("max_size", str(error)) from None
        return value

    @field_validator("group")
    @classmethod
    def _check_group(cls, value: str | int | None) -> str | int | None:
        if isinstance(value, int) and value < 0:
            raise _error("group", "expected a group name or a gid >= 0")
        if isinstance(value, str) and (value == "" or "\0" in value):
            raise _error("group", "expected a group name or a gid >= 0")
        return value
