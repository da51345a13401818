"""The keys that authenticate (and optionally encrypt) the values of a shared tier.

Whoever can write a shared store (the Redis server, the shared directory) could write a
valid-looking block for any key, and so put their bytes into other users' outputs. So every
value carries a keyed MAC that only nodes holding the tier's key can make
(`kvtier.tiers.shared.value`):

- A **key** is at least 32 random bytes kept in a file (hex; `kvtier keys new PATH` writes
  one) or in an environment variable (hex). The config names the file or the variable, never
  the key; a key file must be a regular file, not a symlink, owned by this user or root,
  readable by its owner only. No repr, log line or error message shows key bytes.
- A **key id** (8 bytes, derived from the key with HKDF, not the key) is written in every
  value, so a reader picks the key a value was made with: the current one, or the previous
  one during a rotation (`auth_previous_key_*`: read, never written).
- The **MAC key** (keyed BLAKE3) and the **encryption key** (AES-256-GCM, `encrypt = true`)
  are derived separately with HKDF-SHA256 from the key and the block namespace, which names
  the model, block size and tenant: a value made for one namespace never verifies in another.
- **Tenants**: `kvtier keys derive --from FLEET_KEY --tenant T PATH` derives tenant T's key
  from a fleet key (`derive_tenant_key`). T's nodes hold only that key, so they cannot make a
  value another tenant's nodes accept. Every node of one tenant must hold the same key (all
  the tenant's derived key, or all the fleet key).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from kvtier.errors import ConfigError

log = logging.getLogger("kvtier.tiers.shared")

KEY_BYTES = 32
"""The least key material accepted (and what `new_key` makes)."""
KEY_ID_BYTES = 8
MAX_KEY_FILE_BYTES = 4096
"""A key file is one line of hex; anything longer is not a key file."""

_SALT = b"kvtier shared-tier value keys v1"
_TENANT_SALT = b"kvtier tenant key v1"


def hkdf_sha256(material: bytes, salt: bytes, info: bytes, length: int) -> bytes:
    """HKDF-SHA256 (RFC 5869) of `material`: `length` bytes for the purpose `info`."""
    if not 0 < length <= 255 * 32:
        raise ValueError(f"HKDF output length {length} out of range")
    prk = hmac.digest(salt, material, hashlib.sha256)
    out = b""
    block = b""
    counter = 1
    while len(out) < length:
        block = hmac.digest(prk, block + info + bytes([counter]), hashlib.sha256)
        out += block
        counter += 1
    return out[:length]


class ValueKey:
    """One key (its bytes hidden: the repr shows the key id only) and where it came from."""

    __slots__ = ("_material", "key_id", "source")

    def __init__(self, material: bytes, source: str) -> None:
        if len(material) < KEY_BYTES:
            raise ConfigError(
                [f"{source}: a key must be at least {KEY_BYTES} bytes, got {len(material)}"]
            )
        self._material = bytes(material)
        self.source = source
        """Where the key was read ("file /etc/kvtier/fleet.key", "$KVTIER_AUTH_KEY")."""
        self.key_id = hkdf_sha256(self._material, _SALT, b"key id", KEY_ID_BYTES)
        """Written in every value the key makes; public, and says nothing about the key."""

    def derive(self, purpose: bytes, namespace: str) -> bytes:
        """The 32-byte key of `purpose` for the values of `namespace`."""
        return hkdf_sha256(self._material, _SALT, purpose + b"\0" + namespace.encode(), KEY_BYTES)

    def material(self) -> bytes:
        """The key's bytes, for `derive_tenant_key` only (never log or show them)."""
        return self._material

    def __repr__(self) -> str:
        return f"ValueKey(id={self.key_id.hex()}, {self.source})"

    __str__ = __repr__


