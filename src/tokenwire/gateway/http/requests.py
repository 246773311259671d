"""Reading requests: the body within its limits, JSON, the client's Codec version, the 426.

Every route reads its body through :func:`read_body` (size limit, upload deadline, an
optional gzip coding); what it raises is rendered by :mod:`.errors` in the route's API shape.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import TYPE_CHECKING, Any

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
from tokenwire.gateway.http.admission import TICKET_SCOPE_KEY

if TYPE_CHECKING:
    from tokenwire.gateway.http.state import GatewayState

__all__ = ["client_version", "new_id", "read_body", "read_json", "upgrade_response"]


def client_version(request: Request) -> Version:
    return parse_version(request.headers.get(CLIENT_VERSION_HEADER))


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

    An inference request's upload counts against its silence bound (seed: ``timeoutMs``
    "covers the upload and queue wait"): a client that stops sending gets a 408."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise bad_request(f"request body is {declared} bytes; the limit is {limit}", 413,
                          code="request_too_large")
    chunks, size = [], 0
    ticket = request.scope.get(TICKET_SCOPE_KEY)
    settings = request.app.state.gateway.settings
    deadline = ticket.arrived_at + settings.idle_timeout_s if ticket is not None else None
    try:
        async with asyncio.timeout_at(deadline):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise bad_request(f"request body exceeds the {limit}-byte limit", 413,
                                      code="request_too_large")
                chunks.append(chunk)
    except TimeoutError:
        raise bad_request(f"the request body did not arrive within "
                          f"{settings.idle_timeout_s:g} s", 408,
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


async def read_json(request: Request, limit: int) -> Any:
    body = await read_body(request, limit)
    try:
        return msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}",
                          code="invalid_json") from None


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"
