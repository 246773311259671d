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
    # redis-py's from_url reads a password from the query too
    assert redacted_url("redis://h/0?password=secret&db=1") == "redis://h/0?password=***&db=1"
    assert "secret" not in redacted_url("redis://:secret@h:abc")


def test_serve_takes_the_flag_then_the_environment_then_the_file() -> None:
    from tests.cli.test_serve_cli import _args
    from tokenwire.cli import serve as serve_cmd

    table = {"url": "redis://file:6379/0", "key_prefix": "f:"}
    env = {ENV_STATE_URL: "redis://env:6379/0"}
    assert serve_cmd.settings_from_args(_args(), env={}).state is None
    from_file = serve_cmd.settings_from_args(_args(), env={}, state_table=table).state
    assert from_file.url == "redis://file:6379/0" and from_file.key_prefix == "f:"
    assert serve_cmd.settings_from_args(_args(), env=env, state_table=table).state.url == \
        "redis://env:6379/0"
    flag = serve_cmd.settings_from_args(_args("--state-url", "rediss://flag:1/0"), env=env,
                                        state_table=table).state
    assert flag.url == "rediss://flag:1/0" and flag.key_prefix == "f:"


def test_a_state_section_in_the_file_is_checked_with_the_file(tmp_path) -> None:
    from tokenwire.gateway.config import load_config_file

    path = tmp_path / "gw.toml"
    path.write_text('[state]\nurl = "http://nope"\n[[upstreams]]\nname = "u"\nkind = "openai"\n'
                    'base_url = "http://127.0.0.1:1/v1"\n')
    with pytest.raises(ConfigError, match=r"\[state\].*redis://"):
        load_config_file(path, env={})


def test_a_gateway_without_state_never_imports_redis() -> None:
    import subprocess
    import sys
    from pathlib import Path

    src = Path(__file__).resolve().parents[3] / "src"
    code = ("import sys, asyncio\n"
            "from tokenwire.gateway.server import build_gateway\n"
            "from tokenwire.gateway.config import parse_config\n"
            "from tokenwire.gateway.settings import ServerSettings\n"
            "cfg = parse_config({'upstreams': [{'name': 'u', 'kind': 'openai', 'probe': False,"
            " 'base_url': 'http://127.0.0.1:1/v1', 'models': [{'name': 'm'}]}]}, env={})\n"
            "gw = asyncio.run(build_gateway(cfg, ServerSettings()))\n"
            "assert gw.state.redis is None\n"
            "print('redis' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(src)}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
