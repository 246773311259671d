"""The Starlette app of ``tokenwire serve``: the Codec HTTP surface (codec-spec §2).

Routes:

* ``POST /v1/completions``: OpenAI Completions; ``stream_format`` ``json`` (SSE or one JSON
  body) or a Codec binary format (§2.3). Prompt as text (pattern A) or ids (pattern B).
* ``POST /v1/completions/codec``: Path C, a msgpack or protobuf ``CodecRequest`` body (§1.3).
* ``POST /v1/chat/completions``: OpenAI Chat, same ``stream_format`` choices.
* ``GET /v1/models``, ``GET /health`` (with the capacity counts and the ``features`` list),
  ``GET /metrics`` (Prometheus), ``GET /codec/schema`` (§2.2), ``GET /codec/version``.
* ``POST /tokenize`` and ``POST /detokenize`` in vLLM's shapes (:mod:`.tokenize_routes`).
* ``/.well-known/codec/...`` from :mod:`tokenwire.gateway.wellknown` when it is installed.

Every inference request takes an admission ticket before its body is read
(:mod:`.admission`) and runs under :class:`~.supervisor.SupervisedStream` (queue, retries,
deadlines, heartbeats), created by :meth:`GatewayState.supervise`. Requests are routed by
``model`` to a :class:`~tokenwire.gateway.router.ServedModel`
(:mod:`.router`): one of several upstreams. Every generation response carries ``Vary:
Accept-Encoding, Codec-Client-Version`` (§9.1 item 3) and the routed model's
``Codec-Tokenizer-Map`` (when it has a map); binary streams add ``Codec-Ids-Source``
(``engine``, ``upstream`` or ``retokenized``: where the frames' ids come from). Headers
pass through the floor table for the client's declared version (§5.3) in one place,
:func:`_generation_headers`. Dictionary zstd (§4.1) goes only to clients that send
``Codec-Client-Version``: a generic client's ``zstd`` offer does not mean it holds our
dictionary. Generation endpoints first
answer the 426 when the deployment mandates v0.4 and the client is older (§2.7b, §5.4), for
JSON requests too. Every 4xx/5xx before a stream starts has the OpenAI JSON error body.
"""

from __future__ import annotations

import asyncio
import functools
import secrets
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

from tokenwire.codec.compression import COMPRESSORS, GzipDecompressor, ZstdDict, new_compressor
from tokenwire.codec.frames import StreamFormat
from tokenwire.codec.maps import TokenizerMap
from tokenwire.codec.picker import pick_encoding
from tokenwire.codec.requests import decode_request
from tokenwire.codec.safety_policy import BannedTokenPolicy, SafetyPolicyDescriptor, hash_policy
from tokenwire.codec.versioning import (
    CLIENT_VERSION_HEADER,
    OWN_VERSION,
    VARY,
    Version,
    filter_headers,
    format_version,
    header_allowed,
    needs_upgrade,
    parse_version,
    upgrade_required_response,
)
from tokenwire.errors import (
    ConfigError,
    ProtocolError,
    ResponsesRequestError,
    TokenwireError,
    UnknownModel,
)
from tokenwire.gateway.admission import (
    TICKET_SCOPE_KEY,
    Admission,
    AdmissionMiddleware,
    Ticket,
    limits_of,
)
from tokenwire.gateway.apis.chat import ChatRenderer, parse_chat_request
from tokenwire.gateway.apis.codec_stream import CodecStreamRenderer
from tokenwire.gateway.apis.completions import CompletionsRenderer, parse_completions_request
from tokenwire.gateway.apis.errors import error_body, retry_after_header
from tokenwire.gateway.apis.params import JSON_FORMAT, SUPPORTED_STREAM_FORMATS, bad_request
from tokenwire.gateway.apis.sse import openai_error_code
from tokenwire.gateway.http_streaming import EventResponse, Renderer
from tokenwire.gateway.ir import Failure, GenerationRequest, IdsSource, PromptIds, Upstream
from tokenwire.gateway.observability import Observability, api_for_path
from tokenwire.gateway.response_store import ResponseStore, SQLiteResponseStore
from tokenwire.gateway.retry import RetryPolicy
from tokenwire.gateway.router import HealthMonitor, Router, ServedModel, overall_status
from tokenwire.gateway.schema import PROTO_SCHEMA
from tokenwire.gateway.settings import ServerSettings
from tokenwire.gateway.stops import validate_stops
from tokenwire.gateway.supervisor import SupervisedStream, Timing

