"""One upstream WebSocket per client WebSocket, in front of a Responses upstream that has one.

Opt-in per upstream (``[upstreams.options] websocket = true`` on a ``kind = "responses"``
upstream, README "The Responses API over WebSocket"). A request that came on a client's
Responses WebSocket (``GenerationRequest.connection``) and routes to such an upstream goes
over an upstream socket held for that client socket (:class:`UpstreamSocket`, kept in the
:class:`~tokenwire.gateway.ir.ClientConnection`): opened on the first such request with the
headers the HTTP adapter sends (the upstream's key as ``Authorization``, the configured
headers, the request's affinity headers) plus ``OpenAI-Beta: responses_websockets=2026-02-06``,
then one ``response.create`` text message per request. Every message read is one Responses
event, fed to the same :class:`~.responses_upstream.ResponsesStreamParser` as an SSE event's
data, with the same end (:class:`SocketStream`, which hands the request to an
:class:`~.sse_http.SSEUpstreamStream` when the upgrade is refused): so usage, ids, error
classification, retries, heartbeats, deadlines and metrics are the HTTP path's, unchanged.

Continuing on the socket: the upstream socket remembers its own last completed response
(Codex's protocol, and this gateway's own ``http/ws_session.py``), so when a request is the
previous one plus what the upstream answered plus new items, with every other field equal,
only the new items go, with ``previous_response_id`` naming the upstream's response
(:func:`continuation`); anything else goes whole, ``store: false`` as over HTTP. An upstream
that no longer knows the id (``previous_response_not_found`` before anything else) gets the
whole request on the same socket.

Failures, each on the HTTP path's terms:

* the upgrade refused (426, or any status but 101): this client socket uses the upstream's
  HTTP API from then on; logged once per upstream (:class:`RefusalLog`), counted
  (``refused``);
* the held socket found closed (the upstream closes idle sockets) before a byte of the
  request was written: reopened once, silently, for this request (the upstream cannot have
  seen it);
* a socket that breaks once the request may have been written (the write itself failing,
  or no answer after it), even a reused one: never resent here, since the upstream may
  have read and started it. It is ``CONNECTION`` / ``connection_reset`` before any event
  (after events but before output: ``UPSTREAM``), as a POST whose connection is lost before
  any byte came back, which the supervisor retries on its budget, before output only, on a
  new socket; after output, the same ``UPSTREAM`` failure an HTTP stream cut gives;
* a message over :data:`MAX_MESSAGE_BYTES` (the socket closes with 1009), or a binary one:
  ``UPSTREAM`` / ``malformed_stream``, final;
* a response cut short on our side (the client left, a stop sequence matched, a deadline):
  the socket is aborted, as closing the HTTP response is, so the upstream stops generating.

The client socket closing closes the upstream one (:meth:`UpstreamSocket.aclose`), and so does
the adapter's ``aclose`` at shutdown, after the client sockets drained.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.protocol import State

from tokenwire.gateway.ir import (
    Event,
    Failure,
    FailureClass,
    Finish,
    FinishKind,
    Heartbeat,
    is_terminal,
)
from tokenwire.gateway.upstreams.failures import (
    MALFORMED,
    connection_fault,
    failure_from_response,
)
from tokenwire.gateway.upstreams.sse import DEFAULT_MAX_EVENT_BYTES, SSEEvent
from tokenwire.gateway.upstreams.sse_http import SSEUpstreamStream, broken_stream

__all__ = [
    "BETA_HEADER",
    "BETA_VALUE",
    "CLOSE_TIMEOUT_S",
    "MAX_MESSAGE_BYTES",
    "RefusalLog",
    "Remembered",
    "SocketStream",
    "UpstreamSocket",
    "continuation",
    "remembered",
    "socket_url",
    "upgrade_headers",
]

log = logging.getLogger(__name__)

#: What Codex sends on the upgrade to ask for this protocol (``responses_websocket.rs``).
BETA_HEADER, BETA_VALUE = "OpenAI-Beta", "responses_websockets=2026-02-06"
#: Largest message read from an upstream socket: one event, bounded as one SSE event is
#: (``sse.py``: a whole prompt's ids or logprobs fit far below it).
MAX_MESSAGE_BYTES = DEFAULT_MAX_EVENT_BYTES
#: Messages the socket buffers unread (a slow client); the library's default bound, named.
MAX_QUEUED_MESSAGES = 16
#: Events read off the socket but not yet by the client: a full queue means a slow client,
#: and the task waits (back-pressure reaches the upstream socket).
MAX_QUEUED_EVENTS = 256
#: Waiting for the upstream's close handshake when we close: shutdown must not hang on it.
CLOSE_TIMEOUT_S = 2.0
#: Upgrade answers that mean "no WebSocket here" (the session switches to HTTP for good);
#: any other non-101 (429, 5xx) says the upstream is busy or failing right now.
NO_WEBSOCKET_STATUSES = frozenset({400, 404, 405, 426, 501})
#: HTTP headers of the adapter's client that mean nothing on an upgrade.
_HTTP_ONLY = frozenset({"accept", "accept-encoding", "connection", "content-type",
                        "content-length", "user-agent", "host"})
_encode = msgspec.json.Encoder().encode


def socket_url(api_base: str) -> str:
    """``GET {base}/responses`` as a WebSocket URL (``http`` -> ``ws``, ``https`` -> ``wss``)."""
    scheme, sep, rest = api_base.partition("://")
    return f"{'wss' if scheme == 'https' else 'ws'}{sep}{rest}/responses"


def upgrade_headers(client_headers: Mapping[str, str]) -> dict[str, str]:
    """The adapter's own headers (its key, the configured ones) for the upgrade."""
    return {k: v for k, v in client_headers.items() if k.lower() not in _HTTP_ONLY}


