"""Connection limits in front of the app: deadlines for heads and bodies, per-client and
global caps, and a refusal that costs one write (issue 11 item 1).

uvicorn closes an idle connection only *between* requests (``timeout_keep_alive``): a
connection that sends nothing, or half a request head, is held for ever, and a few hundred
of them fill ``limit_concurrency`` before authentication can run. uvicorn has no setting
for that, so the smallest contained extension is :class:`GuardedH11Protocol`, uvicorn's own
h11 protocol with four additions (handed to uvicorn as its ``http`` protocol factory):

* **Head deadline** (``head_timeout_s``): from the moment a connection opens, or finishes a
  response, until the blank line that ends the next request head. Past it the connection is
  closed (with a bare ``408`` when part of a head had arrived). A slow drip of header bytes
  does not restart it.
* **Body deadline** (``body_timeout_s`` + :data:`BODY_BACKSTOP_GRACE_S`): from the end of the
  head until the last body byte. The routes enforce ``body_timeout_s`` themselves, with a 408
  in their API's shape (``gateway/http/requests.py``); this backstop closes connections whose
  body nobody reads (a request refused before its body, a slow upload after a 401).
* **Per-client cap** (``max_connections_per_client``, by peer IP address): one more
  connection gets ``429`` with ``Retry-After`` and is closed before any byte is read.
* **Global cap** (``max_connections``): at the cap, a new connection evicts the connection
  that has waited longest for a request head (idle keep-alive or unfinished head: the
  cheapest to drop, and an attacker's); connections with a request in flight are never
  evicted. Only when every connection is busy does a new one get ``503`` with
  ``Retry-After``. So a flood of idle sockets cannot starve clients that send requests.

The decisions are a sans-IO table (:class:`ConnectionTable`) that a test drives without a
socket; the protocol subclass only feeds it and acts. h11's own connection state
(``their_state``) says which phase a connection is in. Behaviour is tested only through raw
sockets against a real server (``tests/gateway/test_connection_limits.py``), so a later
change of HTTP server keeps the tests and replaces only this adapter.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from tokenwire.gateway.settings import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_HEAD_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
    ServerSettings,
)

__all__ = [
    "BODY_BACKSTOP_GRACE_S",
    "DEFAULT_BODY_TIMEOUT_S",
    "DEFAULT_HEAD_TIMEOUT_S",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_CONNECTIONS_PER_CLIENT",
    "Admit",
    "ConnectionLimits",
    "ConnectionTable",
    "GuardedH11Protocol",
    "guarded_protocol",
]

#: Head deadline (DEFAULT_HEAD_TIMEOUT_S, 10 s): a request head arrives in one packet from
#: every real client; 10 s covers a slow mobile link many times over (nginx waits 60 s,
#: Apache's RequestReadTimeout 20-40 s) while a slowloris client holds a socket for 10 s,
#: not for ever. Body deadline (DEFAULT_BODY_TIMEOUT_S, 60 s): 8 MiB (the body limit) at
#: ~1.1 Mbit/s; much shorter than the 600 s idle timeout, which is for upstream silence, so
#: 36 slow uploads no longer hold every admission slot for ten minutes.
#: How much later than the routes' own 408 the connection-level body backstop closes.
BODY_BACKSTOP_GRACE_S = 5.0
#: Open connections (DEFAULT_MAX_CONNECTIONS, 4,096): each costs a file descriptor and
#: ~10 KB; ``tokenwire serve`` raises its fd limit to fit them. Per client IP address
#: (DEFAULT_MAX_CONNECTIONS_PER_CLIENT, 256): agents and SDK pools open a few to a few
#: dozen; 256 leaves room for a benchmark or a NAT of users and stops one address from
#: holding the whole table.
#: ``Retry-After`` of both connection refusals: a slot frees within seconds.
RETRY_AFTER_S = 1
#: How long a refused connection is read (and its bytes dropped) before it is closed.
REFUSAL_LINGER_S = 2.0


def _refusal(status: int, reason: str, type_: str, code: str, message: str) -> bytes:
    body = json.dumps({"error": {"message": message, "type": type_, "param": None,
                                 "code": code}}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"retry-after: {RETRY_AFTER_S}\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n").encode()
    return head + body


#: Pre-built: a refusal is one write and a close, never a parse or an allocation per byte.
_TOO_MANY_FROM_CLIENT = _refusal(429, "Too Many Requests", "rate_limit_error",
                                 "too_many_connections",
                                 "Too many open connections from this address; retry shortly.")
_SERVER_FULL = _refusal(503, "Service Unavailable", "server_error", "server_busy",
                        "The server has no free connection slot; retry shortly.")
_TIMEOUT = (b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\n"
            b"connection: close\r\n\r\n")


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The four limits (see the module docstring); built from ``ServerSettings``."""

    head_timeout_s: float = DEFAULT_HEAD_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_connections_per_client: int = DEFAULT_MAX_CONNECTIONS_PER_CLIENT

    @classmethod
    def from_settings(cls, settings: ServerSettings) -> ConnectionLimits:
        return cls(head_timeout_s=settings.head_timeout_s,
                   body_timeout_s=settings.body_timeout_s,
                   max_connections=settings.max_connections,
                   max_connections_per_client=settings.max_connections_per_client)