__all__ = ["GatewayState", "create_app", "read_body"]

#: What this release guarantees, listed by /health so an operator can tell an updated
#: server from an old one (seed: the ``features`` list of ``/health``).
FEATURES = ("responses-ws-426", "openai-internal-strip", "retry-budgets-v1",
            "admission-queue-v1", "heartbeats-v1", "metrics-v1")
#: Server-side order of preference (codec-spec §4.1); availability is the registry's.
_PREFERENCE = ("zstd", "br", "gzip", "identity")
_BINARY_TYPES = {"application/x-msgpack": StreamFormat.MSGPACK,
                 "application/x-protobuf": StreamFormat.PROTOBUF}


@dataclass
class GatewayState:
    """What the routes need: settings, the served models, the policy.

    Build it with ``router=`` (many models), or with one ``upstream`` + ``tmap`` +
    ``max_model_len`` (the embedded engine alone), which becomes a one-model router.
    ``tmap`` / ``max_model_len`` then name the primary model's (``/tokenize``).
    """

    settings: ServerSettings
    upstream: Upstream | None = None
    tmap: TokenizerMap | None = None
    max_model_len: int | None = None
    policy: BannedTokenPolicy | None = None
    descriptor: SafetyPolicyDescriptor | None = None
    #: Other maps to publish (e.g. the bundled bytes when ``tmap`` advertises dictionaries).
    extra_maps: tuple[TokenizerMap, ...] = ()
    created: int = field(default_factory=lambda: int(time.time()))
    clock: Callable[[], float] = time.monotonic
    router: Router = field(default=None)  # type: ignore[assignment]  # set in __post_init__
    health: HealthMonitor = field(default=None)  # type: ignore[assignment]
    #: Stored Responses (``store``, ``previous_response_id``, ``GET /v1/responses/{id}``).
    response_store: ResponseStore = field(default_factory=SQLiteResponseStore)
    #: The capacity bound (seed, "Capacity"); built from the settings and upstream limits.
    admission: Admission = field(default=None)  # type: ignore[assignment]
    #: Prometheus metrics and the request log (``gateway/observability.py``).
    observability: Observability = field(default_factory=Observability)
    #: Generations in flight, for graceful shutdown (weak: a finished one just disappears).
    live_streams: weakref.WeakSet[SupervisedStream] = field(default_factory=weakref.WeakSet)

    def __post_init__(self) -> None:
        if self.router is None:
            if self.upstream is None:
                raise ConfigError("a gateway needs a router or an upstream")
            self.router = Router([ServedModel(
                name=self.upstream.model_id, upstream=self.upstream, tmap=self.tmap,
                max_model_len=self.max_model_len, ids_source=IdsSource.ENGINE,
                upstream_name=getattr(self.upstream, "name", "embedded"))])
        primary = self.router.primary
        if self.tmap is None:
            self.tmap = primary.tmap
        if self.max_model_len is None:
            self.max_model_len = primary.max_model_len
        if self.health is None:
            self.health = HealthMonitor(self.router.upstreams())
        if self.admission is None:
            self.admission = Admission(
                max_concurrent=self.settings.max_concurrent, queue_size=self.settings.queue_size,
                limits=limits_of(up for _, up in self.router.upstreams()))
        self.observability.set_capacity_source(self.admission.counts)

    def timing(self, *, streaming: bool) -> Timing:
        """The request clocks; a non-streaming request has no stream to keep alive."""
        s = self.settings
        return Timing(heartbeat_s=s.heartbeat_s if streaming else None,
                      idle_timeout_s=s.idle_timeout_s, request_cap_s=s.request_cap_s)

    def supervise(self, request: Request, served: ServedModel, gen: GenerationRequest, *,
                  streaming: bool, api: str) -> SupervisedStream:
        """The generation as the APIs see it: queued, retried, timed (``supervisor.py``),
        and recorded (``api`` names the surface in metrics and logs)."""
        record = self.observability.new_request(
            api=api, model=served.name, upstream=served.upstream_name or served.name,
            request_id=gen.request_id, stream=streaming)
        ticket = ticket_of(request)
        ticket.supervised, ticket.on_release = True, record.close
        stream = SupervisedStream(served, gen, ticket,
                                  timing=self.timing(streaming=streaming),
                                  policy=RetryPolicy(enabled=self.settings.retries),
                                  observer=record)
        self.live_streams.add(stream)
        return stream

    def abort_all(self, failure: Failure) -> int:
        """End every running generation with ``failure`` (graceful shutdown's last step:
        each client gets a terminal failure instead of a cut connection); how many."""
        streams = list(self.live_streams)
        for stream in streams:
            stream.abort(failure)
        return len(streams)

    @property
    def dicts(self) -> dict[str, ZstdDict]:
        return dict(self.settings.zstd_dicts)

    def safety_headers(self) -> list[tuple[str, str]]:
        if self.descriptor is None:
            return []
        return [("Codec-Safety-Policy", self.descriptor.id),
                ("Codec-Safety-Policy-Hash", hash_policy(self.descriptor))]

    def policy_for(self, model: ServedModel) -> BannedTokenPolicy | None:
        """The safety policy, for models of the vocabulary it was written for: banned ids
        of one vocabulary mean other tokens in another (§5.5 ``tokenizers``)."""
        if self.policy is None or self.descriptor is None or model.tmap is None:
            return None
        return self.policy if model.tmap.id in self.descriptor.tokenizers else None


