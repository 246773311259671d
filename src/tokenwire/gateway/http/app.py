"""The Starlette app of ``tokenwire serve``: the Codec HTTP surface (codec-spec §2).

Routes:

* ``POST /v1/completions``: OpenAI Completions; ``stream_format`` ``json`` (SSE or one JSON
  body) or a Codec binary format (§2.3). Prompt as text (pattern A) or ids (pattern B).
* ``POST /v1/completions/codec``: Path C, a msgpack or protobuf ``CodecRequest`` body (§1.3).
* ``POST /v1/chat/completions``: OpenAI Chat, same ``stream_format`` choices.
* ``GET /v1/models``, ``GET /v1/models/{id}``, ``GET /health`` (with the capacity counts and
  the ``features`` list), ``GET /metrics`` (Prometheus), ``GET /codec/schema`` (§2.2),
  ``GET /codec/version``.
* ``POST /tokenize`` and ``POST /detokenize`` in vLLM's shapes (:mod:`.tokenize_routes`).
* ``POST /v1/messages/count_tokens`` (Anthropic's, :mod:`.messages_route`).
* ``/.well-known/codec/...`` from :mod:`.wellknown`.
* ``GET /``: the playground page (:mod:`.playground`).

The pieces live beside it in ``http/``: the inference POSTs reach their routes without
Starlette's router and exception layers (:mod:`.dispatch`); every inference request takes an
admission ticket before its body is read (:mod:`.admission`), is read by :mod:`.requests`
(limits, upload deadline, the 426 of §5.4 when the deployment mandates v0.4), and is started
by :mod:`.generation` (routing by ``model``, the coding picked from ``Accept-Encoding``, the
headers filtered by the client's declared version, §5.3) under the supervisor
(:class:`~tokenwire.gateway.supervision.supervisor.SupervisedStream`: queue, retries,
deadlines, heartbeats) that :meth:`~.state.GatewayState.supervise` creates. The Responses
and Messages routes are :mod:`.responses_routes` and :mod:`.messages_route`. Every 4xx/5xx
before a stream starts is rendered by :mod:`.errors`: OpenAI's JSON error body with
``param`` and ``code`` (Messages: Anthropic's).
"""

from __future__ import annotations

import functools
import time
from typing import Any

import msgspec
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route, WebSocketRoute

from tokenwire.codec.frames import StreamFormat
from tokenwire.codec.requests import CodecRequest, decode_request
from tokenwire.codec.versioning import OWN_VERSION, format_version
from tokenwire.errors import TokenwireError, UnknownModel
from tokenwire.gateway.apis.chat import ChatCall, ChatRenderer, parse_chat_request
from tokenwire.gateway.apis.completions import (
    CompletionsCall,
    CompletionsRenderer,
    parse_completions_request,
)
from tokenwire.gateway.apis.params import (
    JSON_FORMAT,
    SUPPORTED_STREAM_FORMATS,
    bad_request,
    parse_sampling,
)
from tokenwire.gateway.http import wellknown
from tokenwire.gateway.http.admission import AdmissionMiddleware
from tokenwire.gateway.http.dispatch import GatewayApp
from tokenwire.gateway.http.errors import exception_response
from tokenwire.gateway.http.generation import codec_renderer, route_model, start_generation
from tokenwire.gateway.http.limits import KeyLimitsMiddleware
from tokenwire.gateway.http.messages_route import count_tokens_endpoint, messages_endpoint
from tokenwire.gateway.http.playground import playground_routes
from tokenwire.gateway.http.requests import (
    client_version,
    decode_json,
    named,
    new_id,
    read_parsed,
    upgrade_response,
)
from tokenwire.gateway.http.responses_get import delete_response, get_response
from tokenwire.gateway.http.responses_routes import responses_routes
from tokenwire.gateway.http.responses_ws import responses_socket
from tokenwire.gateway.http.schema import PROTO_SCHEMA
from tokenwire.gateway.http.security import internal_error_response
from tokenwire.gateway.http.state import GatewayState
from tokenwire.gateway.http.streaming import EventResponse, Renderer
from tokenwire.gateway.http.tokenize_routes import detokenize, tokenize
from tokenwire.gateway.ir import GenerationRequest, PromptIds
from tokenwire.gateway.observability.bounds import api_for_path
from tokenwire.gateway.routing.health import overall_status
from tokenwire.gateway.routing.router import ServedModel
from tokenwire.gateway.stops import validate_stops

