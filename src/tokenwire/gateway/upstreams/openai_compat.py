"""OpenAI-compatible upstreams: vLLM, llama.cpp (``llama-server``, ``python -m llama_cpp.server``),
Ollama, LM Studio and hosted Chat Completions / Completions APIs (``kind = "openai"``).

A :class:`~tokenwire.gateway.ir.ChatPrompt` goes to ``/chat/completions``; a text or ids prompt
to ``/completions`` (option ``api``: ``"auto"`` (default), or ``"chat"`` / ``"completions"``
for an upstream that serves only one; the other prompt kind is then refused). Always
``stream: true`` with ``stream_options.include_usage`` so usage arrives in a final chunk
(gateway-research §5.8); every figure it reports is kept (``usage_wire.py``). Servers that
send none on a stream (``python -m llama_cpp.server``) are counted by the gateway
(``gateway/usage.py``).

Ids (option ``ids``), asked for only when ``request.want_ids``:

* ``"vllm"``: ``"return_token_ids": true``; chunks carry ``choices[i].token_ids`` (vLLM >= 0.10.2).
* ``"llama.cpp"``: ``"return_tokens": true``; chunks carry ``tokens`` (choice or top level).
* ``"none"``: text only; with a tokenizer map the gateway retokenizes (``retokenized``).
* ``"auto"`` (default): ``none`` until :meth:`OpenAICompatUpstream.probe` reads ``owned_by``
  of ``GET /models`` (``vllm`` -> vllm, ``llamacpp`` -> llama.cpp).

Structured output (option ``json_schema``, :data:`JSON_SCHEMA_MODES`): OpenAI's
``response_format`` by default; llama-cpp-python's server takes a schema on ``json_object``
instead, found by :meth:`OpenAICompatUpstream.probe` (models ``owned_by: "me"``).

If ids were asked for but a chunk with text has none (an older server), the stream falls back
to retokenizing with the model's map when it has one, else it fails: a Codec client never
gets text without ids.

The HTTP side (one ``POST``, SSE in, cancellation, the concurrency cap) is
:class:`.sse_http.SSEUpstreamStream` around :class:`ChunkParser`; failures are classified from
structured fields first (:mod:`.failures`).

Ollama answers an over-long prompt by silently dropping its start: when the model has a map
and the final usage reports fewer prompt tokens than the prompt certainly has, the stream
ends with ``Failure(CONTEXT_LENGTH)`` instead of ``Finish`` (option ``truncation = "ignore"``
turns this off; :mod:`.prompt_truncation` says how and where the prompt is counted). The
answer has been streamed by then; there is no pre-flight (Ollama's context size is per
request and per model and not reported by the OpenAI layer), so this is the earliest point
it is known.

Context windows: :meth:`OpenAICompatUpstream.probe` reads the one the server reports
(``max_model_len`` in ``/models``; else llama.cpp's ``/props``, else Ollama's ``/api/show``;
``gateway/context_window.py``), which the router uses to refuse, before sending, a prompt
that certainly does not fit. llama-cpp-python reports none and answers an overflowing
stream with an empty 200: that stream is confirmed non-streamed (``upstreams/overflow_probe.py``,
option ``empty_stream``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import httpx
import msgspec

from tokenwire.codec.frames import MAX_UINT32
from tokenwire.codec.maps import TokenizerMap, bundled_map_path, load_map_file
from tokenwire.errors import ConfigError
from tokenwire.gateway.context_window import (
    INLINE_COUNT_CHARS,
    certain_request_tokens,
    context_length_from_listing,
    context_length_from_props,
    context_length_from_show,
    prompt_chars,
)
from tokenwire.gateway.ir import (
    ChatPrompt,
    Event,
    Failure,
    FailureClass,
    Finish,
    GenerationRequest,
    IdsSource,
    ReasoningDelta,
    TokenDelta,
    TokenLogprob,
    Usage,
)
from tokenwire.gateway.retokenize import (
    RetokenizeFailed,
    Retokenizer,
    retokenize_failure,
)
from tokenwire.gateway.upstreams._openai_body import chat_body, completions_body
from tokenwire.gateway.upstreams.base import (
    ModelRoute,
    UpstreamConfig,
    UpstreamHealth,
    unknown_option,
)
from tokenwire.gateway.upstreams.failures import (
    MALFORMED,
    classify_error,
    failure_from_response,
    fetch_capped,
    read_capped,
)
from tokenwire.gateway.upstreams.logprobs_wire import completions_logprobs, entry_logprobs
from tokenwire.gateway.upstreams.openai_chunk_fields import (
    CallIndexes,
    Malformed,
    broken,
    finish_of,
    text_of,
    tool_call_of,
)
from tokenwire.gateway.upstreams.overflow_probe import (
    EMPTY_STREAM,
    EMPTY_STREAM_MODES,
    ConfirmingStream,
    confirmation_body,
    confirmed_failure,
)
from tokenwire.gateway.upstreams.prompt_truncation import CountedStream, truncation_failure
from tokenwire.gateway.upstreams.sse import SSEEvent
from tokenwire.gateway.upstreams.sse_http import (
    FailedStream,
    SSEUpstreamStream,
    api_key_from_env,
    http_client,
    probe_models,
)
from tokenwire.gateway.upstreams.usage_wire import openai_usage

__all__ = ["IDS_MODES", "JSON_SCHEMA_MODES", "OPTIONS", "TRUNCATION_MODES", "ChunkParser",
           "OpenAICompatUpstream", "parse_options"]

log = logging.getLogger(__name__)

IDS_MODES = ("auto", "vllm", "llama.cpp", "none")
_APIS = ("auto", "chat", "completions")
#: Option ``truncation``: ``fail`` turns a prompt the server cut into an error; ``ignore``
#: trusts the server.
TRUNCATION_MODES = ("fail", "ignore")
#: Option ``json_schema``: how a ``json_schema`` response format is sent. ``native`` is
#: OpenAI's ``{"type": "json_schema", "json_schema": {...}}``; ``json_object`` is
#: ``{"type": "json_object", "schema": ...}`` (``python -m llama_cpp.server``); ``auto``
#: picks ``json_object`` when the model listing says llama-cpp-python's server.
JSON_SCHEMA_MODES = ("auto", "native", "json_object")
#: ``owned_by`` values of ``GET /models`` that identify a server that returns ids.
_OWNERS = {"vllm": "vllm", "llamacpp": "llama.cpp"}
#: ``owned_by`` -> the server, for the behaviours that differ (llama-cpp-python says "me").
_SERVERS = {"vllm": "vllm", "llamacpp": "llama.cpp", "me": "llama-cpp-python"}
#: A props endpoint answers at once or not at all; a slow one must not delay start-up.
PROPS_TIMEOUT_S = 5.0
#: A confirmation that met a connection the server had closed is sent once more.
CONFIRM_TRIES = 2
_json = msgspec.json.Decoder()


class _PlainDelta(msgspec.Struct):
    """A chat chunk's ``delta`` as :meth:`ChunkParser._plain` reads it: ``content``, and
    the fields whose presence sends the chunk to the general path."""

    content: str | None = None
    reasoning_content: Any = None
    reasoning: Any = None
    tool_calls: Any = None
    function_call: Any = None
    refusal: Any = None


class _PlainChoice(msgspec.Struct):
    index: Any = 0
    delta: _PlainDelta | None = None
    text: Any = None
    logprobs: Any = None
    finish_reason: Any = None
    stop_reason: Any = None
    token_ids: Any = None
    tokens: Any = None


class _PlainChunk(msgspec.Struct):
    choices: list[_PlainChoice] | None = None
    usage: Any = None
    error: Any = None
    object: Any = None
    tokens: Any = None


_decode_plain = msgspec.json.Decoder(_PlainChunk).decode


#: The ``[upstreams.options]`` of an OpenAI-compatible upstream that take one of a few
#: words, each with its choices (the first is the default).
_CHOICES: dict[str, tuple[str, ...]] = {
    "ids": IDS_MODES, "api": _APIS, "truncation": TRUNCATION_MODES,
    "empty_stream": EMPTY_STREAM_MODES, "json_schema": JSON_SCHEMA_MODES,
}
#: Every key an OpenAI-compatible upstream reads: the word-valued ones above and the two
#: that shape the request body (``_openai_body.py``).
OPTIONS = frozenset({*_CHOICES, "max_tokens_field", "developer_role"})


def parse_options(upstream: str, options: Mapping[str, object]) -> dict[str, Any]:
    """The options checked (a :class:`ConfigError` naming the key), with the word-valued
    ones' defaults; when the config is read, and by ``from_config`` before any client
    exists. A key this adapter does not read is an error, as for the other kinds: a typo
    would otherwise fall back to the default in silence. ``max_tokens_field`` must be a
    non-empty string and ``developer_role`` true or false."""
    for key in options:
        if key not in OPTIONS:
            raise unknown_option("openai", upstream, key, OPTIONS)
    out: dict[str, Any] = {}
    for key, choices in _CHOICES.items():
        value = options.get(key, choices[0])
        if value not in choices:
            raise ConfigError(f"upstream {upstream!r}: options.{key} must be one of "
                              f"{choices}, not {value!r}")
        out[key] = value
    field = options.get("max_tokens_field", "max_tokens")
    if not isinstance(field, str) or not field:  # "" would send body[""] = max_tokens
        raise ConfigError(f"upstream {upstream!r}: options.max_tokens_field must be a "
                          "non-empty string")
    if not isinstance(options.get("developer_role", False), bool):
        raise ConfigError(f"upstream {upstream!r}: options.developer_role must be true or "
                          "false")
    return out


class OpenAICompatUpstream:
    """Every model of one OpenAI-compatible server (implements ``ir.Upstream``)."""

    kind = "openai"

    def __init__(self, config: UpstreamConfig, client: httpx.AsyncClient,
                 maps: Mapping[str, TokenizerMap]) -> None:
        # Checked already (the config, then from_config before the client): cannot raise.
        opts = parse_options(config.name, config.options)
        self.name = config.name
        self.config = config
        self.ids_mode, self.api = opts["ids"], opts["api"]
        self.truncation, self.empty_stream = opts["truncation"], opts["empty_stream"]
        self.json_schema = opts["json_schema"]
        self._detected: str | None = None  # what probe() found for ids="auto"
        self._server: str | None = None  # which server owned_by names, when known
        self._reported: dict[str, int] = {}  # upstream model id -> its reported window
        self._props_probed = False
        self._client = client
        self._base = config.base_url.rstrip("/")
        self._routes = {r.name: r for r in config.models}
        self._maps = {r.name: _route_map(r, maps) for r in config.models}
        self._slots = asyncio.Semaphore(max(1, config.max_concurrent))

    @classmethod
    def from_config(cls, config: UpstreamConfig, *,
                    transport: httpx.AsyncBaseTransport | None = None,
                    maps: Mapping[str, TokenizerMap] | None = None) -> OpenAICompatUpstream:
        parse_options(config.name, config.options)  # before the client: nothing to leak
        key = api_key_from_env(config)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return cls(config, http_client(config, headers, transport), maps or {})

    parse_options = staticmethod(parse_options)

    def __repr__(self) -> str:  # never the headers: they hold the key
        return f"OpenAICompatUpstream(name={self.name!r}, base_url={self.config.base_url!r})"

    # -- what the router reads -------------------------------------------------------------

    @property
    def model_id(self) -> str:
        return self.config.models[0].name if self.config.models else self.name

    @property
    def effective_ids(self) -> str:
        """The ids mode in force: ``auto`` resolves to what the last probe found."""
        if self.ids_mode == "auto":
            return self._detected or "none"
        return self.ids_mode

    def ids_source_for(self, model: str) -> IdsSource:
        if self.effective_ids != "none":
            return IdsSource.UPSTREAM
        return IdsSource.RETOKENIZED if self._maps.get(model) is not None else IdsSource.NONE

    @property
    def ids_source(self) -> IdsSource:
        return self.ids_source_for(self.model_id)

    def tmap_for(self, model: str) -> TokenizerMap | None:
        return self._maps.get(model)

    def context_length_for(self, model: str) -> int | None:
        """The context window the server reported for ``model`` when probed, if it did."""
        route = self._routes.get(model) or ModelRoute(name=model)
        return self._reported.get(route.sent_as)

    @property
    def binds_max_tokens(self) -> bool:
        """vLLM refuses ``prompt + max_tokens`` over its window; llama.cpp servers shorten
        the answer instead (``gateway/context_window.py``)."""
        return self._server == "vllm"

    @property
    def confirms_empty_streams(self) -> bool:
        if self.empty_stream == "auto":
            return self._server == "llama-cpp-python"
        return self.empty_stream == "confirm"

    # -- the Upstream protocol -------------------------------------------------------------

    def submit(self, request: GenerationRequest,
               ) -> SSEUpstreamStream | CountedStream | ConfirmingStream | FailedStream:
        built = self.build(request)
        if isinstance(built, Failure):
            return FailedStream(built)
        path, body = built
        parser = ChunkParser(request, self)
        stream: SSEUpstreamStream | CountedStream = SSEUpstreamStream(
            client=self._client, url=f"{self._base}/{path}", body=body, parser=parser,
            classify_http=failure_from_response, slots=self._slots)
        if parser.counts_late:
            stream = CountedStream(stream, lambda: self.prompt_lower_bound(request), parser)
        if not self.confirms_empty_streams:
            return stream
        return ConfirmingStream(stream, lambda: self._confirm(path, body))

    async def _confirm(self, path: str, body: dict[str, Any]) -> Failure | None:
        """Ask again, non-streamed (``upstreams/overflow_probe.py``); None: nothing found.
        llama_cpp.server closes the connection of a stream that failed, and the pool may
        hand that dead connection to this request, which then fails unanswered (a reset or
        a disconnect): one more try, on a fresh connection (a one-token request is cheap
        to repeat)."""
        for tries_left in range(CONFIRM_TRIES - 1, -1, -1):
            try:
                async with self._slots, self._client.stream(
                        "POST", f"{self._base}/{path}", json=confirmation_body(body)) as resp:
                    return confirmed_failure(resp.status_code, resp.headers,
                                             await read_capped(resp))
            except (httpx.RemoteProtocolError, httpx.NetworkError):
                if not tries_left:
                    return None
            except httpx.HTTPError:
                return None  # the empty stream stands
        return None

    async def probe(self) -> UpstreamHealth:
        health = await probe_models(self._client, f"{self._base}/models", self,
                                    on_listing=self._read_owners)
        # Once: the health monitor probes again every interval, and a server that has no
        # props endpoint will not grow one.
        if health.models and not self._props_probed and any(
                r.sent_as not in self._reported for r in self.config.models):
            self._props_probed = True
            await self._probe_props()
        return health

    def _read_owners(self, data: list[Any]) -> None:
        """``ids = "auto"``: the server that ``owned_by`` names decides; a listed
        ``max_model_len`` (vLLM) is the model's window."""
        owners = {str(m.get("owned_by", "")) for m in data}
        self._detected = next((_OWNERS[o] for o in owners if o in _OWNERS), None)
        self._server = next((_SERVERS[o] for o in owners if o in _SERVERS), None)
        for entry in data:
            if isinstance(entry, dict) and (n := context_length_from_listing(entry)):
                self._reported[str(entry.get("id"))] = n

    async def _probe_props(self) -> None:
        """Windows the listing did not give, from the server's own endpoint at its root
        (not under ``/v1``): llama.cpp's ``GET /props`` (one model per server) when
        ``owned_by`` says llama.cpp; else Ollama's ``POST /api/show`` per model (an unknown
        server's 404 just tells nothing). llama-cpp-python has neither."""
        root = self._base.removesuffix("/v1")
        if self._server == "llama.cpp":
            props = await self._get_json("GET", f"{root}/props")
            n_ctx = context_length_from_props(props) if props is not None else None
            for route in self.config.models:
                if n_ctx is not None and route.sent_as not in self._reported:
                    self._reported[route.sent_as] = n_ctx
            return
        if self._server is not None:
            return
        for route in self.config.models:
            if route.sent_as in self._reported:
                continue
            show = await self._get_json("POST", f"{root}/api/show", {"model": route.sent_as})
            if show is None:
                return  # not Ollama: no point asking for every model
            if n := context_length_from_show(show):
                self._reported[route.sent_as] = n

    async def _get_json(self, method: str, url: str,
                        body: dict[str, Any] | None = None) -> dict[str, Any] | None:
        try:
            status, _, content = await fetch_capped(self._client, method, url, json=body,
                                                    timeout=PROPS_TIMEOUT_S)
            doc = _json.decode(content) if status == 200 else None
        except (httpx.HTTPError, msgspec.DecodeError):
            return None
        return doc if isinstance(doc, dict) else None

    async def aclose(self) -> None:
        await self._client.aclose()

    # -- request building ------------------------------------------------------------------

    def build(self, request: GenerationRequest) -> tuple[str, dict[str, Any]] | Failure:
        """(path, JSON body) for ``request``, or the Failure that refuses it."""
        route = self._routes.get(request.model) or ModelRoute(name=request.model)
        chat = isinstance(request.prompt, ChatPrompt)
        if self.api != "auto" and (self.api == "chat") != chat:
            return Failure(failure_class=FailureClass.INVALID_REQUEST, status=400,
                           message=f"upstream {self.name!r} serves only the {self.api} API")
        ids = self.effective_ids if request.want_ids else "none"
        if chat:
            body = chat_body(request, route.sent_as, self.config.options)
            fmt = body.get("response_format")
            if fmt is not None and fmt["type"] == "json_schema" and self._json_object_schema:
                # llama-cpp-python's server takes a schema only on json_object (its
                # ResponseFormat); json_schema there is a validation error.
                body["response_format"] = {"type": "json_object",
                                           "schema": fmt["json_schema"]["schema"]}
        else:
            body = completions_body(request, route.sent_as, self.config.options)
        if ids == "vllm":
            body["return_token_ids"] = True
        elif ids == "llama.cpp":
            body["return_tokens"] = True
        return ("chat/completions" if chat else "completions"), body

    @property
    def _json_object_schema(self) -> bool:
        if self.json_schema == "auto":  # what probe() found: owned_by "me"
            return self._server == "llama-cpp-python"
        return self.json_schema == "json_object"

    def prompt_lower_bound(self, request: GenerationRequest) -> int | None:
        """Tokens the prompt certainly has (the preflight's bound), else None."""
        return certain_request_tokens(request, self._maps.get(request.model))