# -- shared request plumbing -------------------------------------------------------------


def client_version(request: Request) -> Version:
    return parse_version(request.headers.get(CLIENT_VERSION_HEADER))


def ticket_of(request: Request) -> Ticket:
    """The admission ticket :class:`~.admission.AdmissionMiddleware` took for the request."""
    ticket = request.scope.get(TICKET_SCOPE_KEY)
    if ticket is None:  # a route outside INFERENCE_PATHS asked: a wiring bug, say so
        raise RuntimeError(f"no admission ticket for {request.url.path}")
    return ticket


def json_error(status: int, message: str, *, code: str | None = None,
               headers: dict[str, str] | None = None) -> Response:
    return Response(error_body(message, status=status, code=code), status_code=status,
                    media_type="application/json", headers={"Vary": VARY, **(headers or {})})


def _upgrade_response(state: GatewayState, request: Request) -> Response | None:
    """The exact 426 of codec-spec §5.4, or None when the client may proceed."""
    policy = state.settings.version_policy
    if not needs_upgrade(policy, client_version(request)):
        return None
    status, headers, body = upgrade_required_response(
        policy, request.headers.get(CLIENT_VERSION_HEADER))
    return Response(body, status_code=status, headers={**dict(headers), "Vary": VARY})


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, at most ``limit`` bytes after an optional gzip coding (§4.1).

    An inference request's upload counts against its silence bound (seed: ``timeoutMs``
    "covers the upload and queue wait"): a client that stops sending gets a 408."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise bad_request(f"request body is {declared} bytes; the limit is {limit}", 413)
    chunks, size = [], 0
    ticket = request.scope.get(TICKET_SCOPE_KEY)
    settings = request.app.state.gateway.settings
    deadline = ticket.arrived_at + settings.idle_timeout_s if ticket is not None else None
    try:
        async with asyncio.timeout_at(deadline):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise bad_request(f"request body exceeds the {limit}-byte limit", 413)
                chunks.append(chunk)
    except TimeoutError:
        raise bad_request(f"the request body did not arrive within "
                          f"{settings.idle_timeout_s:g} s", 408) from None
    body = b"".join(chunks)
    coding = request.headers.get("content-encoding", "identity").strip().lower()
    if coding in ("", "identity"):
        return body
    if coding != "gzip":
        raise bad_request(f"request Content-Encoding {coding!r} is not supported; use gzip", 415)
    dec = GzipDecompressor(max_output=limit)
    return dec.decompress(body) + dec.finish()


async def read_json(request: Request, limit: int) -> Any:
    body = await read_body(request, limit)
    try:
        return msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from None


def _route(state: GatewayState, model: str | None, fmt: StreamFormat | None) -> ServedModel:
    """The served model a request names, refusing binary formats it cannot give ids for."""
    served = state.router.route(model)
    if fmt is not None and not served.has_ids:
        raise bad_request(
            f"stream_format {fmt.value!r} needs token ids, but model {served.name!r} has no "
            "tokenizer map and its upstream returns text only; use stream_format 'json', or "
            "configure a map for the model")
    return served


def _new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


# -- generation ----------------------------------------------------------------------------


