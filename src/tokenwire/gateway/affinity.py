"""Cache-affinity hints and Codex turn state: which ones reach which upstream (pure functions).

Codex sends a ``prompt_cache_key`` in the body and ``session-id`` / ``thread-id`` headers; an
upstream that reuses its prompt cache only when it sees them (the seed measured 0 % vs 99.5 %
cached tokens on identical 27k-token requests) must receive them, and nothing else should:
they identify a user's conversation. The rules (seed, "Response ids, cache affinity, and turn
state"):

* Only well-formed identifiers are forwarded: at most :data:`MAX_AFFINITY_CHARS` characters
  of a safe charset (:data:`_SAFE_ID`). Anything else is dropped silently (never logged).
* Per upstream kind (:data:`HEADERS_BY_KIND`, :data:`BODY_KEYS_BY_KIND`): Responses upstreams
  get the body key and the session/thread headers; OpenAI-compatible servers (OpenRouter is
  one) get the caller's session id as ``x-session-id``; engines in this process, Codec and
  Anthropic upstreams get nothing.
* ``x-codex-turn-state`` keeps one turn on one backend. Codex takes the first value a turn's
  response carries (HTTP header, ``response.metadata``, or the WebSocket upgrade's header)
  and sends it back on every later request of that turn. The gateway hands out its own
  token (:func:`wrap_turn_state`, :func:`replica_token`): the *scope* (the upstream or
  replica that must continue the turn) and, when that upstream issued one, its own value,
  signed with HMAC-SHA256 (:func:`turn_state_key`), so a client can neither point a turn at
  another replica nor hand an upstream a value it did not issue. A value the client echoes
  is read back (:func:`read_turn_state`) and the upstream's part forwarded only to the
  upstream its scope names (:func:`unwrap_turn_state`). A bad signature, another scope, a
  malformed value, or an upstream value over :data:`MAX_TURN_STATE_CHARS` is dropped; none
  is ever logged.

This module sits between ``apis/`` (which collects the hints into
:attr:`~tokenwire.gateway.ir.GenerationRequest.affinity`) and ``upstreams/`` (which asks what to
send), so that neither imports the other (STYLE §6 item 9).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import secrets
from collections.abc import Iterable, Mapping

__all__ = [
    "BODY_KEYS_BY_KIND",
    "HEADERS_BY_KIND",
    "HINT_HEADER_NAMES",
    "MAX_AFFINITY_CHARS",
    "MAX_TURN_STATE_CHARS",
    "TURN_STATE_HEADER",
    "TURN_STATE_SECRET_ENV",
    "affinity_body",
    "affinity_headers",
    "affinity_hints",
    "read_turn_state",
    "replica_token",
    "set_turn_state_secret",
    "turn_state_key",
    "unwrap_turn_state",
    "well_formed_id",
    "wrap_turn_state",
]

#: The seed forwards "only well-formed identifiers of at most 128 characters"; UUIDs, ULIDs and
#: Codex's thread ids are far shorter, so a longer value is not an id.
MAX_AFFINITY_CHARS = 128
#: Upstream turn-state values are about 780 characters (verified live, per the seed); values
#: over 6000 are dropped, as the seed does, so a header cannot grow without bound.
MAX_TURN_STATE_CHARS = 6000
TURN_STATE_HEADER = "x-codex-turn-state"
#: Letters, digits and ``. _ : -``: every id format seen, and nothing that can split a header
#: or smuggle a second value.
_SAFE_ID = re.compile(r"[A-Za-z0-9._:\-]+")
#: Visible ASCII without spaces or commas: a turn-state value is an opaque header token.
_SAFE_STATE = re.compile(r"[\x21-\x2b\x2d-\x7e]+")
#: A gateway turn-state token: ``tw2.<base64url(scope)>.<base64url(mac)>[.<value>]``, the
#: MAC over the scope and the value. Scope and MAC are base64url (no dots), so the value,
#: last, may hold anything a header token may.
_SCOPE_PREFIX = "tw2."
#: 128 bits of HMAC-SHA256: forging one is as hard as guessing a random 128-bit number, and
#: the token stays short (22 characters).
_MAC_BYTES = 16
#: Gateway instances behind one balancer share turns only when they share this secret
#: (README "Replica pools"); without it each process draws its own at start, and a token
#: from another instance or an earlier run is ignored (the turn is routed afresh).
TURN_STATE_SECRET_ENV = "TOKENWIRE_TURN_STATE_SECRET"
#: A shared secret shorter than this is refused: it could be guessed offline from tokens.
_MIN_SECRET_BYTES = 16
_key: bytes | None = None

#: Request headers (by the name we send) each upstream kind uses for cache affinity, and the
#: client hints they are filled from, in order of preference.
HEADERS_BY_KIND: dict[str, dict[str, tuple[str, ...]]] = {
    "responses": {"session-id": ("session-id",), "thread-id": ("thread-id",)},
    "openai": {"x-session-id": ("x-session-id", "session-id")},
}
#: Body keys each upstream kind uses (the Chat/Anthropic/Codec wire has no such key).
BODY_KEYS_BY_KIND: dict[str, tuple[str, ...]] = {"responses": ("prompt_cache_key",)}

#: Client header names collected as hints (lower case). ``x-tokenwire-affinity`` is the
#: explicit key of a replica pool (``routing/pool.py``); no upstream kind is sent it.
_HINT_HEADERS = ("session-id", "thread-id", "x-session-id", "x-tokenwire-affinity")
#: Every header :func:`affinity_hints` reads, as an ASGI scope names them (lower-case bytes).
HINT_HEADER_NAMES = frozenset(n.encode() for n in (*_HINT_HEADERS, TURN_STATE_HEADER.lower()))
#: Body keys collected as hints: ``previous_response_id`` (a Responses body) only picks the
#: replica that produced that response; it is never forwarded as a hint.
_HINT_BODY_KEYS = ("prompt_cache_key", "previous_response_id")


def well_formed_id(value: object) -> bool:
    """True for an affinity id the seed allows forwarding: a short safe-charset string."""
    return (isinstance(value, str) and 0 < len(value) <= MAX_AFFINITY_CHARS
            and _SAFE_ID.fullmatch(value) is not None)


def affinity_hints(body: Mapping[str, object],
                   headers: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The well-formed hints of one client request, as ``(name, value)`` pairs.

    ``headers`` must be case-insensitive or lower-cased (Starlette's are). The turn-state
    value is kept as the client sent it (still wrapped); :func:`affinity_headers` decides.
    """
    hints: list[tuple[str, str]] = []
    for name in _HINT_BODY_KEYS:  # (most requests carry none: absent ones cost no call)
        key = body.get(name)
        if key is not None and well_formed_id(key):
            hints.append((name, str(key)))
    for name in _HINT_HEADERS:
        value = headers.get(name)
        if value is not None and well_formed_id(value):
            hints.append((name, str(value)))
    state = headers.get(TURN_STATE_HEADER)
    if isinstance(state, str) and state.startswith(_SCOPE_PREFIX):
        hints.append((TURN_STATE_HEADER, state))
    return tuple(hints)


