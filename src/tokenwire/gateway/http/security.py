"""Request hardening in front of every API: target, Origin, bearer, upgrade refusal.

A pure ASGI middleware (STYLE §6 item 13). The checks run in the order the gateway seed
fixes ("WebSocket refusals"): an unparsable request target 400, any disallowed ``Origin``
403, a missing or wrong key 401, then for upgrades a 404 on any path but ``/v1/responses``
and a 426 with no body and ``Connection: close`` there (unless ``responses_websocket``:
then a WebSocket there is served, ``http/responses_ws.py``). An upgrade is an ASGI
``websocket`` scope, or an ``http`` scope whose ``Connection`` names ``upgrade`` beside an
``Upgrade`` header (uvicorn hands those to the app when no WebSocket library is installed,
like the Node request handler the seed describes); the latter on other paths is served as
an ordinary request. Keys are never logged or echoed.

Discovery documents (``/.well-known/codec/``) are public, cacheable data that browsers fetch
cross-origin (codec-spec §6.4): plain HTTP requests there skip the Origin and key checks
(their CORS preflight carries neither), and :mod:`.wellknown` answers the preflight. So
are ``GET``/``HEAD`` of the playground's three static files (:mod:`.playground`: no data,
and a browser cannot send a key when it navigates). Every other route keeps both refusals;
the gateway's own origin passes the Origin check only on a loopback ``Host`` or with a
valid key (:meth:`SecurityMiddleware._origin_allowed`: DNS rebinding).

:func:`harden` builds the served stack from :class:`ServerSettings`:
``SecurityMiddleware(CrashBarrier(app))``. Refusals come first so they never reach the app,
its admission counters or an upstream; the barrier turns an unexpected exception into a
500 with an OpenAI-shaped body (or a cut connection once the response head is out) and a
log line naming only the exception type (seed privacy rules: no bodies, messages, stacks).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import ipaddress
import json
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from tokenwire.errors import ConfigError
from tokenwire.gateway.http.asgi import ASGIApp, Message, Receive, Scope, Send
from tokenwire.gateway.http.playground import PAGE_PATHS
from tokenwire.gateway.http.wellknown import WELL_KNOWN_PREFIX
from tokenwire.gateway.state.api_keys import KEY_SCOPE_KEY, ApiKey, digest, key_table

if TYPE_CHECKING:
    from tokenwire.gateway.settings import ServerSettings

__all__ = [
    "MESSAGES_PATH", "RESPONSES_PATH", "CrashBarrier", "QueryRedactor", "SecurityMiddleware",
    "harden", "internal_error", "internal_error_response", "redact_access_log",
]


RESPONSES_PATH = "/v1/responses"
#: The one route whose errors use Anthropic's shape.
MESSAGES_PATH = "/v1/messages"
#: Exceptions the barrier lets through: cancellation (asyncio's and anyio's) and exit.
_PASS_THROUGH = (asyncio.CancelledError, KeyboardInterrupt, SystemExit, GeneratorExit)
# Bounded identifiers in logs (seed privacy rules): a path is cut, the query never logged.
MAX_LOGGED_PATH = 120
# The ASGI extension that lets a websocket scope answer with a plain HTTP response.
_DENIAL_EXT = "websocket.http.response"
_log = logging.getLogger(__name__)
# Methods that may fetch the playground's static files without a key.
_READS = frozenset({"GET", "HEAD"})


def _error(status: int, message: str, type_: str, code: str) -> tuple[int, dict[str, Any]]:
    return status, {"error": {"message": message, "type": type_, "code": code}}


_INVALID = "invalid_request_error"
_BAD_TARGET = _error(400, "The request target cannot be parsed.", _INVALID, "invalid_request")
_BAD_ORIGIN = _error(403, "Cross-origin requests are not allowed.", "permission_error",
                     "origin_not_allowed")
#: The scheme a browser puts in ``Origin`` for each ASGI scope scheme.
_ORIGIN_SCHEME = {"http": "http", "https": "https", "ws": "http", "wss": "https"}

_BAD_KEY = _error(401, "Missing or invalid API key.", "authentication_error", "invalid_api_key")
_NOT_FOUND = _error(404, "No upgrade is served at this path.", _INVALID, "not_found")
_INTERNAL = _error(500, "The server had an internal error.", "server_error", "internal_error")


def _is_loopback(client: Any) -> bool:
    try:
        return _is_loopback_address(client[0])
    except (TypeError, IndexError):
        return False  # unix sockets and unknown peers are never "localhost"


@functools.lru_cache(maxsize=4096)
def _is_loopback_address(host: str) -> bool:
    """Cached: parsing the peer's address with :mod:`ipaddress` was 1 % of a short request's
    CPU, every request, for the handful of addresses a gateway's clients come from."""
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1 (3.11 says not loopback)
    return addr.is_loopback  # 127.0.0.0/8 or ::1


