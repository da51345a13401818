"""What the table of every shared tier has (`SharedTierConfig`): where the key that
authenticates its values is. Importable without any client library, so a config is
validated before anything connects.

    [[tiers]]
    name = "fleet"
    medium = "redis"
    capacity = 65536              # keys kvtier remembers; Redis's maxmemory bounds the store
    url = "redis://10.0.0.5:6379/0"
    auth_key_file = "/etc/kvtier/fleet.key"   # `kvtier keys new /etc/kvtier/fleet.key`

The config names where the key is (a file or an environment variable), never the key.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import ValidationInfo, field_validator, model_validator

from kvtier.config_fields import config_error, expand_path, looks_like_key
from kvtier.tiers.registry import BaseTierConfig

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
"""The name of an environment variable (what a config names instead of a secret)."""


def check_env_name(field: str, value: str | None, holds: str) -> str | None:
    """`value` if it can name the environment variable holding `holds` (a `*_env` field);
    else a validation error saying what is wrong without the value, which may be the secret
    itself pasted into the wrong field (the config's report shows no value of such a field:
    `kvtier.config_fields.is_secret_field`)."""
    if value is None:
        return None
    start = f"must name an environment variable (a name like KVTIER_KEY) holding {holds}"
    if looks_like_key(value):
        raise config_error(
            field, f"{start}; the value given looks like a key, not a name; it is not printed"
        )
    if ENV_NAME.fullmatch(value) is None:
        raise config_error(
            field,
            f"{start}: letters, digits and _, not starting with a digit; the value given is "
            "not such a name (it may be the secret itself); it is not printed",
        )
    return value


def _key_file(field: str, value: object) -> Path | None:
    """A key file path as configured, "~" and $VARS expanded."""
    if value is None:
        return None
    if not isinstance(value, str | Path) or str(value) == "" or "\0" in str(value):
        raise config_error(field, "expected a file path")
    if looks_like_key(str(value)):
        raise config_error(
            field,
            "must name the file holding the key; the value given looks like a key, not a path; "
            "it is not printed",
        )
    try:
        return expand_path(value)
    except ValueError as error:
        if any(looks_like_key(part) for part in re.split(r"[${}/]", str(value))):
            # The unset variable's name is the key pasted after a "$": do not print it.
            raise config_error(field, "names an unset variable that looks like a key") from None
        raise config_error(field, str(error)) from None


class SharedTierConfig(BaseTierConfig):
    """What both shared tiers (redis, shared-fs) have: the key that authenticates their
    values (`kvtier.tiers.shared.auth`). Whoever can write the store (the Redis server, the
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
    require_encrypted: bool = False
    """With `encrypt = true`: a value a key holder wrote without encryption (`encrypt =
    false` on its node) is a miss, counted `unencrypted`, instead of being served (and
    counted in `unencrypted_served`)."""
    auth_key_file: Path | None = None
    """File holding the key (hex, at least 32 bytes; `kvtier keys new PATH`): a regular file,
    not a symlink, owned by the user running the node or root, readable by its owner only
    (chmod 600)."""
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
        return check_env_name(info.field_name or "auth_key_env", value, "the key's hex")

    @model_validator(mode="after")
    def _check_keys(self) -> SharedTierConfig:
        if self.auth_key_file is not None and self.auth_key_env is not None:
            raise config_error("auth_key", "set one of auth_key_file and auth_key_env, not both")
        if self.auth_previous_key_file is not None and self.auth_previous_key_env is not None:
            raise config_error(
                "auth_previous_key",
                "set one of auth_previous_key_file and auth_previous_key_env, not both",
            )
        has_key = self.auth_key_file is not None or self.auth_key_env is not None
        has_previous = (
            self.auth_previous_key_file is not None or self.auth_previous_key_env is not None
        )
        if has_previous and not has_key:
            raise config_error(
                "auth_previous_key",
                "a previous key needs a current one (auth_key_file or auth_key_env)",
            )
        if not self.authenticate and (has_key or has_previous):
            raise config_error(
                "authenticate",
                "authenticate = false uses no key: remove auth_key_* or set authenticate = true",
            )
        if self.encrypt and not self.authenticate:
            raise config_error(
                "encrypt", "encrypt = true needs a key: set authenticate = true (the default)"
            )
        if self.require_encrypted and not self.encrypt:
            raise config_error(
                "require_encrypted",
                "require_encrypted = true refuses unencrypted values: it needs encrypt = true "
                "(else this node could not read its own)",
            )
        return self
