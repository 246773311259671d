"""A lean HTTP/1.1 transport for httpx, for the upstream side of streamed generations.

Why (BENCHMARKS.md, "The hot path (issue 15)"): under httpx's default transport, each read of
a streamed upstream body goes through httpcore's pool and connection objects and anyio's
stream and cancel scope (one ``fail_after`` per read); at one stream that was 45 % of the
gateway's busy CPU samples. This transport keeps httpx's client (headers, timeouts as
configured, its exceptions, content decoding, ``MockTransport`` injection in tests) and
replaces only the layer below it: an :class:`asyncio.Protocol` per connection, the request
head written directly (its headers checked as h11 checks them), llhttp (httptools, the
parser under uvicorn and Node) for the response head, :mod:`.chunked` for chunked bodies
(every streamed answer), and a keep-alive pool. h11 did the heads until issue 15: building
and validating its events was a sixth of the gateway's CPU per short request.

What it keeps from httpcore's behaviour, so the adapters and their failure mapping
(:mod:`.failures`) see the same thing:

* the four httpx timeouts: connect (``ConnectTimeout``), read, per wait for body bytes
  (``ReadTimeout``), write, while the socket's send buffer is full (``WriteTimeout``), and
  pool, while every allowed connection is busy (``PoolTimeout``);
* connect failures as ``ConnectError`` chained to the ``OSError`` / ``ssl.SSLError``, so
  :func:`~.failures.connection_fault` names the cause;
* a response closed before its end (the stream's task cancelled, a terminal event read)
  closes its connection, so the upstream sees the disconnect and stops generating; a
  complete one goes back to the pool (idle at most :data:`KEEPALIVE_EXPIRY_S`, and never
  reused once its socket is readable: the upstream closed it);
* back-pressure: reading pauses while :data:`MAX_BUFFERED_BYTES` wait unread (a chunked
  body may also be pushed to its reader as it arrives, :meth:`_ChunkedBody.listen`, which
  the reader stops as soon as it cannot take more);
* TLS with httpx's own default context (certifi, ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``).

Proxies: httpx reads ``HTTP(S)_PROXY`` only for its own transport, so
:func:`upstream_transport` returns ``None`` (httpx's default) when the environment names a
proxy. HTTP/2 to upstreams is not offered by either (httpx's ``http2`` is off here).
"""

from __future__ import annotations

import asyncio
import math
import select
import urllib.request
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx

from tokenwire.gateway.upstreams.chunked import ChunkedDecoder, ChunkedError
from tokenwire.gateway.upstreams.content_coding import UnsupportedCoding, decoded_pieces
from tokenwire.gateway.upstreams.http_heads import (
    Head,
    MalformedAnswer,
    parse_head,
    request_bytes,
)
from tokenwire.gateway.wakeups import wake

__all__ = ["KEEPALIVE_EXPIRY_S", "MAX_BUFFERED_BYTES", "MAX_HEAD_BYTES", "LeanAnswer",
           "LeanTransport", "UpstreamClient", "upstream_transport"]

#: An idle pooled connection is dropped after this long. It must be shorter than the
#: upstreams' own idle timeout: uvicorn (so vLLM and our own scripted upstreams), llama.cpp's
#: server (cpp-httplib) and Node's http server all close an idle keep-alive connection after
#: 5 s, and at httpx's default of 5 s a request written just as the upstream closes meets
#: its FIN: "Server disconnected without sending a response", a failed attempt for nothing.
#: 2 s leaves the upstream's close 3 s of margin (network delay included); a gap longer than
#: that between requests costs one new connection, which is cheap on the links upstreams use.
KEEPALIVE_EXPIRY_S = 2.0
#: Unread bytes from one upstream before its socket stops being read (back-pressure: the
#: stream's event queue is full because the client is slow).
MAX_BUFFERED_BYTES = 256 * 1024
#: A response head (status line + headers) larger than this is a protocol error; httpcore's
#: limit, so an upstream that worked before still works.
MAX_HEAD_BYTES = 100 * 1024

_Key = tuple[str, str, int]