def _is_loopback_host(host: str) -> bool:
    """``Host`` names a loopback address: ``localhost``, 127.0.0.0/8 or ``[::1]``, any port."""
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    name = name.strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _target_path(scope: Scope) -> str | None:
    """The path the request target names, or None if the target cannot be parsed."""
    raw = scope.get("raw_path") or scope.get("path", "").encode("latin-1")
    try:
        target = raw.decode("ascii")
        if target.startswith("/"):
            return str(scope.get("path", target))
        parts = urlsplit(target)  # absolute-form (RFC 9112 §3.2.2); raises on "http://["
        _ = parts.port  # raises on a non-numeric port
        if parts.scheme not in ("http", "https", "ws", "wss") or not parts.hostname:
            return None
        return parts.path or "/"
    except (UnicodeDecodeError, ValueError):
        return None


def _is_discovery(path: str) -> bool:
    """A path under ``/.well-known/codec/`` with no dot segment (nothing routes one
    elsewhere today; a proxy that resolves them later must not turn the exemption into a
    way around the checks)."""
    segments = path.split("/")
    return path.startswith(WELL_KNOWN_PREFIX + "/") and "." not in segments \
        and ".." not in segments


def _headers(scope: Scope) -> dict[bytes, list[bytes]]:
    out: dict[bytes, list[bytes]] = {}
    for name, value in scope.get("headers", ()):
        out.setdefault(name.lower(), []).append(value)
    return out


def _asks_upgrade(headers: dict[bytes, list[bytes]]) -> bool:
    tokens = {t.strip().lower() for v in headers.get(b"connection", []) for t in v.split(b",")}
    return b"upgrade" in tokens and bool(headers.get(b"upgrade"))


def _presented_key(headers: dict[bytes, list[bytes]]) -> bytes | None:
    """The one credential the request presents, or None.

    Exactly one is accepted: one ``x-api-key`` (what Anthropic clients send) or one
    ``Authorization: Bearer`` (the scheme is case-insensitive), or both carrying the same
    key. Several ``x-api-key`` headers, several ``Authorization`` headers, or two that
    differ are refused as a whole, never tried one by one: one request must not be able to
    test thousands of keys."""
    api_keys = headers.get(b"x-api-key", [])
    auths = headers.get(b"authorization", [])
    if len(api_keys) > 1 or len(auths) > 1:
        return None
    keys = [k.strip() for k in api_keys]
    for value in auths:
        scheme, _, cred = value.strip().partition(b" ")
        if scheme.lower() != b"bearer" or not cred.strip():
            return None
        keys.append(cred.strip())
    if not keys or any(k != keys[0] for k in keys) or not keys[0]:
        return None
    return keys[0]


