"""Named API keys and their limits: the ``[[keys]]`` tables of the config file (issue 16).

::

    [[keys]]
    name = "ci-bot"                 # what metrics and logs show; never the key
    key_env = "CI_BOT_KEY"          # the variable holding the key, or:
    # key_sha256 = "9f86d08..."     # its SHA-256 in hex: the secret never sits anywhere
    rpm = 60                        # requests per minute (optional)
    tpm = 100000                    # tokens per minute, from real usage (optional)
    max_concurrent = 4              # requests at once (optional)

The flat list (``TOKENWIRE_API_KEYS`` / ``api_keys_env``) keeps working beside them: those
keys are unnamed (``"unnamed"`` in metrics) and unlimited. Keys are compared by their SHA-256
(:func:`digest`), so a ``key_sha256`` entry and a key read from a variable are checked alike;
neither the key nor its digest is ever logged, put in a metric label or an error message.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tokenwire.errors import ConfigError, ConfigErrors
from tokenwire.gateway.state.limits import KeyLimits

__all__ = [
    "ANONYMOUS", "ANONYMOUS_KEY", "KEY_FIELDS", "KEY_SCOPE_KEY", "UNNAMED", "ApiKey",
    "check_api_key", "digest", "key_table", "parse_keys", "read_api_keys", "response_owner",
]

#: The metric/log name of a key from the flat list, and of a loopback client with no key.
UNNAMED = "unnamed"
ANONYMOUS = "anonymous"
#: Where :class:`~tokenwire.gateway.http.security.SecurityMiddleware` leaves the accepted
#: :class:`ApiKey` of a request (an ASGI scope key), for the limits middleware.
KEY_SCOPE_KEY = "tokenwire.api_key"
#: Names are metric label values and log fields: short, code-shaped, chosen by the operator.
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
#: The keys of one ``[[keys]]`` table and their types.
KEY_FIELDS: dict[str, tuple[type, ...]] = {
    "name": (str,), "key_env": (str,), "key_sha256": (str,), "rpm": (int,), "tpm": (int,),
    "max_concurrent": (int,),
}


def check_api_key(key: str, where: str) -> None:
    """A key a client can send in a header; the message never contains the key itself."""
    if not key:
        raise ConfigError(f"{where} is empty")
    if not key.isascii() or not key.isprintable() or any(c.isspace() for c in key):
        raise ConfigError(f"{where} contains whitespace or non-printable/non-ASCII characters")


def read_api_keys(var: str, env: Mapping[str, str], *, where: str) -> tuple[str, ...]:
    """The flat list: the comma-separated keys in ``env[var]`` (``TOKENWIRE_API_KEYS`` or the
    variable ``api_keys_env`` / ``--api-keys-env`` names). Errors name the variable, never a
    value."""
    if not var or var not in env:
        raise ConfigError(f"{where}: {var or 'the API key variable'} is not set")
    keys = tuple(k.strip() for k in env[var].split(",") if k.strip())
    if not keys:
        # Set but empty is a mistake (an unexported secret), not a wish to run open.
        raise ConfigError(f"{where}: {var} is set but holds no API key")
    for i, key in enumerate(keys):
        check_api_key(key, f"{where}: {var} key #{i + 1}")
    return keys


def digest(key: str | bytes) -> bytes:
    """The SHA-256 a presented key is compared by."""
    return hashlib.sha256(key.encode() if isinstance(key, str) else key).digest()


@dataclass(frozen=True)
class ApiKey:
    """One named key: its name, the SHA-256 of the secret (never in repr) and its limits."""

    name: str
    sha256: bytes = field(repr=False)
    limits: KeyLimits = field(default_factory=KeyLimits)


def parse_keys(tables: object, env: Mapping[str, str], *, source: str) -> tuple[ApiKey, ...]:
    """Validate the ``[[keys]]`` array; every problem is reported at once, none names a key."""
    if not isinstance(tables, list):
        raise ConfigError(f"{source}: keys must be an array of tables ([[keys]])")
    problems: list[str] = []
    keys: list[ApiKey] = []
    for i, table in enumerate(tables):
        where = f"{source}: [[keys]] #{i + 1}"
        try:
            keys.append(_parse_one(table, env, where))
        except ConfigErrors as exc:
            problems.extend(exc.problems)
        except ConfigError as exc:
            problems.append(str(exc))
    problems.extend(_duplicates(keys, source))
    if problems:
        raise ConfigErrors(problems)
    return tuple(keys)


def _parse_one(table: object, env: Mapping[str, str], where: str) -> ApiKey:
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: must be a table")
    problems = [f"{where}: unknown key {k!r}; expected one of " + ", ".join(KEY_FIELDS)
                for k in table if k not in KEY_FIELDS]
    problems += [f"{where}: {k} must be {'a string' if t == (str,) else 'an integer'}"
                 for k, t in KEY_FIELDS.items() if k in table
                 and (not isinstance(table[k], t) or isinstance(table[k], bool))]
    if problems:
        raise ConfigErrors(problems)
    name = table.get("name")
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ConfigError(f"{where}: name is required: 1-64 letters, digits, '_', '.', '-'")
    if name in (UNNAMED, ANONYMOUS):
        raise ConfigError(f"{where}: name {name!r} is reserved (the flat key list uses it)")
    where = f"{where} ({name})"
    if ("key_env" in table) == ("key_sha256" in table):
        raise ConfigError(f"{where}: give exactly one of key_env and key_sha256")
    if "key_env" in table:
        var = table["key_env"]
        if not env.get(var, "").strip():
            raise ConfigError(f"{where}: key_env names {var}, which is not set")
        secret = env[var].strip()
        check_api_key(secret, f"{where}: the key in {var}")
        sha = digest(secret)
    else:
        hexed = table["key_sha256"].strip().lower()
        if not _SHA256_RE.fullmatch(hexed):
            raise ConfigError(f"{where}: key_sha256 must be 64 hex digits (sha256sum of the "
                              "key, without a newline)")
        sha = bytes.fromhex(hexed)
    try:
        limits = KeyLimits(rpm=table.get("rpm"), tpm=table.get("tpm"),
                           max_concurrent=table.get("max_concurrent"))
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return ApiKey(name=name, sha256=sha, limits=limits)


def _duplicates(keys: Sequence[ApiKey], source: str) -> list[str]:
    problems, names, shas = [], set(), set()
    for key in keys:
        if key.name in names:
            problems.append(f"{source}: two [[keys]] are named {key.name!r}")
        if key.sha256 in shas:
            problems.append(f"{source}: [[keys]] {key.name!r} has the same key as another")
        names.add(key.name)
        shas.add(key.sha256)
    return problems


def key_table(keys: Sequence[ApiKey], flat: Sequence[str]) -> dict[bytes, ApiKey]:
    """digest -> key, for the security check: named keys and the flat list (unnamed, no
    limits). A flat key equal to a named one is the named one."""
    table = {digest(k): ApiKey(name=UNNAMED, sha256=digest(k)) for k in flat}
    table.update({k.sha256: k for k in keys})
    return table


#: The "key" of a loopback client let in without one (``localhost-open``): no limits.
ANONYMOUS_KEY = ApiKey(name=ANONYMOUS, sha256=b"")


def response_owner(key: ApiKey) -> str:
    """Whose stored responses a request with ``key`` sees (``state/response_store.py``,
    :class:`~.response_store.OwnedStore`): a named key's name (its secret may be rotated),
    a flat-list key's own digest (they are all "unnamed"), hashed again so the store never
    holds the digest a key is checked against; the anonymous loopback client's are its
    own. Never contains ``/``: the owner is the first segment of a stored id."""
    if key.name == ANONYMOUS:  # a reserved name: only ANONYMOUS_KEY has it
        return ANONYMOUS
    if key.name != UNNAMED:
        return f"key-{key.name}"
    return "flat-" + hashlib.sha256(b"tokenwire response owner\0" + key.sha256).hexdigest()[:32]