__all__ = ["FEATURES", "GatewayState", "create_app"]

#: What this release guarantees, listed by /health so an operator can tell an updated
#: server from an old one (seed: the ``features`` list of ``/health``).
FEATURES = ("responses-ws-426", "responses-websocket-v1", "openai-internal-strip",
            "retry-budgets-v1", "admission-queue-v1", "heartbeats-v1", "metrics-v1",
            "replica-pools-v1")
_BINARY_TYPES = {"application/x-msgpack": StreamFormat.MSGPACK,
                 "application/x-protobuf": StreamFormat.PROTOBUF}


async def completions(request: Request) -> Response | EventResponse:
    state: GatewayState = request.app.state.gateway
    if (upgrade := upgrade_response(state, request)) is not None:
        return upgrade
    rid = named(request, new_id("cmpl"))
    call = await read_parsed(request, state.settings.max_body_bytes, _completions_call, rid)
    served = route_model(state, call.model, call.stream_format)
    if call.return_token_ids and not served.has_ids:
        raise bad_request(f"return_token_ids needs token ids, but model {served.name!r} has "
                          "no tokenizer map and its upstream returns text only",
                          param="return_token_ids", code="unsupported_value")
    renderer: Renderer
    if call.stream_format is not None:
        renderer = codec_renderer(state, call.stream_format, client_version(request))
    else:
        renderer = CompletionsRenderer(
            completion_id=rid, model=served.name, created=int(time.time()),
            stream=call.stream, include_usage=call.include_usage,
            return_token_ids=call.return_token_ids)
    key = call.stream_format.value if call.stream_format is not None else JSON_FORMAT
    gen = msgspec.structs.replace(
        call.request, want_ids=call.stream_format is not None or call.return_token_ids,
        want_text=call.stream_format is None)
    return start_generation(state, request, served, gen, renderer, key, streaming=call.stream)


async def chat_completions(request: Request) -> Response | EventResponse:
    state: GatewayState = request.app.state.gateway
    if (upgrade := upgrade_response(state, request)) is not None:
        return upgrade
    rid = named(request, new_id("chatcmpl"))
    call = await read_parsed(request, state.settings.max_body_bytes, _chat_call, rid)
    served = route_model(state, call.model, call.stream_format)
    renderer: Renderer
    if call.stream_format is not None:
        renderer = codec_renderer(state, call.stream_format, client_version(request))
    else:
        renderer = ChatRenderer(completion_id=rid, model=served.name,
                                created=int(time.time()), stream=call.stream,
                                include_usage=call.include_usage)
    key = call.stream_format.value if call.stream_format is not None else JSON_FORMAT
    gen = msgspec.structs.replace(call.request, want_ids=call.stream_format is not None,
                                  want_text=call.stream_format is None)
    return start_generation(state, request, served, gen, renderer, key, streaming=call.stream)


def _completions_call(raw: bytes, rid: str) -> CompletionsCall:
    return parse_completions_request(decode_json(raw), request_id=rid)


def _chat_call(raw: bytes, rid: str) -> ChatCall:
    return parse_chat_request(decode_json(raw), request_id=rid)


def _codec_request(raw: bytes, body_fmt: StreamFormat, limit: int) -> CodecRequest:
    return decode_request(raw, body_fmt, max_bytes=limit)


def _path_c_body_format(content_type: str) -> StreamFormat:
    media = content_type.split(";")[0].strip().lower()
    if media not in _BINARY_TYPES:
        raise bad_request(
            f"Content-Type {media or '(none)'!r} is not a Codec request body; use "
            "application/x-msgpack or application/x-protobuf (codec-spec §1.3)", 415,
            code="unsupported_media_type")
    return _BINARY_TYPES[media]