# -- continuing on the socket (pure) -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Remembered:
    """The upstream socket's last completed response, as this side sent and read it."""

    response_id: str
    settings: dict[str, Any]  # the request's fields but input and previous_response_id
    input: list[Any]  # the whole input it answered
    output: list[tuple[Any, ...]]  # its output items, as :func:`_item_key` sees them


def _settings(body: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in ("input", "previous_response_id")}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(str(p.get("text") or p.get("refusal") or "") for p in content or ()
                   if isinstance(p, dict))


def _item_key(item: Any) -> tuple[Any, ...] | None:
    """What must agree between an upstream output item and the input item a client replays
    for it (ids and statuses are the upstream's bookkeeping). None: an item the replay never
    carries (a reasoning item without ``encrypted_content``, an empty message)."""
    if not isinstance(item, dict):
        return ("?", repr(item))
    kind = item.get("type")
    if kind == "message":
        text = _text(item.get("content"))
        return ("message", item.get("role"), text) if text else None
    if kind == "function_call":
        return (kind, item.get("call_id"), item.get("name"), item.get("arguments"))
    if kind == "custom_tool_call":
        return (kind, item.get("call_id"), item.get("name"), item.get("input"))
    if kind == "reasoning":
        blob = item.get("encrypted_content")
        return (kind, blob) if blob else None
    return ("?", msgspec.json.encode(item))


def remembered(body: Mapping[str, Any], response: Mapping[str, Any]) -> Remembered | None:
    """What the socket remembers after ``response`` (a ``response.completed`` snapshot)
    answered the whole request ``body``; None when it cannot be continued from."""
    rid, items = response.get("id"), body.get("input")
    if not isinstance(rid, str) or not rid or not isinstance(items, list):
        return None
    keys = [_item_key(i) for i in response.get("output") or ()]
    return Remembered(response_id=rid, settings=_settings(body), input=list(items),
                      output=[k for k in keys if k is not None])


def continuation(last: Remembered | None, body: Mapping[str, Any]) -> dict[str, Any] | None:
    """``body`` as only its new items after ``last`` (``previous_response_id`` set), when it
    is exactly ``last``'s input, then ``last``'s output, then new items, with every other
    field equal; else None (send it whole)."""
    items = body.get("input")
    if last is None or not isinstance(items, list) or "previous_response_id" in body:
        return None
    if _settings(body) != last.settings:
        return None
    n, m = len(last.input), len(last.output)
    if items[:n] != last.input:
        return None
    rest = items[n:]
    keys: list[tuple[Any, ...]] = []
    taken = 0  # the replayed output: the first items after the old input that carry a key
    while len(keys) < m and taken < len(rest):
        key = _item_key(rest[taken])
        taken += 1
        if key is not None:
            keys.append(key)
    if keys != last.output or taken >= len(rest):
        return None  # not the upstream's answer, or nothing new after it
    return {**body, "previous_response_id": last.response_id, "input": rest[taken:]}


# -- the socket held for one client socket ----------------------------------------------------


class _Refused(Exception):
    """The upstream answered the upgrade with something other than 101."""


