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

__all__ = ["NUM", "Problems", "check_http_url", "check_keys", "type_name"]

#: A TOML number: an integer or a float (``true`` is not one, see :func:`check_keys`).
NUM: tuple[type, ...] = (int, float)


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


def check_http_url(url: str, where: str) -> str:
    """An upstream's or replica's ``base_url``, without its trailing slash."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{where}: base_url {url!r} is not an http:// or https:// URL "
                          "with a host")
    return url.rstrip("/")
