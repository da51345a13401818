"""The `[[tiers]]` table of a Redis tier and its kind (`medium = "redis"`): imported when a
config is validated, so it imports no client library; the storage and its opener are in
`kvtier.tiers.redis.storage` (`pip install 'kvtier[redis]'`).

    [[tiers]]
    name = "fleet"
    medium = "redis"
    capacity = 65536              # keys kvtier remembers; Redis's maxmemory bounds the store
    url = "redis://10.0.0.5:6379/0"
    password_env = "KVTIER_REDIS_PASSWORD"
    auth_key_file = "/etc/kvtier/fleet.key"   # `kvtier keys new /etc/kvtier/fleet.key`
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from kvtier.config_fields import config_error, expand_path
from kvtier.tiers.registry import TierAccess, TierKind
from kvtier.tiers.shared.auth import shown_env_name
from kvtier.tiers.shared.config import SharedTierConfig, check_env_name

_HOST_PORT = re.compile(r"^[A-Za-z0-9_.:\[\]-]+:\d{1,5}$")


def _has_credentials(url: str) -> bool:
    """Whether a Redis URL carries a login: any "@" (`user:pass@host`; a password holding
    "/", "?" or "#" moves where a parser thinks the host ends, so no "@" is allowed anywhere),
    or a `password` / `username` query parameter (redis-py reads both)."""
    if "@" in url:
        return True
    query = url.partition("?")[2].partition("#")[0]
    names = {part.partition("=")[0].strip().lower() for part in re.split("[&;]", query)}
    return bool(names & {"password", "username"})


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
            raise config_error("url", "must start with redis://, rediss:// (TLS) or unix://")
        if _has_credentials(value):
            # Never echoed (the error kind is in kvtier.config's _NO_VALUE_SHOWN).
            raise config_error(
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
                    raise config_error("cluster_nodes", f"entries are 'host:port', got {node!r}")
            if not value:
                raise config_error("cluster_nodes", "must name at least one node")
        return value

    @field_validator("password_env")
    @classmethod
    def _check_env(cls, value: str | None) -> str | None:
        return check_env_name("password_env", value, "the password")

    @field_validator("tls_ca_file", "tls_cert_file", "tls_key_file", mode="before")
    @classmethod
    def _expand_file(cls, value: object) -> Path | None:
        if value is None:
            return None
        if not isinstance(value, str | Path) or str(value) == "":
            raise config_error("tls_file", "expected a file path")
        try:
            return expand_path(value)
        except ValueError as error:
            raise config_error("tls_file", str(error)) from None

    @property
    def uses_tls(self) -> bool:
        return self.tls or (self.url is not None and self.url.startswith("rediss://"))

    @model_validator(mode="after")
    def _one_address(self) -> RedisTierConfig:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise config_error("tls_client", "set both tls_cert_file and tls_key_file, or neither")
        if (self.url is None) == (self.cluster_nodes is None):
            raise config_error(
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
                f"tier {self.name!r}: password_env names {shown_env_name(self.password_env)}, "
                "which is not set"
            )
        return value


KIND = TierKind(
    "redis",
    RedisTierConfig,
    volatile=False,
    owns_index=True,
    shared=True,
    access=TierAccess.CLIENT,
    opener="kvtier.tiers.redis.storage:open_redis_tier",
)
"""Redis's declarations: persistent, shared by many nodes, reached by key through a client,
answering lookups and evicting (its `maxmemory` policy) by itself."""
