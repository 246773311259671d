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
from tokenwire.gateway.apis.responses_request import ResponsesCall, parse_responses_request
from tokenwire.gateway.http.generation import check_inputs, check_model_limits
from tokenwire.gateway.http.requests import decode_json, read_body
from tokenwire.gateway.http.responses_get import get_response, response_store_of
from tokenwire.gateway.http.responses_head import open_stream, turn_state_of
from tokenwire.gateway.http.state import GatewayState
from tokenwire.gateway.http.streaming import EventResponse, WireRecord
from tokenwire.gateway.ir import (
    EventStream,
    Failure,
    FailureClass,
    GenerationRequest,
    is_terminal,
    kind_of,
)
from tokenwire.gateway.routing.router import ServedModel

__all__ = ["Prepared", "create_response", "prepare_response", "refused_stream",
           "responses_routes", "store_hook", "stream_events"]

log = logging.getLogger(__name__)

#: Request fields echoed into the ``response`` object, as OpenAI does. ``service_tier`` is
#: not: the tier served is reported only when the upstream says so (``ResponseMeta``).
_ECHOED = ("instructions", "max_output_tokens", "parallel_tool_calls", "previous_response_id",
           "temperature", "tool_choice", "tools", "top_p", "metadata", "text")
_SSE_HEADERS = (("Cache-Control", "no-store"), ("X-Accel-Buffering", "no"))


@dataclass(frozen=True, slots=True)
class Prepared:
    """A parsed, routed Responses request, ready to be supervised (both transports)."""

    call: ResponsesCall
    served: ServedModel
    renderer: ResponsesRenderer
    gen: GenerationRequest


def prepare_response(state: GatewayState, body: Any, *, raw: bytes | None,
                     headers: Mapping[str, str], store: Any, rid: str,
                     framing: str = "sse", stream: bool | None = None) -> Prepared:
    """Parse, route and check one Responses body; its renderer frames events as ``framing``.

    ``stream`` overrides the body's ``stream`` (the WebSocket always streams). Raises what
    the parser raises (``CompactionRefused`` included) and the router's errors."""
    call = parse_responses_request(body, headers=headers, store=store, raw=raw,
                                   request_id=rid)
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
                                  want_ids=False, want_text=True)
    return Prepared(call=call, served=served, renderer=renderer,
                    gen=check_model_limits(served, gen))


