"""``[[keys]]``: named API keys with limits (gateway/state/api_keys.py), through the config."""

from __future__ import annotations

import hashlib

import pytest

from tokenwire.errors import ConfigError
from tokenwire.gateway.config import parse_config
from tokenwire.gateway.state.api_keys import digest, parse_keys
from tokenwire.gateway.state.limits import KeyLimits

SECRET = "sk-ci-bot-0123456789"
ENV = {"CI_KEY": SECRET}
_UP = [{"name": "up", "kind": "openai", "base_url": "http://127.0.0.1:9/v1", "probe": False}]


def test_keys_from_a_variable_or_a_digest_with_their_limits() -> None:
    sha = hashlib.sha256(b"sk-other-key").hexdigest()
    cfg = parse_config({"upstreams": _UP, "keys": [
        {"name": "ci-bot", "key_env": "CI_KEY", "rpm": 60, "tpm": 1000, "max_concurrent": 2},
        {"name": "batch", "key_sha256": sha.upper()}]}, env=ENV)
    bot, batch = cfg.keys
    assert (bot.name, bot.sha256, bot.limits) == ("ci-bot", digest(SECRET),
                                                  KeyLimits(rpm=60, tpm=1000, max_concurrent=2))
    assert batch.sha256 == digest("sk-other-key") and not batch.limits.any
    assert SECRET not in repr(cfg) and sha not in repr(cfg).lower()


@pytest.mark.parametrize(("table", "message"), [
    ({"name": "a", "key_env": "CI_KEY", "rps": 1}, "unknown key 'rps'"),
    ({"name": "a"}, "exactly one of key_env and key_sha256"),
    ({"name": "a", "key_env": "CI_KEY", "key_sha256": "0" * 64}, "exactly one"),
    ({"name": "a", "key_env": "MISSING"}, "MISSING, which is not set"),
    ({"name": "a", "key_sha256": "xyz"}, "64 hex digits"),
    ({"name": "a b", "key_env": "CI_KEY"}, "name is required"),
    ({"name": "unnamed", "key_env": "CI_KEY"}, "reserved"),
    ({"name": "a", "key_env": "CI_KEY", "rpm": 0}, "rpm must be a whole number >= 1"),
    ({"name": "a", "key_env": "CI_KEY", "tpm": "many"}, "tpm must be an integer"),
])
def test_bad_key_tables_name_the_problem_never_the_key(table: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_keys([table], ENV, source="f.toml")
    assert message in str(info.value)
    assert SECRET not in str(info.value)


def test_two_keys_may_share_neither_a_name_nor_a_secret() -> None:
    with pytest.raises(ConfigError) as info:
        parse_keys([{"name": "a", "key_env": "CI_KEY"}, {"name": "a", "key_env": "CI_KEY"}],
                   ENV, source="f.toml")
    assert "two [[keys]] are named 'a'" in str(info.value)
    assert "same key as another" in str(info.value)
