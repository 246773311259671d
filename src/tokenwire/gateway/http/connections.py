"""Connection limits in front of the app: deadlines for heads and bodies, per-client and
global caps, and a refusal that costs one write (issue 11 item 1).

uvicorn closes an idle connection only *between* requests (``timeout_keep_alive``): a
connection that sends nothing, or half a request head, is held for ever, and a few hundred
of them fill ``limit_concurrency`` before authentication can run. uvicorn has no setting
for that, so the smallest contained extension is :class:`GuardedHttpToolsProtocol`,
uvicorn's own httptools protocol with five additions (handed to uvicorn as its ``http``
protocol factory):

* **Head deadline** (``head_timeout_s``): from the moment a connection opens, or finishes a
  response, until the blank line that ends the next request head. Past it the connection is
  closed (with a bare ``408`` when part of a head had arrived). A slow drip of header bytes
  does not restart it.
* **Head size** (:data:`MAX_HEAD_BYTES`): a head still unfinished past it gets a bare
  ``431`` and the connection closes. llhttp (httptools) has no such bound of its own, and
  httptools buffers an unfinished header in memory, so without it a peer could grow one
  for as long as the head deadline lets it send.
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

Why httptools rather than uvicorn's h11 protocol (which this guard extended until issue 15):
h11 validates every header of every request and response in Python, about a sixth of the
gateway's CPU per short request in a profile; llhttp does the same checks in C. Measured
A/B in BENCHMARKS.md ("Session of 2026-12-04: the request path").

One more thing the protocol offers the app: a cork (``asgi.CORK_EXTENSION``, the request
cycle's writes held, :mod:`.held_writes`), so a response's head and first body leave in
one write. Written one after the other, the head woke the client, which then ran on the
gateway's core and read the head (~0.3 ms, cold) before the gateway could write the body:
the first token waited for it (BENCHMARKS.md, "Session of 2026-12-05 (2)").

HTTP/2 (issue 15): a connection whose TLS negotiated ``h2`` (ALPN), or whose first bytes are
the HTTP/2 preface, is handed to :class:`~tokenwire.gateway.http.http2.H2Protocol`, which
keeps its slot in the same table and the same deadlines (``http2.py``). A refused
connection is answered in the protocol it speaks: its first bytes are awaited (at most
:data:`REFUSAL_SNIFF_S`) so that an h2c client gets its 429/503 as an HTTP/2 response.

The decisions are a sans-IO table (:class:`ConnectionTable`) that a test drives without a
socket; the protocol subclass only feeds it and acts. The parser's callbacks (a head begun,
a head complete, a message complete) and uvicorn's request cycle say which phase a
connection is in. Behaviour is tested only through raw
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

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tokenwire.gateway.http.asgi import CORK_EXTENSION
from tokenwire.gateway.http.errors import error_response
from tokenwire.gateway.http.held_writes import cork_cycle
from tokenwire.gateway.http.http2 import H2_PREFACE, H2Limits, H2Protocol, H2Refusal
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
    "MAX_HEAD_BYTES",
    "Admit",
    "ConnectionLimits",
    "ConnectionTable",
    "GuardedHttpToolsProtocol",
    "Refusal",
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
#: How long a refused connection waits for its first bytes, to answer in HTTP/2 when they
#: are the preface; a client that sends nothing by then gets the HTTP/1.1 refusal. Every
#: HTTP client speaks first, in its first packet.
REFUSAL_SNIFF_S = 1.0

#: A request head (request line and headers) larger than this is refused with 431: h11's
#: and Node's default, which this server kept while it ran on h11; a long JWT bearer
#: (ChatGPT access tokens run to a few KB) fits several times over. HTTP/2's header list
#: has the same bound (``http2.MAX_HEADER_LIST_SIZE``). Checked after each socket read, so
#: a head that arrives whole in one read (at most 256 KiB) is parsed before it is measured.
MAX_HEAD_BYTES = 16 * 1024


@dataclass(frozen=True, slots=True)
class Refusal:
    """A connection refusal: its status and JSON body, and the HTTP/1.1 bytes of both."""

    status: int
    body: bytes
    http1: bytes


def _refusal(status: int, reason: str, type_: str, code: str, message: str, *,
             retry: bool = True) -> Refusal:
    body = json.dumps({"error": {"message": message, "type": type_, "param": None,
                                 "code": code}}).encode()
    retry_after = f"retry-after: {RETRY_AFTER_S}\r\n" if retry else ""
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"{retry_after}content-length: {len(body)}\r\n"
            "connection: close\r\n\r\n").encode()
    return Refusal(status, body, head + body)


#: Pre-built: a refusal is one write and a close, never a parse or an allocation per byte.
_TOO_MANY_FROM_CLIENT = _refusal(429, "Too Many Requests", "rate_limit_error",
                                 "too_many_connections",
                                 "Too many open connections from this address; retry shortly.")
_SERVER_FULL = _refusal(503, "Service Unavailable", "server_error", "server_busy",
                        "The server has no free connection slot; retry shortly.")
#: A head llhttp cannot parse, or whose target is not a URL: uvicorn answers text/plain;
#: every other refusal here, and the app's own 400 for a bad target (which h11 passed to
#: it), is a JSON error in the OpenAI shape.
_BAD_REQUEST = _refusal(400, "Bad Request", "invalid_request_error", "invalid_request",
                        "Invalid HTTP request received.", retry=False)


#: What a request line may name on this parser (HTTP/2 arrives by its preface or ALPN). llhttp
#: also takes ``HTTP/2.0`` written as text and an HTTP/0.9 line with no version at all, and
#: uvicorn served both as HTTP/1.1 (the first with ``scope["http_version"] == "2.0"``); they
#: get RFC 9110's 505 instead.
_SERVED_VERSIONS = frozenset({"1.0", "1.1"})
_VERSION_REFUSED = _refusal(
    505, "HTTP Version Not Supported", "invalid_request_error", "http_version_not_supported",
    "This server speaks HTTP/1.0, HTTP/1.1 and HTTP/2 (prior knowledge or TLS ALPN); the "
    "request line names another version.", retry=False)


#: A request body whose framing does not parse (chunked: a size that is not hex or overflows
#: 64 bits, a chunk longer or shorter than its size line, a bad trailer). The same status
#: and code as a head llhttp cannot parse (:data:`_BAD_REQUEST`), but in the shape of the
#: route's API: the head was read, so the path, and the shape, are known.
_BAD_BODY_MESSAGE = "Invalid HTTP request received: the request body's framing does not parse."


def _bad_body(path: str) -> tuple[Any, bytes]:
    """The 400 for a request to ``path`` whose body does not parse: as an ASGI app (for a
    request queued behind another, answered in its turn) and as HTTP/1.1 bytes (for the
    request being served, answered at once); both close the connection."""
    response = error_response(path, 400, _BAD_BODY_MESSAGE, code="invalid_request",
                              headers={"Connection": "close"})
    head = [b"HTTP/1.1 400 Bad Request\r\n"]
    head += [name + b": " + value + b"\r\n" for name, value in response.raw_headers]
    return response, b"".join(head) + b"\r\n" + response.body


class _UnservedVersion(Exception):
    """Raised by the parser's callback to stop it at a head of an unserved version."""


