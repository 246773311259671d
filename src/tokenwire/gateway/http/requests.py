"""Reading requests: the body within its limits, JSON, the client's Codec version, the 426.

Every route reads its body through :func:`read_body` (size limit, upload deadline, an
optional gzip coding), and most parse it through :func:`read_parsed` (large bodies off the
event loop); what they raise is rendered by :mod:`.errors` in the route's API shape.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from tokenwire.codec.compression import GzipDecompressor
from tokenwire.codec.versioning import (
    CLIENT_VERSION_HEADER,
    VARY,
    Version,
    needs_upgrade,
    parse_version,
    upgrade_required_response,
)
from tokenwire.gateway.apis.params import bad_request
from tokenwire.gateway.http.admission import REQUEST_ID_SCOPE_KEY, TICKET_SCOPE_KEY

if TYPE_CHECKING:
    from tokenwire.gateway.http.state import GatewayState

__all__ = ["INLINE_BODY_BYTES", "MAX_JSON_DEPTH", "client_version", "decode_json", "named",
           "new_id", "read_body", "read_parsed", "upgrade_response"]

T = TypeVar("T")

#: Deepest JSON nesting a request may have. Real bodies nest under 10 levels (a tool's JSON
#: schema a few more); msgspec stops at Python's recursion limit with a RecursionError, and
#: later steps (templates, re-encoding for an upstream) recurse too, so a small bound here
#: keeps every one of them safe.
MAX_JSON_DEPTH = 64
#: Bodies larger than this are parsed on a worker thread (:func:`read_parsed`). One near the
#: 8 MiB limit held every other client (``GET /health`` included) while it was parsed: a
#: Path C body of millions of packed ids ~1.5 s, a Chat body of 270,000 tiny messages ~0.9 s
#: (JSON decoding, the depth walk, then the API's parser). Smaller ones are parsed inline,
#: where a thread's round trip would cost every first token more than the parse.
INLINE_BODY_BYTES = 65_536


def client_version(request: Request) -> Version:
    return parse_version(request.headers.get(CLIENT_VERSION_HEADER))


def named(request: Request, rid: str) -> str:
    """``rid``, made ``request``'s id: an error answer raised from here on carries it
    (``X-Request-Id``, ``errors.exception_response``) as a success does, and so does the
    log line of the refusal. A 400 had no id for the client to report."""
    request.scope[REQUEST_ID_SCOPE_KEY] = rid
    return rid


def upgrade_response(state: GatewayState, request: Request) -> Response | None:
    """The exact 426 of codec-spec §5.4, or None when the client may proceed."""
    policy = state.settings.version_policy
    if not needs_upgrade(policy, client_version(request)):
        return None
    status, headers, body = upgrade_required_response(
        policy, request.headers.get(CLIENT_VERSION_HEADER))
    return Response(body, status_code=status, headers={**dict(headers), "Vary": VARY})


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, at most ``limit`` bytes after an optional gzip coding (§4.1).

    Every route's upload has a deadline, ``body_timeout_s`` from its arrival (the admission
    ticket's time for inference requests, whose upload also counts against their silence
    bound: seed ``timeoutMs`` "covers the upload and queue wait"); a client that stops
    sending gets a 408 instead of holding its slot for the whole idle timeout."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise bad_request(f"request body is {declared} bytes; the limit is {limit}", 413,
                          code="request_too_large")
    chunks, size = [], 0
    ticket = request.scope.get(TICKET_SCOPE_KEY)
    settings = request.app.state.gateway.settings
    started = ticket.arrived_at if ticket is not None else asyncio.get_running_loop().time()
    allowed = min(settings.body_timeout_s, settings.idle_timeout_s)
    try:
        async with asyncio.timeout_at(started + allowed):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise bad_request(f"request body exceeds the {limit}-byte limit", 413,
                                      code="request_too_large")
                chunks.append(chunk)
    except TimeoutError:
        raise bad_request(f"the request body did not arrive within {allowed:g} s", 408,
                          code="request_body_timeout") from None
    body = b"".join(chunks)
    coding = request.headers.get("content-encoding", "identity").strip().lower()
    if coding in ("", "identity"):
        return body
    if coding != "gzip":
        raise bad_request(f"request Content-Encoding {coding!r} is not supported; use gzip", 415,
                          code="unsupported_content_encoding")
    dec = GzipDecompressor(max_output=limit)
    return dec.decompress(body) + dec.finish()


async def read_parsed(request: Request, limit: int, parse: Callable[..., T], *args: Any) -> T:
    """``parse(body, *args)`` of the body :func:`read_body` read: inline when it is at most
    :data:`INLINE_BODY_BYTES`, else on a worker thread (``asyncio.to_thread``), so a large
    body never holds the event loop. ``parse`` must be pure (body in, request out): it may
    run on another thread, so whatever shared state it needs is read first, on the loop,
    and passed in. What it raises reaches the route unchanged, from either thread."""
    body = await read_body(request, limit)
    if len(body) <= INLINE_BODY_BYTES:  # (no await, task or thread for a small one)
        return parse(body, *args)
    return await asyncio.to_thread(parse, body, *args)


def decode_json(body: bytes) -> Any:
    """A JSON request body, nested at most :data:`MAX_JSON_DEPTH` deep; else a 400."""
    try:
        value = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}",
                          code="invalid_json") from None
    except RecursionError:
        raise _too_deep() from None
    # Each container opens with a bracket, so a body with few of them cannot nest deeply:
    # a short chat turn skips the walk (~10 µs with the caches cold, on the way to the
    # first token); brackets inside strings only make the bound looser.
    if body.count(b"[") + body.count(b"{") > MAX_JSON_DEPTH and \
            _depth_exceeds(value, MAX_JSON_DEPTH):
        raise _too_deep()
    return value


def _too_deep() -> Exception:
    return bad_request(f"the request body nests deeper than {MAX_JSON_DEPTH} levels",
                       code="invalid_json")


def _depth_exceeds(value: Any, limit: int) -> bool:
    """Whether ``value`` nests more than ``limit`` containers deep (iterative: the walk
    itself must not recurse)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item \
            if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children
                     if isinstance(child, dict | list))
    return False


def new_id(prefix: str) -> str:
    """A request id: 96 random bits from the OS, as ``secrets.token_hex`` makes them."""
    return f"{prefix}-{os.urandom(12).hex()}"