def upstream_transport(max_connections: int) -> LeanTransport | None:
    """The transport an upstream's client uses: this one, unless the environment names a
    proxy (then ``None``: httpx's own transport, which is where httpx applies proxies)."""
    if any(k in ("http", "https", "all") for k in urllib.request.getproxies()):
        return None
    return LeanTransport(max_connections=max_connections)


class _NoCookies(httpx.Cookies):
    def extract_cookies(self, response: httpx.Response) -> None:
        pass


_NO_COOKIES = _NoCookies()


class UpstreamClient(httpx.AsyncClient):
    """httpx's client for an upstream, with no cookie jar.

    httpx keeps every cookie an upstream sets and sends it on every later request of the
    client. An upstream client serves every user of the gateway, so that would carry one
    user's upstream session (or a CDN's affinity cookie) on everyone's requests. Reading
    them was also a urllib request and response built per request, a tenth of the upstream
    client's CPU per short request (BENCHMARKS.md, "Session of 2026-12-04: the request path")."""

    def __init__(self, *args: Any, transport: httpx.AsyncBaseTransport | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, transport=transport, **kwargs)
        #: The lean transport, when it is this client's: ``stream_post`` then skips
        #: httpx's request and response objects (``None``: httpx's path, e.g. a proxy's).
        self.lean = transport if isinstance(transport, LeanTransport) else None
        #: POST heads built and checked once per (target, headers) (``stream_post``); the
        #: client's own headers are fixed once it is built (``sse_http.http_client``).
        self.post_heads: dict[tuple[bytes, bytes, tuple[tuple[str, str], ...]], bytes] = {}

    @property
    def cookies(self) -> httpx.Cookies:
        return _NO_COOKIES


