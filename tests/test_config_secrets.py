"""A secret pasted into the wrong field of a config is never printed back (issue 31, item
12.1): the key given as `auth_key_env` or `auth_key_file`, a password given as
`password_env`, any value of a `*_env` / `*_file` / password-ish field that fails to
validate, the table a cross-field error quotes, and the messages of the open that name the
variable a field gives."""

from __future__ import annotations

import os
from typing import Any

import pytest

from kvtier.config import parse_config
from kvtier.config_fields import is_secret_field, looks_like_key, show_value
from kvtier.errors import ConfigError
from kvtier.tiers.redis.kind import RedisTierConfig
from kvtier.tiers.shared.auth import load_key_env

KEY = "9f" * 32  # what `kvtier keys new` writes: 64 hex digits
PASSWORD = "hunter2-S3cret!"


def chain(tier: dict[str, Any]) -> dict[str, Any]:
    return {
        "block_size": 4096,
        "model_id": "m",
        "tiers": [{"name": "cpu", "medium": "cpu", "capacity": 4}, {"name": "t", **tier}],
    }


REDIS: dict[str, Any] = {"medium": "redis", "capacity": 8, "url": "redis://127.0.0.1:1/0"}
SHARED_FS: dict[str, Any] = {"medium": "shared-fs", "capacity": 8, "path": "/tmp/kvtier-x"}


def report_of(tier: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(chain(tier))
    return str(caught.value)


@pytest.mark.parametrize(
    ("tier", "field", "says"),
    [
        ({**REDIS, "auth_key_env": KEY}, "auth_key_env", "looks like a key, not a name"),
        ({**SHARED_FS, "auth_key_env": KEY.upper()}, "auth_key_env", "looks like a key"),
        (
            {**SHARED_FS, "auth_key_env": "K", "auth_previous_key_env": KEY},
            "auth_previous_key_env",
            "looks like a key",
        ),
        ({**SHARED_FS, "auth_key_file": KEY}, "auth_key_file", "looks like a key, not a path"),
        ({**SHARED_FS, "auth_key_file": "$" + KEY}, "auth_key_file", "looks like a key"),
        (
            {**REDIS, "auth_key_env": "K", "password_env": PASSWORD},
            "password_env",
            "not such a name",
        ),
        ({**REDIS, "auth_key_env": [KEY]}, "auth_key_env", "expected a string"),
        ({**REDIS, "auth_key_env": "K", "password_env": [PASSWORD]}, "password_env", "expected"),
    ],
)
def test_a_secret_in_the_wrong_field_is_not_printed(
    tier: dict[str, Any], field: str, says: str
) -> None:
    report = report_of(tier)
    assert f"tiers[1].{field}:" in report and says in report
    assert "it is not printed" in report or "got" not in report
    for secret in (KEY, KEY.upper(), PASSWORD, KEY[:16]):
        assert secret not in report


def test_a_cross_field_error_quotes_the_table_without_secret_values() -> None:
    report = report_of(
        {**SHARED_FS, "auth_key_env": "KVTIER_KEY", "auth_key_file": "/etc/kvtier/fleet.key"}
    )
    assert "not both" in report
    assert "KVTIER_KEY" not in report and "fleet.key" not in report
    shown = show_value({"name": "t", "password_env": PASSWORD}, None)
    assert shown == '{ name = "t", password_env = *** }'


def test_the_fields_that_may_hold_a_secret() -> None:
    secret = ["auth_key_env", "auth_key_file", "password_env", "tls_key_file", "api_token"]
    assert all(is_secret_field(name) for name in secret)
    assert not any(is_secret_field(name) for name in ("url", "path", "capacity", "username"))
    assert looks_like_key(KEY) and looks_like_key(f" {KEY}\n")
    assert not looks_like_key("KVTIER_KEY") and not looks_like_key("/etc/kvtier/fleet.key")


def test_the_open_does_not_print_a_variable_name_that_may_be_the_secret() -> None:
    name = "hunter2"  # a valid variable name, but likelier a password than a name
    assert name not in os.environ
    with pytest.raises(ConfigError) as caught:
        load_key_env(name)
    assert name not in str(caught.value) and "not set" in str(caught.value)
    config = RedisTierConfig.model_validate(
        {"name": "t", **REDIS, "auth_key_env": "K", "password_env": name}
    )
    with pytest.raises(ValueError, match="not set") as refused:
        config.password()
    assert name not in str(refused.value)
    with pytest.raises(ConfigError, match=r"\$KVTIER_UNSET_TEST_KEY is not set"):
        load_key_env("KVTIER_UNSET_TEST_KEY")  # a conventional name is still named
