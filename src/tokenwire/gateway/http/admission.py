"""The ASGI side of admission: a ticket before the body is read, 429 when none is left.

:class:`AdmissionMiddleware` takes a :class:`~tokenwire.gateway.supervision.admission.Ticket`
for every inference request (:data:`INFERENCE_PATHS`) as it arrives, before the route reads
a byte of its body (seed, "Capacity": "the admission bound includes body uploads"), and
answers a retryable 429 with ``Retry-After: 1`` when the bound is reached. The queue itself
is sans-HTTP and lives in :mod:`tokenwire.gateway.supervision.admission`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from tokenwire.gateway.http.asgi import ASGIApp, Message, Receive, Scope, Send
from tokenwire.gateway.supervision.admission import RETRY_AFTER_S, Admission, Ticket

__all__ = [
    "INFERENCE_PATHS",
    "REQUEST_ID_SCOPE_KEY",
    "TICKET_SCOPE_KEY",
    "AdmissionMiddleware",
    "is_inference",
    "send_refusal",
    "ticket_of",
]

#: Where :class:`AdmissionMiddleware` leaves the ticket for the route (an ASGI scope key).
TICKET_SCOPE_KEY = "tokenwire.ticket"
#: Where a route leaves the request's id once it has made it (``requests.named``): an error
#: answer raised after that carries it, and so does the log line of its refusal.
REQUEST_ID_SCOPE_KEY = "tokenwire.request_id"
#: The routes that reach an upstream: only these take a ticket (GETs, /tokenize and the
#: discovery documents never queue behind generations).
INFERENCE_PATHS = frozenset({
    "/v1/completions", "/v1/completions/codec", "/v1/chat/completions", "/v1/responses",
    "/v1/messages",
})


_BUSY_MESSAGE = "The gateway is at capacity; retry shortly."
#: Metric/log reasons for a route's refusals, by status (the body says the details).
_REASONS = {400: "invalid_request", 404: "not_found", 408: "body_timeout",
            413: "body_too_large", 415: "unsupported_media_type", 426: "upgrade_required"}


def is_inference(scope: Scope) -> bool:
    """A request that reaches an upstream: a POST to one of :data:`INFERENCE_PATHS`."""
    return scope["type"] == "http" and scope.get("method") == "POST" \
        and scope.get("path") in INFERENCE_PATHS


async def send_refusal(send: Send, path: str, *, status: int, retry_after_s: int,
                       message: str, openai: tuple[str, str], anthropic_type: str,
                       close: bool = False,
                       headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """A retryable refusal sent before the body is read: ``Retry-After`` and OpenAI's error
    shape (``openai`` = its type and code), or Anthropic's on the Messages route; ``headers``
    are added (the per-key limits' ``x-ratelimit-*``)."""
    if path == "/v1/messages":
        body: dict[str, Any] = {"type": "error", "error": {"type": anthropic_type,
                                                           "message": message}}
    else:
        body = {"error": {"message": message, "type": openai[0], "param": None,
                          "code": openai[1]}}
    raw = json.dumps(body).encode()
    head = [(b"content-type", b"application/json"),
            (b"retry-after", str(retry_after_s).encode()),
            (b"content-length", str(len(raw)).encode()), *(headers or ())]
    if close:
        head.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": raw})


class AdmissionMiddleware:
    """Takes a ticket for every inference request (:class:`~.dispatch.GatewayApp` mounts it
    in front of the inference routes only) before the route reads its body; answers
    429 with ``Retry-After: 1`` when none is left; frees its place as the last body message
    goes to the server, and releases the ticket when the exchange ends, however it ends
    (the route's stream owns only the slot).

    ``on_rejected(path, status, reason, request_id)`` hears of every inference request
    refused before it reached the supervisor: the full queue here (no id yet), and the
    route's own 4xx answers (the id once the route made it)."""

    def __init__(self, app: ASGIApp, admission: Admission,
                 on_rejected: Callable[[str, int, str, str | None], None] | None = None,
                 ) -> None:
        self.app = app
        self.admission = admission
        self._on_rejected = on_rejected

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ticket = self.admission.reserve(asyncio.get_running_loop().time())
        if ticket is None:
            if self._on_rejected is not None:
                self._on_rejected(scope["path"], 429, "queue_full", None)
            await send_refusal(send, scope["path"], status=429, retry_after_s=RETRY_AFTER_S,
                               message=_BUSY_MESSAGE,
                               openai=("rate_limit_error", "rate_limit_exceeded"),
                               anthropic_type="rate_limit_error")
            return
        scope[TICKET_SCOPE_KEY] = ticket
        status = 0

        async def watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                ticket.end_place()  # before the client can read the end (Ticket.end_place)
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            ticket.release()
            if status >= 400 and not ticket.supervised and self._on_rejected is not None:
                self._on_rejected(scope["path"], status, _REASONS.get(status, f"http_{status}"),
                                  scope.get(REQUEST_ID_SCOPE_KEY))


def ticket_of(request: Any) -> Ticket:
    """The admission ticket :class:`~.admission.AdmissionMiddleware` took for the request."""
    ticket = request.scope.get(TICKET_SCOPE_KEY)
    if ticket is None:  # a route outside INFERENCE_PATHS asked: a wiring bug, say so
        raise RuntimeError(f"no admission ticket for {request.url.path}")
    return ticket