def _bare(status: int, reason: str) -> bytes:
    """A bodyless answer that closes the connection."""
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-length: 0\r\n"
            "connection: close\r\n\r\n").encode()


_TIMEOUT = _bare(408, "Request Timeout")
_CONNECT_REFUSED = _bare(405, "Method Not Allowed")
_HEAD_TOO_LARGE = _bare(431, "Request Header Fields Too Large")


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

    refusal: Refusal | None = None
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

    def replace(self, old: Any, new: Any) -> None:
        """``new`` takes over ``old``'s slot (a connection that turned out to be HTTP/2); if
        it was waiting, it waits on as the newest in line (its first bytes just came)."""
        address = self._address.pop(old, None)
        if address is None:
            return
        self._address[new] = address
        waiting = self._waiting.pop(old, False) is None
        if waiting:
            self._waiting[new] = None

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
#: Where the client's current request is, from the parser's callbacks: nothing of it yet,
#: part of its head, or its body (the head done, the message not yet complete).
_NOTHING, _IN_HEAD, _IN_BODY = "nothing", "in head", "in body"


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol under a :class:`ConnectionTable` (see the module
    docstring)."""

    def __init__(self, *args: Any, table: ConnectionTable, h2: H2Limits | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._table = table
        self._h2 = h2  # None: HTTP/2 is off
        self._phase: str | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._head_bytes = False  # part of a head arrived in the current wait
        self._receiving = _NOTHING
        self._head_size = 0  # bytes read since the current head began (MAX_HEAD_BYTES)
        self._refused: _Refused | None = None
        #: The first bytes, kept until they show whether this is the HTTP/2 preface.
        self._sniffed: bytes | None = b"" if h2 is not None else None
        #: The socket now belongs to a WebSocket protocol: no phase, no deadline here.
        self._upgraded = False
        #: The head just parsed asks for an upgrade that is not served (see _feed), and
        #: that head's headers while it is parsed again.
        self._ignored_upgrade = False
        self._replayed_headers: list[tuple[bytes, bytes]] | None = None
        #: Bytes that do not parse arrived: nothing more is read (see _refuse).
        self._unreadable = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        admit = self._table.open(self, address)
        alpn_h2 = self._h2 is not None and _alpn(transport) == "h2"
        if admit.refusal is not None:
            self._refused = _Refused(transport, admit.refusal, sniff=self._h2 is not None,
                                     h2=alpn_h2)
            return
        if admit.victim is not None:
            admit.victim.evict()
        super().connection_made(transport)
        if alpn_h2:
            self._become_h2(b"")
            return
        if _alpn(transport) is not None:
            self._sniffed = None  # TLS chose HTTP/1.1
        self._update()

    def data_received(self, data: bytes) -> None:
        if self._refused is not None:
            self._refused.data(data)
            return
        if self._unreadable:
            return  # after bytes that do not parse, nothing more is read (see _refuse)
        if self._phase == _HEAD:
            self._head_bytes = True
        if self._sniffed is not None:
            data = self._sniffed + data
            if len(data) < len(H2_PREFACE) and H2_PREFACE.startswith(data):
                self._sniffed = data
                return
            self._sniffed = None
            if data.startswith(H2_PREFACE):
                self._become_h2(data)
                return
        if self._receiving is not _IN_BODY:
            self._head_size += len(data)  # reset when a head completes in this read
        self._unset_keepalive_if_required()
        self._feed(data)
        if self._receiving is _IN_HEAD and self._head_size > MAX_HEAD_BYTES:
            self._refuse(_HEAD_TOO_LARGE)
            return
        self._update()

    def _refuse(self, answer: bytes) -> None:
        """Answer a head that will not be served with ``answer`` (a bare 4xx) and close.
        When a request before it on the connection (pipelined, or still running) has not
        had its whole answer, that answer goes out first and the connection closes after
        it without the refusal, which HTTP/1.1 could only send after it anyway: closing at
        once would drop an answer the client is owed."""
        self._cancel()
        self._unreadable = True
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.keep_alive = False  # uvicorn closes the connection after it
            return
        self.transport.write(answer)
        self.transport.close()

    def _feed(self, data: bytes) -> None:
        """uvicorn's parse step (its ``data_received``), with one change: an upgrade it does
        not serve (anything but a WebSocket: ``curl --http2`` asks for ``h2c``) is ignored,
        as RFC 9110 §7.8 lets a server do, and the request is read on as HTTP/1.1. llhttp
        stops at the end of such a head and treats what follows as the new protocol's, so
        uvicorn would run the request with its body lost."""
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if isinstance(exc.__context__, _UnservedVersion):  # (httptools wraps it)
                self._refuse(_VERSION_REFUSED.http1)
                return
            self.logger.warning("Invalid HTTP request received.")
            if self._receiving is _IN_BODY:
                self._refuse_body()
            else:
                self.send_400_response("Invalid HTTP request received.")
        except httptools.HttpParserUpgrade as exc:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._read_on_without_upgrade(data[exc.args[0]:])

    def send_400_response(self, msg: str) -> None:
        self._refuse(_BAD_REQUEST.http1)

    def _refuse_body(self) -> None:
        """The body of the request being read does not parse. llhttp stops there and parses
        nothing more, so its route would wait for body bytes that never come: before this,
        it answered its 408 at the body deadline (60 s by default), holding the connection
        and the request's admission slot all along. :meth:`_refuse` would only mark the
        connection to close after this request's answer, which is the very answer that
        cannot come from a body that never ends. So it gets the 400 now, and the close.

        * Its route runs (the usual case, keep-alive or not) and has not started a
          response: the 400 is written here, and the cycle is marked disconnected before
          the route can run again, so its ``receive`` says ``http.disconnect`` (its body
          read ends with ``ClientDisconnect``, its task ends and frees its slot) and
          whatever it sends after is dropped: the 400 is the only answer. A response
          already started cannot be replaced: the close alone ends it.
        * It is pipelined behind a request whose answer is still owed: that answer goes
          first; this request then runs as the 400 alone (its route never starts), whose
          ``connection: close`` closes the connection after it.
        * Its response is already complete (a route that answered without reading the
          body): the 400 goes out as for a bad head (:meth:`_refuse`)."""
        cycle = self.cycle
        self._receiving = _NOTHING  # nothing more of it will be read: no body backstop
        if cycle is None or cycle.scope is not self.scope:  # no cycle of its own: defensive
            self._refuse(_BAD_REQUEST.http1)
            return
        app, answer = _bad_body(str(cycle.scope.get("path", "")))
        self._cancel()
        self._unreadable = True
        for i, (queued, _) in enumerate(self.pipeline):
            if queued is cycle:
                self.pipeline[i] = (cycle, app)
                return
        if cycle.response_complete:
            self._refuse(answer)
            return
        if not cycle.response_started and not self.transport.is_closing():
            self.transport.write(answer)
        cycle.disconnected = True  # (uvicorn's connection_lost sets it only a turn later)
        cycle.message_event.set()
        self.transport.close()

    def _read_on_without_upgrade(self, rest: bytes) -> None:
        """Parse the request again from its head, less the ``Upgrade`` header (without it
        llhttp does not upgrade), on a new parser; then what followed it (its body). The
        app still gets every header, as h11 passed them: a route may answer the upgrade
        request itself (the 426 of ``security.py``)."""
        self._ignored_upgrade = False
        method = self.parser.get_method()
        if method == b"CONNECT":  # a tunnel request upgrades whatever its headers say
            self._refuse(_CONNECT_REFUSED)
            return
        self._replayed_headers = list(self.headers)
        head = [method, b" ", self.url, b" HTTP/",
                self.parser.get_http_version().encode("ascii"), b"\r\n"]
        for name, value in self.headers:
            if name != b"upgrade":
                head += [name, b": ", value, b"\r\n"]
        head.append(b"\r\n")
        self.parser = httptools.HttpRequestParser(self)
        # The leniency uvicorn's own parser has (HttpToolsProtocol.__init__).
        self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
        self._feed(b"".join(head) + rest)

    def _become_h2(self, data: bytes) -> None:
        """Hand the socket, its table slot and its first bytes to an HTTP/2 protocol."""
        self._cancel()
        self._unset_keepalive_if_required()
        self.connections.discard(self)
        proto = H2Protocol(self, self._h2, body_backstop_s=self.limits_.body_timeout_s
                           + BODY_BACKSTOP_GRACE_S)
        self._table.replace(self, proto)
        self.transport.set_protocol(proto)
        proto.connection_made(self.transport)
        if data:
            proto.data_received(data)

    # -- the parser's callbacks: where the client's request is ------------------------------

    def on_message_begin(self) -> None:
        self._receiving = _IN_HEAD
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        if self.parser.get_http_version() not in _SERVED_VERSIONS:
            raise _UnservedVersion  # answered in _feed: the parser stops here
        self._receiving = _IN_BODY
        self._head_size = 0
        if self._replayed_headers is not None:  # the scope holds this very list
            self.headers[:], self._replayed_headers = self._replayed_headers, None
        elif self.parser.should_upgrade() and not self._should_upgrade():
            self._ignored_upgrade = True  # read again as HTTP/1.1: see _feed
            return
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.scope is self.scope:  # (not a WebSocket upgrade)
            # The app's task is made, not run yet; uvicorn's HTTP scope has no extensions.
            self.scope["extensions"] = {CORK_EXTENSION: functools.partial(cork_cycle, cycle)}

    def on_message_complete(self) -> None:
        self._receiving = _NOTHING
        if not self._ignored_upgrade:
            super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._update()

    def connection_lost(self, exc: Exception | None) -> None:
        self._table.close(self)
        self._cancel()
        if self._refused is not None:
            self._refused.cancel()
        else:
            super().connection_lost(exc)

    def handle_websocket_upgrade(self) -> None:
        # The socket moves to another protocol object, which this table never hears from
        # (the Responses WebSocket counts its own sockets, gateway/http/ws_session.py). The
        # parser never completes the upgrade request's message: without ``_upgraded``,
        # ``_update`` would arm the body backstop and cut the socket 65 s later.
        self._upgraded = True
        self._table.close(self)
        self._cancel()
        super().handle_websocket_upgrade()

    def evict(self) -> None:
        """Close a connection that waits for a head, to make room for a new one."""
        self._cancel()
        if not self.transport.is_closing():
            self.transport.close()

    # -- phases ---------------------------------------------------------------------------

    def _update(self) -> None:
        if self._upgraded or self.transport is None or self.transport.is_closing():
            return
        if self._receiving is _IN_BODY:
            if self._phase != _BODY:
                self._enter(_BODY, self.limits_.body_timeout_s + BODY_BACKSTOP_GRACE_S)
                self._table.busy(self)
        elif (self.cycle is None or self.cycle.response_complete) and not self.pipeline:
            # No request in flight: waiting for the next head (perhaps begun already).
            if self._phase != _HEAD:
                self._enter(_HEAD, self.limits_.head_timeout_s)
                self._head_bytes = self._receiving is _IN_HEAD
                self._table.waiting(self)
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


def _alpn(transport: asyncio.BaseTransport) -> str | None:
    sslobj = transport.get_extra_info("ssl_object")
    return sslobj.selected_alpn_protocol() if sslobj is not None else None


class _Refused:
    """A connection refused at the cap. Lingering close (as Apache does): a client that
    already sent its request would get a reset, and lose the refusal, if the socket closed
    with its bytes unread. So: send, half-close, discard what arrives, close on its EOF or
    soon. With HTTP/2 on (``sniff``), the refusal waits for the first bytes to pick the
    protocol it is written in; ``h2``: TLS already chose HTTP/2."""

    def __init__(self, transport: asyncio.Transport, refusal: Refusal, *, sniff: bool,
                 h2: bool) -> None:
        loop = asyncio.get_running_loop()
        self.transport, self.refusal = transport, refusal
        self.sent = False
        self.buffer = b""
        self.h2: H2Refusal | None = None
        self.timers = [loop.call_later(REFUSAL_LINGER_S, transport.close)]
        if h2:
            self.h2 = H2Refusal(transport, refusal.status, refusal.body, RETRY_AFTER_S)
        elif sniff:
            self.timers.append(loop.call_later(REFUSAL_SNIFF_S, self.http1))
        else:
            self.http1()

    def data(self, data: bytes) -> None:
        if self.h2 is not None:
            self.h2.feed(data)
            return
        if self.sent:
            return  # discarded
        data = self.buffer + data
        if len(data) < len(H2_PREFACE) and H2_PREFACE.startswith(data):
            self.buffer = data
        elif data.startswith(H2_PREFACE):
            self.h2 = H2Refusal(self.transport, self.refusal.status, self.refusal.body,
                                RETRY_AFTER_S)
            self.h2.feed(data)
        else:
            self.http1()

    def http1(self) -> None:
        if self.sent or self.h2 is not None or self.transport.is_closing():
            return
        self.sent = True
        self.transport.write(self.refusal.http1)
        if self.transport.can_write_eof():
            self.transport.write_eof()

    def cancel(self) -> None:
        for timer in self.timers:
            timer.cancel()


def guarded_protocol(limits: ConnectionLimits, h2: H2Limits | None = None,
                     ) -> Callable[..., GuardedHttpToolsProtocol]:
    """uvicorn's ``http`` protocol factory over one shared :class:`ConnectionTable`;
    ``h2``: the HTTP/2 limits, or None to serve HTTP/1.1 only."""
    return functools.partial(GuardedHttpToolsProtocol, table=ConnectionTable(limits), h2=h2)