@dataclass(frozen=True, slots=True)
class Admit:
    """:meth:`ConnectionTable.open`'s decision: ``refusal`` bytes to send, or accept (after
    evicting ``victim``, when one is named)."""

    refusal: bytes | None = None
    victim: Any = None


class ConnectionTable:
    """Who is connected, from where, and who waits for a head (sans-IO, no clock)."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self._address: dict[Any, str] = {}
        self._per_address: dict[str, int] = {}
        #: Connections waiting for a request head, oldest first: the eviction order.
        self._waiting: OrderedDict[Any, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._address)

    def open(self, conn: Any, address: str) -> Admit:
        """A new connection from ``address``; it starts out waiting for a head."""
        if self._per_address.get(address, 0) >= self.limits.max_connections_per_client:
            return Admit(refusal=_TOO_MANY_FROM_CLIENT)
        victim = None
        if len(self._address) >= self.limits.max_connections:
            if not self._waiting:
                return Admit(refusal=_SERVER_FULL)
            victim = next(iter(self._waiting))
            self.close(victim)
        self._address[conn] = address
        self._per_address[address] = self._per_address.get(address, 0) + 1
        self._waiting[conn] = None
        return Admit(victim=victim)

    def waiting(self, conn: Any) -> None:
        """``conn`` waits for a request head again (evictable, newest in line)."""
        if conn in self._address:
            self._waiting.pop(conn, None)
            self._waiting[conn] = None

    def busy(self, conn: Any) -> None:
        """``conn`` has a request in flight (never evicted)."""
        self._waiting.pop(conn, None)

    def close(self, conn: Any) -> None:
        address = self._address.pop(conn, None)
        self._waiting.pop(conn, None)
        if address is None:
            return
        left = self._per_address[address] - 1
        if left:
            self._per_address[address] = left
        else:
            del self._per_address[address]


_HEAD, _BODY, _APP = "head", "body", "app"


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol under a :class:`ConnectionTable` (see the module docstring)."""

    def __init__(self, *args: Any, table: ConnectionTable, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._table = table
        self._phase: str | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._head_bytes = False  # part of a head arrived in the current wait
        self._refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        admit = self._table.open(self, address)
        if admit.refusal is not None:
            # Lingering close (as Apache does): a client that already sent its request
            # would get a reset, and lose the refusal, if the socket closed with its bytes
            # unread. So: send, half-close, discard what arrives, close on its EOF or soon.
            self._refused = True
            transport.write(admit.refusal)
            if transport.can_write_eof():
                transport.write_eof()
            self._deadline = asyncio.get_running_loop().call_later(
                REFUSAL_LINGER_S, transport.close)
            return
        if admit.victim is not None:
            admit.victim.evict()
        super().connection_made(transport)
        self._update()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._phase == _HEAD:
            self._head_bytes = True
        super().data_received(data)
        self._update()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._update()

    def connection_lost(self, exc: Exception | None) -> None:
        self._table.close(self)
        self._cancel()
        if not self._refused:
            super().connection_lost(exc)

    def handle_websocket_upgrade(self, event: Any) -> None:
        # The socket moves to another protocol object, which this table never hears from.
        self._table.close(self)
        self._cancel()
        super().handle_websocket_upgrade(event)

    def evict(self) -> None:
        """Close a connection that waits for a head, to make room for a new one."""
        self._cancel()
        if not self.transport.is_closing():
            self.transport.close()

    # -- phases ---------------------------------------------------------------------------

    def _update(self) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        their = self.conn.their_state
        if their is h11.IDLE and (self.cycle is None or self.cycle.response_complete):
            if self._phase != _HEAD:
                self._enter(_HEAD, self.limits_.head_timeout_s)
                self._head_bytes = False
                self._table.waiting(self)
        elif their is h11.SEND_BODY:
            if self._phase != _BODY:
                self._enter(_BODY, self.limits_.body_timeout_s + BODY_BACKSTOP_GRACE_S)
                self._table.busy(self)
        elif self._phase != _APP:
            self._enter(_APP, None)
            self._table.busy(self)

    @property
    def limits_(self) -> ConnectionLimits:
        return self._table.limits

    def _enter(self, phase: str, timeout: float | None) -> None:
        self._cancel()
        self._phase = phase
        if timeout is not None:
            self._deadline = self.loop.call_later(timeout, self._expired)

    def _cancel(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self._phase == _HEAD:
            answer = self._head_bytes  # silence needs no answer; half a head gets a 408
        else:  # the body backstop: a 408 unless a response already went out
            answer = self.cycle is None or not self.cycle.response_started
        if answer:
            self.transport.write(_TIMEOUT)
        self.transport.close()


def guarded_protocol(limits: ConnectionLimits) -> Callable[..., GuardedH11Protocol]:
    """uvicorn's ``http`` protocol factory over one shared :class:`ConnectionTable`."""
    return functools.partial(GuardedH11Protocol, table=ConnectionTable(limits))