async def completions_codec(request: Request) -> Response | EventResponse:
    """Path C: binary request in, binary frames out (codec-spec §1.3, §2.7b)."""
    state: GatewayState = request.app.state.gateway
    if (upgrade := upgrade_response(state, request)) is not None:
        return upgrade
    rid = named(request, new_id("cmpl"))
    body_fmt = _path_c_body_format(request.headers.get("content-type", ""))
    limit = state.settings.max_body_bytes
    creq = await read_parsed(request, limit, _codec_request, body_fmt, limit)
    try:
        fmt = StreamFormat(creq.stream_format)
    except ValueError:
        raise bad_request(
            f"unsupported stream_format {creq.stream_format!r} for Path C; supported: "
            + ", ".join(f.value for f in StreamFormat), param="stream_format") from None
    if fmt.content_type != body_fmt.content_type:  # §2.4: body type and format must agree
        raise bad_request(f"a {body_fmt.content_type} body cannot ask for stream_format "
                          f"{fmt.value!r} ({fmt.content_type})", 415, param="stream_format",
                          code="unsupported_media_type")
    if not creq.prompt_ids:
        raise bad_request("prompt_ids is empty", param="prompt_ids", code="empty_array")
    # The JSON APIs' ranges and codes: a temperature outside 0..2 is refused, not clamped.
    sampling = parse_sampling({"max_tokens": creq.max_tokens, "temperature": creq.temperature},
                              default_max_tokens=None)
    try:
        stop = validate_stops(creq.stop)
    except ValueError as exc:
        raise bad_request(str(exc), param="stop") from None
    served = route_model(state, None, fmt)  # Path C bodies name no model (§1.3): the default
    # An absent temperature is the generator's choice (gateway/defaults.py), as elsewhere.
    gen = GenerationRequest(prompt=PromptIds(ids=creq.prompt_ids), max_tokens=sampling.max_tokens,
                            api="codec", temperature=sampling.temperature, stop=stop,
                            request_id=rid, want_ids=True, want_text=False)
    renderer = codec_renderer(state, fmt, client_version(request))
    return start_generation(state, request, served, gen, renderer, fmt.value, streaming=True)


# -- small GET routes ------------------------------------------------------------------------


async def models(request: Request) -> Response:
    """Every served model; ``owned_by`` is its upstream's name (issue 4 item 4)."""
    state: GatewayState = request.app.state.gateway
    return JSONResponse({"object": "list",
                         "data": [_model_entry(state, m) for m in state.router.models]})


async def model(request: Request) -> Response:
    """One served model (the ``openai`` SDK's ``models.retrieve``), by any name the router
    routes; an unknown one is OpenAI's 404 ``model_not_found``."""
    state: GatewayState = request.app.state.gateway
    name = request.path_params["model_id"]
    if not name:  # "/v1/models/" names no model: never the default one
        raise UnknownModel("no model named: GET /v1/models/{id} needs an id; GET /v1/models "
                           "lists them")
    return JSONResponse(_model_entry(state, state.router.route(name)))


def _model_entry(state: GatewayState, m: ServedModel) -> dict[str, Any]:
    entry: dict[str, Any] = {"id": m.name, "object": "model", "created": state.created,
                             "owned_by": m.upstream_name or "tokenwire",
                             "codec_ids_source": m.ids_source.value}
    if m.max_model_len is not None:
        entry["max_model_len"] = m.max_model_len
        if m.context_source:  # config, upstream or engine (gateway/context_window.py)
            entry["context_length_source"] = m.context_source
    if m.tmap is not None:
        entry["codec_tokenizer_map"] = {"id": m.tmap.id, "hash": m.tmap.hash}
    if m.aliases:  # other names requests may use for this model (one entry per model)
        entry["aliases"] = list(m.aliases)
    return entry


