"""A small round-robin HTTP/1.1 load balancer for several gateway instances on one machine.

It stands where nginx, HAProxy or a cloud balancer stands in a real deployment (README
"Deployment: several instances"), and behaves as they do on the points the gateway's
clients can see:

* **per request, not per connection**: each request of a keep-alive client connection goes
  to the next instance in turn (the openai SDK and Codex keep one connection for a whole
  session; a per-connection balancer would keep every turn on one instance);
* **streams pass through unbuffered**: each body chunk the instance sends is written to
  the client as it arrives (with the socket's back-pressure), never collected;
* **status, headers and trailers are the instance's** (minus hop-by-hop headers, RFC 9110
  §7.6.1), plus ``x-tokenwire-instance`` naming the instance that answered;
* **a cut stays a cut**: when an instance's connection ends before its response does (a
  crash, a SIGKILL), the client's connection is aborted, so a client sees a broken stream,
  never a short body presented as complete; when the client goes away, the instance's
  connection is closed, so the gateway cancels the generation: at once when the request
  was not complete yet, else at the first write that fails (a client that shuts down its
  write side once its request is sent, a half-close, still gets the whole response, as
  HAProxy's default does; TCP cannot tell it from a client that left until a write is
  answered with a reset, and the gateway's streams write heartbeats);
* **WebSocket pass-through**: an ``Upgrade`` request is forwarded, and after the
  instance's ``101`` the two sockets are spliced byte for byte (the Responses API's
  WebSocket transport);
* an instance that refuses the connection is skipped (the next one is tried, as a passive
  health check would); when none accepts, ``502`` in the OpenAI error shape.

HTTP/1.1 is parsed by ``h11`` (a sans-IO state machine, already a dependency through
uvicorn); each request opens its own connection to the instance (``Connection: close``):
no pooling to get wrong, and a loopback connect costs tens of microseconds.

The gateway instances see every request as coming from the balancer's address (loopback):
without API keys they admit loopback clients keyless, so a balancer listening on another
address must sit in front of instances that have keys (the launcher refuses otherwise).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import h11

__all__ = ["CONNECT_TIMEOUT_S", "IDLE_TIMEOUT_S", "INSTANCE_HEADER", "MAX_HEAD_BYTES",
           "Backend", "Balancer"]

log = logging.getLogger(__name__)

#: Header naming the instance that answered (``host:port``): the demo shows the rotation,
#: and tests check which instance served which turn.
INSTANCE_HEADER = "x-tokenwire-instance"
#: A request or response head larger than this is refused (431 for a client's). The
#: gateway's own cap is far below (its head limit); nginx's default buffers are 8-32 KiB.
MAX_HEAD_BYTES = 64 * 1024
#: Reads are at most this large; each one is forwarded as it comes.
READ_SIZE = 64 * 1024
#: A loopback instance accepts in microseconds; one that does not within 5 s is skipped.
CONNECT_TIMEOUT_S = 5.0
#: A client connection with no request in flight is closed after this (nginx's keepalive
#: timeout is 75 s); a request in flight has no timeout here: the gateway's own idle
#: timeout and heartbeats govern long streams.
IDLE_TIMEOUT_S = 75.0
#: Hop-by-hop headers (RFC 9110 §7.6.1), never forwarded; framing (content-length,
#: transfer-encoding) is kept, so h11 frames each hop the way the sender did.
_HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"te",
                         b"trailer", b"upgrade", b"proxy-authenticate",
                         b"proxy-authorization"})


@dataclass
class Backend:
    """One gateway instance, and how many requests it was given."""

    host: str
    port: int
    requests: int = 0

    @property
    def name(self) -> str:
        return f"{self.host}:{self.port}"


class _Cut(Exception):
    """The instance's connection ended before its response did."""


@dataclass
class _Switch:
    """The instance answered ``101 Switching Protocols``."""

    response: h11.InformationalResponse