class RefusalLog:
    """One warning per upstream for refused upgrades (every client socket of an upstream
    without the transport would repeat it); later ones at debug level, all counted."""

    def __init__(self) -> None:
        self.logged = False

    def refused(self, upstream: str, status: int) -> None:
        level = logging.DEBUG if self.logged else logging.WARNING
        self.logged = True
        log.log(level, "upstream %r refused the Responses WebSocket upgrade (HTTP %s): its "
                "client sockets use its HTTP API (counted in "
                "tokenwire_upstream_websockets_total{outcome=\"refused\"})", upstream, status)


class UpstreamSocket:
    """One upstream WebSocket held for one client connection: opened lazily, reopened when
    found closed, never used after the upstream refused the upgrade (:attr:`refused`)."""

    def __init__(self, *, upstream: str, url: str, headers: Mapping[str, str],
                 open_timeout_s: float, note: Callable[[str, str], None],
                 refusals: RefusalLog | None = None,
                 on_close: Callable[[UpstreamSocket], None] = lambda s: None) -> None:
        self.upstream, self.url = upstream, url
        self._headers = {**headers, BETA_HEADER: BETA_VALUE}
        self._open_timeout = open_timeout_s
        self._note, self._on_close = note, on_close
        self._refusals = refusals or RefusalLog()
        self._conn: ClientConnection | None = None
        self.refused = False
        self.last: Remembered | None = None
        self.opened = 0  # sockets opened for this client socket (the first and reopenings)
        #: One response at a time on the socket (the client socket already runs one).
        self.lock = asyncio.Lock()

    async def connection(self, extra: Mapping[str, str]) -> tuple[ClientConnection, bool]:
        """The open socket and whether it was already open (reused); raises
        :class:`_Refused` when the upgrade is refused, ``OSError`` / ``TimeoutError`` /
        ``InvalidHandshake`` when it cannot be opened."""
        conn = self._conn
        if conn is not None and conn.state is State.OPEN:
            return conn, True
        self.discard()
        try:
            conn = await connect(self.url, additional_headers={**self._headers, **extra},
                                 max_size=MAX_MESSAGE_BYTES, max_queue=MAX_QUEUED_MESSAGES,
                                 open_timeout=self._open_timeout,
                                 close_timeout=CLOSE_TIMEOUT_S)
        except InvalidStatus as exc:
            if exc.response.status_code not in NO_WEBSOCKET_STATUSES:
                raise  # busy or failing (429, 5xx): a connection failure, try again later
            self.refused = True
            self._note(self.upstream, "refused")
            self._refusals.refused(self.upstream, exc.response.status_code)
            raise _Refused from exc
        self._conn = conn
        self.opened += 1
        self._note(self.upstream, "opened")
        return conn, False

    @property
    def head(self) -> Mapping[str, str]:
        """The upgrade response's headers (the upstream's ``x-codex-turn-state`` is there)."""
        return self._conn.response.headers if self._conn is not None \
            and self._conn.response is not None else {}

    def discard(self, *, lost: bool = False) -> None:
        """Drop the socket now (its TCP connection aborted, so a running response stops
        upstream); its memory goes with it."""
        conn, self._conn, self.last = self._conn, None, None
        if conn is not None and conn.state is not State.CLOSED:
            conn.transport.abort()
        if lost:
            self._note(self.upstream, "lost")

    async def aclose(self) -> None:
        conn, self._conn, self.last = self._conn, None, None
        self._on_close(self)
        if conn is None:
            return
        if self.lock.locked():  # a response still running must stop upstream anyway
            conn.transport.abort()
            return
        try:
            # websockets' close() first drains the send buffer with no deadline of its own
            # (a peer that stopped reading would hold this shielded close for as long as TCP
            # takes to give up): the whole handshake gets the bound.
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await conn.close()
        except Exception:  # broken, or too slow to close: nothing left to tell it
            conn.transport.abort()


# -- one response over it ---------------------------------------------------------------------


class _Stale(Exception):
    """A reused socket was found closed before a byte of the request was written: open a
    new one (safe: the upstream cannot have seen the request)."""


def _not_found(message: str) -> bool:
    """Is the first answer to a continued request ``previous_response_not_found``?"""
    if "previous_response_not_found" not in message:
        return False
    try:
        data = msgspec.json.decode(message)
    except msgspec.DecodeError:
        return False
    err = data.get("error") if isinstance(data, dict) else None
    return (isinstance(data, dict) and data.get("type") == "error" and isinstance(err, dict)
            and err.get("code") == "previous_response_not_found")