def _generation_headers(
    state: GatewayState, served: ServedModel, cv: Version, renderer: Renderer, encoding: str,
    zdict: ZstdDict | None, reason_code: str, request_id: str,
) -> list[tuple[str, str]]:
    """All response headers of a generation, filtered by the client's version (§5.3)."""
    headers = [("Content-Type", renderer.content_type), ("Vary", VARY),
               ("Cache-Control", "no-store"), ("X-Accel-Buffering", "no"),
               ("X-Request-Id", request_id)]
    if served.tmap is not None:
        headers.append(("Codec-Tokenizer-Map", served.tmap.hash))
    if isinstance(renderer, CodecStreamRenderer):  # where the frames' ids come from
        headers.append(("Codec-Ids-Source", served.ids_source.value))
    if encoding != "identity":
        headers.append(("Content-Encoding", encoding))
    if zdict is not None:  # §4.1: every zstd response names its dictionary
        headers.append(("Codec-Zstd-Dict", zdict.hash))
    if state.policy_for(served) is not None:
        headers += state.safety_headers()
    headers.append(("Codec-Pick", reason_code))
    return filter_headers(headers, cv)


def _failure_response(failure: Failure) -> tuple[int, list[tuple[str, str]], bytes]:
    """A failure before any byte was sent is an ordinary error response with its status."""
    status = failure.status if 400 <= failure.status <= 599 else 500
    body = error_body(failure.message, status=status, code=openai_error_code(failure))
    return status, [("Content-Type", "application/json"), ("Vary", VARY),
                    *retry_after_header(failure.retry_after)], body


def _start_generation(
    state: GatewayState, request: Request, served: ServedModel, gen: GenerationRequest,
    renderer: Renderer, format_key: str, *, streaming: bool,
    on_failure: Callable[[Failure], tuple[int, list[tuple[str, str]], bytes]] | None = None,
) -> Response | EventResponse:
    """Negotiate the coding (§4.3), admit the request, and return the streaming response.

    ``on_failure`` builds the error response for a failure before any byte was sent: an
    API with its own error shape (Anthropic Messages) passes one; the default is OpenAI's."""
    cv = client_version(request)
    policy = state.policy_for(served)
    gen = msgspec.structs.replace(
        gen, model=served.name,
        banned_ids=policy.banned_ids if policy is not None else gen.banned_ids)
    zdict = state.settings.zstd_dicts.get(format_key)
    # Dictionary zstd only for clients that declare a Codec version: generic HTTP clients
    # (httpx, browsers) offer "zstd" too, and cannot decode a body that needs our dictionary
    # ("Dictionary mismatch"). Undeclared clients get br/gzip, which every client decodes.
    allow_zstd = (zdict is not None and CLIENT_VERSION_HEADER in request.headers
                  and header_allowed("Codec-Zstd-Dict", cv))
    pick = pick_encoding(
        request.headers.get("accept-encoding"), zstd_has_dict=allow_zstd,
        server_supports=tuple(c for c in _PREFERENCE if c in COMPRESSORS),
    )
    zdict = zdict if pick.encoding == "zstd" else None
    api = "codec" if isinstance(renderer, CodecStreamRenderer) else api_for_path(request.url.path)
    stream = state.supervise(request, served, gen, streaming=streaming, api=api)
    return EventResponse(
        stream, renderer,
        headers=_generation_headers(state, served, cv, renderer, pick.encoding, zdict,
                                    pick.reason_code.value, gen.request_id),
        compressor=functools.partial(new_compressor, pick.encoding, dictionary=zdict),
        on_failure=on_failure or _failure_response, window=state.settings.window_s,
        streaming=streaming, clock=state.clock, record=stream.observer,
    )


def _codec_renderer(state: GatewayState, fmt: StreamFormat, cv: Version) -> CodecStreamRenderer:
    return CodecStreamRenderer(fmt, client_version=cv,
                               legacy_finish_reason=state.settings.legacy_finish_reason)