async def health(request: Request) -> Response:
    """Overall status plus each upstream's last probe; 503 when no upstream is up."""
    state: GatewayState = request.app.state.gateway
    upstreams = await state.health.snapshot()
    status = overall_status(h.state for h in upstreams)
    running, queued = state.admission.counts()
    pools = {p.name: p.snapshot() for p in state.pools()}  # every replica (routing/pool.py)
    body: dict[str, Any] = {"status": status, "upstreams": [{
        "name": h.name, "kind": h.kind, "state": h.state.value, "models": list(h.models),
        "detail": h.detail, **({"replicas": pools[h.name]} if h.name in pools else {})}
        for h in upstreams],
        "running": running, "queued": queued, "features": list(FEATURES),
        "state": await _shared_state(state)}
    if state.router.default is not None:
        body["model"] = state.router.default.name
    return JSONResponse(body, status_code=503 if status == "down" else 200)


async def _shared_state(state: GatewayState) -> dict[str, Any]:
    """Where shared state lives: this process (``local``), or Redis, up or degraded (a
    degraded one is re-checked here when its re-check is due: README "Shared state")."""
    if state.redis is None:
        return {"backend": "local"}
    await state.redis.check()
    return state.redis.snapshot()


async def metrics(request: Request) -> Response:
    """Prometheus text format (behind the same key as the APIs when auth is on)."""
    body, content_type = request.app.state.gateway.observability.metrics_response_body()
    return Response(body, headers={"content-type": content_type, "cache-control": "no-store"})


async def codec_schema(request: Request) -> Response:
    return PlainTextResponse(PROTO_SCHEMA)


async def codec_version(request: Request) -> Response:
    """The draft's optional capability hint (§2.2); not a security boundary."""
    return JSONResponse({"version": format_version(OWN_VERSION),
                         "stream_formats": list(SUPPORTED_STREAM_FORMATS),
                         "delta_varint": True})


# -- assembly --------------------------------------------------------------------------------


def _discovery_routes(state: GatewayState) -> list[BaseRoute]:
    policies = (wellknown.PublishedPolicy.from_descriptor(state.descriptor),) \
        if state.descriptor is not None else ()
    disc = wellknown.DiscoveryState(
        maps=(*state.router.maps(), *state.extra_maps), dicts=state.dicts, policies=policies,
        version_policy=state.settings.version_policy,
        public_base_url=state.settings.public_base_url)
    return list(wellknown.wellknown_routes(disc))


def create_app(state: GatewayState) -> GatewayApp:
    """The ASGI app over ``state`` (the upstream must already be started)."""
    routes: list[BaseRoute] = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/completions/codec", completions_codec, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/messages", messages_endpoint, methods=["POST"]),  # Anthropic Messages
        Route("/v1/messages/count_tokens", count_tokens_endpoint, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", model, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/codec/schema", codec_schema, methods=["GET"]),
        Route("/codec/version", codec_version, methods=["GET"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        *responses_routes(),  # POST /v1/responses (OpenAI Responses)
        Route("/v1/responses/{response_id}", get_response, methods=["GET"]),  # stored ones
        Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
        *_discovery_routes(state),
        *playground_routes(),  # GET /: the playground page (http/playground.py)
    ]
    if state.settings.responses_websocket:  # GET /v1/responses upgraded (Codex's transport)
        routes.append(WebSocketRoute("/v1/responses", responses_socket))

    def rejected(path: str, status: int, reason: str, request_id: str | None) -> None:
        state.observability.rejected(api=api_for_path(path), status=status, reason=reason,
                                     request_id=request_id)

    # One renderer for every error a route raises, in its API's shape (http/errors.py).
    # Starlette's ServerErrorMiddleware sends the Exception one (the crash barrier's body,
    # instead of its plain-text 500) before re-raising; the CrashBarrier then only logs.
    # The inference POSTs skip Starlette's stack (http/dispatch.py): per-key limits first (a
    # key over its limit is refused before it queues, http/limits.py), then admission.
    app = GatewayApp(
        routes=routes,
        limits=functools.partial(KeyLimitsMiddleware, limiter=state.limiter,
                                 metrics=state.key_metrics, on_rejected=rejected),
        admission=functools.partial(AdmissionMiddleware, admission=state.admission,
                                    on_rejected=rejected),
        exception_handlers={TokenwireError: exception_response,
                            HTTPException: exception_response,
                            Exception: internal_error_response})
    app.state.gateway = state
    return app