class _Connection(asyncio.Protocol):
    """One socket: buffered reads with a deadline, writes that wait while paused."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._eof = False
        self._lost: BaseException | None = None
        self.closed = False
        self._reading_paused = False
        self._writable = True
        self._waiter: asyncio.Future[None] | None = None
        self.idle_since = 0.0
        # One timer for the connection's timed waits (see _wait): the deadline it was armed
        # for, and the deadline of the wait in progress (inf: none, or an untimed one).
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._until = math.inf
        #: Takes what arrives instead of the buffer, while set and nothing is buffered (a
        #: body pushed to its reader: :meth:`_ChunkedBody.listen`).
        self.listener: Callable[[bytes], None] | None = None

    # -- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        listener = self.listener
        if listener is not None and not self._chunks:
            listener(data)
            return
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > MAX_BUFFERED_BYTES and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()  # type: ignore[union-attr]
        self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        # Kept half-open (as anyio's protocol does): the connection is closed by whoever
        # reads the EOF or finds it in the pool, never from inside the loop's callback,
        # which may run while the loop is closing (uvloop then fails "Event loop is closed").
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._lost = exc
        self._writable = True
        self._wake()

    def pause_writing(self) -> None:
        self._writable = False

    def resume_writing(self) -> None:
        self._writable = True
        self._wake()

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        wake(waiter)

    # -- what the transport calls ---------------------------------------------------------

    @property
    def reusable(self) -> bool:
        """Open and nothing unexpected arrived: safe for the next request."""
        return not self.closed and not self._eof and not self._chunks

    def readable_now(self) -> bool:
        """Whether the socket has something to read that the loop has not delivered yet.

        An idle HTTP/1.1 connection has nothing to say: readable means its FIN (or stray
        bytes) reached the kernel after the loop last polled, so the connection must not take
        a request (httpcore's ``has_expired`` asks the same of its socket)."""
        sock = self.transport.get_extra_info("socket") if self.transport else None
        if sock is None:
            return False
        poller = select.poll()
        try:
            poller.register(sock.fileno(), select.POLLIN | select.POLLPRI)
        except (OSError, ValueError):  # closed under us
            return True
        return bool(poller.poll(0))

    def take_buffered(self) -> bytes:
        data = b"".join(self._chunks) if len(self._chunks) != 1 else self._chunks[0]
        self._chunks.clear()
        self._buffered = 0
        if self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]
        return data

    async def read(self, timeout: float | None) -> bytes:
        """What arrived, waiting at most ``timeout`` for something; ``b""`` at EOF."""
        while not self._chunks:
            if self._eof or self.closed:
                if self._lost is not None:
                    raise self._lost
                return b""
            await self._wait(timeout)
        return self.take_buffered()

    async def write(self, data: bytes, timeout: float | None) -> None:
        if self.closed:
            raise ConnectionResetError("the upstream closed the connection")
        self.transport.write(data)  # type: ignore[union-attr]
        while not self._writable and not self.closed:
            await self._wait(timeout)

    async def _wait(self, timeout: float | None) -> None:
        """Until :meth:`_wake`, or ``TimeoutError`` after ``timeout`` seconds.

        One future per wait (httpcore + anyio paid a cancel scope, a task-group check and a
        stream wrapper per read), and one timer per connection rather than per wait: a
        streamed body waits once per chunk, each wait's deadline later than the last, so the
        timer armed by the first wait stays armed, and is re-armed only when it fires
        before the deadline of the wait in progress (or a wait asks for an earlier one). A
        timer per wait was a heap push and a cancel per token (BENCHMARKS.md, "Session of
        2026-12-05")."""
        waiter = self._waiter = self._loop.create_future()
        if timeout is None:
            self._until = math.inf
            await waiter
            return
        until = self._until = self._loop.time() + timeout
        if self._timer is None or until < self._timer_at:
            self._arm(until)
        await waiter

    def _arm(self, until: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = until
        self._timer = self._loop.call_at(until, self._on_timer)

    def _on_timer(self) -> None:
        armed_for, self._timer, self._timer_at = self._timer_at, None, math.inf
        waiter = self._waiter
        if waiter is None or waiter.done() or self._until == math.inf:
            return  # nobody waits under a deadline now: the next timed wait arms its own
        if self._until > armed_for:  # the wait in progress began later, so ends later
            self._arm(self._until)
            return
        waiter.set_exception(TimeoutError())

    def close(self) -> None:
        self.listener = None
        waiter = self._waiter
        if self._timer is not None and (waiter is None or waiter.done()):
            # Nobody waits: a live timer would only keep this connection for a timeout.
            self._timer.cancel()
            self._timer = None
            self._timer_at = math.inf
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()


async def _read_head(conn: _Connection, timeout: float | None,
                     request: httpx.Request | None) -> tuple[Head, bytes]:
    """The final response head (1xx heads skipped, as h11 did) and the bytes after it."""
    buf, searched = b"", 0
    while True:
        end = buf.find(b"\r\n\r\n", max(searched - 3, 0))
        if end < 0:
            if len(buf) > MAX_HEAD_BYTES:
                conn.close()
                raise MalformedAnswer("response head too large", request=request)
            searched = len(buf)
            data = await _read(conn, timeout, request)
            if not data:
                conn.close()
                # httpcore's wording and class for an upstream that hung up unanswered.
                raise httpx.RemoteProtocolError(
                    "Server disconnected without sending a response." if not buf else
                    "peer closed connection without sending a complete response head",
                    request=request)
            buf += data
            continue
        if end + 4 > MAX_HEAD_BYTES:
            conn.close()
            raise MalformedAnswer("response head too large", request=request)
        head = parse_head(buf[:end + 4], conn.close, request)
        buf, searched = buf[end + 4:], 0
        if not 100 <= head.status < 200:
            return head, buf


# -- the response body ---------------------------------------------------------------------


class _Body(httpx.AsyncByteStream):
    """A response body read off its connection: ``length`` bytes (``None``: up to the
    connection's end).

    :meth:`read` is the one reader (``__aiter__`` is a loop over it). It may be cancelled
    at any time without losing a byte (the bytes stay in the connection's buffer until a
    read returns), which is what lets an SSE stream read its body in its consumer's task
    (``sse_http.SSEUpstreamStream``): the supervisor's timer cancels that wait for each
    heartbeat. The read timeout counts silence across such cancelled reads, from the last
    bytes that came, as one uninterrupted read would."""

    def __init__(self, transport: LeanTransport, key: _Key, conn: _Connection,
                 request: httpx.Request | None, read_timeout: float | None, *, start: bytes,
                 keep_alive: bool, length: int | None = None) -> None:
        self._transport, self._key, self._conn = transport, key, conn
        self._request, self._timeout = request, read_timeout
        self._start, self._keep_alive, self._left = start, keep_alive, length
        self._reusable = keep_alive
        self._done = False  # the connection went back to the pool or was closed
        self._silent_since: float | None = None  # waiting for bytes since (loop time)

    @property
    def ended(self) -> bool:
        """The body's end has been read: the next :meth:`read` returns ``b""`` at once."""
        return self._done or self._left == 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while data := await self.read():
            yield data

    async def read(self) -> bytes:
        """The next bytes of the body; ``b""`` once it ended. The call after the one that
        reached the end gives the connection back (or :meth:`close`)."""
        while True:
            if self.ended:
                self._finish(self._reusable_at_end())
                return b""
            data = self._start or await self._read()
            self._start = b""
            if not data:
                if self._left is None:  # the body ran to the connection's end, as it said
                    self._finish(False)
                    return b""
                self._conn.close()
                raise httpx.RemoteProtocolError(
                    "peer closed connection without sending complete message body: "
                    f"{self._left} bytes missing", request=self._request)
            if (data := self._frame(data)):
                return data

    def _reusable_at_end(self) -> bool:
        return self._reusable

    def _frame(self, data: bytes) -> bytes:
        """The body's part of ``data``, as read off the connection."""
        left = self._left
        if left is not None:
            if len(data) > left:  # bytes past the end: none can follow
                data, self._reusable = data[:left], False
            self._left = left - len(data)
        return data

    async def _read(self) -> bytes:
        timeout = self._timeout
        if timeout is not None:
            now = self._conn._loop.time()
            if self._silent_since is None:
                self._silent_since = now
            timeout = max(0.0, self._silent_since + timeout - now)
        data = await _read(self._conn, timeout, self._request)
        self._silent_since = None
        return data

    def _finish(self, reusable: bool) -> None:
        if not self._done:
            self._done = True
            self._conn.listener = None  # (the next request's body is not ours)
            if not reusable:
                self._conn.close()
            self._transport._release(self._key, self._conn)

    def close(self) -> None:
        """Reading stops: the connection is pooled if the body's end was read; else it
        carries the rest of an answer nobody will read, so it closes (and the upstream sees
        the disconnect)."""
        if not self._done:
            self._finish(self.ended and self._reusable_at_end())

    async def aclose(self) -> None:
        self.close()


class _ChunkedBody(_Body):
    """A chunked body (every streamed upstream answer), decoded by :mod:`.chunked`."""

    def __init__(self, *args: Any, start: bytes, keep_alive: bool) -> None:
        super().__init__(*args, start=start, keep_alive=keep_alive)
        self._decoder = ChunkedDecoder()
        self._pieces: deque[bytes] = deque()  # decoded chunks not returned yet: one a read
        self._on_piece: Callable[[bytes], None] | None = None  # while pushed (listen)
        self._error: httpx.HTTPError | None = None  # a pushed chunk broke the framing

    @property
    def ended(self) -> bool:
        return self._done or (self._decoder.done and not self._pieces)

    def _reusable_at_end(self) -> bool:
        return self._keep_alive and not self._decoder.extra

    # -- push: the body handed over in the connection's callback ---------------------------
    #
    # Why (BENCHMARKS.md, "Session of 2026-12-05"): read by :meth:`read`, every chunk of a
    # streamed answer woke its reader's task and climbed a dozen coroutine frames to reach
    # the parser. Pushed, the connection's ``data_received`` decodes it and hands the pieces
    # to ``on_piece`` at once (``sse_http.SSEUpstreamStream`` parses them there and passes
    # the events on without a task switch). The reader's task waits in :meth:`wait_pushed`
    # meanwhile, and is woken only by what it must see itself: ``listen(None)`` (the
    # listener wants the task), the end of the connection, or the read timeout, which
    # counts silence from the last pushed bytes as :meth:`read` does.

    def take_start(self) -> list[bytes]:
        """The decoded chunks of the bytes that came with the head (the first :meth:`read`'s
        otherwise), at once."""
        start, self._start = self._start, b""
        return self._decode(start) if start else []

    def _decode(self, data: bytes) -> list[bytes]:
        """The whole chunks ``data`` completes; bad framing closes the connection and is
        httpx's ``RemoteProtocolError``, as httpcore reported it (a :class:`MalformedAnswer`:
        final)."""
        try:
            return self._decoder.feed(data)
        except ChunkedError as exc:
            self._conn.close()
            raise MalformedAnswer(str(exc), request=self._request) from exc

    def can_listen(self) -> bool:
        """Nothing is waiting to be read by :meth:`read` (the head's leftover, decoded
        pieces, buffered bytes) and the body and its connection are open."""
        conn = self._conn
        return not (self._start or self._pieces or self._done or self._decoder.done
                    or conn._chunks or conn._eof or conn.closed)

    def listen(self, on_piece: Callable[[bytes], None] | None) -> None:
        """Hand each decoded chunk to ``on_piece`` as it arrives (``None``: stop, and wake
        the task in :meth:`wait_pushed`; later bytes are buffered for :meth:`read`)."""
        self._on_piece = on_piece
        conn = self._conn
        if on_piece is None:
            conn.listener = None
            conn._wake()
        elif not self._done:
            conn.listener = self._pushed

    async def wait_pushed(self) -> None:
        """Wait while the body is pushed: until ``listen(None)``, the connection's end (the
        next :meth:`read` reports it) or the read timeout (``httpx.ReadTimeout``, as
        :meth:`read` raises it); cancellable at any time without losing a byte."""
        conn = self._conn
        timeout = self._timeout
        if timeout is not None:
            now = conn._loop.time()
            if self._silent_since is None:
                self._silent_since = now
            timeout = max(0.0, self._silent_since + timeout - now)
        try:
            await conn._wait(timeout)
        except TimeoutError as exc:
            conn.close()
            raise httpx.ReadTimeout("timed out waiting for the upstream",
                                    request=self._request) from exc
        if self._error is not None:
            raise self._error

    def _pushed(self, data: bytes) -> None:
        """The connection's listener: ``data`` arrived."""
        conn = self._conn
        if self._timeout is not None:  # the silence restarts: the wait's deadline moves on
            self._silent_since = now = conn._loop.time()
            conn._until = now + self._timeout
        try:
            pieces = self._decode(data)
        except httpx.RemoteProtocolError as exc:  # the waiting task raises it (wait_pushed)
            self._error = exc
            self.listen(None)
            return
        on_piece = self._on_piece
        if on_piece is None:  # (never: the listener is cleared with it)
            self._pieces.extend(pieces)
            return
        for piece in pieces:  # each chunk as the upstream framed it, as read() gives them
            on_piece(piece)
        if self._decoder.done and not self._done:
            self.listen(None)  # the end: read() returns b"" and pools the connection

    async def read(self) -> bytes:
        while True:
            if self._error is not None:
                raise self._error
            if self._pieces:  # each chunk as the upstream framed it, as httpcore gave them
                return self._pieces.popleft()
            if self.ended:
                self._finish(self._reusable_at_end())
                return b""
            data = self._start or await self._read()
            self._start = b""
            if not data:
                self._conn.close()
                raise httpx.RemoteProtocolError("peer closed connection without sending "
                                                "complete message body: incomplete chunked "
                                                "read", request=self._request)
            self._pieces.extend(self._decode(data))


async def _read(conn: _Connection, timeout: float | None,
                request: httpx.Request | None) -> bytes:
    try:
        return await conn.read(timeout)
    except TimeoutError as exc:
        conn.close()
        raise httpx.ReadTimeout("timed out waiting for the upstream", request=request) from exc
    except OSError as exc:
        conn.close()
        raise httpx.ReadError(str(exc) or type(exc).__name__, request=request) from exc


class LeanTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 over a keep-alive pool: at most ``max_connections`` requests in flight (a
    request waits up to the pool timeout for a free one), idle connections reused."""

    def __init__(self, *, max_connections: int,
                 keepalive_expiry: float = KEEPALIVE_EXPIRY_S) -> None:
        self._max = max_connections
        self._expiry = keepalive_expiry
        self._idle: dict[_Key, list[_Connection]] = {}
        self._open: set[_Connection] = set()  # every connection not yet closed: aclose ends all
        self._slots: asyncio.Semaphore | None = None  # made on the loop that uses it
        self._ssl: Any = None
        self._closed = False
        self._reaper: asyncio.Task[None] | None = None  # while connections are idle

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        data = request_bytes(request.method.encode("ascii"), url.raw_path, request.headers.raw,
                              await request.aread(), request)
        head, stream = await self._send(url, data, request.method == "HEAD",
                                        request.extensions.get("timeout", {}), request)
        return httpx.Response(head.status, headers=head.headers, stream=stream,
                              extensions={"http_version": b"HTTP/1.1",
                                          "reason_phrase": head.reason})

    async def post(self, url: httpx.URL, data: bytes,
                   timeouts: dict[str, float | None]) -> LeanAnswer:
        """Send ``data``, a whole POST to ``url`` (``stream_post.post_bytes``): the answer's
        head and body, with no httpx ``Request`` or ``Response`` built (the SSE adapters'
        requests, :mod:`.stream_post`)."""
        return LeanAnswer(*await self._send(url, data, False, timeouts, None))

    async def _send(self, url: httpx.URL, data: bytes, head_only: bool,
                    timeouts: dict[str, float | None],
                    request: httpx.Request | None) -> tuple[Head, _Body]:
        """Send ``data`` (a whole request) on a connection of the pool: the response head and
        its body's stream, which gives the connection back when it ends or closes."""
        if self._closed:
            raise RuntimeError("the transport is closed")
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._max)
        slots = self._slots
        if not slots.locked():  # a free connection: taken at once, no pool timer to arm
            await slots.acquire()
        else:
            try:
                async with asyncio.timeout(timeouts.get("pool")):
                    await slots.acquire()
            except TimeoutError as exc:
                raise httpx.PoolTimeout("no free upstream connection", request=request) \
                    from exc
        key = (url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80))
        conn: _Connection | None = None
        try:
            conn = self._reuse(key) or await self._connect(key, request, timeouts)
            return await self._exchange(key, conn, data, head_only, timeouts, request)
        except BaseException:
            if conn is not None:
                self._drop(conn)
            slots.release()
            raise

    def _reuse(self, key: _Key) -> _Connection | None:
        idle, now = self._idle.get(key), asyncio.get_running_loop().time()
        while idle:
            conn = idle.pop()
            if conn.reusable and not self._expired(conn, now) and not conn.readable_now():
                return conn
            self._drop(conn)
        return None

    def _expired(self, conn: _Connection, now: float) -> bool:
        return now - conn.idle_since >= self._expiry

    def _drop(self, conn: _Connection) -> None:
        """Close ``conn`` and forget it."""
        conn.close()
        self._open.discard(conn)

    async def _connect(self, key: _Key, request: httpx.Request | None,
                       timeouts: dict[str, float | None]) -> _Connection:
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        tls: dict[str, Any] = {}
        if scheme == "https":
            self._ssl = self._ssl or httpx.create_ssl_context()
            tls = {"ssl": self._ssl, "server_hostname": host}
        try:
            async with asyncio.timeout(timeouts.get("connect")):
                _, conn = await loop.create_connection(lambda: _Connection(loop), host, port,
                                                       **tls)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"connecting to {host}:{port} timed out",
                                       request=request) from exc
        except OSError as exc:  # refused, DNS, TLS (ssl.SSLError is an OSError)
            raise httpx.ConnectError(str(exc) or type(exc).__name__, request=request) from exc
        self._open.add(conn)
        return conn

    async def _exchange(self, key: _Key, conn: _Connection, data: bytes, head_only: bool,
                        timeouts: dict[str, float | None],
                        request: httpx.Request | None) -> tuple[Head, _Body]:
        try:
            await conn.write(data, timeouts.get("write"))
        except TimeoutError as exc:
            raise httpx.WriteTimeout("timed out sending to the upstream",
                                     request=request) from exc
        except OSError as exc:
            raise httpx.WriteError(str(exc) or type(exc).__name__, request=request) from exc
        read_timeout = timeouts.get("read")
        head, rest = await _read_head(conn, read_timeout, request)
        args = (self, key, conn, request, read_timeout)
        if head_only or head.status in (204, 304):  # RFC 9112 §6.3: no body
            stream = _Body(*args, start=b"", keep_alive=head.keep_alive and not rest,
                           length=0)
        elif head.chunked:
            stream = _ChunkedBody(*args, start=rest, keep_alive=head.keep_alive)
        else:
            stream = _Body(*args, start=rest, keep_alive=head.keep_alive, length=head.length)
        return head, stream

    def _release(self, key: _Key, conn: _Connection) -> None:
        """A request's connection is done: pooled when it can carry another, else closed."""
        if self._slots is not None:
            self._slots.release()
        if conn.closed:
            self._open.discard(conn)
            return
        if self._closed or not conn.reusable:
            self._drop(conn)
            return
        conn.idle_since = asyncio.get_running_loop().time()
        self._idle.setdefault(key, []).append(conn)
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.get_running_loop().create_task(self._reap())

    async def _reap(self) -> None:
        """Close idle connections as they expire, and every idle one when the loop ends.

        Without it an expired connection stays open until a request finds it, and a loop
        that ends with idle connections (its tasks cancelled, as ``asyncio.run`` and uvicorn
        do, the client never closed) leaves their transports open: uvloop then warns of
        each. The loop's clock, not ``time.monotonic``, so a test's virtual clock drives it.
        """
        loop = asyncio.get_running_loop()
        try:
            while True:
                now = loop.time()
                for idle in self._idle.values():
                    for conn in [c for c in idle if self._expired(c, now)]:
                        idle.remove(conn)
                        self._drop(conn)
                waiting = [c.idle_since for idle in self._idle.values() for c in idle]
                if not waiting:
                    return
                await asyncio.sleep(min(waiting) + self._expiry - now)
        except asyncio.CancelledError:
            for idle in self._idle.values():
                for conn in idle:
                    self._drop(conn)
            self._idle.clear()
            raise

    async def aclose(self) -> None:
        # Like httpcore's pool: every connection, those still streaming a body too.
        self._closed = True
        if self._reaper is not None:
            self._reaper.cancel()
        for conn in self._open:
            conn.close()
        self._open.clear()
        self._idle.clear()


