"""HTTP/2 for ``tokenwire serve``: h2c with prior knowledge and TLS with ALPN (issue 15).

uvicorn speaks HTTP/1.1 only. The connection guard (``connections.py``) looks at each new
connection: TLS that negotiated ``h2`` by ALPN, or cleartext whose first 24 bytes are the
HTTP/2 connection preface (RFC 9113 §3.4, "prior knowledge"), is handed to
:class:`H2Protocol`; anything else stays with uvicorn's h11. ``H2Protocol`` is the ``h2``
library's sans-IO state machine driving the *same* ASGI app, with the same connection
table (per-address and global caps, eviction of waiting connections) and deadlines:

* **Head deadline**: while no stream is open (from the preface, or from the end of the last
  stream), the next complete request head must arrive within ``head_timeout_s`` (the idle
  keep-alive time after a response, as for HTTP/1.1); PINGs and SETTINGS do not restart it.
  Past it: GOAWAY and close. A header block that never ends (HEADERS without END_HEADERS,
  CONTINUATION dripped) is one such wait.
* **Body deadline**: per stream, from its head to its last DATA frame; past it the stream
  gets a 408 (or a reset, once its response has started), the connection lives on.
* **HTTP/2's own limits** (see :class:`H2Limits` and docs/security.md): streams open at once,
  header list size (the same 16 KiB as the HTTP/1.1 head), flow-control windows (a peer
  can never make us buffer more request body than the window we granted; response data
  waits for the peer's window), and floods of frames that cost us a reply or a task
  (RST_STREAM — the "rapid reset" of CVE-2023-44487 —, PING, SETTINGS, PRIORITY, empty
  DATA) counted per connection in a window by :class:`FloodGuard`; past the budget, GOAWAY
  with ENHANCE_YOUR_CALM. CONTINUATION floods are bounded by ``h2`` itself (64 frames per
  header block) and by the header list size; a reset stream's app task is cancelled and
  counts against ``max_concurrent_streams`` until it has ended, so resets cannot pile up
  work.

The decisions that need a clock (:class:`FloodGuard`) are sans-IO, with the clock passed in.
WebSocket over HTTP/2 (RFC 8441) is not offered: SETTINGS_ENABLE_CONNECT_PROTOCOL stays off.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from tokenwire.gateway.http.asgi import CORK_EXTENSION

__all__ = [
    "ALPN_PROTOCOLS",
    "H2_PREFACE",
    "FloodGuard",
    "H2Limits",
    "H2Protocol",
    "H2Refusal",
]

log = logging.getLogger(__name__)

#: The client connection preface (RFC 9113 §3.4) that opens every HTTP/2 connection.
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#: ALPN offer of a TLS listener, preferred first (RFC 7301); HTTP/1.1 only when h2 is off.
ALPN_PROTOCOLS = ("h2", "http/1.1")

#: Streams a client may have open at once on one connection. RFC 9113 §6.5.2 recommends no
#: less than 100 (nginx, Go and h2o use 100-250); each is one request through admission.
MAX_CONCURRENT_STREAMS = 100
#: Decoded header list, in bytes: the same bound as the HTTP/1.1 head
#: (``connections.MAX_HEAD_BYTES``), so no header fits one protocol and not the other.
MAX_HEADER_LIST_SIZE = 16 * 1024
#: Per-stream receive window (bytes of request body the client may send before we read
#: it): h2's default 64 KiB. The connection window is raised to cover every stream at once.
STREAM_WINDOW = 65_535
CONNECTION_WINDOW = 1 << 20
#: Frames that cost a reply or a task, per connection per window (see FloodGuard). A real
#: client sends a handful (one SETTINGS, a PING per keep-alive, one reset per cancelled
#: request); 200 a second is far above that and far below what a flood needs to hurt.
FLOOD_BUDGET = 200
FLOOD_WINDOW_S = 1.0
#: After a graceful GOAWAY (shutdown, or the app's ``connection: close``), how long the
#: socket stays open once its last stream ended, so frames the client already sent (the
#: rest of a request body it was uploading) arrive instead of meeting a reset.
GOAWAY_LINGER_S = 2.0
#: Connection-specific headers HTTP/2 forbids (RFC 9113 §8.2.2); the app's ``connection:
#: close`` becomes a GOAWAY after that stream instead.
_HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection",
                         b"transfer-encoding", b"upgrade"})


@dataclass(frozen=True, slots=True)
class H2Limits:
    """The HTTP/2 limits (module docstring), beside the connection table's four."""

    max_concurrent_streams: int = MAX_CONCURRENT_STREAMS
    max_header_list_size: int = MAX_HEADER_LIST_SIZE
    stream_window: int = STREAM_WINDOW
    connection_window: int = CONNECTION_WINDOW
    flood_budget: int = FLOOD_BUDGET
    flood_window_s: float = FLOOD_WINDOW_S


