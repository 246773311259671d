"""``POST /v1/responses``: the Starlette handler over :mod:`.responses_render`.

Streaming (the Codex path): the request is parsed (:mod:`.responses_request`: hygiene,
``previous_response_id``), routed and admitted; then the response head and
``response.created`` + ``response.in_progress`` go out at once, *before* the upstream
answers (seed, "Streaming, reasoning summaries, and heartbeats"), and every later failure is
a ``response.failed`` inside the stream. While the request is queued, waiting to retry or
the upstream is quiet, the supervisor (``gateway/supervision/supervisor.py``) sends a
heartbeat every 15 s, rendered as a genuine ``response.in_progress`` data event (Codex's
idle timer ignores SSE comments, gateway-research §2). Validation, routing and capacity failures
happen before the head and are HTTP errors in OpenAI's shape; the one exception is the
seed's ``compaction_trigger`` refusal, which a stream reports as ``response.failed`` with
``invalid_prompt`` so Codex stops instead of retrying.

Not streaming: one ``response`` object, or the failure as an HTTP error with its status and
the Responses error code (:func:`~.responses_render.failure_error_body`). Either way a
finished response is stored when the request asked (``store``, default true) for
``previous_response_id`` and ``GET /v1/responses/{id}`` (:mod:`.responses_get`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import anyio
import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from tokenwire.errors import CompactionRefused
from tokenwire.gateway.affinity import TURN_STATE_HEADER
from tokenwire.gateway.apis.errors import retry_after_header
from tokenwire.gateway.apis.responses_hygiene import collaboration_call_fields
from tokenwire.gateway.apis.responses_render import (
    ResponsesRenderer,
    failure_error_body,
    new_response_id,
)
from tokenwire.gateway.apis.responses_request import (
    ResponsesCall,
    load_previous,
    parse_responses_request,
)
from tokenwire.gateway.http.generation import check_inputs, check_model_limits
from tokenwire.gateway.http.requests import INLINE_BODY_BYTES, decode_json, named, read_parsed
from tokenwire.gateway.http.responses_get import get_response, response_store_of
from tokenwire.gateway.http.responses_head import open_stream, turn_state_of
from tokenwire.gateway.http.state import GatewayState
from tokenwire.gateway.http.streaming import EventResponse, WireRecord
from tokenwire.gateway.ir import (
    ClientConnection,
    EventStream,
    Failure,
    FailureClass,
    GenerationRequest,
    is_terminal,
    kind_of,
)
from tokenwire.gateway.routing.router import ServedModel
from tokenwire.gateway.state.response_store import ResponseTooLarge, StoreUnavailable

__all__ = ["NOT_STORED_HEADER", "Prepared", "Saver", "create_response", "final_saver",
           "prepare_response", "refused_stream", "responses_routes", "store_hook",
           "stream_events"]

log = logging.getLogger(__name__)

#: Request fields echoed into the ``response`` object, as OpenAI does. ``service_tier`` is
#: not: the tier served is reported only when the upstream says so (``ResponseMeta``).
_ECHOED = ("instructions", "max_output_tokens", "parallel_tool_calls", "previous_response_id",
           "temperature", "tool_choice", "tools", "top_p", "metadata", "text")
_SSE_HEADERS = (("Cache-Control", "no-store"), ("X-Accel-Buffering", "no"))
#: On a non-streamed response that was served but not stored (``store_unavailable``: the
#: shared store's Redis is down; ``too_large``: over ``[state] store_max_bytes``;
#: ``store_error``). A stream's head is gone by then: the log line and
#: ``tokenwire_responses_not_stored_total`` say it instead.
NOT_STORED_HEADER = "X-Tokenwire-Not-Stored"

#: Saves a finished response; returns why it was not stored, or None when it was.
Saver = Callable[[dict[str, Any]], Awaitable[str | None]]


@dataclass(frozen=True, slots=True)
class Prepared:
    """A parsed, routed Responses request, ready to be supervised (both transports)."""

    call: ResponsesCall
    served: ServedModel
    renderer: ResponsesRenderer
    gen: GenerationRequest


async def prepare_response(state: GatewayState, body: Any, *, raw: bytes | None,
                           headers: Mapping[str, str], store: Any, rid: str,
                           framing: str = "sse", stream: bool | None = None,
                           connection: ClientConnection | None = None) -> Prepared:
    """Read the ``previous_response_id`` from ``store`` (one read), then parse, route and
    check one Responses body; its renderer frames events as ``framing``.

    ``stream`` overrides the body's ``stream`` (the WebSocket always streams);
    ``connection`` is the client socket the request came on (``ir.ClientConnection``). Raises what
    the parser raises (``CompactionRefused`` included), ``StoreUnavailable`` (503) and the
    router's errors."""
    previous = await load_previous(body, store)
    if previous is not None:
        state.pin_previous(previous)  # the replica that produced it, from any instance
    if raw is None or len(raw) <= INLINE_BODY_BYTES:
        call = parse_responses_request(body, headers=headers, previous=previous, raw=raw,
                                       request_id=rid)
    else:  # read_parsed's rule; the store read above sits between decoding and parsing
        call = await asyncio.to_thread(parse_responses_request, body, headers=headers,
                                       previous=previous, raw=raw, request_id=rid)
    streaming = call.stream if stream is None else stream
    served = state.router.route(call.model)
    check_inputs(served, call.request)
    renderer = ResponsesRenderer(
        response_id=rid, model=served.name, created_at=int(time.time()), stream=streaming,
        reasoning_summary=call.reasoning_summary or "auto", echo=_echo(call),
        # A Responses upstream's end_turn is its own (ResponseMeta): never invent one for it.
        derive_end_turn=kind_of(served.upstream) != "responses",
        call_fields=partial(collaboration_call_fields,
                            collaboration_tools=call.collaboration_tools),
        framing=framing)
    gen = msgspec.structs.replace(call.request, model=served.name, request_id=rid,
                                  want_ids=False, want_text=True, connection=connection)
    return Prepared(call=call, served=served, renderer=renderer,
                    gen=check_model_limits(served, gen))


