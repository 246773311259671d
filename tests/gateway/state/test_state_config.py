"""``[state]``, ``--state-url`` and ``TOKENWIRE_STATE_URL`` (``state/config.py``)."""

from __future__ import annotations

import pytest

from tokenwire.errors import ConfigError
from tokenwire.gateway.state.config import (
    DEFAULT_KEY_PREFIX,
    ENV_STATE_URL,
    StateConfig,
    redacted_url,
    resolve_state,
)


def test_no_state_anywhere_means_none() -> None:
    assert resolve_state(None, env={}) is None


def test_flag_over_env_over_table() -> None:
    table = {"url": "redis://table:6379/0", "key_prefix": "x:"}
    env = {ENV_STATE_URL: "redis://env:6379/1"}
    assert resolve_state(table, env={}).url == "redis://table:6379/0"
    assert resolve_state(table, env=env).url == "redis://env:6379/1"
    got = resolve_state(table, flag_url="rediss://flag:6380/2", env=env)
    assert got.url == "rediss://flag:6380/2" and got.tls and got.key_prefix == "x:"
    assert resolve_state(None, env=env).key_prefix == DEFAULT_KEY_PREFIX


@pytest.mark.parametrize(("table", "message"), [
    ({"url": "http://h:6379"}, "redis://"),
    ({"url": "redis://h", "bogus": 1}, "unknown key 'bogus'"),
    ({"url": "redis://h", "timeout_ms": 0}, "timeout_ms"),
    ({"url": "redis://h", "timeout_ms": 60_000}, "timeout_ms"),
    ({"url": "redis://h", "timeout_ms": True}, "wrong type"),
    ({"url": "redis://h", "key_prefix": "a b"}, "key_prefix"),
    ({"url": "redis://h", "store_max_bytes": 10}, "store_max_bytes"),
    ({"url": "redis://h", "tls_ca_file": "/ca.pem"}, "rediss://"),
    ({"url": "redis://h", "password_env": "UNSET_PW"}, "UNSET_PW"),
    ({"url": "redis://:pw@h", "password_env": "PW"}, "both"),
    ({"key_prefix": "x:"}, "no url"),
])
def test_bad_tables_are_config_errors(table: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve_state(table, env={"PW": "x"})


def test_password_env_and_tls_ca() -> None:
    cfg = resolve_state({"url": "rediss://redis.internal:6380/0", "password_env": "PW",
                         "tls_ca_file": "/etc/ca.pem", "timeout_ms": 100}, env={"PW": "pw1"})
    assert cfg == StateConfig(url="rediss://redis.internal:6380/0", password="pw1",
                              tls_ca_file="/etc/ca.pem", timeout_s=0.1)
    assert "pw1" not in repr(cfg)


def test_redaction_keeps_user_host_port_and_db() -> None:
    assert redacted_url("redis://u:secret@h:1/3") == "redis://u:***@h:1/3"
    assert redacted_url("rediss://:secret@[::1]:6380") == "rediss://:***@[::1]:6380"
    assert redacted_url("redis://h:1/0") == "redis://h:1/0"