class FloodGuard:
    """Counts costly frames in fixed windows of ``window_s``; :meth:`hit` says when the
    budget is spent (sans-IO: the caller passes the time)."""

    def __init__(self, budget: int, window_s: float) -> None:
        self.budget = budget
        self.window_s = window_s
        self._start = float("-inf")
        self._count = 0

    def hit(self, now: float) -> bool:
        """One more costly frame at ``now``; True once this window's budget is exceeded."""
        if now - self._start >= self.window_s:
            self._start, self._count = now, 0
        self._count += 1
        return self._count > self.budget


def _new_connection(limits: H2Limits) -> h2.connection.H2Connection:
    conn = h2.connection.H2Connection(h2.config.H2Configuration(
        client_side=False, header_encoding=None, validate_inbound_headers=True))
    conn.local_settings = h2.settings.Settings(client=False, initial_values={
        h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: limits.max_concurrent_streams,
        h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: limits.max_header_list_size,
        h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: limits.stream_window,
        h2.settings.SettingCodes.ENABLE_PUSH: 0,
    })
    # Enforced from the first HEADERS, not only once the client acknowledged our SETTINGS.
    conn.decoder.max_header_list_size = limits.max_header_list_size
    conn.initiate_connection()
    if limits.connection_window > 65_535:
        conn.increment_flow_control_window(limits.connection_window - 65_535)
    return conn


class _Stream:
    """One request/response exchange: the ASGI ``receive``/``send`` of one stream."""

    def __init__(self, proto: H2Protocol, stream_id: int, scope: dict[str, Any],
                 ended: bool) -> None:
        self.proto = proto
        self.id = stream_id
        self.scope = scope
        self.body = bytearray()
        self.more_body = not ended
        self.event = asyncio.Event()
        self.window = asyncio.Event()
        self.disconnected = False
        self.response_started = False
        self.response_complete = False
        self.task: asyncio.Task[None] | None = None
        self.deadline: asyncio.TimerHandle | None = None
        self.close_after = False
        self.end_delivered = False
        #: The response head waits in h2's buffer for the first body (``asgi``'s cork; any
        #: other stream's write on the connection sends it as well).
        self.corked = False
        scope["extensions"] = {CORK_EXTENSION: self.cork}

    def cork(self, on: bool) -> None:
        self.corked = on
        if not on:
            self.proto._flush()

    async def run(self, app: Callable[..., Any]) -> None:
        try:
            await app(self.scope, self.receive, self.send)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            log.error("Exception in ASGI application", exc_info=exc)
            if not self.response_started:
                await self._send_500()
            else:
                self.proto.reset(self, h2.errors.ErrorCodes.INTERNAL_ERROR)
        else:
            if not self.response_started and not self.disconnected:
                await self._send_500()
            elif not self.response_complete and not self.disconnected:
                self.proto.reset(self, h2.errors.ErrorCodes.INTERNAL_ERROR)

    async def _send_500(self) -> None:
        await self.send({"type": "http.response.start", "status": 500,
                         "headers": [(b"content-type", b"text/plain; charset=utf-8")]})
        await self.send({"type": "http.response.body", "body": b"Internal Server Error"})

    async def receive(self) -> dict[str, Any]:
        # As uvicorn's h11 cycle: the body as it comes, then (once its end was handed over)
        # wait until the client goes or the response completes: the app's disconnect watch.
        while not (self.disconnected or self.response_complete) and not self.body \
                and (self.more_body or self.end_delivered):
            await self.event.wait()
            self.event.clear()
        if self.disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        data, self.body = bytes(self.body), bytearray()
        self.proto.consumed(self, len(data))
        self.end_delivered = not self.more_body
        return {"type": "http.request", "body": data, "more_body": self.more_body}

    async def send(self, message: dict[str, Any]) -> None:
        if self.disconnected:
            return
        kind = message["type"]
        if not self.response_started:
            if kind != "http.response.start":
                raise RuntimeError(f"expected 'http.response.start', got {kind!r}")
            self.response_started = True
            self.proto.send_head(self, message["status"], message.get("headers", []))
            return
        if self.response_complete or kind != "http.response.body":
            raise RuntimeError(f"unexpected ASGI message {kind!r} on a finished response")
        body = message.get("body", b"")
        more = message.get("more_body", False)
        if self.scope["method"] == "HEAD":
            body = b""
        await self.proto.send_body(self, body, end=not more)
        if not more:
            self.response_complete = True
            self.event.set()
            self.proto.stream_done(self)


