"""The ``[state]`` section: where the gateway's shared state lives (README "Shared state").

Without it (and without ``--state-url`` / ``TOKENWIRE_STATE_URL``) a gateway keeps its state
in its own process, exactly as a single instance always has. With it, every instance that
names the same Redis shares the response store, affinity pins and the replica of each stored
response (``state/redis_conn.py`` is the one connection; ``state/redis_store.py`` the store).

This module only validates: it imports no Redis client, so a gateway without ``[state]``
pays nothing for it. The URL is taken from, highest first: the ``--state-url`` flag, the
``TOKENWIRE_STATE_URL`` environment variable, ``[state] url``; the section's other keys apply
to whichever URL wins.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from tokenwire.errors import ConfigError, ConfigErrors

__all__ = [
    "DEFAULT_KEY_PREFIX",
    "DEFAULT_STORE_MAX_BYTES",
    "DEFAULT_TIMEOUT_MS",
    "ENV_STATE_URL",
    "MAX_TIMEOUT_MS",
    "STATE_KEYS",
    "StateConfig",
    "parse_state_table",
    "redacted_url",
    "resolve_state",
]

ENV_STATE_URL = "TOKENWIRE_STATE_URL"
#: Every key this gateway writes starts with it, so one Redis can serve several deployments
#: (or other applications) without collisions; ``FLUSHDB`` is never needed to separate them.
DEFAULT_KEY_PREFIX = "tokenwire:"
#: The deadline of one Redis call. Redis answers a LAN round trip in well under a
#: millisecond and the gateway's calls are single-key reads and writes, so 250 ms is two
#: orders of magnitude of headroom for a loaded Redis or network, while a dead or partitioned
#: Redis costs a request at most a quarter second before the connection is marked degraded
#: (after which requests skip Redis entirely until the next re-check, ``redis_conn.py``).
DEFAULT_TIMEOUT_MS = 250
#: A longer deadline would let a hung Redis stall every request that touches state.
MAX_TIMEOUT_MS = 5_000
#: One stored response (its input items plus the response object, JSON) at most this many
#: bytes in Redis. A Codex turn with its whole conversation is typically tens to a few
#: hundred KB; 8 MiB holds long agent sessions while keeping one value far below Redis's
#: 512 MB string limit and one GET far below the call deadline. Larger responses are served
#: but not stored, with a log line and a response header (README "Shared state").
DEFAULT_STORE_MAX_BYTES = 8 * 1024 * 1024
#: Below this a store could not hold even a short conversation.
_MIN_STORE_MAX_BYTES = 1024
#: The same 512 MB Redis string limit, with room for the key and framing.
_MAX_STORE_MAX_BYTES = 256 * 1024 * 1024

_NUM = (int, float)
#: ``[state]`` keys and their types.
STATE_KEYS: dict[str, tuple[type, ...]] = {
    "url": (str,), "password_env": (str,), "key_prefix": (str,), "tls_ca_file": (str,),
    "timeout_ms": _NUM, "store_max_bytes": (int,),
}
_SCHEMES = ("redis", "rediss")
#: Keys are ``<prefix><kind>:<id>``; a prefix longer than this is a mistake, not a need.
_MAX_PREFIX_CHARS = 64


@dataclass(frozen=True, slots=True)
class StateConfig:
    """A validated ``[state]``: the Redis URL (``redis://`` or ``rediss://`` for TLS), the
    password (from the URL or ``password_env``), the key prefix, the CA file for TLS, the
    per-call deadline and the byte cap of one stored response."""

    url: str
    password: str | None = None
    key_prefix: str = DEFAULT_KEY_PREFIX
    tls_ca_file: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_MS / 1000
    store_max_bytes: int = DEFAULT_STORE_MAX_BYTES

    @property
    def tls(self) -> bool:
        return urlsplit(self.url).scheme == "rediss"

    @property
    def display_url(self) -> str:
        """The URL without its password, for /health and log lines."""
        return redacted_url(self.url)

    def __repr__(self) -> str:  # never print the password
        return (f"StateConfig(url={self.display_url!r}, key_prefix={self.key_prefix!r}, "
                f"timeout_s={self.timeout_s})")


def redacted_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (the user name is kept), in the
    netloc and in a ``?password=`` query parameter (redis-py's ``from_url`` reads both)."""
    parts = urlsplit(url)
    if parts.query:
        query = [(k, "***" if k.lower() == "password" else v)
                 for k, v in parse_qsl(parts.query, keep_blank_values=True)]
        parts = parts._replace(query=urlencode(query, safe="*"))
    if parts.password is None:
        return urlunsplit(parts)
    host_port = parts.netloc.rpartition("@")[2]  # after the credentials: no secret in it
    netloc = f"{parts.username or ''}:***@{host_port}"
    return urlunsplit(parts._replace(netloc=netloc))


def _check_url(url: str, where: str) -> None:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError on a bad port
    except ValueError as exc:
        raise ConfigError(f"{where}: url {redacted_url(url)!r} is not a URL: {exc}") from None
    if parts.scheme not in _SCHEMES or not parts.hostname:
        raise ConfigError(f"{where}: url {redacted_url(url)!r} must be redis://host[:port][/db]"
                          " or rediss://... (TLS)")


def parse_state_table(table: Mapping[str, Any], where: str = "[state]") -> dict[str, Any]:
    """Check a ``[state]`` table's keys, types and ranges; every problem is reported."""
    problems: list[str] = []
    for key, value in table.items():
        types = STATE_KEYS.get(key)
        if types is None:
            problems.append(f"{where}: unknown key {key!r}; expected one of "
                            + ", ".join(STATE_KEYS))
        elif not isinstance(value, types) or isinstance(value, bool):
            problems.append(f"{where}: {key} has the wrong type, got {value!r}")
    if problems:
        raise ConfigErrors(problems)
    timeout = table.get("timeout_ms", DEFAULT_TIMEOUT_MS)
    if not (math.isfinite(timeout) and 0 < timeout <= MAX_TIMEOUT_MS):
        problems.append(f"{where}: timeout_ms must be in (0, {MAX_TIMEOUT_MS}], got {timeout}")
    cap = table.get("store_max_bytes", DEFAULT_STORE_MAX_BYTES)
    if not _MIN_STORE_MAX_BYTES <= cap <= _MAX_STORE_MAX_BYTES:
        problems.append(f"{where}: store_max_bytes must be in [{_MIN_STORE_MAX_BYTES}, "
                        f"{_MAX_STORE_MAX_BYTES}], got {cap}")
    prefix = table.get("key_prefix", DEFAULT_KEY_PREFIX)
    if len(prefix) > _MAX_PREFIX_CHARS or any(c.isspace() for c in prefix):
        problems.append(f"{where}: key_prefix must be at most {_MAX_PREFIX_CHARS} characters "
                        "without spaces")
    if "url" in table:
        try:
            _check_url(table["url"], where)
        except ConfigError as exc:
            problems.append(str(exc))
    if problems:
        raise ConfigErrors(problems)
    return dict(table)


def resolve_state(table: Mapping[str, Any] | None, *, flag_url: str | None = None,
                  env: Mapping[str, str]) -> StateConfig | None:
    """The state configuration from flag, environment and ``[state]``; None means "no shared
    state" (today's single-process behaviour)."""
    table = parse_state_table(table or {})
    url = flag_url or env.get(ENV_STATE_URL) or table.get("url")
    where = ("--state-url" if flag_url else ENV_STATE_URL if env.get(ENV_STATE_URL)
             else "[state]")
    if not url:
        if table:
            raise ConfigError("[state] has settings but no url (nor --state-url or "
                              f"{ENV_STATE_URL}); name the Redis to share state on")
        return None
    _check_url(url, where)
    password = None
    if "password_env" in table:
        var = table["password_env"]
        password = env.get(var)
        if not password:
            raise ConfigError(f"[state] password_env names {var!r}, which is not set or empty")
        if urlsplit(url).password:
            raise ConfigError("[state]: the password is given both in the url and by "
                              "password_env; keep one")
    ca = table.get("tls_ca_file")
    if ca and urlsplit(url).scheme != "rediss":
        raise ConfigError("[state] tls_ca_file needs a rediss:// url (TLS)")
    return StateConfig(url=url, password=password,
                       key_prefix=table.get("key_prefix", DEFAULT_KEY_PREFIX),
                       tls_ca_file=ca,
                       timeout_s=table.get("timeout_ms", DEFAULT_TIMEOUT_MS) / 1000,
                       store_max_bytes=table.get("store_max_bytes", DEFAULT_STORE_MAX_BYTES))