async def create_response(request: Request) -> Response | EventResponse | _SSEResponse:
    state = request.app.state.gateway
    rid = named(request, new_response_id())
    raw, body = await read_parsed(request, state.settings.max_body_bytes, _with_json)
    store = response_store_of(request)
    try:
        prep = await prepare_response(state, body, raw=raw, headers=request.headers,
                                      store=store, rid=rid)
    except CompactionRefused as exc:
        if isinstance(body, dict) and body.get("stream") is True:
            return _refused_stream(rid, body, exc)
        raise
    call, renderer = prep.call, prep.renderer
    stream = state.supervise(request, prep.served, prep.gen, streaming=call.stream,
                             api="responses")
    headers = [("Content-Type", renderer.content_type), *_SSE_HEADERS, ("X-Request-Id", rid)]
    save = store_hook(state, store, call)
    if call.stream:
        return _SSEResponse(stream, renderer, headers=headers, save=save,
                            record=stream.observer)
    from tokenwire.codec.compression import IdentityCompressor

    async def before_send() -> None:  # stored before the body goes out (any instance reads it)
        final = renderer.final_response
        if save is not None and final is not None and (reason := await save(final)):
            headers.append((NOT_STORED_HEADER, reason))

    return EventResponse(stream, _TurnStateRenderer(renderer, headers),
                         headers=lambda: headers + stream.served_headers(),
                         compressor=IdentityCompressor, on_failure=_failure_response,
                         window=0.0, streaming=False, record=stream.observer,
                         before_send=before_send)


def _with_json(raw: bytes) -> tuple[bytes, Any]:
    """The body and its JSON: the bytes travel on (an unchanged body is forwarded as sent)."""
    return raw, decode_json(raw)


def _echo(call: ResponsesCall) -> dict[str, Any]:
    echo = {k: call.body[k] for k in _ECHOED if k in call.body}
    echo["store"] = call.store
    summary = call.reasoning_summary
    echo["reasoning"] = {"effort": call.request.reasoning_effort,
                         "summary": None if summary == "none" else summary}
    return echo


