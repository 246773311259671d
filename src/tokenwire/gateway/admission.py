"""Capacity: a bounded number of upstream requests, a FIFO queue, and 429 before the body.

Seed, "Capacity": at most ``max_concurrent`` upstream requests run at once (four by
default), and each upstream may have its own, smaller limit (the embedded engine runs one
generation at a time). Up to ``queue_size`` (32) more requests wait in arrival order instead
of failing. A request counts from the moment it arrives, *before its body is read*: "the
admission bound includes body uploads", so an overload never buffers bodies. When every
running and waiting place is taken, the request is answered with a retryable 429 and
``Retry-After: 1`` before a byte of its body is read (:class:`AdmissionMiddleware`).

Two steps, two objects:

* :meth:`Admission.reserve` when the request arrives: a :class:`Ticket`, or ``None`` when
  full. The ticket is the request's place in flight; it ends when the HTTP exchange ends.
* :meth:`Admission.enqueue` once the request is parsed and routed: a future that resolves
  when an upstream slot is granted. Waiters are granted in arrival order; a waiter for an
  upstream at its own limit does not hold back a later waiter for another upstream (each
  upstream's queue is FIFO, and a free slot is never left idle while someone could use it).
  Cancelling the wait (the client went away) removes the waiter without touching an upstream.

``running`` and ``queued`` are read by ``/health`` and the metrics: ``queued`` is every
request in flight that does not hold a slot (uploading, validating or waiting).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from tokenwire.errors import ConfigError

__all__ = [
    "DEFAULT_MAX_CONCURRENT",
    "DEFAULT_QUEUE_SIZE",
    "INFERENCE_PATHS",
    "RETRY_AFTER_S",
    "TICKET_SCOPE_KEY",
    "Admission",
    "AdmissionMiddleware",
    "Ticket",
    "is_inference",
    "send_refusal",
]

#: Seed: "The daemon runs at most maxConcurrent providers (four by default)."
DEFAULT_MAX_CONCURRENT = 4
#: Seed: "Up to 32 additional requests wait in a FIFO queue".
DEFAULT_QUEUE_SIZE = 32
#: Seed: "A full queue returns busy with HTTP 429 and Retry-After: 1."
RETRY_AFTER_S = 1
#: Where :class:`AdmissionMiddleware` leaves the ticket for the route (an ASGI scope key).
TICKET_SCOPE_KEY = "tokenwire.ticket"
#: The routes that reach an upstream: only these take a ticket (GETs, /tokenize and the
#: discovery documents never queue behind generations).
INFERENCE_PATHS = frozenset({
    "/v1/completions", "/v1/completions/codec", "/v1/chat/completions", "/v1/responses",
    "/v1/messages",
})


@dataclass(eq=False, slots=True)
class Ticket:
    """One request in flight. ``arrived_at`` is the event loop's clock at arrival: the
    request's deadlines (idle timeout, one-hour cap) count from it, queue wait included."""

    admission: Admission
    arrived_at: float
    upstream: object | None = None  # the upstream whose slot it holds, when running
    released: bool = False
    #: Set when the route handed the request to the supervisor (which records it); a
    #: request answered before that was refused (400, 413, ...) and is counted as such.
    supervised: bool = False
    #: Runs once when the exchange ends (the request's record writes its log line then,
    #: after the last byte was sent).
    on_release: Callable[[], None] | None = None

    @property
    def running(self) -> bool:
        return self.upstream is not None

    def release_slot(self) -> None:
        """Give the upstream slot back (idempotent): the next waiter may start."""
        self.admission._release_slot(self)

    def release(self) -> None:
        """End the request's place in flight, and its slot if it still holds one."""
        self.admission._release(self)


@dataclass(slots=True)
class _Waiter:
    ticket: Ticket
    upstream: object
    future: asyncio.Future[None]


