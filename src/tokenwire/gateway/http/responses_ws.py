"""``GET /v1/responses`` over WebSocket: the Responses API on the Codex CLI's own transport.

Codex (``codex-rs/codex-api/src/endpoint/responses_websocket.rs``) opens one socket per
session (``OpenAI-Beta: responses_websockets=2026-02-06`` on the upgrade, its usual
``Authorization``), then sends one ``response.create`` text message per turn and reads the
ordinary Responses events as JSON text messages until ``response.completed`` (or
``response.failed`` / ``response.incomplete``). On a 426 it falls back to HTTP at once. The
upgrade has already passed :class:`~.security.SecurityMiddleware` (target, Origin, key); here
it must also pass the socket caps and the capacity rule (a 429 when no request could be
admitted right now), each refused with a JSON body and ``Retry-After`` before the handshake.

Each ``response.create`` is one request, exactly as a ``POST /v1/responses`` with
``stream: true`` (:func:`~.responses_routes.prepare_response`, the same renderer framed as
bare JSON, :func:`~.responses_routes.stream_events`): its own admission ticket, deadlines,
heartbeats, retries, metrics and log line, so an idle socket holds no capacity; and its own
per-key limits check (``http/limits.py``: a 429 ``error`` with ``rate_limit_exceeded``).
One response runs at a time per socket; a second ``response.create`` meanwhile is a 409 ``error``. A
failure before the response starts is ``{"type": "error", "status": N, "error": {...}}``
with the HTTP path's status and code (Codex maps it as it maps that HTTP error); after it
started, ``response.failed``, as on SSE. ``generate: false`` is a warm-up: validated and
remembered, answered with an empty created / in_progress / completed lifecycle, no model run.

The socket remembers its last completed response (:class:`~.ws_session.SocketMemory`), so
Codex's ``previous_response_id`` with only the new ``input`` items works with ``store:
false``; the turn state is remembered too and sent with the next turn (Codex echoes it in
``client_metadata``). The upgrade response carries ``x-codex-turn-state`` (Codex reads it
there, ``responses_websocket.rs``, and replays it when it reconnects within the turn): the
one the client sent, when this gateway signed it, else, when the default model is served
by a replica pool, a token naming the replica chosen for the socket now
(:func:`upgrade_turn_state`), so every turn of the socket goes there while it is up.
Codex's other upgrade headers are not sent: Codex replays them at the start of every response
on the socket (``codex-rs/core``), as the model that served it (``openai-model``: a mismatch
with the requested model is a "rerouted" warning), its catalog version (``x-models-etag``:
a new one refetches a catalog we do not serve) and "usage counts the reasoning items"
(``x-reasoning-included``); none is known when the socket opens, since each
``response.create`` may reach another model and upstream.

Limits and close codes: :mod:`.ws_session`. On shutdown every session drains like an HTTP
stream: an idle one closes (1001) at once, a busy one after its response (which the grace
period may end with ``server_shutting_down``).

Upstreams: every turn is translated to the routed upstream's own API, as ``POST`` does; a
Responses upstream with ``websocket = true`` instead gets one upstream WebSocket held for this
socket (``upstreams/responses_socket.py``), reached through the request's
:class:`~tokenwire.gateway.ir.ClientConnection`, which closes with this socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from starlette.responses import Response
from starlette.websockets import WebSocket, WebSocketDisconnect

from tokenwire.errors import CompactionRefused, TokenwireError
from tokenwire.gateway.affinity import (
    TURN_STATE_HEADER,
    affinity_hints,
    read_turn_state,
    replica_token,
)
from tokenwire.gateway.apis.errors import error_object
from tokenwire.gateway.apis.responses_render import ResponsesRenderer, new_response_id
from tokenwire.gateway.apis.sse import json_bytes
from tokenwire.gateway.http.errors import error_parts
from tokenwire.gateway.http.limits import end_lease, key_of, limited_message, start_lease
from tokenwire.gateway.http.requests import INLINE_BODY_BYTES, decode_json
from tokenwire.gateway.http.responses_get import response_store_of
from tokenwire.gateway.http.responses_head import open_stream
from tokenwire.gateway.http.responses_routes import (
    final_saver,
    prepare_response,
    refused_stream,
    store_hook,
    stream_events,
)
from tokenwire.gateway.http.shutdown import shutdown_failure
from tokenwire.gateway.http.state import GatewayState
from tokenwire.gateway.http.ws_session import (
    CLOSE_GOING_AWAY,
    CLOSE_NORMAL,
    CONNECTION_LIMIT_CODE,
    CONNECTION_LIMIT_MESSAGE,
    Create,
    Refusal,
    SessionClock,
    SocketMemory,
    parse_message,
)
from tokenwire.gateway.ir import (
    ClientConnection,
    EventStream,
    Finish,
    FinishKind,
    GenerationRequest,
    PromptText,
)
from tokenwire.gateway.state.key_limiter import Lease
from tokenwire.gateway.supervision.admission import RETRY_AFTER_S

__all__ = ["MAX_MESSAGE_HEADER", "responses_socket", "upgrade_turn_state"]

log = logging.getLogger(__name__)

#: Newer Codex builds read this upgrade header as the largest message the server takes.
MAX_MESSAGE_HEADER = "x-codex-websocket-max-message-bytes"
_BUSY_MESSAGE = "The gateway is at capacity; retry shortly."
_SOCKETS_MESSAGE = {429: "Too many open Responses WebSockets from this address; retry "
                         "shortly or use HTTP.",
                    503: "The server has no free Responses WebSocket slot; retry shortly or "
                         "use HTTP."}
#: A warm-up's terminal: an empty, completed response.
_WARM_UP_END = Finish(reason=FinishKind.EOS)
_IDLE_REASON = "idle timeout"
_SHUTDOWN_REASON = "server shutting down"


def _denial(status: int, code: str, message: str) -> Response:
    type_ = "rate_limit_error" if status == 429 else "server_error"
    body = {"error": {"message": message, "type": type_, "param": None, "code": code}}
    return Response(json_bytes(body), status_code=status, media_type="application/json",
                    headers={"Retry-After": str(RETRY_AFTER_S), "Connection": "close"})


def upgrade_turn_state(state: GatewayState, headers: dict[str, str]) -> str | None:
    """The ``x-codex-turn-state`` of an upgrade response (module docstring), or None."""
    sent = headers.get(TURN_STATE_HEADER)
    if sent is not None and read_turn_state(sent) is not None:
        return sent
    default = state.router.default
    pool = getattr(default.upstream, "replicas", None) and default.upstream if default else None
    if pool is None:
        return None
    hints = affinity_hints({}, headers)
    choice = pool.choose(GenerationRequest(prompt=PromptText(text=""), affinity=hints))
    return replica_token(choice.replica.name) if choice.replica is not None else None


async def responses_socket(websocket: WebSocket) -> None:
    """The WebSocket route: socket caps and the capacity rule, then one :class:`_Session`."""
    state: GatewayState = websocket.app.state.gateway
    client = websocket.client
    address = client.host if client is not None else "?"
    refused = state.ws_sockets.open(address)
    if refused is not None:
        state.observability.rejected(api="responses", status=refused, reason="ws_sockets")
        await websocket.send_denial_response(_denial(refused, "too_many_connections"
                                                     if refused == 429 else "server_busy",
                                                     _SOCKETS_MESSAGE[refused]))
        return
    try:
        probe = state.admission.reserve(anyio.current_time())
        if probe is None:  # the rule every POST meets: no request could be admitted now
            state.observability.rejected(api="responses", status=429, reason="queue_full")
            await websocket.send_denial_response(
                _denial(429, "rate_limit_exceeded", _BUSY_MESSAGE))
            return
        probe.release()  # an idle socket holds no capacity: each response.create takes one
        await _Session(state, websocket).run()
    finally:
        state.ws_sockets.close(address)


class _Session:
    """One accepted socket: a reader loop and at most one running response."""

    def __init__(self, state: GatewayState, websocket: WebSocket) -> None:
        self.state, self.ws = state, websocket
        settings = state.settings
        self.max_bytes = settings.max_body_bytes
        self.clock = SessionClock(opened_at=anyio.current_time(),
                                  idle_timeout_s=settings.ws_idle_timeout_s,
                                  cap_s=settings.ws_session_cap_s)
        #: The upgrade's key's view of the store: every turn reads and writes through it.
        self.store = response_store_of(websocket)
        self.memory = SocketMemory(self.store, budget=state.ws_memory)
        self.headers = {k.lower(): v for k, v in websocket.headers.items()}
        #: The turn state of the socket's next turn: the upgrade's, then each response's.
        self.turn_state = upgrade_turn_state(state, self.headers)
        self.busy = False
        self.draining = False
        self.stream: EventStream | None = None
        self._wait: anyio.CancelScope | None = None
        self.session_id = new_response_id().replace("resp_", "ws_", 1)
        #: What upstreams keep for this socket (an upstream WebSocket): closed with it.
        self.connection = ClientConnection(note=state.observability.upstream_socket)

    async def run(self) -> None:
        headers = [(b"x-request-id", self.session_id.encode()),
                   (MAX_MESSAGE_HEADER.encode(), str(self.max_bytes).encode())]
        if self.turn_state is not None:
            headers.append((TURN_STATE_HEADER.encode(), self.turn_state.encode()))
        await self.ws.accept(headers=headers)
        self.state.ws_sessions.add(self)
        try:
            async with anyio.create_task_group() as tg:
                try:
                    await self._read(tg)
                finally:
                    if self.stream is not None:  # the client left mid-response: stop it
                        self.stream.cancel()
                    tg.cancel_scope.cancel()
        except (WebSocketDisconnect, OSError):
            pass  # the peer went away while we were sending: nothing more to tell it
        finally:
            self.state.ws_sessions.discard(self)
            self.memory.forget()  # its bytes back to every socket's budget
            with anyio.CancelScope(shield=True):  # bounded: CLOSE_TIMEOUT_S per socket
                await self.connection.aclose()  # the upstream sockets held for this one

    def drain(self) -> None:
        """Graceful shutdown: take no new response; close once the running one ended."""
        self.draining = True
        self._wake()

    def _wake(self) -> None:
        if self._wait is not None:
            self._wait.cancel()

    # -- reading ---------------------------------------------------------------------------

    async def _read(self, tg: anyio.abc.TaskGroup) -> None:
        while True:
            now = anyio.current_time()
            if not self.busy:
                if self.draining:
                    await self.ws.close(CLOSE_GOING_AWAY, _SHUTDOWN_REASON)
                    return
                if self.clock.wait_budget(now) <= 0:
                    capped = self.clock.capped(now) and not self.clock.over_cap
                    await self.ws.close(CLOSE_NORMAL, CONNECTION_LIMIT_MESSAGE if capped
                                        else _IDLE_REASON)
                    return
            message = None
            with anyio.CancelScope() as scope:
                self._wait = scope
                if not self.busy:
                    scope.deadline = now + self.clock.wait_budget(now)
                message = await self.ws.receive()
            self._wait = None
            if message is None:
                continue  # a deadline, the end of a response or a drain: look again
            if message["type"] == "websocket.disconnect":
                return
            if not await self._on_message(message, tg):
                return

    async def _on_message(self, message: dict[str, Any], tg: anyio.abc.TaskGroup) -> bool:
        """Handle one client message; False when the socket was closed."""
        text, data = message.get("text"), message.get("bytes")
        # A message of megabytes is decoded and re-encoded on a worker thread, as an HTTP
        # body is (http/requests.read_parsed): on the loop it held every other client.
        parsed = (await asyncio.to_thread(parse_message, text, data, max_bytes=self.max_bytes,
                                          decode=decode_json)
                  if text is not None and len(text) > INLINE_BODY_BYTES else
                  parse_message(text, data, max_bytes=self.max_bytes, decode=decode_json))
        if isinstance(parsed, Refusal):
            self._rejected(parsed.status, parsed.code)
            await self._error(parsed.status, parsed.code, parsed.message, parsed.param)
            if parsed.close_code is not None:
                await self.ws.close(parsed.close_code, parsed.code)
                return False
            return True
        if self.busy:
            self._rejected(409, "response_in_progress")
            await self._error(409, "response_in_progress", "a response is already running on "
                              "this socket; send the next response.create after its "
                              "terminal event")
            return True
        if self.draining:
            failure = shutdown_failure()
            await self._error(503, failure.code or "server_shutting_down", failure.message)
            await self.ws.close(CLOSE_GOING_AWAY, _SHUTDOWN_REASON)
            return False
        if self.clock.capped(anyio.current_time()):
            await self._error(400, CONNECTION_LIMIT_CODE, CONNECTION_LIMIT_MESSAGE)
            await self.ws.close(CLOSE_NORMAL, CONNECTION_LIMIT_MESSAGE)
            return False
        self.busy = True
        tg.start_soon(self._respond, parsed)
        return True

    # -- one response ----------------------------------------------------------------------

    async def _respond(self, create: Create) -> None:
        try:
            if create.generate:
                await self._generate(create)
            else:
                await self._warm_up(create)
        except (WebSocketDisconnect, OSError):
            if self.stream is not None:
                self.stream.cancel()
        except Exception as exc:  # a bug: one response ends, the socket and server go on
            log.error("responses websocket request failed: %s", type(exc).__name__)
            if self.stream is not None:
                self.stream.cancel()
            with contextlib.suppress(WebSocketDisconnect, OSError):
                await self._error(500, "internal_error", "The server had an internal error.")
        finally:
            self.busy, self.stream = False, None
            self.clock.response_ended(anyio.current_time())
            self._wake()

    def _turn_headers(self, body: dict[str, Any]) -> dict[str, str]:
        """The upgrade's headers, plus the turn state Codex echoes in ``client_metadata``
        (or, when it does not, the one this socket last received from its upstream)."""
        headers = dict(self.headers)
        meta = body.get("client_metadata")
        echoed = meta.get(TURN_STATE_HEADER) if isinstance(meta, dict) else None
        state = echoed if isinstance(echoed, str) else self.turn_state
        if state is not None:
            headers[TURN_STATE_HEADER] = state
        return headers

    async def _generate(self, create: Create) -> None:
        state = self.state
        key = key_of(self.ws.scope)  # the upgrade's key: each response.create is limited
        verdict, lease = await start_lease(state.limiter, state.key_metrics, key)
        if lease is None:
            assert verdict.refused is not None
            self._rejected(429, f"key_{verdict.refused.value}")
            await self._error(429, "rate_limit_exceeded", limited_message(key, verdict))
            return
        try:
            await self._admitted(create, lease)
        finally:
            end_lease(state.limiter, state.key_metrics, lease)

    async def _admitted(self, create: Create, lease: Lease) -> None:
        state, rid = self.state, new_response_id()
        ticket = state.admission.reserve(anyio.current_time())
        if ticket is None:
            self._rejected(429, "queue_full")
            await self._error(429, "rate_limit_exceeded", _BUSY_MESSAGE)
            return
        try:
            try:
                prep = await prepare_response(state, create.body, raw=create.raw,
                                              headers=self._turn_headers(create.body),
                                              store=self.memory, rid=rid, framing="json",
                                              stream=True, connection=self.connection)
            except CompactionRefused as exc:
                stream, renderer = refused_stream(rid, create.body, exc, framing="json")
                await self._pump(stream, renderer)
                return
            except TokenwireError as exc:
                status, message, code, param = error_parts(exc)
                self._rejected(status, code)
                await self._error(status, code, message, param)
                return
            stream = state.supervise(None, prep.served, prep.gen, streaming=True,
                                     api="responses", ticket=ticket, lease=lease)
            self.stream = stream  # cancelled if the client leaves while the head waits
            stream, _facts = await open_stream(stream, prep.renderer)  # responses_head.py
            self.stream = stream
            save = store_hook(state, self.store, prep.call)
            await self._pump(stream, prep.renderer, record=stream.observer,
                             before_terminal=final_saver(prep.renderer, save))
            self._finished(prep.call, prep.renderer)
        finally:
            ticket.release()

    async def _warm_up(self, create: Create) -> None:
        """``generate: false``: the request is checked and remembered (Codex continues from
        its id with the input it already sent); an empty, complete lifecycle, no model."""
        rid = new_response_id()
        try:
            prep = await prepare_response(self.state, create.body, raw=create.raw,
                                          headers=self._turn_headers(create.body),
                                          store=self.memory, rid=rid, framing="json",
                                          stream=True)
        except TokenwireError as exc:  # CompactionRefused included: nothing to warm up
            status, message, code, param = error_parts(exc)
            self._rejected(status, code)
            await self._error(status, code, message, param)
            return
        renderer = prep.renderer
        await self._send(renderer.created_events())
        end = renderer.on_event(_WARM_UP_END)
        before_terminal = final_saver(
            renderer, store_hook(self.state, self.store, prep.call))
        if before_terminal is not None:
            await before_terminal()
        await self._send(end)
        self._finished(prep.call, renderer)

    def _finished(self, call: Any, renderer: ResponsesRenderer) -> None:
        """The socket's own memory (``store: false`` too) and the turn state; the shared
        store was written before the terminal event went out (``final_saver``)."""
        final = renderer.final_response
        if final is None:
            return
        if final.get("status") == "completed":
            self.memory.remember(final["id"], list(call.input_items), final, now=time.time())
        if renderer.turn_state is not None:
            self.turn_state = renderer.turn_state

    async def _pump(self, stream: EventStream, renderer: ResponsesRenderer, *,
                    record: Any = None,
                    before_terminal: Callable[[], Awaitable[None]] | None = None) -> None:
        async def emit(chunks: list[bytes]) -> None:
            await self._send(chunks)
            if record is not None and chunks:
                record.wire_bytes("identity", sum(len(c) for c in chunks))

        await stream_events(stream, renderer, emit, lambda: None,
                            gone=(WebSocketDisconnect, OSError),
                            before_terminal=before_terminal)

    # -- sending ---------------------------------------------------------------------------

    async def _send(self, chunks: list[bytes]) -> None:
        for chunk in chunks:
            await self.ws.send_text(chunk.decode())

    async def _error(self, status: int, code: str, message: str,
                     param: str | None = None) -> None:
        """Codex's wrapped error: ``{"type": "error", "status": N, "error": {...}}``."""
        error = error_object(message, status=status, code=code, param=param)
        await self.ws.send_text(json_bytes({"type": "error", "status": status,
                                            **error}).decode())

    def _rejected(self, status: int, reason: str) -> None:
        self.state.observability.rejected(api="responses", status=status, reason=reason)