def parse_key(text: bytes, source: str) -> ValueKey:
    """A key from its hex text (surrounding whitespace ignored); ConfigError naming `source`
    (never the text) when it is not hex of at least KEY_BYTES bytes."""
    try:
        material = bytes.fromhex(text.strip().decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise ConfigError(
            [
                f"{source}: not a key (expected hex of at least {KEY_BYTES} bytes, as "
                "`kvtier keys new PATH` writes)"
            ]
        ) from None
    return ValueKey(material, source)


def load_key_file(path: Path) -> ValueKey:
    """The key in `path`: a regular file (not a symlink), owned by the user running this
    node or by root (any other owner could replace the key, or read it, at will), and
    neither readable nor writable by its group or others. ConfigError naming the file, the
    rule it breaks and the fix otherwise (never the key)."""
    source = f"key file {path}"
    flags = os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise ConfigError(
            [f"{source} does not exist (make one with `kvtier keys new {path}`)"]
        ) from None
    except OSError as error:
        if os.path.islink(path):
            raise ConfigError(
                [f"{source} is a symlink: name the key file itself (a link can be swapped)"]
            ) from None
        raise ConfigError([f"{source}: cannot open: {error.strerror or error}"]) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError([f"{source} is not a regular file"])
        user = os.geteuid()
        if info.st_uid not in (user, 0):
            raise ConfigError(
                [
                    f"{source} is owned by uid {info.st_uid}, neither this user (uid {user}) "
                    f"nor root: its owner could swap the key; chown {user} {path}"
                ]
            )
        if info.st_mode & 0o077:
            raise ConfigError(
                [
                    f"{source} is readable or writable by others (mode "
                    f"{stat.S_IMODE(info.st_mode):o}): chmod 600 {path}"
                ]
            )
        if info.st_size > MAX_KEY_FILE_BYTES:
            raise ConfigError([f"{source} is {info.st_size} bytes: not a key file"])
        text = os.read(fd, MAX_KEY_FILE_BYTES + 1)
    except OSError as error:
        raise ConfigError([f"{source}: cannot read: {error.strerror or error}"]) from None
    finally:
        os.close(fd)
    return parse_key(text, source)


_CONVENTIONAL_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")


def shown_env_name(name: str) -> str:
    """How a message names the variable `name` that a `*_env` field gives: `$NAME` when it is
    an UPPER_CASE name as variables are named, else not shown at all, for a value such as
    "hunter2" is likelier the secret itself pasted into the wrong field than a name."""
    if _CONVENTIONAL_ENV_NAME.fullmatch(name) is not None:
        return f"${name}"
    return "the variable it names (not printed: not an UPPER_CASE name, perhaps the secret)"


def load_key_env(name: str) -> ValueKey:
    """The key in the environment variable `name` (hex); ConfigError naming the variable
    (`shown_env_name`) when it is unset or not a key."""
    source = shown_env_name(name)
    value = os.environ.get(name)
    if value is None:
        raise ConfigError([f"auth_key_env: {source} is not set"])
    return parse_key(value.encode("utf-8", "replace"), source)


def new_key() -> bytes:
    """Fresh random key material (KEY_BYTES bytes from the OS's CSPRNG)."""
    return secrets.token_bytes(KEY_BYTES)


def derive_tenant_key(fleet: ValueKey, tenant: str) -> bytes:
    """Tenant `tenant`'s key, derived from a fleet key: a node holding it cannot compute the
    fleet key or another tenant's key."""
    if not tenant:
        raise ConfigError(["a tenant key needs a tenant name"])
    return hkdf_sha256(fleet.material(), _TENANT_SALT, tenant.encode(), KEY_BYTES)


def write_key_file(path: Path, material: bytes) -> ValueKey:
    """Write `material` (hex, one line) to a new file `path`, mode 0600; refuses to overwrite
    or to follow a symlink (FileExistsError). Returns the key (for its id)."""
    key = ValueKey(material, f"key file {path}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        data = material.hex().encode() + b"\n"
        while data:
            data = data[os.write(fd, data) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)
    return key


@dataclass(frozen=True, slots=True, repr=False)
class NamespaceKey:
    """One key's derived keys for one namespace (what a ValueCodec uses)."""

    key_id: bytes
    mac_key: bytes
    """32 bytes: the keyed BLAKE3 of every value."""
    encryption_key: bytes
    """32 bytes: AES-256-GCM of encrypted values (derived separately from the MAC key)."""

    def __repr__(self) -> str:
        return f"NamespaceKey(id={self.key_id.hex()})"


@dataclass(frozen=True, slots=True)
class ValueAuth:
    """The keys of a shared tier's namespace: `current` makes every value written; a value is
    read when its key id is that of `current` or of a previous key."""

    current: NamespaceKey
    accepted: dict[bytes, NamespaceKey] = field(default_factory=dict)
    encrypt: bool = False
    require_encrypted: bool = False
    """With `encrypt`: a key holder's MAC-only value is refused (a miss), not served."""

    @classmethod
    def for_namespace(
        cls,
        namespace: str,
        current: ValueKey,
        previous: Sequence[ValueKey] = (),
        *,
        encrypt: bool = False,
        require_encrypted: bool = False,
    ) -> ValueAuth:
        """The derived keys of `namespace` (which names model, block size and tenant)."""
        keys = [current, *previous]
        derived = [
            NamespaceKey(
                key.key_id, key.derive(b"mac", namespace), key.derive(b"aes-256-gcm", namespace)
            )
            for key in keys
        ]
        accepted: dict[bytes, NamespaceKey] = {}
        for key in reversed(derived):  # the current key wins a (1 in 2**64) id collision
            accepted[key.key_id] = key
        return cls(derived[0], accepted, encrypt, require_encrypted)

    def key_ids(self) -> list[str]:
        """The accepted key ids, hex, current first (for messages)."""
        return [self.current.key_id.hex()] + [
            key_id.hex() for key_id in self.accepted if key_id != self.current.key_id
        ]


class _AuthConfig(Protocol):
    """The auth fields of `SharedTierConfig` (a protocol: no import of the config here)."""

    name: str
    authenticate: bool
    encrypt: bool
    require_encrypted: bool
    auth_key_file: Path | None
    auth_key_env: str | None
    auth_previous_key_file: Path | None
    auth_previous_key_env: str | None


def _load(file: Path | None, env: str | None) -> ValueKey | None:
    if file is not None:
        return load_key_file(file)
    if env is not None:
        return load_key_env(env)
    return None


def auth_from_config(config: _AuthConfig, namespace: str) -> ValueAuth | None:
    """The keys a shared tier's opener passes to its ValueCodec (None: `authenticate =
    false`, logged as the risk it is). ConfigError, one line naming the tier and the fix,
    when no key is configured or a key cannot be loaded."""
    tier = f"tier {config.name!r}"
    if not config.authenticate:
        log.warning(
            "%s: authenticate = false: its values carry only an unkeyed checksum, so whoever "
            "can write the store can make this node serve forged KV blocks",
            tier,
        )
        return None
    try:
        current = _load(config.auth_key_file, config.auth_key_env)
        previous = _load(config.auth_previous_key_file, config.auth_previous_key_env)
    except ConfigError as error:
        raise ConfigError([f"{tier}: {problem}" for problem in error.problems]) from None
    if current is None:
        raise ConfigError(
            [
                f"{tier}: a shared tier needs a key: set auth_key_file (make one with `kvtier "
                "keys new PATH`) or auth_key_env (the NAME of a variable holding the key's hex), "
                "or authenticate = false to accept forged values"
            ]
        )
    if config.encrypt:
        require_encryption()
    return ValueAuth.for_namespace(
        namespace,
        current,
        [] if previous is None else [previous],
        encrypt=config.encrypt,
        require_encrypted=config.require_encrypted,
    )


def require_encryption() -> None:
    """ConfigError naming the extra when `cryptography` (for `encrypt = true`) is missing."""
    try:
        import cryptography.hazmat.primitives.ciphers.aead  # noqa: F401
    except ImportError:
        raise ConfigError(
            ["encrypt = true needs the cryptography package: pip install 'kvtier[encrypt]'"]
        ) from None
