"""A scripted OpenAI-compatible upstream: every attempt gets the next entry of a script.

The gateway under test talks to this server over a real loopback socket, so every fault is a
real HTTP or TCP behaviour (a status with a body, a ``Retry-After`` header, an RST, a body
that stops, a silence), never a mock of tokenwire's own classes. The server runs in the same
``looptime`` event loop as the gateway and the client, so its sleeps ("the first token comes
after 40 s") are loop time and cost no real time.

``ScriptedUpstream(script)`` serves ``/v1/chat/completions``, ``/v1/completions`` (OpenAI Chat
/ Completions SSE, with vLLM's ``token_ids`` when the request asks ``return_token_ids``) and
``/v1/responses`` (the Responses SSE shape, for a ``kind = "responses"`` upstream), and
``GET /v1/models``. Attempt *n* (a POST to a generation route) gets ``script[n - 1]``; past
the end the last entry repeats (a persistent fault), or with ``cycle=True`` the script starts
over (a flapping upstream). :attr:`ScriptedUpstream.attempts` records each attempt's loop
time; :attr:`ScriptedUpstream.disconnects` counts requests whose client (the gateway) closed
the connection before the answer ended: an aborted stream, or an unanswered request given up.

The RST faults need the connection's socket, which ASGI does not expose: the server uses a
uvicorn ``H11Protocol`` subclass that files each transport under its peer address, the same
``(host, port)`` the ASGI scope names as ``client``.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["Attempt", "Fault", "QuietServer", "ScriptedUpstream", "closed_port", "serve_app"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

#: What the server pretends the prompt cost: reported in the usage chunk.
PROMPT_TOKENS = 5
#: Token ids start here, one id per text piece (vLLM's ``token_ids``), so a Codec client
#: sees ids that are obviously the script's.
FIRST_ID = 1000
#: "Forever" for a hang or a stall, in loop time: far past every deadline under test, and
#: still a finite timer so the loop's clock can jump over it.
FOREVER_S = 10 * 24 * 3600.0


@dataclass(frozen=True)
class Fault:
    """What one upstream attempt does. Build with the class methods; ``kind`` selects.

    ``text`` is answered in pieces split at spaces (one SSE chunk and one token id each);
    ``after`` is how many pieces go out before a mid-stream fault; ``delay_s`` is the silence
    before the first piece; ``gap_s`` the silence between pieces.
    """

    kind: str
    text: str = "Hello there, world"
    http_status: int = 200
    headers: tuple[tuple[str, str], ...] = ()
    body: Any = None
    after: int = 0
    delay_s: float = 0.0
    gap_s: float = 0.0
    finish_reason: str = "stop"

    @classmethod
    def ok(cls, text: str = "Hello there, world", *, delay_s: float = 0.0,
           gap_s: float = 0.0, finish_reason: str = "stop") -> Fault:
        """A whole answer: pieces, a ``finish_reason``, usage, ``[DONE]``."""
        return cls("ok", text=text, delay_s=delay_s, gap_s=gap_s, finish_reason=finish_reason)

    @classmethod
    def status(cls, status: int, *, retry_after: float | str | None = None,
               code: str | int | None = None, type: str | None = None,
               message: str | None = None, body: Any = None,
               extra: dict[str, Any] | None = None) -> Fault:
        """An HTTP error before any byte of a stream: ``{"error": {...}}`` (OpenAI's shape)
        unless ``body`` is given (bytes or a JSON value), with ``Retry-After`` when given."""
        if body is None:
            err: dict[str, Any] = {"message": message or f"scripted HTTP {status}",
                                   "type": type, "param": None, "code": code, **(extra or {})}
            body = {"error": err}
        headers = (("Retry-After", str(retry_after)),) if retry_after is not None else ()
        return cls("status", http_status=status, headers=headers, body=body)

    @classmethod
    def reset(cls) -> Fault:
        """The request is read, then the connection is reset (RST, SO_LINGER 0)."""
        return cls("reset")

    @classmethod
    def hang(cls) -> Fault:
        """The request is read and never answered."""
        return cls("hang")

    @classmethod
    def cut(cls, text: str = "Hello there, world", *, after: int = 2) -> Fault:
        """``after`` pieces, then the connection closes mid-body (no last chunk, no
        ``finish_reason``, no ``[DONE]``)."""
        return cls("cut", text=text, after=after)

    @classmethod
    def stall(cls, text: str = "Hello there, world", *, after: int = 2) -> Fault:
        """``after`` pieces, then silence with the connection open."""
        return cls("stall", text=text, after=after)

    @classmethod
    def malformed(cls, *, after: int = 0) -> Fault:
        """``after`` good pieces, then a ``data:`` line that is not JSON."""
        return cls("malformed", after=after)

    @classmethod
    def bad_framing(cls, *, after: int = 0) -> Fault:
        """``after`` good pieces, then a chunk-size line that is not hex, written on the
        socket under the server's own chunked framing, and the connection closed."""
        return cls("bad_framing", after=after)

    @classmethod
    def no_terminal(cls, text: str = "Hello there, world", *, after: int | None = None) -> Fault:
        """``after`` pieces (all by default), then a clean end of the body: no
        ``finish_reason``, no ``[DONE]``."""
        pieces = len(_pieces(text))
        return cls("no_terminal", text=text, after=pieces if after is None else after)

    @classmethod
    def stream_error(cls, error: dict[str, Any], *, after: int = 0) -> Fault:
        """``after`` pieces, then ``data: {"error": ...}`` (vLLM's mid-stream error; on the
        Responses route a ``response.failed`` carrying it) and the end of the body."""
        return cls("stream_error", body={"error": error}, after=after)


@dataclass(frozen=True)
class Attempt:
    """One generation request as the upstream saw it."""

    index: int  # 1-based
    path: str
    at: float  # loop time when its request arrived
    fault: str
    body: Any = None


def _pieces(text: str) -> list[str]:
    words = text.split(" ")
    return [w if i == 0 else " " + w for i, w in enumerate(words)] if text else []


class _PeerRegistry:
    """Transports by peer address, filled by :class:`_RegisteringProtocol`."""

    def __init__(self) -> None:
        self.by_peer: dict[tuple[str, int], asyncio.Transport] = {}


def _protocol_class(registry: _PeerRegistry) -> type[H11Protocol]:
    class _RegisteringProtocol(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if self.client is not None:
                registry.by_peer[self.client] = transport

        def connection_lost(self, exc: Exception | None) -> None:
            if self.client is not None:
                registry.by_peer.pop(self.client, None)
            super().connection_lost(exc)

    return _RegisteringProtocol


def _rst(transport: asyncio.Transport) -> None:
    """Close with SO_LINGER 0: the kernel sends RST instead of FIN."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


@dataclass
class ScriptedUpstream:
    """The scripted server's behaviour and what it saw (see the module docstring)."""

    script: list[Fault]
    cycle: bool = False
    model: str = "m"
    #: The first token id and the prompt count it reports: a fallback upstream gets others,
    #: so a client's answer shows whose it is.
    first_id: int = FIRST_ID
    prompt_tokens: int = PROMPT_TOKENS
    attempts: list[Attempt] = field(default_factory=list)
    disconnects: int = 0
    #: Set at teardown: every hang and stall returns, so the server can shut down.
    released: asyncio.Event = field(default_factory=asyncio.Event)
    _peers: _PeerRegistry = field(default_factory=_PeerRegistry)

    def next_fault(self) -> Fault:
        n = len(self.attempts)
        if self.cycle:
            return self.script[n % len(self.script)]
        return self.script[min(n, len(self.script) - 1)]

    @property
    def attempt_times(self) -> list[float]:
        return [a.at for a in self.attempts]

    def app(self) -> Starlette:
        return Starlette(routes=[
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/v1/chat/completions", _Generate(self, "chat"), methods=["POST"]),
            Route("/v1/completions", _Generate(self, "completions"), methods=["POST"]),
            Route("/v1/responses", _Generate(self, "responses"), methods=["POST"]),
        ])

    def protocol_class(self) -> type[H11Protocol]:
        return _protocol_class(self._peers)

    async def _models(self, request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [
            {"id": self.model, "object": "model", "owned_by": "vllm"}]})


class _Generate:
    """One generation route as a plain ASGI app: it owns every byte it sends."""

    def __init__(self, up: ScriptedUpstream, api: str) -> None:
        self.up, self.api = up, api

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = await Request(scope, receive).body()
        body = json.loads(raw or b"{}")
        fault = self.up.next_fault()
        loop = asyncio.get_running_loop()
        self.up.attempts.append(Attempt(index=len(self.up.attempts) + 1, path=scope["path"],
                                        at=loop.time(), fault=fault.kind, body=body))
        if fault.kind == "reset":
            _rst(self.up._peers.by_peer[tuple(scope["client"])])
            return
        if fault.kind == "hang":
            await self._wait_forever(receive)
            return
        if fault.kind == "status":
            data = fault.body if isinstance(fault.body, bytes) else json.dumps(
                fault.body).encode()
            await send({"type": "http.response.start", "status": fault.http_status, "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
                *((k.lower().encode(), v.encode()) for k, v in fault.headers)]})
            await send({"type": "http.response.body", "body": data})
            return
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
        watcher = loop.create_task(self._watch(receive))
        try:
            await self._stream(scope, send, fault, body)
        finally:
            watcher.cancel()

    async def _watch(self, receive: Receive) -> None:
        """Counts a client that went away while the stream was open."""
        while (await receive())["type"] != "http.disconnect":
            pass
        self.up.disconnects += 1

    async def _wait_forever(self, receive: Receive) -> None:
        """Hold the request unanswered until teardown (or the client leaves)."""
        gone = asyncio.ensure_future(self._watch(receive))
        released = asyncio.ensure_future(self.up.released.wait())
        try:
            await asyncio.wait({gone, released}, timeout=FOREVER_S,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            released.cancel()

    async def _stream(self, scope: Scope, send: Send, fault: Fault, body: Any) -> None:
        pieces = _pieces(fault.text)
        want_ids = bool(body.get("return_token_ids"))
        head = pieces[:fault.after] if fault.kind != "ok" else pieces
        if fault.delay_s:
            await asyncio.sleep(fault.delay_s)
        if self.api == "responses":
            await self._responses_head(send)
        for i, piece in enumerate(head):
            if i and fault.gap_s:
                await asyncio.sleep(fault.gap_s)
            await self._data(send, self._piece(piece, i, want_ids))
        match fault.kind:
            case "ok":
                await self._finish(send, fault, len(pieces))
                return
            case "cut":
                transport = self.up._peers.by_peer.get(tuple(scope["client"]))
                if transport is not None:
                    transport.close()  # FIN mid-body: the chunked body never ends
                return
            case "stall":
                await self._hold()
                return
            case "malformed":
                await self._raw(send, b'data: {"choices": [{"delta": {"content": "x"\n\n')
            case "bad_framing":
                transport = self.up._peers.by_peer.get(tuple(scope["client"]))
                if transport is not None:
                    transport.write(b"zz\r\ndata: x\r\n")
                    transport.close()
                return
            case "stream_error" if self.api == "responses":
                await self._data(send, {"type": "response.failed", "response": {
                    "id": "resp_up", "object": "response", "status": "failed",
                    "output": [], **fault.body}})
            case "stream_error":
                await self._data(send, fault.body)
            case "no_terminal":
                pass
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _hold(self) -> None:
        try:
            await asyncio.wait_for(self.up.released.wait(), FOREVER_S)
        except TimeoutError:
            pass

    # -- wire shapes -------------------------------------------------------------------------

    def _piece(self, piece: str, i: int, want_ids: bool) -> dict[str, Any]:
        if self.api == "responses":
            return {"type": "response.output_text.delta", "item_id": "msg_1",
                    "output_index": 0, "content_index": 0, "delta": piece}
        choice: dict[str, Any] = {"index": 0, "finish_reason": None}
        if self.api == "chat":
            choice["delta"] = {"role": "assistant", "content": piece} if i == 0 else {
                "content": piece}
        else:
            choice["text"] = piece
        if want_ids:
            choice["token_ids"] = [self.up.first_id + i]
        return {"id": "scripted", "object": "chunk", "model": self.up.model,
                "choices": [choice]}

    async def _finish(self, send: Send, fault: Fault, n: int) -> None:
        if self.api == "responses":
            await self._data(send, {"type": "response.completed", "response": {
                "id": "resp_up", "object": "response", "status": "completed",
                "output": [], "usage": {"input_tokens": self.up.prompt_tokens,
                                        "output_tokens": n,
                                        "total_tokens": self.up.prompt_tokens + n}}})
        else:
            choice: dict[str, Any] = {"index": 0, "finish_reason": fault.finish_reason}
            choice["delta" if self.api == "chat" else "text"] = {} if self.api == "chat" else ""
            await self._data(send, {"id": "scripted", "object": "chunk", "choices": [choice]})
            await self._data(send, {"id": "scripted", "object": "chunk", "choices": [],
                                    "usage": {"prompt_tokens": self.up.prompt_tokens,
                                              "completion_tokens": n,
                                              "total_tokens": self.up.prompt_tokens + n}})
            await self._raw(send, b"data: [DONE]\n\n")
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _responses_head(self, send: Send) -> None:
        await self._data(send, {"type": "response.created", "response": {
            "id": "resp_up", "object": "response", "status": "in_progress", "output": []}})

    async def _data(self, send: Send, obj: Any) -> None:
        event = obj.get("type") if self.api == "responses" and isinstance(obj, dict) else None
        head = f"event: {event}\n".encode() if event else b""
        await self._raw(send, head + b"data: " + json.dumps(obj).encode() + b"\n\n")

    @staticmethod
    async def _raw(send: Send, data: bytes) -> None:
        await send({"type": "http.response.body", "body": data, "more_body": True})


# -- serving ---------------------------------------------------------------------------------


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed): connecting is refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class QuietServer(uvicorn.Server):
    """uvicorn without its 0.1 s housekeeping tick (the Date header, exit polling).

    Under looptime every timer is a stop for the clock: ten ticks per loop second per server
    made a 600 s scenario cost seconds of real time. This server waits for :meth:`stop`
    instead (``should_exit`` alone is not watched)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._stopped = asyncio.Event()

    async def main_loop(self) -> None:
        await self.on_tick(0)  # the Date header, once
        await self._stopped.wait()

    def stop(self) -> None:
        self.should_exit = True
        self._stopped.set()


async def serve_app(app: Any, *, http: Any = "h11") -> tuple[QuietServer, asyncio.Task[None],
                                                             int]:
    """Serve ``app`` with uvicorn in the running loop on a free loopback port."""
    # IPPROTO_TCP named explicitly: asyncio sets TCP_NODELAY only on sockets whose ``proto``
    # is TCP, and accepted sockets inherit it. With proto 0, Nagle holds each small write of
    # a kept-alive connection for the peer's delayed ACK (~40 ms of real time), during which
    # looptime moves the clock on in steps of uvicorn's 0.1 s tick timer: seconds of
    # phantom loop time in every measurement.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = int(sock.getsockname()[1])
    config = uvicorn.Config(app, log_level="critical", lifespan="off", http=http,
                            timeout_graceful_shutdown=1, timeout_keep_alive=3600)
    server = QuietServer(config)
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError("uvicorn exited before it started")
        await asyncio.sleep(0.01)
    return server, task, port