def _route_map(route: ModelRoute, maps: Mapping[str, TokenizerMap]) -> TokenizerMap | None:
    """The route's map: given by id (or by model name) in ``maps``, bundled, or a file."""
    for key in (route.map_id, route.name):
        if key and key in maps:
            return maps[key]
    if route.map_path:
        return load_map_file(route.map_path)
    if route.map_id:
        return load_map_file(bundled_map_path(route.map_id))
    return None


class ChunkParser:
    """Chat / Completions chunks (JSON text of one SSE ``data``) -> IR events. Sans-IO.

    The terminal is held until the usage chunk (no choices, after the finish), ``[DONE]``
    or EOF, so that the usage, which OpenAI sends after the chunk with ``finish_reason``,
    comes out before it as the IR requires.
    """

    def __init__(self, request: GenerationRequest, upstream: OpenAICompatUpstream) -> None:
        self._req = request
        self._up = upstream
        self._finish: Finish | Failure | None = None  # a Failure: a word of a cut answer
        self._usage: Usage | None = None
        self._expect_ids = request.want_ids and upstream.effective_ids != "none"
        self._seen_ids = False
        self._retok: Retokenizer | None = None
        self._ended = False
        self._any = False  # any event at all: an empty 200 is its own failure
        self._calls = CallIndexes()
        self._tool_calls_seen = False  # then a legacy function_call is the same call again
        #: A long prompt is counted on a worker thread (``prompt_truncation.CountedStream``)
        #: and checked there; a short one here, at the end; one the preflight counted with
        #: the same map is not counted again (``GenerationRequest.counts``).
        tmap = upstream.tmap_for(request.model)
        self.counts_late = (upstream.truncation != "ignore" and tmap is not None
                            and prompt_chars(request.prompt) > INLINE_COUNT_CHARS
                            and not request.counts.has(request.prompt, tmap.hash))
        self.check_due = False  # the stream ended with a usage to check, counted late

    def on_sse(self, sse: SSEEvent) -> list[Event]:
        if sse.event == "error":
            return self._error_event(sse.data)
        return self.on_data(sse.data)

    def _error_event(self, data: str) -> list[Event]:
        """An ``event: error`` (llama-server's ``error:`` line, ``sse.py``): its data is the
        error object itself (``{"code": 400, "type": "exceed_context_size_error", ...}``)
        or wrapped as a chunk's is (``{"error": {...}}``). Read as a chunk, it had no
        ``choices`` and was skipped: the stream then ended without a finish_reason, a
        retryable broken stream, where the upstream had said why (a context overflow is
        final, with its counts)."""
        if self._ended:
            return []
        self._any = True
        try:
            err = _json.decode(data)
        except msgspec.DecodeError:
            err = data[:200]
        if isinstance(err, dict) and isinstance(err.get("error"), dict):
            err = err["error"]
        return self._error(err)

    def _error(self, err: Any) -> list[Event]:
        self._ended = True
        return [classify_error(err if isinstance(err, dict) else {"message": str(err)},
                               status=None)]

    def on_data(self, data: str) -> list[Event]:
        if self._ended:
            return []
        self._any = True
        if data.strip() == "[DONE]":
            return self._terminal()
        try:
            return self._chunk(data)
        except Malformed as exc:
            return self._fail(f"upstream sent a chunk of the wrong shape: {exc}", MALFORMED)

    def _chunk(self, data: str) -> list[Event]:
        plain = self._plain(data)
        if plain is not None:
            return plain
        try:
            chunk = _json.decode(data)
        except msgspec.DecodeError:
            return self._fail(f"upstream sent a chunk that is not JSON: {data[:200]!r}",
                              MALFORMED)
        if not isinstance(chunk, dict):
            return self._fail("upstream sent a chunk that is not a JSON object", MALFORMED)
        # A null error is none (as every null field of the API); it once failed the stream
        # with the message "None".
        if chunk.get("error") is not None or chunk.get("object") == "error":
            return self._error(chunk.get("error", chunk))
        choices = chunk.get("choices") or ()
        if not isinstance(choices, list | tuple):  # (a number here once crashed the parser)
            return self._fail("upstream sent a chunk whose choices are not a list", MALFORMED)
        out: list[Event] = []
        usage = openai_usage(chunk.get("usage"))
        if usage is not None:
            self._usage = usage
        for choice in choices:
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                out += self._choice(choice, chunk)
        if usage is not None and not choices and self._finish is not None:
            # OpenAI's usage chunk, the last before ``[DONE]``: the answer is whole. An
            # upstream that then held the response open kept the client for the read
            # timeout (300 s) and failed an answer it already had.
            return [*out, *self._terminal()]
        return out

    def _plain(self, data: str) -> list[Event] | None:
        """The events of a plain chunk (text, or a finish, and nothing else), decoded into
        :class:`_PlainChunk`; ``None`` for any other chunk, which the general path reads
        (tool calls, reasoning, logprobs, ids, usage, errors, or a shape msgspec refuses).
        Nearly every chunk of a stream is plain: this read costs about half the dict's
        (BENCHMARKS.md, "Session of 2026-12-04 (2)") and gives the same events."""
        try:
            chunk = _decode_plain(data)
        except msgspec.DecodeError:  # not JSON, not an object, an unexpected type
            return None
        if chunk.choices is None or chunk.usage is not None or chunk.error is not None \
                or chunk.object == "error" or chunk.tokens is not None:
            return None
        out: list[Event] = []
        for choice in chunk.choices:
            delta = choice.delta
            if choice.logprobs is not None or choice.token_ids is not None \
                    or choice.tokens is not None:
                return None
            if delta is not None:  # chat
                if delta.reasoning_content is not None or delta.reasoning is not None \
                        or delta.tool_calls is not None or delta.function_call is not None \
                        or delta.refusal is not None \
                        or choice.text is not None:
                    return None
                text = delta.content
            elif isinstance(choice.text, str | None):  # completions
                text = choice.text
            else:
                return None
            if choice.index != 0:
                continue  # other choices are not asked for, as on the general path
            out += self._tokens(text or "", None)
            if choice.finish_reason:
                self._finish = finish_of(choice.finish_reason, choice.stop_reason)
        return out

    def on_eof(self) -> list[Event]:
        """The body ended: a stream with a ``finish_reason`` but no ``[DONE]`` is complete;
        one without is a broken stream, never a Finish."""
        if self._ended:
            return []
        if not self._any:
            return self._fail("upstream answered 200 with an empty stream (no event)",
                              EMPTY_STREAM)
        if self._finish is None:
            return self._fail("upstream stream ended without a finish_reason")
        return self._terminal()

    def _choice(self, choice: dict, chunk: dict) -> list[Event]:
        out: list[Event] = []
        delta = choice.get("delta")
        if isinstance(delta, dict):  # chat
            # A refusal (OpenAI's structured outputs) is the answer's text, as the Responses
            # adapter reads ``response.refusal.delta``; the IR has no refusal of its own.
            text = text_of(delta.get("content"), "content") + text_of(delta.get("refusal"),
                                                                  "refusal")
            reasoning = text_of(delta.get("reasoning_content") or delta.get("reasoning"),
                              "reasoning")
            if reasoning:
                out.append(ReasoningDelta(text=reasoning))
            calls = delta.get("tool_calls") or []
            if not isinstance(calls, list):
                raise Malformed(f"tool_calls is a {type(calls).__name__}, not a list")
            if calls:
                self._tool_calls_seen = True
            elif not self._tool_calls_seen \
                    and (legacy := delta.get("function_call")) is not None:
                # The functions API's one call per answer (finish_reason "function_call"):
                # call 0. Unread, the call was lost and the answer ended as one with calls.
                # Only in a stream without tool_calls: llama_cpp.server sends each call
                # both ways in one delta, and read twice its arguments ran together.
                calls = [{"index": 0, "function": legacy}]
            out += (self._calls.place(tool_call_of(c)) for c in calls)
            lp = choice.get("logprobs")
            logprobs = entry_logprobs(lp.get("content") if isinstance(lp, dict) else None)
        else:  # completions
            text = text_of(choice.get("text"), "text")
            logprobs = completions_logprobs(choice.get("logprobs"))
        ids = choice.get("token_ids") or choice.get("tokens") or chunk.get("tokens")
        out += self._tokens(text, ids, logprobs)
        reason = choice.get("finish_reason")
        if reason:
            self._finish = finish_of(reason, choice.get("stop_reason"))
        return out

    def _tokens(self, text: str, ids: Any,
                logprobs: tuple[TokenLogprob, ...] = ()) -> list[Event]:
        if isinstance(ids, list) and ids and all(type(i) is int for i in ids):
            # Codec frames carry uint32 ids: a negative or larger one broke the encoder
            # after the head (the gateway's own error), and a bool passed as an int went
            # out as msgpack ``true``.
            if min(ids) < 0 or max(ids) > MAX_UINT32:
                raise Malformed("a token id is not a uint32")
            self._seen_ids = True
            return [TokenDelta(ids=tuple(ids), text=text, logprobs=logprobs)]
        if not text:
            return [TokenDelta(logprobs=logprobs)] if logprobs else []
        if self._expect_ids and self._retok is None:
            tmap = self._up.tmap_for(self._req.model)
            if self._seen_ids or tmap is None:
                self._expect_ids = False
                return self._fail("upstream returned text without its token ids", MALFORMED)
            log.warning("upstream %s returned no token ids; retokenizing", self._up.name)
            self._retok = Retokenizer(tmap)
        if self._retok is not None:
            try:
                return [TokenDelta(ids=self._retok.feed(text), text=text, logprobs=logprobs)]
            except RetokenizeFailed as exc:
                self._ended = True
                return [retokenize_failure(exc)]
        return [TokenDelta(text=text, logprobs=logprobs)]

    def _terminal(self) -> list[Event]:
        self._ended = True
        out: list[Event] = []
        if self._retok is not None:
            try:
                rest = self._retok.flush()
            except RetokenizeFailed as exc:
                return [retokenize_failure(exc)]
            if rest:
                out.append(TokenDelta(ids=rest))
        if self._finish is None:
            return [*out, broken("upstream stream ended ([DONE]) without a finish_reason")]
        if self._usage is not None:
            out.append(self._usage)
            if self.counts_late:
                self.check_due = True
            elif self._up.truncation != "ignore":
                truncated = self.truncation(self._up.prompt_lower_bound(self._req))
                if truncated is not None:
                    return [*out, truncated]
        return [*out, self._finish]

    def truncation(self, bound: int | None) -> Failure | None:
        """The failure when the upstream read fewer prompt tokens than ``bound``."""
        return truncation_failure(bound, self._usage.prompt_tokens
                                  if self._usage is not None else None)

    def _fail(self, message: str, code: str | None = None) -> list[Event]:
        self._ended = True
        return [broken(message, code)]