def _failure(cls: FailureClass, message: str, code: str | None = None) -> Failure:
    return Failure(failure_class=cls, status=504 if cls is FailureClass.TIMEOUT else 502,
                   code=code, message=f"upstream {message}")


class SocketStream:
    """One generation over the client socket's :class:`UpstreamSocket`
    (:class:`~tokenwire.gateway.ir.EventStream`), or over the upstream's HTTP API (an
    :class:`~.sse_http.SSEUpstreamStream` with the same request, parser and end) once the
    upstream refused the upgrade (module docstring).

    A task reads the socket's messages and queues their events: a cancelled wait loses
    nothing, a slow client makes the task wait (at most :data:`MAX_QUEUED_EVENTS` queued),
    and :meth:`cancel` cancels the task, which stops the response upstream."""

    def __init__(self, *, socket: UpstreamSocket, read_timeout_s: float,
                 **http: Any) -> None:
        self._socket, self._read_timeout = socket, read_timeout_s
        self._http = http  # what the HTTP stream is built from, if the upgrade is refused
        self._body, self.parser = http["body"], http["parser"]
        self._headers = dict(http.get("headers") or {})
        self._on_done: Callable[[], None] = http.get("on_done", lambda: None)
        self._queue: asyncio.Queue[Event] = asyncio.Queue(MAX_QUEUED_EVENTS)
        self._task: asyncio.Task[None] | None = None
        self._finished = False  # a terminal has been queued (or is pending)
        self._pending: Event | None = None  # the terminal, when it met a full queue
        self._seen_bytes = False
        #: The HTTP stream serving the request after a refused upgrade; read once the
        #: task queued :data:`_OVER_HTTP`.
        self._over_http: SSEUpstreamStream | None = None
        self._switched = False

    async def next_event(self) -> Event:
        if self._switched:
            return await self._over_http.next_event()  # type: ignore[union-attr]
        if self._task is None and not self._finished:
            self._task = asyncio.get_running_loop().create_task(self._run())
        if self._pending is not None and self._queue.empty():
            event, self._pending = self._pending, None
            return event
        event = await self._queue.get()
        if event is _OVER_HTTP:
            self._switched = True
            return await self._over_http.next_event()  # type: ignore[union-attr]
        return event

    def cancel(self) -> None:
        if self._over_http is not None:
            self._over_http.cancel()
            return
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._end(Finish(reason=FinishKind.ABORT))

    def _end(self, terminal: Event) -> None:
        """Queue the terminal without waiting (it goes after what is queued); at most one."""
        if self._finished:
            return
        self._finished = True
        try:
            self._queue.put_nowait(terminal)
        except asyncio.QueueFull:  # the reader drains the queue first, then gets it
            self._pending = terminal
        self._on_done()

    async def _put_all(self, events: list[Event]) -> bool:
        """Queue ``events`` (waiting while the queue is full); True once the stream ended."""
        for event in events:
            if self._finished:
                break
            if is_terminal(event):
                self._end(event)
            else:
                await self._queue.put(event)
        return self._finished

    async def _run(self) -> None:
        try:
            sock = self._socket
            if not sock.refused:
                async with sock.lock:
                    try:
                        await self._over_socket()
                        return
                    except _Refused:
                        pass
            # The upstream's HTTP API, with the whole request: nothing was queued yet.
            self._over_http = SSEUpstreamStream(**self._http)
            self._queue.put_nowait(_OVER_HTTP)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug here must still end the stream
            log.error("upstream socket stream failed: %s", type(exc).__name__)
            self._end(Failure(failure_class=FailureClass.INTERNAL, status=500,
                              message=f"upstream internal error: {type(exc).__name__}"))
        finally:
            if self._over_http is None:
                self._end(broken_stream())

    def _whole_body(self) -> dict[str, Any]:
        body = self._body
        if isinstance(body, bytes):  # a passthrough body: the client's own JSON object
            body = msgspec.json.decode(body)
        return dict(body)

    async def _over_socket(self) -> None:
        sock, body = self._socket, self._whole_body()
        for _ in range(2):  # a reused socket found closed gets one new socket
            try:
                conn, reused = await sock.connection(self._headers)
            except InvalidStatus as exc:  # busy or failing now (429, 5xx): as over HTTP
                answer = exc.response
                self._end(failure_from_response(answer.status_code, answer.headers,
                                                answer.body or b""))
                return
            except (OSError, TimeoutError, InvalidHandshake) as exc:
                code = "connect_timeout" if isinstance(exc, TimeoutError) \
                    else connection_fault(exc)
                self._end(_failure(FailureClass.CONNECTION, "could not open its WebSocket: "
                                   f"{type(exc).__name__}: {exc}".rstrip(": "), code))
                return
            try:
                await self._respond(conn, body, reused=reused)
                return
            except _Stale:
                sock.discard()
        self._end(_failure(FailureClass.CONNECTION, "closed its WebSocket as the request was "
                           "sent", "connection_reset"))

    async def _respond(self, conn: ClientConnection, body: dict[str, Any], *,
                       reused: bool) -> None:
        sock, parser = self._socket, self.parser
        sent = continuation(sock.last, body)
        finished = False
        try:
            if not await self._send(conn, sent or body, reused=reused):
                finished = True  # a failure was queued for the broken socket
                return
            first = True
            while True:
                message = await self._receive(conn, started=not first)
                if message is None:
                    finished = True  # a failure was queued and the socket dropped
                    return
                if first:
                    first = False
                    if sent is not None and _not_found(message):  # it forgot: send it whole
                        sock.last, sent, first = None, None, True
                        if not await self._send(conn, body, reused=False):
                            finished = True
                            return
                        continue
                    if await self._put_all(parser.on_head(sock.head)):
                        break
                self._seen_bytes = True
                if await self._put_all(parser.on_sse(SSEEvent("message", message))):
                    break
            finished = parser.terminal is not None  # else its response still runs upstream
            completed = getattr(parser, "completed", None)
            sock.last = remembered(body, completed) if completed is not None \
                and parser.terminal == "response.completed" else None
        finally:
            if not finished:  # cancelled, a stop sequence, or a broken event: stop it upstream
                sock.discard()

    async def _send(self, conn: ClientConnection, body: dict[str, Any], *,
                    reused: bool) -> bool:
        """Send one ``response.create``; False once a failure was queued for a socket that
        closed under it. A reused socket found closed before the write raises
        :class:`_Stale` instead (a new socket): ``send`` checks the state before writing
        and nothing is awaited between this check and that one, so "not open here" means
        not a byte went; a failure once it was open may come after the frame was written."""
        message = _encode({"type": "response.create", **body}).decode()
        if reused and conn.state is not State.OPEN:
            raise _Stale
        try:
            await conn.send(message)
            return True
        except ConnectionClosed as exc:
            self._socket.discard(lost=True)
            self._end(_failure(FailureClass.CONNECTION, "closed its WebSocket as the request "
                               f"was sent ({_close_reason(exc)})", "connection_reset"))
            return False

    async def _receive(self, conn: ClientConnection, *, started: bool) -> str | None:
        """The next text message; None once a failure was queued for a broken socket."""
        try:
            async with asyncio.timeout(self._read_timeout):
                message = await conn.recv()
        except TimeoutError:
            self._end(_failure(FailureClass.TIMEOUT, "timed out: no WebSocket message in "
                               f"{self._read_timeout:g} s", "read_timeout"))
        except ConnectionClosed as exc:
            if exc.rcvd is not None and exc.rcvd.code == 1009 and exc.rcvd_then_sent:
                # The upstream closed first, saying our request was over its message limit.
                self._end(Failure(failure_class=FailureClass.INVALID_REQUEST, status=413,
                                  code="request_too_large",
                                  message="the request is over the upstream's WebSocket "
                                          "message limit"))
            elif exc.sent is not None and exc.sent.code == 1009:
                self._end(_failure(FailureClass.UPSTREAM, "sent a WebSocket message over "
                                   f"{MAX_MESSAGE_BYTES} bytes", MALFORMED))
            elif not started:  # reused or not: the request was written, it may have run
                self._socket.discard(lost=True)
                self._end(_failure(FailureClass.CONNECTION, "closed its WebSocket before "
                                   f"answering ({_close_reason(exc)})", "connection_reset"))
            else:
                self._socket.discard(lost=True)
                self._end(_failure(FailureClass.UPSTREAM, "broke the stream: its WebSocket "
                                   f"closed mid-response ({_close_reason(exc)})"))
        else:
            if isinstance(message, str):
                return message
            self._end(_failure(FailureClass.UPSTREAM, "sent a binary WebSocket message (the "
                               "Responses events are JSON text)", MALFORMED))
        self._socket.discard()
        return None


#: Queued by :class:`SocketStream`'s task when the HTTP stream serves the request.
_OVER_HTTP: Final = Heartbeat()


def _close_reason(exc: ConnectionClosed) -> str:
    frame = exc.rcvd or exc.sent
    return f"close code {frame.code}" if frame is not None else "no close frame"