async def completions(request: Request) -> Response | EventResponse:
    state: GatewayState = request.app.state.gateway
    if (upgrade := _upgrade_response(state, request)) is not None:
        return upgrade
    body = await read_json(request, state.settings.max_body_bytes)
    rid = _new_id("cmpl")
    call = parse_completions_request(body, request_id=rid)
    served = _route(state, call.model, call.stream_format)
    if call.return_token_ids and not served.has_ids:
        raise bad_request(f"return_token_ids needs token ids, but model {served.name!r} has "
                          "no tokenizer map and its upstream returns text only")
    renderer: Renderer
    if call.stream_format is not None:
        renderer = _codec_renderer(state, call.stream_format, client_version(request))
    else:
        renderer = CompletionsRenderer(
            completion_id=rid, model=served.name, created=int(time.time()),
            stream=call.stream, include_usage=call.include_usage,
            return_token_ids=call.return_token_ids)
    key = call.stream_format.value if call.stream_format is not None else JSON_FORMAT
    gen = msgspec.structs.replace(
        call.request, want_ids=call.stream_format is not None or call.return_token_ids,
        want_text=call.stream_format is None)
    return _start_generation(state, request, served, gen, renderer, key, streaming=call.stream)


async def chat_completions(request: Request) -> Response | EventResponse:
    state: GatewayState = request.app.state.gateway
    if (upgrade := _upgrade_response(state, request)) is not None:
        return upgrade
    body = await read_json(request, state.settings.max_body_bytes)
    rid = _new_id("chatcmpl")
    call = parse_chat_request(body, request_id=rid)
    served = _route(state, call.model, call.stream_format)
    renderer: Renderer
    if call.stream_format is not None:
        renderer = _codec_renderer(state, call.stream_format, client_version(request))
    else:
        renderer = ChatRenderer(completion_id=rid, model=served.name,
                                created=int(time.time()), stream=call.stream,
                                include_usage=call.include_usage)
    key = call.stream_format.value if call.stream_format is not None else JSON_FORMAT
    gen = msgspec.structs.replace(call.request, want_ids=call.stream_format is not None,
                                  want_text=call.stream_format is None)
    return _start_generation(state, request, served, gen, renderer, key, streaming=call.stream)


def _path_c_body_format(content_type: str) -> StreamFormat:
    media = content_type.split(";")[0].strip().lower()
    if media not in _BINARY_TYPES:
        raise bad_request(
            f"Content-Type {media or '(none)'!r} is not a Codec request body; use "
            "application/x-msgpack or application/x-protobuf (codec-spec §1.3)", 415)
    return _BINARY_TYPES[media]


async def completions_codec(request: Request) -> Response | EventResponse:
    """Path C: binary request in, binary frames out (codec-spec §1.3, §2.7b)."""
    state: GatewayState = request.app.state.gateway
    if (upgrade := _upgrade_response(state, request)) is not None:
        return upgrade
    body_fmt = _path_c_body_format(request.headers.get("content-type", ""))
    limit = state.settings.max_body_bytes
    creq = decode_request(await read_body(request, limit), body_fmt, max_bytes=limit)
    try:
        fmt = StreamFormat(creq.stream_format)
    except ValueError:
        raise bad_request(
            f"unsupported stream_format {creq.stream_format!r} for Path C; supported: "
            + ", ".join(f.value for f in StreamFormat)) from None
    if fmt.content_type != body_fmt.content_type:  # §2.4: body type and format must agree
        raise bad_request(f"a {body_fmt.content_type} body cannot ask for stream_format "
                          f"{fmt.value!r} ({fmt.content_type})", 415)
    if not creq.prompt_ids:
        raise bad_request("prompt_ids is empty")
    if creq.max_tokens < 1:
        raise bad_request("max_tokens must be at least 1")
    try:
        stop = validate_stops(creq.stop)
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    rid = _new_id("cmpl")
    served = _route(state, None, fmt)  # Path C bodies name no model (§1.3): the default
    temperature = 1.0 if creq.temperature is None else min(max(creq.temperature, 0.0), 2.0)
    gen = GenerationRequest(prompt=PromptIds(ids=creq.prompt_ids), max_tokens=creq.max_tokens,
                            temperature=temperature, stop=stop, request_id=rid, want_ids=True,
                            want_text=False)
    renderer = _codec_renderer(state, fmt, client_version(request))
    return _start_generation(state, request, served, gen, renderer, fmt.value, streaming=True)


# -- small GET routes ------------------------------------------------------------------------


async def models(request: Request) -> Response:
    """Every served model; ``owned_by`` is its upstream's name (issue 4 item 4)."""
    state: GatewayState = request.app.state.gateway
    return JSONResponse({"object": "list",
                         "data": [_model_entry(state, m) for m in state.router.models]})