# -- a streamed POST without httpx's objects ------------------------------------------------


async def decoded_body(body: AsyncIterator[bytes], coding: str) -> AsyncIterator[bytes]:
    """A body with ``Content-Encoding: coding`` decoded in bounded pieces
    (:func:`~.content_coding.decoded_pieces`); a coding it cannot decode is a
    :class:`MalformedAnswer`, final: the same bytes would fail the same way."""
    try:
        async for piece in decoded_pieces(body, coding):
            yield piece
    except UnsupportedCoding as exc:
        raise MalformedAnswer(str(exc)) from exc


class LeanAnswer:
    """An answer read by :meth:`LeanTransport.post`: the part of ``httpx.Response`` the SSE
    adapters read (``status_code``, ``headers``, ``aiter_bytes``, ``aclose``).

    Why (BENCHMARKS.md, "Session of 2026-12-04 (2)"): per upstream request, httpx built a
    ``Request`` (its ``Headers`` normalised and merged twice) and a ``Response``, and every
    body chunk crossed four nested async generators (the response's decoder and chunker,
    ``aiter_raw``, the client's stream wrapper) before reaching the SSE decoder. Here a
    chunk comes straight from the body's own iterator, and a body with a
    ``Content-Encoding`` is decoded in bounded pieces (``content_coding``: httpx's decoders
    expand a read without bound)."""

    def __init__(self, head: Head, body: _Body) -> None:
        self.status_code = head.status
        self.content_type = head.content_type
        self._head, self._body = head, body
        self._headers: httpx.Headers | None = None

    @property
    def headers(self) -> httpx.Headers:
        if self._headers is None:
            self._headers = httpx.Headers(self._head.headers)
        return self._headers

    def aiter_bytes(self) -> AsyncIterator[bytes]:
        if self._head.coding:
            return decoded_body(self._body, self._head.coding)
        return self._body.__aiter__()

    def reader(self) -> _Body | None:
        """The body itself, when nothing needs decoding (its reads are cancel-safe)."""
        return None if self._head.coding else self._body

    def close(self) -> None:
        self._body.close()

    async def aclose(self) -> None:
        self._body.close()
