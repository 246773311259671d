"""Starting a generation: route the model, negotiate the coding, admit, stream.

Shared by every generation route (Completions, Chat, Path C, Responses, Messages): the
response headers pass through the floor table for the client's declared version (§5.3) in
one place, :func:`generation_headers`; dictionary zstd (§4.1) goes only to clients that
send ``Codec-Client-Version``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from tokenwire.codec.compression import COMPRESSORS, ZstdDict, new_compressor
from tokenwire.codec.frames import StreamFormat
from tokenwire.codec.picker import Pick, pick_encoding
from tokenwire.codec.versioning import (
    CLIENT_VERSION_HEADER,
    VARY,
    Version,
    filter_headers,
    header_allowed,
)
from tokenwire.gateway.apis.codec_stream import CodecStreamRenderer
from tokenwire.gateway.apis.errors import error_body, retry_after_header
from tokenwire.gateway.apis.params import bad_request
from tokenwire.gateway.apis.sse import openai_error_code
from tokenwire.gateway.http.requests import client_version
from tokenwire.gateway.http.state import GatewayState
from tokenwire.gateway.http.streaming import EventResponse, Renderer
from tokenwire.gateway.ir import (
    ChatPrompt,
    Failure,
    GenerationRequest,
    ImagePart,
    PromptIds,
    kind_of,
)
from tokenwire.gateway.observability.bounds import api_for_path
from tokenwire.gateway.request_fields import refusal
from tokenwire.gateway.routing.router import ServedModel

__all__ = ["ACCEPT_ENCODING_HEADER", "RAW_BODY_HEADER", "RAW_CODING_HEADER", "check_inputs",
           "check_model_limits", "codec_renderer", "generation_headers", "route_model",
           "start_generation"]

#: Server-side order of preference (codec-spec §4.1); availability is the registry's.
_PREFERENCE = ("zstd", "br", "gzip", "identity")
_SERVER_CODINGS = tuple(c for c in _PREFERENCE if c in COMPRESSORS)  # as installed
#: The playground's way to choose a coding (``GET /``, ``http/playground.py``): a page script
#: cannot set ``Accept-Encoding`` (a forbidden header), so the pick reads this request
#: header instead when present (same syntax).
ACCEPT_ENCODING_HEADER = "Tokenwire-Accept-Encoding"
#: Browsers decode any ``Content-Encoding`` before a script sees a byte. A request with
#: ``Tokenwire-Raw-Body: 1`` gets its coding named in ``Tokenwire-Content-Encoding`` instead,
#: so the page counts the bytes as sent and inflates them itself (DecompressionStream).
RAW_BODY_HEADER = "Tokenwire-Raw-Body"
RAW_CODING_HEADER = "Tokenwire-Content-Encoding"
#: What the picker is offered for an API's own event stream (OpenAI or Anthropic SSE, not
#: Codec frames) to a client that declares no Codec version, unless the deployment sets
#: ``compress_event_streams``: such clients offer gzip/br because their HTTP library always
#: does, and a compressed token stream cost them 0.28 ms of time to first token (the
#: gateway's compressor and the client's decoder, both cold on the first chunk; one client
#: alternating the two, 60 rounds: +1.06 ms added over direct compressed, +0.78 not;
#: BENCHMARKS.md, "Session of 2026-12-05 (5)") to save ~200 bytes a token. Codec clients,
#: the playground's explicit ``Tokenwire-Accept-Encoding``, Codec streams and whole bodies
#: keep the §4.3 pick.
_UNCOMPRESSED = "identity"


def route_model(state: GatewayState, model: str | None, fmt: StreamFormat | None) -> ServedModel:
    """The served model a request names, refusing binary formats it cannot give ids for."""
    served = state.router.route(model)
    if fmt is not None and not served.has_ids:
        raise bad_request(
            f"stream_format {fmt.value!r} needs token ids, but model {served.name!r} has no "
            "tokenizer map and its upstream returns text only; use stream_format 'json', or "
            "configure a map for the model", param="stream_format", code="unsupported_value")
    return served


def check_inputs(served: ServedModel, gen: GenerationRequest) -> None:
    """Refuse, before admission, input the routed model cannot read: an image sent to a
    text-only model is a 400 naming the field (the engine would otherwise fail deep in its
    chat template, after the request waited its turn); so is a field the upstream's kind
    cannot honour (``gateway/request_fields.py``: nothing is dropped silently)."""
    refused = refusal(gen, kind_of(served.upstream))
    if refused is not None:
        raise refused
    if served.accepts_images or not isinstance(gen.prompt, ChatPrompt):
        return
    for message in gen.prompt.messages:
        if isinstance(message.content, str):
            continue
        image = next((p for p in message.content if isinstance(p, ImagePart)), None)
        if image is not None:
            raise bad_request(f"this model does not accept images ({served.name!r} reads "
                              "text only); send the request without the image",
                              param=image.param, code="unsupported_value")


def check_model_limits(served: ServedModel, gen: GenerationRequest, *,
                       prompt_field: str = "prompt") -> GenerationRequest:
    """What reaches an upstream is what the routed model can do: prompt ids outside its
    map's vocabulary are a 400 naming the field; ``max_tokens`` is capped at its context
    window (the parsers already refuse values past ``MAX_MAX_TOKENS``, naming their field;
    APIs with a default, like Responses' 4096, must still work on a small model)."""
    ids = gen.prompt.ids if isinstance(gen.prompt, PromptIds) else ()
    top = served.tmap.max_id if served.tmap is not None else None
    # min and max run in C; the index is searched for only once an id is known to be bad
    # (a Python pass over millions of ids held the event loop for a second)
    if ids and top is not None and not 0 <= min(ids) <= max(ids) <= top:
        bad = next(i for i, t in enumerate(ids) if not 0 <= t <= top)
        raise bad_request(f"{prompt_field}[{bad}]: token id {ids[bad]} is outside model "
                          f"{served.name!r}'s vocabulary 0..{top}",
                          param=f"{prompt_field}[{bad}]", code="invalid_value")
    limit = served.max_model_len
    if limit is not None and gen.max_tokens is not None and gen.max_tokens > limit:
        gen = msgspec.structs.replace(gen, max_tokens=limit)
    return gen


#: Distinct heads ``GatewayState.heads`` keeps (models x client versions x codings); past
#: it, they start over.
MAX_HEADS = 256


def generation_headers(
    state: GatewayState, served: ServedModel, cv: Version, renderer: Renderer, encoding: str,
    zdict: ZstdDict | None, reason_code: str, request_id: str, *, raw: bool = False,
) -> list[tuple[str, str]]:
    """All response headers of a generation, filtered by the client's version (§5.3).

    Only the request id differs between requests of one model, client version and coding:
    the rest is built and filtered once and kept in ``state.heads`` (on the way to every
    first token, building and filtering it took ~38 µs with the caches cold: BENCHMARKS.md,
    "Session of 2026-12-05 (6)"). An entry is used only for the very model object it was
    built for (a reloaded router's models are new objects)."""
    key = (served.name, cv, renderer.content_type, isinstance(renderer, CodecStreamRenderer),
           encoding, zdict.hash if zdict is not None else None, reason_code, raw)
    entry = state.heads.get(key)
    if entry is None or entry[0] is not served:
        if len(state.heads) >= MAX_HEADS:
            state.heads.clear()
        entry = state.heads[key] = (served, *_static_headers(
            state, served, cv, renderer, encoding, zdict, reason_code, raw=raw))
    _, before, after = entry
    return [*before, ("X-Request-Id", request_id), *after]  # (no version floor, §5.3)


def _static_headers(
    state: GatewayState, served: ServedModel, cv: Version, renderer: Renderer, encoding: str,
    zdict: ZstdDict | None, reason_code: str, *, raw: bool,
) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
    """The head of :func:`generation_headers` before and after the request id, filtered."""
    before = [("Content-Type", renderer.content_type), ("Vary", VARY),
              ("Cache-Control", "no-store"), ("X-Accel-Buffering", "no")]
    headers = []
    if served.tmap is not None:
        headers.append(("Codec-Tokenizer-Map", served.tmap.hash))
    if isinstance(renderer, CodecStreamRenderer):  # where the frames' ids come from
        headers.append(("Codec-Ids-Source", served.ids_source.value))
    if raw:  # the page decodes the body itself (RAW_BODY_HEADER)
        headers.append((RAW_CODING_HEADER, encoding))
    elif encoding != "identity":
        headers.append(("Content-Encoding", encoding))
    if zdict is not None:  # §4.1: every zstd response names its dictionary
        headers.append(("Codec-Zstd-Dict", zdict.hash))
    if state.policy_for(served) is not None:
        headers += state.safety_headers()
    headers.append(("Codec-Pick", reason_code))
    return tuple(filter_headers(before, cv)), tuple(filter_headers(headers, cv))


def _failure_response(failure: Failure) -> tuple[int, list[tuple[str, str]], bytes]:
    """A failure before any byte was sent is an ordinary error response with its status."""
    status = failure.status if 400 <= failure.status <= 599 else 500
    body = error_body(failure.message, status=status, code=openai_error_code(failure),
                      param=failure.param)
    return status, [("Content-Type", "application/json"), ("Vary", VARY),
                    *retry_after_header(failure.retry_after)], body


def start_generation(
    state: GatewayState, request: Request, served: ServedModel, gen: GenerationRequest,
    renderer: Renderer, format_key: str, *, streaming: bool,
    on_failure: Callable[[Failure], tuple[int, list[tuple[str, str]], bytes]] | None = None,
) -> Response | EventResponse:
    """Negotiate the coding (§4.3), admit the request, and return the streaming response.

    ``on_failure`` builds the error response for a failure before any byte was sent: an
    API with its own error shape (Anthropic Messages) passes one; the default is OpenAI's."""
    check_inputs(served, gen)
    path = request.scope["path"]  # not ``request.url``: a URL object parsed for one string
    gen = check_model_limits(served, gen, prompt_field="prompt_ids"
                             if path.endswith("/codec") else "prompt")
    cv = client_version(request)
    gen = msgspec.structs.replace(gen, model=served.name)  # banned ids: state.supervise
    zdict = state.settings.zstd_dicts.get(format_key)
    # Dictionary zstd only for clients that declare a Codec version: generic HTTP clients
    # (httpx, browsers) offer "zstd" too, and cannot decode a body that needs our dictionary
    # ("Dictionary mismatch"). Undeclared clients get br/gzip, which every client decodes.
    declared = CLIENT_VERSION_HEADER in request.headers
    allow_zstd = zdict is not None and declared and header_allowed("Codec-Zstd-Dict", cv)
    codec = isinstance(renderer, CodecStreamRenderer)
    chosen = request.headers.get(ACCEPT_ENCODING_HEADER)
    offered = chosen if chosen is not None else request.headers.get("accept-encoding")
    if streaming and not codec and not declared and chosen is None \
            and not state.settings.compress_event_streams:
        offered = _UNCOMPRESSED  # an API's event stream to a generic client (why: there)
    pick = _pick(offered, allow_zstd)
    zdict = zdict if pick.encoding == "zstd" else None
    api = "codec" if codec else api_for_path(path)
    stream = state.supervise(request, served, gen, streaming=streaming, api=api)

    def headers() -> list[tuple[str, str]]:  # at the head: a fallback may serve by then
        serving = stream.serving if isinstance(stream.serving, ServedModel) else served
        return generation_headers(state, serving, cv, renderer, pick.encoding, zdict,
                                  pick.reason_code.value, gen.request_id,
                                  raw=request.headers.get(RAW_BODY_HEADER) == "1",
                                  ) + filter_headers(
            stream.served_headers(), cv)

    return EventResponse(
        stream, renderer, headers=headers,
        # gzip keeps one deflate block open for Codec token streams, Z_BLOCK for the text APIs'
        # SSE (the rule and its numbers: codec/compression.py GzipCompressor).
        compressor=functools.partial(new_compressor, pick.encoding, dictionary=zdict,
                                     open_block=api == "codec"),
        on_failure=on_failure or _failure_response, window=state.settings.window_s,
        streaming=streaming, clock=state.clock, record=stream.observer,
    )


@functools.lru_cache(maxsize=256)
def _pick(accept_encoding: str | None, zstd_has_dict: bool) -> Pick:
    """The §4.3 pick for one ``Accept-Encoding`` value: a pure function of it, and clients
    send the same few values, so it is worked out once per value (parsing and ranking it was
    ~1 % of a short request's CPU). The cache is bounded: varied headers only cost misses."""
    return pick_encoding(accept_encoding, zstd_has_dict=zstd_has_dict,
                         server_supports=_SERVER_CODINGS)


def codec_renderer(state: GatewayState, fmt: StreamFormat, cv: Version) -> CodecStreamRenderer:
    return CodecStreamRenderer(fmt, client_version=cv,
                               legacy_finish_reason=state.settings.legacy_finish_reason)