@dataclass
class Balancer:
    """Round-robin over ``backends``; :meth:`start` listens, :meth:`aclose` stops."""

    backends: Sequence[Backend]
    host: str = "127.0.0.1"
    port: int = 0
    _server: asyncio.Server | None = None
    _turn: itertools.count = field(default_factory=itertools.count)
    _clients: set[asyncio.Task] = field(default_factory=set)

    async def start(self) -> int:
        """Listen; returns the port (``port=0`` picks a free one)."""
        self._server = await asyncio.start_server(self._serve_client, self.host, self.port,
                                                  limit=MAX_HEAD_BYTES)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._clients):
                task.cancel()
            await asyncio.gather(*self._clients, return_exceptions=True)
            await self._server.wait_closed()

    # -- one client connection -------------------------------------------------------------

    async def _serve_client(self, reader: asyncio.StreamReader,
                            writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._clients.add(task)
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        try:
            while await self._one_request(conn, reader, writer):
                conn.start_next_cycle()
        except (h11.ProtocolError, OSError, TimeoutError, asyncio.IncompleteReadError):
            writer.transport.abort()
        except asyncio.CancelledError:  # aclose(): this task is the balancer's own
            writer.transport.abort()
        finally:
            self._clients.discard(task)
            writer.close()

    async def _one_request(self, conn: h11.Connection, reader: asyncio.StreamReader,
                           writer: asyncio.StreamWriter) -> bool:
        """Proxy one request; True when the client connection may carry another."""
        try:
            event = await asyncio.wait_for(_next_event(conn, reader), IDLE_TIMEOUT_S)
        except h11.RemoteProtocolError as exc:
            if conn.our_state is h11.SEND_RESPONSE or conn.our_state is h11.IDLE:
                await _send_error(conn, writer, exc.error_status_hint, "invalid_request",
                                  f"bad request: {exc}")
            return False
        if not isinstance(event, h11.Request):
            return False  # ConnectionClosed, or an idle client that went away
        opened = await self._connect()
        if opened is None:
            await _drain_body(conn, reader)
            await _send_error(conn, writer, 502, "no_instance",
                              "no gateway instance accepted the connection")
            return _reusable(conn)
        backend, (b_reader, b_writer) = opened
        try:
            return await self._exchange(conn, reader, writer, event, backend, b_reader,
                                        b_writer)
        finally:
            b_writer.transport.abort()

    async def _connect(self) -> tuple[Backend, tuple[asyncio.StreamReader,
                                                     asyncio.StreamWriter]] | None:
        """The next instance in turn that accepts a connection (None: none does)."""
        start = next(self._turn)
        for i in range(len(self.backends)):
            backend = self.backends[(start + i) % len(self.backends)]
            try:
                pair = await asyncio.wait_for(
                    asyncio.open_connection(backend.host, backend.port, limit=READ_SIZE),
                    CONNECT_TIMEOUT_S)
            except (OSError, TimeoutError):
                log.warning("instance %s refused the connection: trying the next",
                            backend.name)
                continue
            backend.requests += 1
            return backend, pair
        return None

    async def _exchange(self, conn: h11.Connection, reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter, request: h11.Request, backend: Backend,
                        b_reader: asyncio.StreamReader, b_writer: asyncio.StreamWriter
                        ) -> bool:
        upgrade = _is_upgrade(request.headers)
        b_conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)
        b_writer.write(b_conn.send(h11.Request(
            method=request.method, target=request.target,
            headers=_forwarded_request_headers(request.headers, upgrade=upgrade),
            http_version="1.1")) or b"")
        upload = asyncio.create_task(_upload(conn, reader, b_conn, b_writer))
        download = asyncio.create_task(_download(conn, writer, b_conn, b_reader, backend))
        try:
            done, _ = await asyncio.wait({upload, download},
                                         return_when=asyncio.FIRST_COMPLETED)
            if download not in done:
                if await _client_broke_off(conn, writer, upload):
                    return False
                if conn.their_state is not h11.DONE:
                    return False  # the client went away before its request was complete
                # EOF after a whole request: a half-close, or a client that left; only a
                # write can tell them apart, so the response goes on (a gone client fails
                # the next write, the gateway's heartbeats included).
                result = await download
            else:
                result = download.result()
        except (_Cut, h11.RemoteProtocolError, OSError):
            if conn.our_state is h11.SEND_RESPONSE:  # nothing sent yet: say so
                await _send_error(conn, writer, 502, "instance_failed",
                                  f"gateway instance {backend.name} failed before answering")
                return False
            writer.transport.abort()  # mid-response: the client must see a cut
            return False
        finally:
            for task in (upload, download):
                task.cancel()
            await asyncio.gather(upload, download, return_exceptions=True)
        if isinstance(result, _Switch):
            await _splice(conn, reader, writer, b_conn, b_reader, b_writer, result.response)
            return False
        return _reusable(conn)


async def _client_broke_off(conn: h11.Connection, writer: asyncio.StreamWriter,
                            upload: asyncio.Task[None]) -> bool:
    """Whether the upload ended on the client's fault (its body shorter than it said, or
    not HTTP): then it has its 400 (or, mid-response, a cut) and the exchange is over.
    Errors of the instance's side are re-raised."""
    try:
        upload.result()
    except h11.RemoteProtocolError as exc:  # ``conn`` is the client's side
        if conn.our_state is h11.SEND_RESPONSE:
            await _send_error(conn, writer, 400, "incomplete_request", f"bad request: {exc}")
        else:
            writer.transport.abort()
        return True
    return False


# -- the two directions of one exchange ----------------------------------------------------


async def _next_event(conn: h11.Connection, reader: asyncio.StreamReader) -> object:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        conn.receive_data(await reader.read(READ_SIZE))


async def _upload(conn: h11.Connection, reader: asyncio.StreamReader, b_conn: h11.Connection,
                  b_writer: asyncio.StreamWriter) -> None:
    """Forward the request body; then watch the client: returns at its EOF (any bytes it
    sends meanwhile are the next pipelined request, kept in ``conn``), or once a head's
    worth is kept: the rest waits in the socket (TCP back-pressure) until the response is
    done, so a client sending while a long stream comes back cannot grow our memory."""
    while True:
        event = await _next_event(conn, reader)
        if isinstance(event, h11.Data):
            b_writer.write(b_conn.send(h11.Data(data=event.data)) or b"")
            await b_writer.drain()
        elif isinstance(event, h11.EndOfMessage):
            b_writer.write(b_conn.send(h11.EndOfMessage()) or b"")
            await b_writer.drain()
            break
        elif isinstance(event, h11.ConnectionClosed):
            return
    kept = 0
    while kept < MAX_HEAD_BYTES:
        data = await reader.read(READ_SIZE)
        conn.receive_data(data)  # b"": no next request on this connection
        if not data:
            return
        kept += len(data)


