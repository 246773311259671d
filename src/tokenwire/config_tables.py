"""Checking decoded TOML tables: unknown keys, wrong types, every problem at once.

Shared by the gateway's configuration (``gateway/config.py`` assembles the file; each layer
checks its own tables: ``gateway/routing/config.py`` the pools and fallbacks,
``gateway/state/`` the keys and ``[state]``). Messages name the table and the key, never a
value read from the environment.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from tokenwire.errors import ConfigError, ConfigErrors

__all__ = ["MAX_TIME_S", "MIN_INTERVAL_S", "NUM", "Problems", "check_http_url", "check_keys",
           "check_port", "check_seconds", "type_name"]

#: A TOML number: an integer or a float (``true`` is not one, see :func:`check_keys`).
NUM: tuple[type, ...] = (int, float)

#: The longest time any setting may name (a day). TOML and the flags' float() read ``nan``
#: and ``inf``: NaN fails every comparison, so a check written ``<= 0`` let it through to
#: asyncio.timeout (uvloop raises on it, asyncio's never fires) and to the loops that compare
#: against it (never due, or always); infinity and 1e308 turned a limit off without a word,
#: and overflowed where a time becomes an integer (a Redis TTL, a Retry-After).
MAX_TIME_S = 86_400.0
#: The shortest interval of something repeated while nothing else happens (a heartbeat, a
#: probe): shorter is a tight loop (heartbeat_s = 1e-6 sent 1.2 MB of keep-alives to one
#: client in 3 s, the process at full CPU).
MIN_INTERVAL_S = 0.01


def type_name(types: tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false",
             dict: "a table", list: "an array"}
    return " or ".join(dict.fromkeys(names[t] for t in types))


class Problems:
    """Every problem of one configuration, gathered so that one start reports them all
    (issue 10: four starts to get through keys, map and probe)."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def add(self, exc: ConfigError) -> None:
        self.messages.extend(getattr(exc, "problems", None) or [str(exc)])

    def check(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args)``, or None with its ConfigError(s) recorded."""
        try:
            return fn(*args, **kwargs)
        except ConfigError as exc:
            self.add(exc)
            return None


def check_keys(table: Mapping[str, Any], schema: Mapping[str, tuple[type, ...]],
               where: str) -> None:
    """Unknown keys and wrong types are errors: a typo must not become a silent default.
    Every bad key of the table is reported, not only the first."""
    problems = []
    for key, value in table.items():
        if key not in schema:
            problems.append(f"{where}: unknown key {key!r}; expected one of "
                            + ", ".join(schema))
            continue
        types = schema[key]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            problems.append(f"{where}: {key} must be {type_name(types)}, got {value!r}")
    if problems:
        raise ConfigErrors(problems)


def check_seconds(value: float, key: str, where: str = "", *, zero: bool = False,
                  interval: bool = False) -> None:
    """A setting's number of seconds: more than 0 (0 too with ``zero``, where 0 is a
    documented "at once"; at least :data:`MIN_INTERVAL_S` with ``interval``) and at most
    :data:`MAX_TIME_S`; NaN and infinity are neither."""
    if interval:
        low_ok, span = value >= MIN_INTERVAL_S, f"a number of seconds from {MIN_INTERVAL_S:g}"
    elif zero:
        low_ok, span = value >= 0, "a number of seconds from 0"
    else:
        low_ok, span = value > 0, "a positive number of seconds"
    if not (low_ok and value <= MAX_TIME_S):  # written so that NaN fails it
        raise ConfigError(f"{where + ': ' if where else ''}{key} must be {span} up to "
                          f"{MAX_TIME_S:.0f}, got {value!r}")


def check_port(value: int, key: str, *, lowest: int = 0) -> None:
    """A TCP port to listen on: getaddrinfo takes one past 65535 modulo 65536 (70000 was
    bound as 4464) and bind() raises OverflowError on it. 0 asks for any free port."""
    if not lowest <= value <= 65535:
        raise ConfigError(f"{key} must be a port number from {lowest} to 65535, got {value!r}")


def check_http_url(url: str, where: str) -> str:
    """An upstream's or replica's ``base_url``, without its trailing slash."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{where}: base_url {url!r} is not an http:// or https:// URL "
                          "with a host")
    return url.rstrip("/")