class SecurityMiddleware:
    """Refuse what the seed's check order refuses; pass everything else to ``app``."""

    def __init__(self, app: ASGIApp, *, bearer_tokens: Sequence[str] | None,
                 allowed_origins: Sequence[str] = (),
                 allow_unauthenticated_localhost: bool = False,
                 responses_websocket: bool = False,
                 named_keys: Sequence[ApiKey] = ()) -> None:
        tokens = key_table(named_keys, [t for t in (bearer_tokens or ()) if t])
        if not tokens and not allow_unauthenticated_localhost:
            # Fail closed: an open gateway must be asked for, never the default.
            raise ConfigError("no bearer token configured; set one or explicitly allow "
                              "unauthenticated localhost")
        self.app = app
        #: SHA-256 of each accepted key -> the key (its name and limits), for
        #: ``http/limits.py``: the request's scope carries the key under ``KEY_SCOPE_KEY``.
        self._tokens = tuple(tokens.items())
        self._origins = frozenset(o.rstrip("/").lower() for o in allowed_origins)
        self._localhost_open = allow_unauthenticated_localhost
        #: Serve WebSocket upgrades of /v1/responses (``http/responses_ws.py``) instead of
        #: the seed's 426; an ``http`` scope asking to upgrade still gets the 426.
        self._responses_websocket = responses_websocket

    def _authorized(self, scope: Scope, headers: dict[bytes, list[bytes]]) -> bool:
        """Whether the request may pass; the key it presented (if accepted) goes into the
        scope, so a loopback client of ``localhost-open`` that sends a key is limited too."""
        key = _presented_key(headers)
        found = None
        if key is not None:
            presented = digest(key)
            for sha, api_key in self._tokens:  # every key, no early exit: time says nothing
                if hmac.compare_digest(presented, sha):
                    found = api_key
        if found is not None:
            scope[KEY_SCOPE_KEY] = found
            return True
        return self._localhost_open and _is_loopback(scope.get("client"))

    def _refusal(self, scope: Scope) -> tuple[int, dict[str, Any] | None] | None:
        path = _target_path(scope)
        if path is None:
            return _BAD_TARGET
        if scope["type"] == "http" and _is_discovery(path):
            return None  # public discovery documents, for any origin (§6.4)
        if scope["type"] == "http" and path in PAGE_PATHS and scope.get("method") in _READS:
            return None  # the playground's static files hold no data; its calls need the key
        headers = _headers(scope)
        origins = headers.get(b"origin", [])
        if any(not self._origin_allowed(o.decode("latin-1").rstrip("/").lower(), scope,
                                        headers) for o in origins):
            return _BAD_ORIGIN
        if not self._authorized(scope, headers):
            return _BAD_KEY
        upgrade = scope["type"] == "websocket" or _asks_upgrade(headers)
        if upgrade and path == RESPONSES_PATH:
            if self._responses_websocket and scope["type"] == "websocket":
                return None
            return 426, None  # the seed: no body, Connection: close
        if scope["type"] == "websocket":
            return _NOT_FOUND
        return None

    def _origin_allowed(self, origin: str, scope: Scope,
                        headers: dict[bytes, list[bytes]]) -> bool:
        """A configured origin, or the gateway's own (the playground page: browsers send
        ``Origin`` on every same-origin POST). Its own origin counts only when the ``Host``
        is a loopback name or a valid key comes with it: a DNS-rebinding page has the
        attacker's host name as its origin *and* as ``Host``, so "same origin" alone would
        let any web site drive a localhost-open gateway."""
        if origin in self._origins:
            return True
        hosts = headers.get(b"host", [])
        if len(hosts) != 1:
            return False
        host = hosts[0].decode("latin-1").lower()
        # A WebSocket scope's scheme is ws/wss; the page's origin is http/https.
        scheme = _ORIGIN_SCHEME.get(scope.get("scheme", "http"), "http")
        if origin != f"{scheme}://{host}":
            return False
        # A valid key, whoever the peer is: the same check with the loopback exemption off.
        return _is_loopback_host(host) or self._authorized({**scope, "client": None}, headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, body = refusal
        _log.info("refused status=%d path=%r", status, str(scope.get("path", ""))[:MAX_LOGGED_PATH])
        if body is not None and scope.get("path") == MESSAGES_PATH:
            body = _anthropic(body)
        await _respond(scope, send, status, body)


async def _respond(scope: Scope, send: Send, status: int, body: dict[str, Any] | None) -> None:
    payload = json.dumps(body).encode() if body is not None else b""
    headers = [(b"content-length", str(len(payload)).encode()), (b"connection", b"close")]
    if body is not None:
        headers.append((b"content-type", b"application/json"))
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})
    elif _DENIAL_EXT in scope.get("extensions", {}):
        await send({"type": "websocket.http.response.start", "status": status,
                    "headers": headers})
        await send({"type": "websocket.http.response.body", "body": payload})
    else:
        # Without the denial extension, closing before accept makes the server send 403.
        await send({"type": "websocket.close", "code": 1008})