def refused_stream(rid: str, body: dict[str, Any], exc: CompactionRefused, *,
                   framing: str = "sse") -> tuple[EventStream, ResponsesRenderer]:
    """The seed's final refusal as a stream: created, in_progress, failed (invalid_prompt);
    no upstream is called."""
    model = body.get("model") if isinstance(body.get("model"), str) else ""
    renderer = ResponsesRenderer(response_id=rid, model=model, created_at=int(time.time()),
                                 stream=True, framing=framing)
    failure = Failure(failure_class=FailureClass.INVALID_REQUEST, message=str(exc), status=400)
    return _Ended(failure), renderer


def _refused_stream(rid: str, body: dict[str, Any], exc: CompactionRefused) -> _SSEResponse:
    stream, renderer = refused_stream(rid, body, exc)
    return _SSEResponse(stream, renderer, save=None,
                        headers=[("Content-Type", renderer.content_type), *_SSE_HEADERS,
                                 ("X-Request-Id", rid)])


class _Ended:
    """An event stream that is one terminal event (a refusal decided before any upstream)."""

    def __init__(self, event: Failure) -> None:
        self._event = event

    async def next_event(self) -> Failure:
        return self._event

    def cancel(self) -> None:
        pass


def _failure_response(failure: Failure) -> tuple[int, list[tuple[str, str]], bytes]:
    status, body = failure_error_body(failure)
    return status, [("Content-Type", "application/json"),
                    *retry_after_header(failure.retry_after)], body


def store_hook(state: GatewayState, store: Any, call: ResponsesCall) -> Saver | None:
    """Saves a finished response when the client asked to (``store`` defaults to true),
    with the replica that produced it. Never raises: the answer is served either way, and a
    response that could not be stored is logged, counted and its reason returned."""
    if store is None or not call.store:
        return None

    async def save(response: dict[str, Any]) -> str | None:
        rid = response["id"]
        try:
            await store.put(rid, input_items=list(call.input_items), response=response,
                            replica=state.replica_of(rid))
            return None
        except ResponseTooLarge as exc:
            reason, detail = "too_large", str(exc)
        except StoreUnavailable:
            # Not a line per response: the connection logged the outage once (redis_conn.py)
            # and the counter counts what it cost.
            log.debug("response %s served but not stored: the store is unavailable", rid)
            state.observability.not_stored("store_unavailable")
            return "store_unavailable"
        except Exception as exc:  # the answer is served; a store bug must not undo it
            reason, detail = "store_error", type(exc).__name__
        log.warning("response %s served but not stored (%s): %s", rid, reason, detail)
        state.observability.not_stored(reason)
        return reason

    return save


class _TurnStateRenderer:
    """The renderer, plus (non-streaming) the turn-state header once the terminal was
    rendered.

    ``headers`` is the very list the :class:`EventResponse` sends: a whole body is rendered
    before its head goes out, so the upstream's wrapped ``x-codex-turn-state`` is appended
    to it here (a stream carries it as ``response.metadata`` instead).
    """

    def __init__(self, inner: ResponsesRenderer, headers: list[tuple[str, str]]) -> None:
        self._inner, self._headers = inner, headers
        self.content_type = inner.content_type

    def on_event(self, event: Any) -> list[bytes]:
        out = self._inner.on_event(event)
        if is_terminal(event) and self._inner.turn_state is not None:
            self._headers.append((TURN_STATE_HEADER, self._inner.turn_state))
        return out

    def on_error(self, exc: BaseException) -> list[bytes]:
        return self._inner.on_error(exc)


Send = Callable[[MutableMapping[str, Any]], Any]