@dataclass
class Admission:
    """The capacity bound of one gateway (see the module docstring).

    ``limits`` maps ``id(upstream)`` to that upstream's own concurrency limit (upstream
    objects need not be hashable; :func:`limits_of` builds it); upstreams not listed are
    bounded by ``max_concurrent`` alone.
    """

    max_concurrent: int = DEFAULT_MAX_CONCURRENT
    queue_size: int = DEFAULT_QUEUE_SIZE
    limits: Mapping[int, int] = field(default_factory=dict)
    _in_flight: int = 0
    _running: int = 0
    _per_upstream: dict[int, int] = field(default_factory=dict)
    _waiters: list[_Waiter] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.max_concurrent < 1:
            raise ConfigError("max_concurrent must be at least 1")
        if self.queue_size < 0:
            raise ConfigError("the admission queue size must be >= 0")
        if any(n < 1 for n in self.limits.values()):
            raise ConfigError("an upstream's concurrency limit must be at least 1")

    @property
    def capacity(self) -> int:
        """Requests in flight before a 429. Seed: "the larger of top-level maxConcurrent and
        the sum of effective provider limits, plus 32"."""
        return max(self.max_concurrent, sum(self.limits.values())) + self.queue_size

    @property
    def running(self) -> int:
        return self._running

    @property
    def queued(self) -> int:
        return self._in_flight - self._running

    def counts(self) -> tuple[int, int]:
        """``(running, queued)`` for /health and the metrics."""
        return self._running, self.queued

    def reserve(self, now: float) -> Ticket | None:
        """A place in flight for a request arriving at ``now``, or None when full."""
        if self._in_flight >= self.capacity:
            return None
        self._in_flight += 1
        return Ticket(admission=self, arrived_at=now)

    def enqueue(self, ticket: Ticket, upstream: object) -> asyncio.Future[None]:
        """Wait in line for a slot on ``upstream``; the future resolves when it is granted.

        Cancel the future to leave the line (nothing else is needed)."""
        if ticket.released or ticket.running:
            raise RuntimeError("a released or running ticket cannot queue again")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(_Waiter(ticket, upstream, future))
        self._grant()
        return future

    # -- internals -------------------------------------------------------------------------

    def _fits(self, upstream: object) -> bool:
        if self._running >= self.max_concurrent:
            return False
        limit = self.limits.get(id(upstream))
        return limit is None or self._per_upstream.get(id(upstream), 0) < limit

    def _grant(self) -> None:
        """Start every waiter that fits, oldest first."""
        if self._running >= self.max_concurrent:  # full: nobody fits (O(1) for a long line)
            return
        kept: list[_Waiter] = []
        for i, w in enumerate(self._waiters):
            if self._running >= self.max_concurrent:  # just filled: the rest keep waiting
                kept += self._waiters[i:]
                break
            if w.future.done():  # cancelled while waiting: it just leaves the line
                continue
            if self._fits(w.upstream):
                w.ticket.upstream = w.upstream
                self._running += 1
                self._per_upstream[id(w.upstream)] = self._per_upstream.get(id(w.upstream), 0) + 1
                w.future.set_result(None)
            else:
                kept.append(w)
        self._waiters = kept

    def _release_slot(self, ticket: Ticket) -> None:
        if ticket.upstream is None:
            return
        key = id(ticket.upstream)
        ticket.upstream = None
        self._running -= 1
        self._per_upstream[key] -= 1
        self._grant()

    def _release(self, ticket: Ticket) -> None:
        if ticket.released:
            return
        ticket.released = True
        for w in self._waiters:  # still in line: leave it
            if w.ticket is ticket and not w.future.done():
                w.future.cancel()
        self._release_slot(ticket)
        self._in_flight -= 1
        self._grant()
        if ticket.on_release is not None:
            ticket.on_release()


def limits_of(upstreams: Iterable[object]) -> dict[int, int]:
    """Each upstream's own concurrency limit, read from its ``max_concurrent`` attribute or
    its config's (the embedded engine: 1, one generation at a time)."""
    out: dict[int, int] = {}
    for up in upstreams:
        limit = getattr(up, "max_concurrent", None)
        if limit is None:
            limit = getattr(getattr(up, "config", None), "max_concurrent", None)
        if isinstance(limit, int) and limit >= 1:
            out[id(up)] = limit
    return out


# -- the ASGI side ---------------------------------------------------------------------------

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

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
                       close: bool = False) -> None:
    """A retryable refusal sent before the body is read: ``Retry-After`` and OpenAI's error
    shape (``openai`` = its type and code), or Anthropic's on the Messages route."""
    if path == "/v1/messages":
        body: dict[str, Any] = {"type": "error", "error": {"type": anthropic_type,
                                                           "message": message}}
    else:
        body = {"error": {"message": message, "type": openai[0], "param": None,
                          "code": openai[1]}}
    raw = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"),
               (b"retry-after", str(retry_after_s).encode()),
               (b"content-length", str(len(raw)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": raw})


class AdmissionMiddleware:
    """Takes a ticket for every inference request before the route reads its body; answers
    429 with ``Retry-After: 1`` when none is left; releases the ticket when the exchange
    ends, however it ends (the route's stream owns only the slot).

    ``on_rejected(path, status, reason)`` hears of every inference request refused before
    it reached the supervisor: the full queue here, and the route's own 4xx answers."""

    def __init__(self, app: ASGIApp, admission: Admission,
                 on_rejected: Callable[[str, int, str], None] | None = None) -> None:
        self.app = app
        self.admission = admission
        self._on_rejected = on_rejected

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not is_inference(scope):
            await self.app(scope, receive, send)
            return
        ticket = self.admission.reserve(asyncio.get_running_loop().time())
        if ticket is None:
            if self._on_rejected is not None:
                self._on_rejected(scope["path"], 429, "queue_full")
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
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            ticket.release()
            if status >= 400 and not ticket.supervised and self._on_rejected is not None:
                self._on_rejected(scope["path"], status, _REASONS.get(status, f"http_{status}"))