class CrashBarrier:
    """An unexpected exception from ``app`` ends one request, never the process or its log.

    Before the response head: a 500 with an OpenAI-shaped JSON body. After it: nothing more
    can be said in HTTP, so the barrier returns and the server closes the connection (the
    client sees a truncated body, not a well-formed success). Either way one log line names
    the exception type and the path; uvicorn's own "Exception in ASGI application" line,
    which carries the stack and message, is never reached.

    Starlette's ``ServerErrorMiddleware`` answers first (its 500 handler, which
    :func:`harden` sets to the same JSON body) and then re-raises; the barrier sees that
    the head went out and only logs, so a request never gets two responses.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except _PASS_THROUGH:  # cancellation and interpreter exit are not crashes
            raise
        except BaseException as exc:
            if _is_disconnect(exc):
                _log.info("client disconnected path=%r", _logged_path(scope))
                return
            _log.error("internal error type=%s path=%r response_started=%s",
                       type(exc).__name__, _logged_path(scope), started)
            if not started:
                with contextlib.suppress(Exception):  # the peer left: nothing more to tell
                    await _respond(scope, send, *internal_error(scope.get("path", "")))


async def internal_error_response(request: Any, exc: Exception) -> Any:
    """Starlette's 500 handler: the barrier's body, so both paths answer alike."""
    from starlette.responses import Response

    status, body = internal_error(request.url.path)
    return Response(json.dumps(body).encode(), status_code=status,
                    media_type="application/json")


def _anthropic(body: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI-shaped refusal in Anthropic's shape, for the Messages route (its SDKs
    read ``error.type``: ``authentication_error``, ``permission_error``, ...)."""
    err = body["error"]
    kind = {"invalid_request": "invalid_request_error", "not_found": "not_found_error"}.get(
        err.get("code"), err["type"])
    return {"type": "error", "error": {"type": kind, "message": err["message"]}}


def internal_error(path: str) -> tuple[int, dict[str, Any]]:
    """The 500 of an unexpected exception, in the shape of the API at ``path``."""
    if path == MESSAGES_PATH:
        return 500, {"type": "error", "error": {"type": "api_error",
                                                "message": _INTERNAL[1]["error"]["message"]}}
    return _INTERNAL


def _logged_path(scope: Scope) -> str:
    return str(scope.get("path", ""))[:MAX_LOGGED_PATH]


def _is_disconnect(exc: BaseException) -> bool:
    """The client went away mid-request (Starlette's ``ClientDisconnect``, a reset socket):
    an ordinary event, never an internal error."""
    from starlette.requests import ClientDisconnect

    return isinstance(exc, ClientDisconnect | ConnectionError)


class QueryRedactor(logging.Filter):
    """Drops the query string from every request target in a log record's arguments:
    queries carry keys and prompts (``GET /health?api_key=...``) and are never logged.

    Installed on uvicorn's access logger by :func:`redact_access_log` (its record arguments
    are client, method, target, HTTP version, status); ``serve`` also turns that log off,
    so this guards anyone who turns it back on."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(_without_query(a) for a in record.args)
        record.msg = _without_query(record.msg)
        return True


def _without_query(value: Any) -> Any:
    if isinstance(value, str) and "?" in value and ("/" in value or value.startswith("?")):
        return value.split("?", 1)[0]
    return value


def redact_access_log() -> None:
    """Install :class:`QueryRedactor` on uvicorn's access logger (idempotent)."""
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, QueryRedactor) for f in access.filters):
        access.addFilter(QueryRedactor())


def harden(app: ASGIApp, settings: ServerSettings) -> ASGIApp:
    """The app as ``tokenwire serve`` serves it: checks outermost, then the crash barrier.

    Only the serving entry points call this (``create_app`` stays unwrapped so tests and
    embedders can mount the bare routes). ``settings.auth`` ``"localhost-open"`` lets
    loopback peers in without a key; with no key configured, remote peers are all refused.
    """
    redact_access_log()
    return SecurityMiddleware(
        CrashBarrier(app), bearer_tokens=settings.api_keys,
        allowed_origins=settings.allowed_origins,
        allow_unauthenticated_localhost=settings.auth == "localhost-open",
        responses_websocket=settings.responses_websocket, named_keys=settings.named_keys)
