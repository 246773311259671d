"""One generation as a pure ASGI response: events -> renderer -> coalescer -> socket.

The promise this module keeps (codec-spec §10 item 1): every frame becomes decodable by the
client within one coalescing window of being generated, for every content coding. Frames go
through :class:`~tokenwire.codec.coalescer.Coalescer`, which flushes the compressor (without
resetting its history) when a window closes; the wait for the next event is bounded by the
window's deadline, so a window closes on time even when the model pauses.

Other rules kept here:

* Nothing is sent before the first event. If it is a :class:`~tokenwire.gateway.ir.Failure`
  (bad prompt, engine down), the client gets a plain error response with a real status. A
  :class:`~tokenwire.gateway.ir.Heartbeat` (15 s queued, retrying or waiting) opens the
  stream like any output: from then on a failure is reported in-stream.
  After the headers, errors go inside the stream (the renderer's ``on_error``), never a 500
  (STYLE §6 item 10, Starlette's ``ServerErrorMiddleware`` behaviour).
* A client disconnect (``http.disconnect``) cancels the upstream generation at once; so does
  any other way this response stops before the terminal event (codec-spec §10 item 17).
* ``streaming=False`` (a JSON body) collects every event first and sends one compressed
  body with ``Content-Length``; the disconnect watch still applies.
* ``headers`` may be a function, called when the head goes out: the model serving the
  request is known only then (a fallback before the head changes it; README "Fallbacks").
* A stream's head leaves with its first body, in one write, when the server offers its
  cork (``asgi.CORK_EXTENSION``). Written alone, it woke the client, which read it
  on the gateway's core before the gateway could write the first token. A whole body and
  an error follow their head at once and are not corked.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol

from tokenwire.codec.coalescer import Coalescer
from tokenwire.codec.compression import Compressor
from tokenwire.gateway.http.asgi import CORK_EXTENSION, Cork
from tokenwire.gateway.ir import (
    Event,
    EventStream,
    Failure,
    Heartbeat,
    MessageStart,
    ResponseMeta,
    Usage,
    is_terminal,
    start_early,
)
from tokenwire.gateway.wakeups import EXPIRED, DeadlineWaits

__all__ = ["USAGE_SOURCE_HEADER", "ErrorFactory", "EventResponse", "Renderer", "WireRecord"]

#: Names who counted a non-streamed answer's usage: engine, upstream or gateway.
USAGE_SOURCE_HEADER = "Tokenwire-Usage-Source"

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Any]
Send = Callable[[Message], Any]
Headers = list[tuple[str, str]]
#: Builds the whole response for a failure that arrives before any byte was sent.
ErrorFactory = Callable[[Failure], tuple[int, Headers, bytes]]


class WireRecord(Protocol):
    """Where the bytes written to the client are counted (an observability record)."""

    def wire_bytes(self, encoding: str, n: int) -> None: ...


class Renderer(Protocol):
    content_type: str

    def on_event(self, event: Event) -> list[bytes]: ...

    def on_error(self, exc: BaseException) -> list[bytes]: ...


def _usage_header(events: list[Event]) -> Headers:
    """Who counted the usage of a whole body (README "Usage"); a stream's headers go out
    before its counts exist, so a stream names it in its usage object instead."""
    usage = next((e for e in reversed(events) if isinstance(e, Usage)), None)
    return [] if usage is None else [(USAGE_SOURCE_HEADER, usage.source.value)]


#: How far inside the open window the events taken at its deadline are placed
#: (:meth:`EventResponse._take_ready`): far above the clock's resolution, far below any
#: window.
_BEFORE_DEADLINE_S = 1e-6


class EventResponse:
    """ASGI app for one generation (STYLE §6 item 13: plain ASGI, no BaseHTTPMiddleware)."""

    def __init__(
        self,
        stream: EventStream,
        renderer: Renderer,
        *,
        headers: Headers | Callable[[], Headers],
        compressor: Callable[[], Compressor],
        on_failure: ErrorFactory,
        window: float,
        streaming: bool = True,
        clock: Callable[[], float] = time.monotonic,
        record: WireRecord | None = None,
        before_send: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._stream = stream
        #: Awaited once a whole (non-streamed) body is rendered, before its head goes out:
        #: the Responses store writes there, so the answer is readable once it is received.
        self._before_send = before_send
        self._record = record
        self._renderer = renderer
        self._headers = headers
        # Built when the body starts, not at admission: a compressor holds its window
        # (~0.1 MB gzip, ~0.4 MB brotli) and hundreds of requests may be queued.
        self._new_compressor = compressor
        self._on_failure = on_failure
        self._window = window
        self._streaming = streaming
        self._clock = clock
        self._encoding = "identity"  # of the streamed body, once it started
        self._terminal_seen = False
        self.disconnected = False
        # The open window's deadline (``clock``) and the same instant in the loop's time.
        self._window_deadline: float | None = None
        self._window_until = 0.0
        self._cork: Cork | None = None  # the socket's, while it holds the head

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        extensions = scope.get("extensions")
        cork = extensions.get(CORK_EXTENSION) if extensions else None
        # The generation's task first: the loop runs ready tasks in the order they were
        # made, and every step before the upstream request is written delays the first
        # token (with the record's metrics held until the first write, ~0.1 ms of it:
        # BENCHMARKS.md, "Session of 2026-12-05 (5)"). A disconnect is still seen as soon
        # as the watcher runs.
        start_early(self._stream)
        watcher = asyncio.get_running_loop().create_task(self._watch_disconnect(receive))
        try:
            if self._streaming:
                await self._stream_body(send, cork)
            else:
                await self._whole_body(send)
        finally:
            self._uncork()
            watcher.cancel()
            if not self._terminal_seen:  # disconnect, send failure or cancellation
                self._stream.cancel()

    def _cork_head(self, cork: Cork | None) -> None:
        """Hold what is written from now until :meth:`_uncork` (the head, then a body)."""
        if cork is not None:
            cork(True)
            self._cork = cork

    def _uncork(self) -> None:
        """Send what the cork held; a no-op when nothing is corked (every later write)."""
        cork, self._cork = self._cork, None
        if cork is not None:
            cork(False)

    def _head(self) -> Headers:
        return self._headers() if callable(self._headers) else list(self._headers)

    async def _watch_disconnect(self, receive: Receive) -> None:
        """On a disconnect, cancel the stream: it then ends with ``ABORT`` after what it had
        queued (``EventStream.cancel``), and the body ends there, its writes to the gone
        client returning at once. Nothing is cancelled mid-write, so no cancel scope is
        needed: anyio's task group and scope were ~5 % of a short request's CPU (cProfile)."""
        while (await receive())["type"] != "http.disconnect":
            pass
        self.disconnected = True
        self._stream.cancel()

    async def _next(self) -> Event:
        event = await self._stream.next_event()
        if is_terminal(event):
            self._terminal_seen = True
        return event

    async def _all_events(self) -> list[Event]:
        """Every event through the terminal. A supervised stream is waited on once for its
        terminal (``settled``/``ready``) instead of once per event."""
        events = [await self._next()]  # (the first read starts a supervised stream's task)
        settled = getattr(self._stream, "settled", None)
        while not is_terminal(events[-1]):
            if settled is None:
                events.append(await self._next())
                continue
            await settled()
            events += self._stream.ready()  # type: ignore[attr-defined]
        self._terminal_seen = True
        return events

    async def _send_whole(self, send: Send, status: int, headers: Headers, body: bytes) -> None:
        # Not corked: the body follows its head at once (no work between the two writes),
        # and two more system calls per answer cost 4 % of the requests a second
        # (BENCHMARKS.md, "Session of 2026-12-05 (2)").
        raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]
        raw.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _send_failure(self, send: Send, failure: Failure) -> None:
        status, headers, body = self._on_failure(failure)
        # The answer's request id, as a success carries it: the one the gateway's log line
        # and the client's bug report can both name.
        rid = next((v for k, v in self._head() if k == "X-Request-Id"), None)
        if rid is not None:
            headers = [*headers, ("X-Request-Id", rid)]
        await self._send_whole(send, status, headers, body)
        self._count("identity", body)  # error bodies are never content-coded

    async def _whole_body(self, send: Send) -> None:
        events = await self._all_events()
        if self.disconnected:  # nobody to render, store or send for
            return
        if isinstance(events[-1], Failure):
            await self._send_failure(send, events[-1])
            return
        renderer = self._renderer
        body = b"".join(chunk for ev in events for chunk in renderer.on_event(ev))
        if self._before_send is not None:
            await self._before_send()
        comp = self._new_compressor()
        data = comp.compress_body(body)
        await self._send_whole(send, 200, self._head() + _usage_header(events), data)
        self._count(comp.encoding, data)

    async def _stream_body(self, send: Send, cork: Cork | None) -> None:
        event = await self._next()
        held: list[Event] = []
        # Facts (an early prompt count too) and message boundaries, not output: a failure
        # after them still gets its real status.
        while isinstance(event, ResponseMeta | MessageStart | Usage):
            held.append(event)
            event = await self._next()
        if isinstance(event, Failure):
            await self._send_failure(send, event)
            return
        raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self._head()]
        self._cork_head(cork)  # until the first body is written (or __call__ ends)
        await send({"type": "http.response.start", "status": 200, "headers": raw})
        comp = self._new_compressor()
        coalescer = Coalescer(comp, window=self._window)
        self._encoding = comp.encoding
        waits = DeadlineWaits()
        try:
            while not self.disconnected:  # else the stream was cancelled: nobody to send to
                chunks = [c for ev in held for c in self._renderer.on_event(ev)]
                held = []
                out = self._feed(coalescer, chunks + self._renderer.on_event(event),
                                 flush=type(event) is Heartbeat)
                if is_terminal(event):
                    await self._body(send, out + coalescer.close(self._clock()), more=False)
                    return
                if out:
                    await self._body(send, out, more=True)
                self._uncork()  # the head, with the first body if it made one
                event = await self._next_in_window(coalescer, send, waits)
        except Exception as exc:  # after the headers: report in-stream (never a 500)
            log.error("generation stream failed after the response started: %s",
                      type(exc).__name__)
            self._stream.cancel()
            out = self._feed(coalescer, self._renderer.on_error(exc))
            await self._body(send, out + coalescer.close(self._clock()), more=False)
        finally:
            waits.close()

    def _feed(self, coalescer: Coalescer, chunks: list[bytes], *, flush: bool = False) -> bytes:
        # The chunks of one event go in as one unit: the Chat renderer opens with a role-only
        # chunk before the first content, and the coalescer flushes its first unit at once;
        # fed one by one, the first real content would wait a whole window.
        # A heartbeat closes its window: it comes after 15 s of silence to be seen now.
        return coalescer.add(b"".join(chunks), self._clock(), flush=flush) if chunks else b""

    async def _next_in_window(self, coalescer: Coalescer, send: Send,
                              waits: DeadlineWaits) -> Event:
        """The next event, flushing the open window at its deadline while waiting. The
        window's deadline is in ``clock``'s time, converted to the loop's once per window,
        so the waits of one window share one timer (:mod:`~tokenwire.gateway.wakeups`)."""
        while True:
            deadline = coalescer.deadline
            if deadline is None:
                return await self._next()
            now = self._clock()
            if deadline > now:
                if deadline != self._window_deadline:
                    self._window_deadline = deadline
                    self._window_until = asyncio.get_running_loop().time() + (deadline - now)
                settled = getattr(self._stream, "settled", None)
                if settled is None:
                    event = await waits.wait(self._next, self._window_until)
                    if event is not EXPIRED:
                        return event  # type: ignore[return-value]
                elif await waits.wait(settled, self._window_until) is not EXPIRED:
                    # A terminal or a backlog: what is queued goes into the window now.
                    terminal = await self._take_ready(coalescer, send, deadline)
                    if terminal is not None:
                        return terminal
                    continue
                # Re-derived if ``clock`` says the window is still open (the two clocks
                # differ by their resolution): the next wait is then a real one, never a spin.
                self._window_deadline = None
                if settled is not None:  # the window's events, then its flush
                    terminal = await self._take_ready(coalescer, send, deadline)
                    if terminal is not None:
                        return terminal
            out = coalescer.poll(self._clock())
            if out:
                await self._body(send, out, more=True)

    async def _take_ready(self, coalescer: Coalescer, send: Send,
                          deadline: float) -> Event | None:
        """Feed the open window every event the stream has queued (it came before the
        window's deadline, so it counts as inside it, whenever this task got to run); the
        terminal, if one came, is returned for the body's end."""
        at = min(self._clock(), deadline - _BEFORE_DEADLINE_S)
        out = b""
        for event in self._stream.ready():  # type: ignore[attr-defined]
            if is_terminal(event):
                self._terminal_seen = True
                if out:
                    await self._body(send, out, more=True)
                return event
            chunks = self._renderer.on_event(event)
            if chunks:
                out += coalescer.add(b"".join(chunks), at, flush=type(event) is Heartbeat)
        if out:
            await self._body(send, out, more=True)
        return None

    async def _body(self, send: Send, data: bytes, *, more: bool) -> None:
        await send({"type": "http.response.body", "body": data, "more_body": more})
        self._uncork()  # the first body goes out with its head before it is counted: the
        # first count posts the record's held metrics (``observability/records.py``)
        self._count(self._encoding, data)

    def _count(self, encoding: str, data: bytes) -> None:
        if self._record is not None and data:
            self._record.wire_bytes(encoding, len(data))
