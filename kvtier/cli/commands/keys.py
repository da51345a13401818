"""`kvtier keys`: make the key files that authenticate a shared tier's values.

    kvtier keys new PATH                               a fresh random key (a fleet key)
    kvtier keys derive --from FLEET_KEY --tenant T PATH  tenant T's key, derived from it
    kvtier keys id PATH                                the key id values made with it carry

A key file is one line of hex, mode 0600; a command never overwrites a file, never follows a
symlink and never prints a key (only its id, which values carry anyway). Name the file in the
tier's `auth_key_file`. Give tenant T's nodes only T's derived key: they can then make no
value another tenant's nodes accept (see `kvtier.tiers.shared.auth`).
"""

from __future__ import annotations

from pathlib import Path

import click

from kvtier.cli.console import out
from kvtier.errors import ConfigError

_PATH = click.Path(dir_okay=False, path_type=Path)


def _write(path: Path, material: bytes, what: str) -> None:
    from kvtier.tiers.shared.auth import write_key_file

    try:
        key = write_key_file(path, material)
    except FileExistsError:
        raise ConfigError([f"{path} exists: a key file is never overwritten"]) from None
    except OSError as error:
        raise ConfigError([f"cannot write {path}: {error.strerror or error}"]) from None
    out.print(
        f"wrote {what} to {path} (mode 0600, key id {key.key_id.hex()}); name it in the "
        "tier's auth_key_file",
        markup=False,
    )


@click.group()
def keys() -> None:
    """Make the key files that authenticate a shared tier's values (redis, shared-fs).

    \b
    Examples:
      kvtier keys new /etc/kvtier/fleet.key
      kvtier keys derive --from /etc/kvtier/fleet.key --tenant acme /etc/kvtier/acme.key
      kvtier keys id /etc/kvtier/acme.key
    """


@keys.command()
@click.argument("path", type=_PATH)
def new(path: Path) -> None:
    """Write a fresh random key (32 bytes, hex) to PATH, a new file of mode 0600."""
    from kvtier.tiers.shared.auth import new_key

    _write(path, new_key(), "a new key")


@keys.command()
@click.option(
    "--from",
    "fleet_path",
    type=_PATH,
    required=True,
    help="The fleet key file the tenant's key is derived from.",
)
@click.option("--tenant", required=True, help="The tenant (as in the config's `tenant`).")
@click.argument("path", type=_PATH)
def derive(fleet_path: Path, tenant: str, path: Path) -> None:
    """Write TENANT's key, derived from the fleet key with HKDF-SHA256, to PATH (mode 0600).

    Nodes holding it share blocks with the tenant's other nodes only, and cannot make a
    value another tenant's nodes accept."""
    from kvtier.tiers.shared.auth import derive_tenant_key, load_key_file

    if not tenant:
        raise ConfigError(["--tenant must name a tenant"])
    fleet = load_key_file(fleet_path)
    _write(path, derive_tenant_key(fleet, tenant), f"the key of tenant {tenant!r}")


@keys.command(name="id")
@click.argument("path", type=_PATH)
def key_id(path: Path) -> None:
    """Print the key id of the key file PATH (what values made with it carry), not the key."""
    from kvtier.tiers.shared.auth import load_key_file

    out.print(load_key_file(path).key_id.hex(), markup=False)