async def _download(conn: h11.Connection, writer: asyncio.StreamWriter, b_conn: h11.Connection,
                    b_reader: asyncio.StreamReader, backend: Backend) -> _Switch | None:
    """Forward the instance's response as it arrives; raises :class:`_Cut` (or h11's
    error) when the instance's connection ends before the response does."""
    while True:
        event = await _next_event(b_conn, b_reader)
        if isinstance(event, h11.InformationalResponse):
            if event.status_code == 101:
                return _Switch(event)
            writer.write(conn.send(h11.InformationalResponse(
                status_code=event.status_code, headers=_end_to_end(event.headers),
                reason=event.reason)) or b"")
        elif isinstance(event, h11.Response):
            headers = [*_end_to_end(event.headers),
                       (INSTANCE_HEADER.encode(), backend.name.encode())]
            writer.write(conn.send(h11.Response(status_code=event.status_code,
                                                headers=headers, reason=event.reason)) or b"")
        elif isinstance(event, h11.Data):
            writer.write(conn.send(h11.Data(data=event.data)) or b"")
            await writer.drain()
        elif isinstance(event, h11.EndOfMessage):
            writer.write(conn.send(h11.EndOfMessage(headers=event.headers)) or b"")
            await writer.drain()
            return None
        else:  # ConnectionClosed, PAUSED: the response did not end properly
            raise _Cut(backend.name)


async def _splice(conn: h11.Connection, reader: asyncio.StreamReader,
                  writer: asyncio.StreamWriter, b_conn: h11.Connection,
                  b_reader: asyncio.StreamReader, b_writer: asyncio.StreamWriter,
                  response: h11.InformationalResponse) -> None:
    """After ``101``: the client and the instance talk directly, byte for byte."""
    headers = [(k, v) for k, v in response.headers if k != b"connection"]
    writer.write(conn.send(h11.InformationalResponse(
        status_code=101, headers=[*headers, (b"connection", b"upgrade")],
        reason=response.reason)) or b"")
    client_rest, _ = conn.trailing_data
    backend_rest, _ = b_conn.trailing_data
    if client_rest:
        b_writer.write(client_rest)
    if backend_rest:
        writer.write(backend_rest)

    async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        while data := await src.read(READ_SIZE):
            dst.write(data)
            await dst.drain()

    tasks = [asyncio.create_task(pipe(reader, b_writer)),
             asyncio.create_task(pipe(b_reader, writer))]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# -- helpers -------------------------------------------------------------------------------


def _connection_tokens(headers: Sequence[tuple[bytes, bytes]]) -> set[bytes]:
    return {t.strip().lower() for k, v in headers if k == b"connection" for t in v.split(b",")}


def _is_upgrade(headers: Sequence[tuple[bytes, bytes]]) -> bool:
    return b"upgrade" in _connection_tokens(headers) and any(k == b"upgrade" for k, _ in headers)


def _end_to_end(headers: Sequence[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    named = _connection_tokens(headers)
    return [(k, v) for k, v in headers if k not in _HOP_BY_HOP and k not in named]


def _forwarded_request_headers(headers: Sequence[tuple[bytes, bytes]], *, upgrade: bool
                               ) -> list[tuple[bytes, bytes]]:
    out = _end_to_end(headers)
    if upgrade:
        out += [(k, v) for k, v in headers if k == b"upgrade"]
        out.append((b"connection", b"upgrade"))
    else:
        out.append((b"connection", b"close"))
    return out


def _reusable(conn: h11.Connection) -> bool:
    return conn.our_state is h11.DONE and conn.their_state is h11.DONE


async def _drain_body(conn: h11.Connection, reader: asyncio.StreamReader) -> None:
    """Read (and drop) the rest of a request that will not be forwarded."""
    with contextlib.suppress(h11.ProtocolError, OSError):
        while conn.their_state is h11.SEND_BODY:
            event = await _next_event(conn, reader)
            if isinstance(event, h11.ConnectionClosed):
                return


async def _send_error(conn: h11.Connection, writer: asyncio.StreamWriter, status: int,
                      code: str, message: str) -> None:
    """An answer of the balancer's own, in the OpenAI error shape."""
    body = json.dumps({"error": {"message": message, "type": "server_error"
                                 if status >= 500 else "invalid_request_error",
                                 "param": None, "code": code}}).encode()
    with contextlib.suppress(h11.ProtocolError, OSError):
        writer.write(conn.send(h11.Response(status_code=status, headers=[
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close")])) or b"")
        writer.write(conn.send(h11.Data(data=body)) or b"")
        writer.write(conn.send(h11.EndOfMessage()) or b"")
        await writer.drain()