def affinity_headers(kind: str, upstream_name: str,
                     hints: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The headers an upstream of ``kind`` named ``upstream_name`` should receive."""
    given = dict(hints)
    out: dict[str, str] = {}
    for header, sources in HEADERS_BY_KIND.get(kind, {}).items():
        value = next((given[s] for s in sources if well_formed_id(given.get(s))), None)
        if value is not None:
            out[header] = value
    if kind == "responses" and TURN_STATE_HEADER in given:
        state = unwrap_turn_state(upstream_name, given[TURN_STATE_HEADER])
        if state is not None:
            out[TURN_STATE_HEADER] = state
    return out


def affinity_body(kind: str, hints: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The body keys an upstream of ``kind`` should receive (for a translated body)."""
    given = dict(hints)
    return {k: given[k] for k in BODY_KEYS_BY_KIND.get(kind, ()) if well_formed_id(given.get(k))}


def _valid_state(value: object) -> bool:
    return (isinstance(value, str) and 0 < len(value) <= MAX_TURN_STATE_CHARS
            and _SAFE_STATE.fullmatch(value) is not None)


def turn_state_key() -> bytes:
    """The HMAC key of turn-state tokens: :data:`TURN_STATE_SECRET_ENV` when set, else
    one random key per process (drawn on first use)."""
    global _key
    if _key is None:
        shared = os.environ.get(TURN_STATE_SECRET_ENV)
        if shared is not None and len(shared.encode()) < _MIN_SECRET_BYTES:
            raise ValueError(f"{TURN_STATE_SECRET_ENV} must be at least {_MIN_SECRET_BYTES} "
                             "bytes (a shared secret every gateway instance knows)")
        _key = shared.encode() if shared is not None else secrets.token_bytes(32)
    return _key


def set_turn_state_secret(secret: bytes | None) -> None:
    """Use ``secret`` from now on (None: read the environment again on next use)."""
    global _key
    _key = secret


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(scope: str, value: str) -> str:
    digest = hmac.new(turn_state_key(), f"tw2\x00{scope}\x00{value}".encode(),
                      hashlib.sha256).digest()
    return _b64(digest[:_MAC_BYTES])


def _token(scope: str, value: str) -> str:
    tail = f".{value}" if value else ""
    return f"{_SCOPE_PREFIX}{_b64(scope.encode())}.{_mac(scope, value)}{tail}"


def wrap_turn_state(upstream_name: str, value: str) -> str | None:
    """The token to hand the client for ``value`` issued by ``upstream_name``; ``None`` drops
    a malformed or oversized upstream value."""
    if not _valid_state(value):
        return None
    return _token(upstream_name, value)


def replica_token(scope: str) -> str:
    """A token that names only ``scope`` (a replica of a pool): the turn continues there,
    with no upstream value to forward (``routing/pool.py``)."""
    return _token(scope, "")


def read_turn_state(wrapped: str) -> tuple[str, str | None] | None:
    """``(scope, upstream value or None)`` of a token this gateway signed, else None."""
    # A header value is latin-1: non-ASCII would make compare_digest raise, not refuse.
    if not isinstance(wrapped, str) or not wrapped.startswith(_SCOPE_PREFIX) \
            or len(wrapped) > MAX_TURN_STATE_CHARS + 128 or not wrapped.isascii():
        return None
    parts = wrapped[len(_SCOPE_PREFIX):].split(".", 2)
    if len(parts) < 2:
        return None
    value = parts[2] if len(parts) == 3 else ""
    if value and not _valid_state(value):
        return None
    try:
        scope = _unb64(parts[0]).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    if not hmac.compare_digest(parts[1], _mac(scope, value)):
        return None
    return scope, value or None


def unwrap_turn_state(upstream_name: str, wrapped: str) -> str | None:
    """The upstream value inside ``wrapped`` when its scope is ``upstream_name``, else None."""
    found = read_turn_state(wrapped)
    return found[1] if found is not None and found[0] == upstream_name else None