def _model_entry(state: GatewayState, m: ServedModel) -> dict[str, Any]:
    entry: dict[str, Any] = {"id": m.name, "object": "model", "created": state.created,
                             "owned_by": m.upstream_name or "tokenwire",
                             "codec_ids_source": m.ids_source.value}
    if m.max_model_len is not None:
        entry["max_model_len"] = m.max_model_len
    if m.tmap is not None:
        entry["codec_tokenizer_map"] = {"id": m.tmap.id, "hash": m.tmap.hash}
    return entry


async def health(request: Request) -> Response:
    """Overall status plus each upstream's last probe; 503 when no upstream is up."""
    state: GatewayState = request.app.state.gateway
    upstreams = await state.health.snapshot()
    status = overall_status(h.state for h in upstreams)
    running, queued = state.admission.counts()
    body: dict[str, Any] = {"status": status, "upstreams": [{
        "name": h.name, "kind": h.kind, "state": h.state.value, "models": list(h.models),
        "detail": h.detail} for h in upstreams],
        "running": running, "queued": queued, "features": list(FEATURES)}
    if state.router.default is not None:
        body["model"] = state.router.default.name
    return JSONResponse(body, status_code=503 if status == "down" else 200)


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


# -- errors and assembly ---------------------------------------------------------------------


async def _protocol_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ProtocolError)
    status = exc.status_hint if 400 <= exc.status_hint <= 599 else 400
    # OpenAI's code for an unknown model, which SDKs and agents recognise.
    code = "model_not_found" if isinstance(exc, UnknownModel) else type(exc).__name__
    return json_error(status, str(exc), code=code)


async def _tokenwire_error(request: Request, exc: Exception) -> Response:
    status = getattr(exc, "status_hint", 500)
    return json_error(status, str(exc), code=type(exc).__name__)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return json_error(exc.status_code, str(exc.detail), headers=dict(exc.headers or {}))


def _discovery_routes(state: GatewayState) -> list[BaseRoute]:
    # ---- HOOK: /.well-known/codec/ discovery (issue 3 item 2) --------------------------
    # gateway/wellknown.py is written separately; mount it when it is present.
    try:
        from tokenwire.gateway import wellknown
    except ImportError:  # pragma: no cover - the module ships with the package
        return []
    policies = (wellknown.PublishedPolicy.from_descriptor(state.descriptor),) \
        if state.descriptor is not None else ()
    disc = wellknown.DiscoveryState(
        maps=(*state.router.maps(), *state.extra_maps), dicts=state.dicts, policies=policies,
        version_policy=state.settings.version_policy)
    return list(wellknown.wellknown_routes(disc))


def create_app(state: GatewayState) -> Starlette:
    """The ASGI app over ``state`` (the upstream must already be started)."""
    from tokenwire.gateway.apis.messages import messages_endpoint  # issue 5 item 5
    from tokenwire.gateway.apis.responses_get import get_response, responses_error_response
    from tokenwire.gateway.apis.responses_route import responses_routes  # issue 5 item 1
    from tokenwire.gateway.security import internal_error_response
    from tokenwire.gateway.tokenize_routes import detokenize, tokenize

    routes: list[BaseRoute] = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/completions/codec", completions_codec, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/messages", messages_endpoint, methods=["POST"]),  # Anthropic Messages
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/codec/schema", codec_schema, methods=["GET"]),
        Route("/codec/version", codec_version, methods=["GET"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        *responses_routes(),  # POST /v1/responses (OpenAI Responses)
        Route("/v1/responses/{response_id}", get_response, methods=["GET"]),  # stored ones
        *_discovery_routes(state),
    ]
    def rejected(path: str, status: int, reason: str) -> None:
        state.observability.rejected(api=api_for_path(path), status=status, reason=reason)

    app = Starlette(routes=routes, middleware=[
        Middleware(AdmissionMiddleware, admission=state.admission, on_rejected=rejected)],
        exception_handlers={
        ProtocolError: _protocol_error, TokenwireError: _tokenwire_error,
        HTTPException: _http_error,
        ResponsesRequestError: responses_error_response,  # OpenAI shape with param/code
        # Starlette's ServerErrorMiddleware sends this (instead of its plain-text 500)
        # before re-raising; the serving stack's CrashBarrier then only logs.
        Exception: internal_error_response,
    })
    app.state.gateway = state
    return app
