"""Sans-IO decisions of the Responses WebSocket: what a client message is, which sockets may
open, when a session must end, and what a socket remembers (no sockets, no clock read).

The protocol is the Codex CLI's (``codex-rs/codex-api/src/endpoint/responses_websocket.rs``
and ``core/src/client.rs``): every client text message is a JSON object
``{"type": "response.create", ...}`` carrying the fields of a ``POST /v1/responses`` body,
plus ``generate`` (``false``: a warm-up that returns an empty response and runs no model)
and ``previous_response_id`` with only the new ``input`` items. :func:`parse_message` turns
one message into a :class:`Create` or a :class:`Refusal`; the transport
(``http/responses_ws.py``) sends the refusal as ``{"type": "error", "status", "error"}`` and
closes the socket when the refusal carries a close code.

Limits, each a peer controls (README "Responses over WebSocket"):

* **Message size**: ``max_body_bytes`` (8 MiB), the same as an HTTP body: a larger message
  is a 413 ``error`` and close code 1009. uvicorn's own frame buffer stops at that plus
  :data:`BACKSTOP_SLACK_BYTES` (its close 1009 carries no ``error`` message).
* **Sockets**: :data:`~tokenwire.gateway.settings.DEFAULT_WS_MAX_SOCKETS` (1,024) open at once
  and :data:`~tokenwire.gateway.settings.DEFAULT_WS_MAX_SOCKETS_PER_CLIENT` (64) per IP
  address (:class:`SocketTable`): a Codex session holds one; an IDE with many threads a few
  dozen. Beyond, the upgrade gets 429 / 503 with ``Retry-After``, and Codex falls back to
  HTTP. An idle socket holds no admission slot: capacity is taken per ``response.create``.
* **Idle time** between responses: :data:`~tokenwire.gateway.settings.DEFAULT_WS_IDLE_TIMEOUT_S`
  (15 min): a user reading an answer or a long local command keeps the socket; an abandoned
  one is closed (1000) and Codex reconnects on its next turn.
* **Session life**: :data:`~tokenwire.gateway.settings.DEFAULT_WS_SESSION_CAP_S` (60 min), as
  OpenAI: an idle socket is closed at the cap; a response running at the cap finishes, and
  the next ``response.create`` gets the ``websocket_connection_limit_reached`` error Codex
  knows (it reconnects at once) and the close (:class:`SessionClock`).
* **Memory**: a socket remembers its last completed response (input and output items) so
  ``previous_response_id`` works with ``store: false``; at most
  :data:`MAX_REMEMBERED_BYTES` of it, and all sockets together at most
  :data:`MAX_REMEMBERED_TOTAL_BYTES` (:class:`MemoryBudget`), else nothing (the
  continuation then gets ``previous_response_not_found`` and Codex resends the whole
  input).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from tokenwire.errors import ProtocolError
from tokenwire.gateway.state.response_store import ResponseStore, StoredResponse

__all__ = [
    "BACKSTOP_SLACK_BYTES",
    "CLOSE_GOING_AWAY",
    "CLOSE_INVALID_PAYLOAD",
    "CLOSE_NORMAL",
    "CLOSE_TOO_BIG",
    "CLOSE_UNSUPPORTED_DATA",
    "CONNECTION_LIMIT_CODE",
    "CONNECTION_LIMIT_MESSAGE",
    "CREATE",
    "MAX_REMEMBERED_BYTES",
    "MAX_REMEMBERED_TOTAL_BYTES",
    "Create",
    "MemoryBudget",
    "Refusal",
    "SessionClock",
    "SocketMemory",
    "SocketTable",
    "parse_message",
]

#: The one client message type (Codex 0.171 sends no other).
CREATE = "response.create"
#: RFC 6455 §7.4.1 close codes used here.
CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001  # the server is shutting down
CLOSE_UNSUPPORTED_DATA = 1003  # a binary message: this protocol is text only
CLOSE_INVALID_PAYLOAD = 1007  # a text message that is not a JSON object
CLOSE_TOO_BIG = 1009
#: Codex maps this ``error.code`` to a retryable error and opens a new socket (its
#: ``WEBSOCKET_CONNECTION_LIMIT_REACHED_CODE``); the message is OpenAI's, word for word.
CONNECTION_LIMIT_CODE = "websocket_connection_limit_reached"
CONNECTION_LIMIT_MESSAGE = ("Responses websocket connection limit reached (60 minutes). "
                            "Create a new websocket connection to continue.")
#: How far above the message limit uvicorn's own frame buffer stops (its close carries no
#: typed error): room for the gateway to read a slightly oversized message and say why.
BACKSTOP_SLACK_BYTES = 64 * 1024
#: A socket's memory of its last response (its whole conversation, encoded): 32 MiB, four
#: message limits, far past any context window a served model has.
MAX_REMEMBERED_BYTES = 32 * 1024 * 1024
#: What every socket remembers together. Per socket alone, the socket caps (64 per address,
#: 1,024 in all) let one key make the gateway hold 2 GiB per address and 32 GiB in all.
MAX_REMEMBERED_TOTAL_BYTES = 512 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Create:
    """One ``response.create``: the HTTP body's fields (``type`` and ``generate`` removed),
    the same body as JSON bytes, and whether the model runs."""

    body: dict[str, Any]
    raw: bytes
    generate: bool


@dataclass(frozen=True, slots=True)
class Refusal:
    """A message the server answers with an ``error`` (and a close, when ``close_code``)."""

    status: int
    code: str
    message: str
    param: str | None = None
    close_code: int | None = None


def parse_message(text: str | None, data: bytes | None, *, max_bytes: int,
                  decode: Callable[[bytes], Any]) -> Create | Refusal:
    """One client message, decoded and checked (never raises but what ``decode`` does
    besides a :class:`~tokenwire.errors.ProtocolError`). ``decode`` is the HTTP routes' JSON
    decoder (``http/requests.py``: its depth limit, its errors)."""
    if text is None:
        return Refusal(400, "unsupported_message", "binary messages are not accepted; send "
                       "JSON text messages", close_code=CLOSE_UNSUPPORTED_DATA)
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        return Refusal(413, "request_too_large", f"the message is {size} bytes; the limit is "
                       f"{max_bytes}", close_code=CLOSE_TOO_BIG)
    try:
        obj = decode(text.encode("utf-8", "surrogatepass"))
    except ProtocolError as exc:
        return Refusal(400, exc.code or "invalid_json", str(exc),
                       close_code=CLOSE_INVALID_PAYLOAD)
    if not isinstance(obj, dict):
        return Refusal(400, "invalid_type", "a message must be a JSON object with a \"type\"",
                       close_code=CLOSE_INVALID_PAYLOAD)
    kind = obj.get("type")
    if kind != CREATE:
        return Refusal(400, "unknown_message_type", f"unknown message type {kind!r}; the only "
                       f"one is {CREATE!r}", param="type")
    generate = obj.get("generate", True)
    if not isinstance(generate, bool):
        return Refusal(400, "invalid_type", "generate must be a boolean", param="generate")
    body = {k: v for k, v in obj.items() if k not in ("type", "generate")}
    return Create(body=body, raw=json.dumps(body).encode(), generate=generate)


class SocketTable:
    """Open sockets, in all and per address (sans-IO): :meth:`open` says whether one more
    may open (``None``) or the refusal status (429 per address, 503 in all)."""

    def __init__(self, *, max_sockets: int, max_per_client: int) -> None:
        self.max_sockets, self.max_per_client = max_sockets, max_per_client
        self._per_address: dict[str, int] = {}
        self._total = 0

    def __len__(self) -> int:
        return self._total

    def open(self, address: str) -> int | None:
        if self._per_address.get(address, 0) >= self.max_per_client:
            return 429
        if self._total >= self.max_sockets:
            return 503
        self._per_address[address] = self._per_address.get(address, 0) + 1
        self._total += 1
        return None

    def close(self, address: str) -> None:
        left = self._per_address.get(address, 0) - 1
        if left < 0:
            return
        self._total -= 1
        if left:
            self._per_address[address] = left
        else:
            del self._per_address[address]


@dataclass(slots=True)
class SessionClock:
    """When a session must end, from times the caller passes in (the event loop's).

    An idle socket closes at the idle deadline or at the cap, whichever comes first. A
    response that runs across the cap finishes; the socket then waits (up to the idle
    timeout) for the client's next message, which gets the ``websocket_connection_limit_
    reached`` error: Codex sends its next turn at once, and that error, rather than a close
    racing its message, is what makes it reconnect cleanly."""

    opened_at: float
    idle_timeout_s: float
    cap_s: float
    last_activity: float = field(default=0.0)
    #: A response ended past the cap: the next message is answered with the limit error.
    over_cap: bool = False

    def __post_init__(self) -> None:
        self.last_activity = self.opened_at

    def response_ended(self, now: float) -> None:
        """The idle time counts from here."""
        self.last_activity = now
        self.over_cap = self.capped(now)

    def capped(self, now: float) -> bool:
        return now >= self.opened_at + self.cap_s

    def wait_budget(self, now: float) -> float:
        """How long an idle socket may wait for its next message (<= 0: close it now)."""
        idle = self.last_activity + self.idle_timeout_s
        return (idle if self.over_cap else min(idle, self.opened_at + self.cap_s)) - now


class MemoryBudget:
    """Bytes every socket's memory holds together (one per gateway, ``GatewayState``): a
    response that does not fit is not remembered, as one over the socket's own cap."""

    def __init__(self, total: int = MAX_REMEMBERED_TOTAL_BYTES) -> None:
        self.total, self.used = total, 0

    def take(self, size: int) -> bool:
        if self.used + size > self.total:
            return False
        self.used += size
        return True

    def give(self, size: int) -> None:
        self.used -= size


class SocketMemory:
    """The store a socket's requests read: its own last response first (``store: false``
    included), then the gateway's (``store: true`` responses of any transport). What it
    holds counts against ``budget``, shared by every socket; :meth:`forget` when the socket
    closes gives it back."""

    def __init__(self, shared: ResponseStore | None, *,
                 max_bytes: int = MAX_REMEMBERED_BYTES,
                 budget: MemoryBudget | None = None) -> None:
        self._shared, self._max = shared, max_bytes
        self._budget = budget if budget is not None else MemoryBudget()
        self._held = 0  # bytes of ``last`` counted in the budget
        self.last: StoredResponse | None = None

    async def get(self, response_id: str) -> StoredResponse | None:
        if self.last is not None and self.last.id == response_id:
            return self.last
        return await self._shared.get(response_id) if self._shared is not None else None

    def remember(self, response_id: str, input_items: list[Any], response: dict[str, Any],
                 *, now: float) -> bool:
        """Keep this response as the socket's last one; False (and forget) when too big."""
        size = len(msgspec.json.encode(input_items)) + len(msgspec.json.encode(response))
        self.forget()
        if size > self._max or not self._budget.take(size):
            return False
        self._held = size
        self.last = StoredResponse(id=response_id, created=now, input=tuple(input_items),
                                   response=response)
        return True

    def forget(self) -> None:
        """Let the last response go and give its bytes back to the budget."""
        self._budget.give(self._held)
        self._held, self.last = 0, None