async def create_response(request: Request) -> Response | EventResponse | _SSEResponse:
    state = request.app.state.gateway
    raw = await read_body(request, state.settings.max_body_bytes)
    body = decode_json(raw)
    rid = new_response_id()
    store = response_store_of(request)
    try:
        prep = prepare_response(state, body, raw=raw, headers=request.headers, store=store,
                                rid=rid)
    except CompactionRefused as exc:
        if isinstance(body, dict) and body.get("stream") is True:
            return _refused_stream(rid, body, exc)
        raise
    call, renderer = prep.call, prep.renderer
    stream = state.supervise(request, prep.served, prep.gen, streaming=call.stream,
                             api="responses")
    headers = [("Content-Type", renderer.content_type), *_SSE_HEADERS, ("X-Request-Id", rid)]
    on_final = store_hook(store, call)
    if call.stream:
        return _SSEResponse(stream, renderer, headers=headers, on_final=on_final,
                            record=stream.observer)
    from tokenwire.codec.compression import IdentityCompressor

    return EventResponse(stream, _StoringRenderer(renderer, on_final, headers),
                         headers=lambda: headers + stream.served_headers(),
                         compressor=IdentityCompressor, on_failure=_failure_response,
                         window=0.0, streaming=False, record=stream.observer)


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
    return _SSEResponse(stream, renderer, on_final=None,
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


def store_hook(store: Any, call: ResponsesCall) -> Callable[[dict[str, Any]], None] | None:
    """Saves a finished response when the client asked to (``store`` defaults to true)."""
    if store is None or not call.store:
        return None

    def put(response: dict[str, Any]) -> None:
        try:
            store.put(response["id"], input_items=list(call.input_items), response=response)
        except Exception as exc:  # the answer was delivered; a store failure must not undo it
            log.error("could not store response %s: %s", response.get("id"), type(exc).__name__)

    return put


class _StoringRenderer:
    """The renderer, plus (non-streaming) the store call and the turn-state header once the
    terminal was rendered.

    ``headers`` is the very list the :class:`EventResponse` sends: a whole body is rendered
    before its head goes out, so the upstream's wrapped ``x-codex-turn-state`` is appended
    to it here (a stream carries it as ``response.metadata`` instead).
    """

    def __init__(self, inner: ResponsesRenderer,
                 on_final: Callable[[dict[str, Any]], None] | None,
                 headers: list[tuple[str, str]]) -> None:
        self._inner, self._on_final, self._headers = inner, on_final, headers
        self.content_type = inner.content_type

    def on_event(self, event: Any) -> list[bytes]:
        out = self._inner.on_event(event)
        if not is_terminal(event):
            return out
        if self._on_final and self._inner.final_response is not None:
            self._on_final(self._inner.final_response)
        if self._inner.turn_state is not None:
            self._headers.append((TURN_STATE_HEADER, self._inner.turn_state))
        return out

    def on_error(self, exc: BaseException) -> list[bytes]:
        return self._inner.on_error(exc)


Send = Callable[[MutableMapping[str, Any]], Any]


class _SSEResponse:
    """The streaming answer as plain ASGI: head and ``response.created`` first, then events
    as they come (heartbeats included); a disconnect cancels the upstream."""

    def __init__(self, stream: EventStream, renderer: ResponsesRenderer, *,
                 headers: list[tuple[str, str]],
                 on_final: Callable[[dict[str, Any]], None] | None,
                 record: WireRecord | None = None) -> None:
        self._stream, self._renderer, self._headers = stream, renderer, headers
        self._on_final, self._record = on_final, record
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
        final = self._renderer.final_response
        if self._on_final is not None and final is not None:
            self._on_final(final)

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

        await stream_events(self._stream, self._renderer, partial(self._body, send), finished)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _body(self, send: Send, chunks: list[bytes]) -> None:
        if chunks:
            data = b"".join(chunks)
            await send({"type": "http.response.body", "body": data, "more_body": True})
            if self._record is not None:
                self._record.wire_bytes("identity", len(data))


async def stream_events(stream: EventStream, renderer: ResponsesRenderer,
                        emit: Callable[[list[bytes]], Awaitable[None]],
                        finished: Callable[[], None],
                        gone: tuple[type[BaseException], ...] = ()) -> None:
    """``response.created`` + ``response.in_progress`` at once, then every event rendered,
    until the terminal (``finished`` is called as it is seen, before it is emitted). Any
    error is reported in-stream as ``response.failed`` (never a 500): the one event loop
    of the SSE route and the WebSocket (``http/responses_ws.py``). ``gone``: exceptions
    that mean the client left (re-raised as they are: nobody is there to tell)."""
    await emit(renderer.created_events())
    try:
        while True:
            event = await stream.next_event()
            if is_terminal(event):
                finished()
            await emit(renderer.on_event(event))
            if is_terminal(event):
                return
    except gone:
        raise
    except Exception as exc:  # after the head: report in-stream (never a 500)
        log.error("responses stream failed after the response started: %s",
                  type(exc).__name__)
        stream.cancel()
        finished()
        await emit(renderer.on_error(exc))


def responses_routes() -> list[BaseRoute]:
    """The routes to mount in :func:`tokenwire.gateway.http.app.create_app`."""
    return [Route("/v1/responses", create_response, methods=["POST"]),
            Route("/v1/responses/{response_id}", get_response, methods=["GET"])]