class _SSEResponse:
    """The streaming answer as plain ASGI: head and ``response.created`` first, then events
    as they come (heartbeats included); a disconnect cancels the upstream."""

    def __init__(self, stream: EventStream, renderer: ResponsesRenderer, *,
                 headers: list[tuple[str, str]], save: Saver | None,
                 record: WireRecord | None = None) -> None:
        self._stream, self._renderer, self._headers = stream, renderer, headers
        self._save, self._record = save, record
        self._finished = False

    async def __call__(self, scope: Any, receive: Callable[[], Any], send: Send) -> None:
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._watch_disconnect, receive, tg.cancel_scope)
                try:
                    await self._run(send)
                finally:
                    tg.cancel_scope.cancel()
        finally:
            if not self._finished:  # disconnect, send failure or cancellation
                self._stream.cancel()

    async def _watch_disconnect(self, receive: Callable[[], Any],
                                scope: anyio.CancelScope) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self._stream.cancel()
        scope.cancel()

    async def _run(self, send: Send) -> None:
        # The head may wait for the first event (http/responses_head.py): then it names the
        # model that serves and carries the turn state (the replica of the turn).
        self._stream, facts = await open_stream(self._stream, self._renderer)
        served = getattr(self._stream, "served_headers", None)
        head = [*self._headers, *(served() if served is not None else [])]
        if (turn_state := turn_state_of(facts)) is not None:
            head.append((TURN_STATE_HEADER, turn_state))
        raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in head]
        await send({"type": "http.response.start", "status": 200, "headers": raw})

        def finished() -> None:
            self._finished = True

        await stream_events(self._stream, self._renderer, partial(self._body, send), finished,
                            before_terminal=final_saver(self._renderer, self._save))
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _body(self, send: Send, chunks: list[bytes]) -> None:
        if chunks:
            data = b"".join(chunks)
            await send({"type": "http.response.body", "body": data, "more_body": True})
            if self._record is not None:
                self._record.wire_bytes("identity", len(data))


def final_saver(renderer: ResponsesRenderer, save: Saver | None
                ) -> Callable[[], Awaitable[None]] | None:
    """Stores the renderer's final response (once rendered): :func:`stream_events`'s
    ``before_terminal``."""
    if save is None:
        return None

    async def before_terminal() -> None:
        if renderer.final_response is not None:
            await save(renderer.final_response)

    return before_terminal


async def stream_events(stream: EventStream, renderer: ResponsesRenderer,
                        emit: Callable[[list[bytes]], Awaitable[None]],
                        finished: Callable[[], None],
                        gone: tuple[type[BaseException], ...] = (), *,
                        before_terminal: Callable[[], Awaitable[None]] | None = None) -> None:
    """``response.created`` + ``response.in_progress`` at once, then every event rendered,
    until the terminal (``finished`` is called as it is seen, before it is emitted). Any
    error is reported in-stream as ``response.failed`` (never a 500): the one event loop
    of the SSE route and the WebSocket (``http/responses_ws.py``). ``gone``: exceptions
    that mean the client left (re-raised as they are: nobody is there to tell).

    ``before_terminal`` (the store, :func:`final_saver`) runs after the terminal event is
    rendered and before it is sent: a client that has seen ``response.completed`` can
    continue from it on any instance at once (LiteLLM's #28587 was this the other way)."""
    await emit(renderer.created_events())
    try:
        while True:
            event = await stream.next_event()
            if is_terminal(event):
                finished()
            chunks = renderer.on_event(event)
            if is_terminal(event):
                if before_terminal is not None:
                    await before_terminal()
                await emit(chunks)
                return
            await emit(chunks)
    except gone:
        raise
    except Exception as exc:  # after the head: report in-stream (never a 500)
        log.error("responses stream failed after the response started: %s",
                  type(exc).__name__)
        stream.cancel()
        finished()
        chunks = renderer.on_error(exc)
        if before_terminal is not None:
            await before_terminal()
        await emit(chunks)


def responses_routes() -> list[BaseRoute]:
    """The routes to mount in :func:`tokenwire.gateway.http.app.create_app`."""
    return [Route("/v1/responses", create_response, methods=["POST"]),
            Route("/v1/responses/{response_id}", get_response, methods=["GET"])]