class H2Protocol(asyncio.Protocol):
    """One HTTP/2 connection (see the module docstring), taken over from the guarded h11
    protocol ``origin``: same app, server state and connection table."""

    def __init__(self, origin: Any, limits: H2Limits | None = None, *,
                 body_backstop_s: float) -> None:
        self.origin = origin
        self.limits = limits or H2Limits()
        #: The connection-level body deadline of a stream (the routes' own 408 comes first).
        self.body_backstop_s = body_backstop_s
        self.table = origin._table
        self.config = origin.config
        self.app = origin.app
        self.app_state = origin.app_state
        self.server_state = origin.server_state
        self.loop = origin.loop
        self.conn = _new_connection(self.limits)
        self.streams: dict[int, _Stream] = {}
        #: App tasks not yet ended (reset streams included: they count until they stop).
        self.running: set[asyncio.Task[None]] = set()
        self.flood = FloodGuard(self.limits.flood_budget, self.limits.flood_window_s)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self._idle: asyncio.TimerHandle | None = None
        self._writable = asyncio.Event()
        self._writable.set()
        self._closing = False
        self._draining = False

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.transport = transport
        self.server_state.connections.add(self)
        sslobj = transport.get_extra_info("ssl_object")
        self.scheme = "https" if sslobj is not None else "http"
        self.server = _addr(transport.get_extra_info("sockname"))
        self.client = _addr(transport.get_extra_info("peername"))
        self._flush()
        self._wait_for_head(self.table.limits.head_timeout_s)

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            self._goaway(getattr(exc, "error_code", h2.errors.ErrorCodes.PROTOCOL_ERROR))
            return
        for event in events:
            self._handle(event)
            if self._closing:
                return
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self.server_state.connections.discard(self)
        self.table.close(self)
        self._cancel_idle()
        for stream in list(self.streams.values()):
            self._disconnect(stream)
        self._writable.set()

    def pause_writing(self) -> None:
        # The peer does not read: stop reading its frames too, so the replies they ask for
        # (PING and SETTINGS acks, resets) cannot pile up in our write buffer.
        self._writable.clear()
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._writable.set()
        self.transport.resume_reading()

    # -- what uvicorn and the connection table call -------------------------------------------

    def shutdown(self) -> None:
        """Graceful shutdown: new streams are refused (``REFUSED_STREAM``: safe to retry);
        once the streams in flight are done, GOAWAY, and close :data:`GOAWAY_LINGER_S`
        later. The GOAWAY waits for them because h2-based clients (httpx) stop reading
        every stream when one arrives, even those it lets finish."""
        if self._draining or self._closing:
            return
        self._draining = True
        self._maybe_idle()

    def evict(self) -> None:
        """Close a connection with no stream open, to make room for a new one."""
        self._goaway(h2.errors.ErrorCodes.NO_ERROR)

    # -- events ---------------------------------------------------------------------------

    def _handle(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            self._request(event)
        elif isinstance(event, h2.events.DataReceived):
            self._data(event)
        elif isinstance(event, h2.events.StreamEnded):
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream.more_body = False
                self._cancel_deadline(stream)
                stream.event.set()
        elif isinstance(event, h2.events.StreamReset):
            self._costly()
            stream = self.streams.pop(event.stream_id, None)
            if stream is not None:
                self._disconnect(stream)
                self._maybe_idle()
        elif isinstance(event, h2.events.WindowUpdated):
            targets = (self.streams.values() if event.stream_id == 0
                       else [s for s in (self.streams.get(event.stream_id),) if s])
            for stream in targets:
                stream.window.set()
        elif isinstance(event, (h2.events.PingReceived, h2.events.RemoteSettingsChanged,
                                h2.events.PriorityUpdated)):
            self._costly()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._closing = True
            self.transport.close()

    def _costly(self) -> None:
        if self.flood.hit(self.loop.time()):
            log.warning("HTTP/2 flood from %s: GOAWAY", self.client)
            # h2 has already queued its replies (PING acks...) for this read: drop them.
            self.conn.clear_outbound_data_buffer()
            self._goaway(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)

    def _request(self, event: h2.events.RequestReceived) -> None:
        sid = event.stream_id
        if self._draining or len(self.running) >= self.limits.max_concurrent_streams:
            # Reset streams whose task has not ended yet still count: a rapid reset cannot
            # start more work than the stream limit.
            self._reset_quietly(sid, h2.errors.ErrorCodes.REFUSED_STREAM)
            return
        scope = self._scope(event.headers)
        if scope is None:
            self._reset_quietly(sid, h2.errors.ErrorCodes.PROTOCOL_ERROR)
            return
        ended = event.stream_ended is not None
        stream = _Stream(self, sid, scope, ended)
        self.streams[sid] = stream
        self._cancel_idle()
        self.table.busy(self)
        if not ended:
            stream.deadline = self.loop.call_later(self.body_backstop_s, self._body_expired,
                                                   stream)
        task = self.loop.create_task(stream.run(self.app))
        stream.task = task
        self.running.add(task)
        self.server_state.tasks.add(task)
        task.add_done_callback(self._task_done)

    def _reset_quietly(self, stream_id: int, code: int) -> None:
        # The client may have closed the stream already (its RST_STREAM in the same read).
        try:
            self.conn.reset_stream(stream_id, code)
        except h2.exceptions.ProtocolError:  # StreamClosedError, or the connection ended
            pass

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self.running.discard(task)
        self.server_state.tasks.discard(task)

    def _scope(self, headers: list[tuple[bytes, bytes]]) -> dict[str, Any] | None:
        pseudo: dict[bytes, bytes] = {}
        plain: list[tuple[bytes, bytes]] = []
        for name, value in headers:
            if name.startswith(b":"):
                pseudo[name] = value
            else:
                plain.append((name, value))
        method, target = pseudo.get(b":method"), pseudo.get(b":path")
        if method is None or target is None or method == b"CONNECT":
            return None
        authority = pseudo.get(b":authority")
        if authority is not None and not any(n == b"host" for n, _ in plain):
            plain.insert(0, (b"host", authority))  # what HTTP/1.1 apps read (RFC 9113 §8.3.1)
        raw_path, _, query = target.partition(b"?")
        try:
            path = unquote(raw_path.decode("ascii"))
        except UnicodeDecodeError:
            return None
        root = self.config.root_path
        return {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "2", "server": self.server, "client": self.client,
            "scheme": self.scheme, "method": method.decode("ascii"), "root_path": root,
            "path": root + path, "raw_path": root.encode("ascii") + raw_path,
            "query_string": query, "headers": plain, "state": self.app_state.copy(),
        }

    def _data(self, event: h2.events.DataReceived) -> None:
        stream = self.streams.get(event.stream_id)
        if not event.data:
            self._costly()  # an empty DATA frame flood (CVE-2019-9518)
        if stream is None or stream.disconnected:
            # Nobody reads it: give the window back at once.
            self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            return
        stream.body += event.data
        # Padding is flow-controlled too but never reaches the app: return it now.
        pad = event.flow_controlled_length - len(event.data)
        if pad:
            self.conn.acknowledge_received_data(pad, event.stream_id)
        stream.event.set()

    def consumed(self, stream: _Stream, size: int) -> None:
        """The app read ``size`` body bytes: open the window by as much (back-pressure)."""
        if size and not self._closing and stream.id in self.streams:
            try:
                self.conn.acknowledge_received_data(size, stream.id)
            except h2.exceptions.StreamClosedError:
                return
            self._flush()

    # -- sending ----------------------------------------------------------------------------

    def send_head(self, stream: _Stream, status: int,
                  headers: list[tuple[bytes, bytes]]) -> None:
        out = [(b":status", str(status).encode())]
        for name, value in self.server_state.default_headers:
            out.append((name.lower(), value))
        for name, value in headers:
            name = name.lower()
            if name in _HOP_BY_HOP:
                if name == b"connection" and b"close" in value.lower():
                    stream.close_after = True
                continue
            out.append((name, value))
        if self._closing or stream.id not in self.streams:
            return
        self.conn.send_headers(stream.id, out)
        if not stream.corked:
            self._flush()

    async def send_body(self, stream: _Stream, data: bytes, *, end: bool) -> None:
        view = memoryview(data)
        while view and not stream.disconnected:
            await self._writable.wait()
            if stream.disconnected or self._closing:
                return
            room = min(self.conn.local_flow_control_window(stream.id),
                       self.conn.max_outbound_frame_size)
            if room <= 0:  # the peer's window is shut: wait for its WINDOW_UPDATE
                stream.window.clear()
                await stream.window.wait()
                continue
            chunk, view = view[:room], view[room:]
            self.conn.send_data(stream.id, bytes(chunk), end_stream=end and not view)
            self._flush()
        if end and not data and not stream.disconnected and not self._closing:
            self.conn.end_stream(stream.id)
            self._flush()

    def stream_done(self, stream: _Stream) -> None:
        """The response is complete (the request may still be uploading: it is dropped)."""
        self._cancel_deadline(stream)
        if self.streams.pop(stream.id, None) is None:
            return
        if stream.more_body and not self._closing:  # the app answered before the body ended
            self._reset_quietly(stream.id, h2.errors.ErrorCodes.NO_ERROR)
            self._flush()
        self.server_state.total_requests += 1
        if stream.close_after:
            self.shutdown()
        self._maybe_idle()

    def reset(self, stream: _Stream, code: int) -> None:
        if self.streams.pop(stream.id, None) is not None and not self._closing:
            self._reset_quietly(stream.id, code)
            self._flush()
        self._disconnect(stream)
        self._maybe_idle()

    def _disconnect(self, stream: _Stream) -> None:
        """The client reset the stream (or the connection went): the app's ``receive``
        says ``http.disconnect`` (which stops its generation) and its sends are dropped."""
        stream.disconnected = True
        self._cancel_deadline(stream)
        stream.event.set()
        stream.window.set()

    def _flush(self) -> None:
        data = self.conn.data_to_send()
        if data and not self.transport.is_closing():
            self.transport.write(data)

    def _goaway(self, code: int) -> None:
        if self._closing:
            return
        self._closing = True
        try:
            self.conn.close_connection(code, last_stream_id=self.conn.highest_inbound_stream_id)
            self._flush()
        except h2.exceptions.ProtocolError:
            pass
        self.transport.close()

    # -- deadlines ------------------------------------------------------------------------

    def _maybe_idle(self) -> None:
        if self._closing or self.streams:
            return
        self.table.waiting(self)  # evictable again, draining or not
        if self._draining:
            self.conn.close_connection(h2.errors.ErrorCodes.NO_ERROR,
                                       last_stream_id=self.conn.highest_inbound_stream_id)
            self._flush()
            self._closing = True  # nothing more is read or sent
            self._cancel_idle()
            self._idle = self.loop.call_later(GOAWAY_LINGER_S, self.transport.close)
            return
        self._wait_for_head(min(self.table.limits.head_timeout_s,
                                float(self.config.timeout_keep_alive)))

    def _wait_for_head(self, timeout: float) -> None:
        self._cancel_idle()
        self._idle = self.loop.call_later(timeout, self._idle_expired)

    def _cancel_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def _idle_expired(self) -> None:
        self._idle = None
        if not self.streams:
            self._goaway(h2.errors.ErrorCodes.NO_ERROR)

    def _body_expired(self, stream: _Stream) -> None:
        stream.deadline = None
        if stream.id not in self.streams or not stream.more_body:
            return
        if not stream.response_started and not self._closing:
            stream.response_started = stream.response_complete = True
            self.conn.send_headers(stream.id, [(b":status", b"408"),
                                               (b"content-length", b"0")], end_stream=True)
            self.streams.pop(stream.id, None)
            self._reset_quietly(stream.id, h2.errors.ErrorCodes.NO_ERROR)
            self._flush()
            self._disconnect(stream)
            self._maybe_idle()
        else:
            self.reset(stream, h2.errors.ErrorCodes.CANCEL)

    @staticmethod
    def _cancel_deadline(stream: _Stream) -> None:
        if stream.deadline is not None:
            stream.deadline.cancel()
            stream.deadline = None


def _addr(info: Any) -> tuple[str, int] | None:
    return (str(info[0]), int(info[1])) if isinstance(info, tuple) and len(info) >= 2 else None


class H2Refusal:
    """A connection refused at the cap that turned out to speak HTTP/2: its first request
    gets the refusal (status, JSON body, ``Retry-After``) in HTTP/2, then GOAWAY. Fed the
    bytes the guard receives until then (bounded by the guard's linger timer)."""

    def __init__(self, transport: asyncio.Transport, status: int, body: bytes,
                 retry_after_s: int) -> None:
        self.transport = transport
        self.status, self.body, self.retry_after = status, body, retry_after_s
        self.conn = _new_connection(H2Limits(max_concurrent_streams=1))
        self.done = False

    def feed(self, data: bytes) -> None:
        if self.done:
            return
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError:
            self.done = True
            self.transport.close()
            return
        for event in events:
            if isinstance(event, h2.events.RequestReceived):
                self.conn.send_headers(event.stream_id, [
                    (b":status", str(self.status).encode()),
                    (b"content-type", b"application/json"),
                    (b"retry-after", str(self.retry_after).encode()),
                    (b"content-length", str(len(self.body)).encode())])
                self.conn.send_data(event.stream_id, self.body, end_stream=True)
                self.conn.close_connection(h2.errors.ErrorCodes.NO_ERROR,
                                           last_stream_id=event.stream_id)
                self.done = True
                break
        self.transport.write(self.conn.data_to_send())
