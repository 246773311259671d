"""The sans-IO half of the Codec-native upstream: requests, frames -> IR, failures.

:mod:`.codec_native` does the I/O; everything it decides is here, testable without a
socket (STYLE §3, §6 item 11):

* :class:`CodecOptions`, the ``kind = "codec"`` options, validated at start-up;
* :class:`ModelWire`, the Codec client's request decisions (:mod:`tokenwire.client._base`)
  for one model, plus the chat request the client library does not make;
* :class:`FrameTranslator` and :func:`terminal_for`: decoded frames to IR events, finish
  reasons in the spec's and the engines' words (codec-spec §5.7);
* :func:`classify_http` and :func:`classify_exception`: every upstream failure to a
  :class:`~tokenwire.gateway.ir.Failure`, by the rules every HTTP adapter shares
  (:mod:`.failures`), plus the Codec-only cases (426 version mandate, map mismatch, ...).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec

from tokenwire.client._base import (
    DEFAULT_CLIENT_VERSION,
    BaseCodecClient,
    CompletionOptions,
    ResponseDecoder,
    ResponseHead,
    TokenChunk,
)
from tokenwire.client.discovery import DiscoveryCache, Flow
from tokenwire.codec.compression import ZstdDict
from tokenwire.codec.finish_reason import ClientFinishReason, normalize_finish_reason
from tokenwire.codec.frames import StreamFormat
from tokenwire.codec.maps import TokenizerMap
from tokenwire.codec.versioning import parse_version_required
from tokenwire.errors import (
    CodecTransportError,
    CodecVersionRequired,
    ConfigError,
    ContentTypeMismatch,
    DiscoveryError,
    RemoteProtocolError,
    TokenizerMapMismatch,
)
from tokenwire.gateway.defaults import DEFAULT_MAX_TOKENS
from tokenwire.gateway.ir import (
    ChatMessage,
    ChatPrompt,
    Event,
    Failure,
    FailureClass,
    Finish,
    FinishKind,
    GenerationRequest,
    PromptIds,
    PromptText,
    TextPart,
    TokenDelta,
    ToolCallDelta,
    ToolSpec,
    Usage,
    UsageSource,
)
from tokenwire.gateway.stops import StopMatcher
from tokenwire.gateway.upstreams._openai_body import response_format_json
from tokenwire.gateway.upstreams.base import new_call_id
from tokenwire.gateway.upstreams.failures import failure_from_exception, failure_from_response

__all__ = [
    "CodecOptions",
    "FrameTranslator",
    "ModelWire",
    "classify_exception",
    "classify_http",
    "terminal_for",
]

_OPTION_KEYS = frozenset({"stream_format", "path", "accept_encoding", "zstd", "allow_http"})
_ALLOWED_FORMATS = (StreamFormat.MSGPACK, StreamFormat.PROTOBUF)


@dataclass(frozen=True)
class CodecOptions:
    """The ``kind = "codec"`` options; see the module docstring."""

    stream_format: StreamFormat = StreamFormat.MSGPACK
    path: str = "b"
    accept_encoding: str | None = None
    zstd: bool = False
    allow_http: bool | None = None

    @classmethod
    def parse(cls, upstream: str, options: Mapping[str, object]) -> CodecOptions:
        """Validate ``options``; unknown keys and values are a :class:`ConfigError`."""
        unknown = sorted(set(options) - _OPTION_KEYS)
        if unknown:
            raise ConfigError(f"upstream {upstream!r}: unknown codec option(s) {unknown}; "
                              f"known: {sorted(_OPTION_KEYS)}")
        fmt = options.get("stream_format", "msgpack")
        if fmt not in [f.value for f in _ALLOWED_FORMATS]:
            raise ConfigError(f"upstream {upstream!r}: stream_format must be 'msgpack' or "
                              f"'protobuf', got {fmt!r}")
        path = options.get("path", "b")
        if path not in ("b", "c"):
            raise ConfigError(f"upstream {upstream!r}: path must be 'b' or 'c', got {path!r}")
        enc = options.get("accept_encoding")
        for key in ("zstd", "allow_http"):
            if options.get(key) is not None and not isinstance(options[key], bool):
                raise ConfigError(f"upstream {upstream!r}: {key} must be true or false")
        if enc is not None and not isinstance(enc, str):
            raise ConfigError(f"upstream {upstream!r}: accept_encoding must be a string")
        allow_http = options.get("allow_http")
        return cls(StreamFormat(str(fmt)), str(path), enc, bool(options.get("zstd", False)),
                   allow_http if isinstance(allow_http, bool) else None)


class ModelWire(BaseCodecClient):
    """The Codec client's decisions for one model of the upstream (its map, its name)."""

    def __init__(self, base_url: str, opts: CodecOptions, *, name: str, sent_as: str,
                 tmap: TokenizerMap | None, map_id: str | None, cache: DiscoveryCache) -> None:
        super().__init__(base_url, stream_format=opts.stream_format, tokenizer_map=tmap,
                         model=sent_as, accept_encoding=opts.accept_encoding, zstd=opts.zstd,
                         allow_http=opts.allow_http, cache=cache)
        self.name = name
        self.tmap = tmap
        self.map_id = map_id
        self.path_pref = opts.path
        #: Set when probe() found the upstream serving another map: every request fails.
        self.mismatch: str | None = None

    def pin(self, tmap: TokenizerMap) -> None:
        """Adopt a map found by discovery; later responses must name it (§2.7)."""
        self.tmap = tmap
        self.pinned_hash = tmap.hash
        self.cache.maps.put(tmap)

    def check_head(self, headers: Mapping[str, str]) -> ResponseHead:
        """§2.7 on a 200: content type, zstd dictionary, and the map, which must be ours."""
        return self._check_head(headers, self.pinned_hash)

    def needs_flow(self, head: ResponseHead) -> Flow:
        """Discovery for what the head names and we lack: ``(dict or None, map or None)``."""
        return self._needs_flow(head, self.tmap)

    def decoder(self, path: str, head: ResponseHead, zdict: ZstdDict | None) -> ResponseDecoder:
        """Bounded decompressor + frame decoder, without a detokenizer: ids only."""
        return self._decoder(path, head, zdict, None, None)

    def attempts(self, req: GenerationRequest) -> list[tuple[str, str, dict[str, str], bytes]]:
        """``(path, url, headers, body)`` to try in order: Path C then B on 404 (§2.1)."""
        match req.prompt:
            case ChatPrompt(messages=messages):
                return [("chat", *self._chat(req, messages))]
            case PromptText(text=text):
                return [("a", *self._request(self._opts(req, text, "a"), "a", None))]
            case PromptIds(ids=ids):
                paths = ["c", "b"] if self.path_pref == "c" and _fits_path_c(req) else ["b"]
                opts = self._opts(req, ids, paths[0])
                return [(p, *self._request(opts, p, ids)) for p in paths]
        raise TypeError(f"unknown prompt type {type(req.prompt).__name__}")

    def _opts(self, req: GenerationRequest, prompt: str | tuple[int, ...],
              path: str) -> CompletionOptions:
        return CompletionOptions(prompt, _max_tokens(req), req.temperature, req.stop, req.seed,
                                 path, _extra_fields(req))

    def _chat(self, req: GenerationRequest,
              messages: tuple[ChatMessage, ...]) -> tuple[str, dict[str, str], bytes]:
        # The engine applies its own chat template (§2.2: the sglang fork's chat path).
        body: dict[str, Any] = {
            "model": self.model, "messages": [_message_json(m) for m in messages],
            "max_tokens": _max_tokens(req), "stream": True,
            "stream_format": self.stream_format.value, **_extra_fields(req),
        }
        if req.temperature is not None:
            body["temperature"] = req.temperature
        if req.seed is not None:
            body["seed"] = req.seed
        if req.stop:
            body["stop"] = list(req.stop)
        if req.tools:
            body["tools"] = [_tool_json(t) for t in req.tools]
        for key in ("tool_choice", "parallel_tool_calls", "reasoning_effort"):
            if (value := getattr(req, key)) is not None:
                body[key] = value
        return (f"{self.base_url}/v1/chat/completions", self._headers("application/json"),
                json.dumps(body, ensure_ascii=False).encode("utf-8"))


def _fits_path_c(req: GenerationRequest) -> bool:
    """A ``CodecRequest`` (§1.3) has no seed, top_p, top_k, min_p or ignore_eos: dropping
    them silently would change the answer, so such requests go by Path B."""
    return (req.seed is None and not req.ignore_eos and req.response_format is None
            and all(getattr(req, k) is None for k in _EXTRA_SAMPLING))


def _max_tokens(req: GenerationRequest) -> int:
    """Codec requests carry a number (a ``CodecRequest`` always has one): the gateway's
    default when the client set none (``gateway/defaults.py``)."""
    return req.max_tokens if req.max_tokens is not None else DEFAULT_MAX_TOKENS


def _extra_fields(req: GenerationRequest) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    for key in _EXTRA_SAMPLING:  # only what the client set
        if (value := getattr(req, key)) is not None:
            extra[_ENGINE_NAMES.get(key, key)] = value
    if req.ignore_eos:
        extra["ignore_eos"] = True
    if req.response_format is not None:  # the engines' OpenAI-shaped bodies take Chat's form
        extra["response_format"] = response_format_json(req.response_format)
    return extra


#: Sampling fields a ``CodecRequest`` lacks and the engines' JSON bodies (vLLM, sglang
#: forks) take: sent on Paths A and B only when the client set them.
_EXTRA_SAMPLING = ("top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                   "repeat_penalty")
#: The Codec engines are vLLM and sglang forks: their name for llama.cpp's repeat_penalty.
_ENGINE_NAMES = {"repeat_penalty": "repetition_penalty"}


def _message_json(m: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role}
    if isinstance(m.content, str):
        out["content"] = m.content
    else:
        out["content"] = [
            {"type": "text", "text": p.text} if isinstance(p, TextPart) else
            {"type": "image_url", "image_url": {"url": p.url, **(
                {"detail": p.detail} if p.detail else {})}}
            for p in m.content
        ]
    if m.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.name, "arguments": c.arguments}}
                             for c in m.tool_calls]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    return out


def _tool_json(t: ToolSpec) -> dict[str, Any]:
    if t.kind == "custom":
        custom = {"name": t.name, "description": t.description,
                  **({"format": t.format} if t.format else {})}
        return {"type": "custom", "custom": custom}
    fn: dict[str, Any] = {"name": t.name, "description": t.description,
                          "parameters": t.parameters or {"type": "object", "properties": {}}}
    if t.strict is not None:
        fn["strict"] = t.strict
    return {"type": "function", "function": fn}


# -- frames -> IR (sans-IO) ------------------------------------------------------------------


class FrameTranslator:
    """Decoded frames (:class:`TokenChunk`) in, IR events out; ``finished`` after the terminal.

    ``detok`` is a streaming detokenizer when the client shows text, else ``None`` (ids
    only, nothing decoded). With text, stop strings are also applied to it (OpenAI
    semantics, :mod:`~tokenwire.gateway.stops`) so a text client sees what the embedded
    engine would show; ids are never trimmed. A banned id (the deployment's policy, §5.5)
    ends the stream before it is sent. So does an id past ``max_id``, the last id of the
    model's map (when one is known): the engine is not speaking that map, and the gateway
    names the map to its clients (``Codec-Tokenizer-Map``), so the id is an upstream error.
    """

    def __init__(self, request: GenerationRequest, detok: Any | None, *,
                 max_id: int | None = None) -> None:
        self._banned = request.banned_ids
        self._max_id = max_id
        self._detok = detok
        self._stops = StopMatcher(request.stop) if detok is not None else None
        self._prompt_tokens = (len(request.prompt.ids)
                               if isinstance(request.prompt, PromptIds) else None)
        self._n_ids = 0
        self._n_tools = 0
        self.finished = False

    def on_chunk(self, chunk: TokenChunk) -> list[Event]:
        if self.finished:
            return []
        out: list[Event] = []
        ids = chunk.ids
        outside = self._outside(ids)
        if outside is not None:
            ids = ids[:outside]
        cut = next((k for k, i in enumerate(ids) if i in self._banned), None) \
            if self._banned else None
        if cut is not None:
            ids = ids[:cut]
        if ids:
            out.append(self._delta(ids))
            if self._stops is not None and self._stops.matched is not None:
                return out + self._end(Finish(reason=FinishKind.STOP_SEQUENCE,
                                              matched_stop=self._stops.matched))
        if outside is not None and cut is None:  # the frame is not the map's: none of it
            return out + self._end(Failure(
                failure_class=FailureClass.UPSTREAM, status=502, code="protocol_error",
                message=f"the upstream sent token id {chunk.ids[outside]}, outside its "
                        f"tokenizer map's vocabulary 0..{self._max_id}: it does not speak "
                        "that map"))
        for tc in chunk.tool_calls:
            out.append(ToolCallDelta(index=self._n_tools, id=tc.id or new_call_id(),
                                     name=tc.name, arguments=tc.arguments_json))
            self._n_tools += 1
        if cut is not None:
            return out + self._end(Finish(reason=FinishKind.POLICY_VIOLATION))
        if chunk.done:
            return out + self._end(terminal_for(chunk.finish_reason, tools=self._n_tools > 0))
        return out

    def _outside(self, ids: tuple[int, ...]) -> int | None:
        """The index of the first id past the map's last one, if any (max() runs in C; the
        index is searched for only once an id is known to be bad)."""
        if not ids or self._max_id is None or max(ids) <= self._max_id:
            return None
        return next(k for k, i in enumerate(ids) if i > self._max_id)

    def missing_terminal(self) -> Failure:
        self.finished = True
        return Failure(failure_class=FailureClass.UPSTREAM, status=502, code="truncated",
                       message="the upstream stream ended without a done=true frame")

    def _delta(self, ids: tuple[int, ...]) -> TokenDelta:
        self._n_ids += len(ids)
        if self._detok is None or self._stops is None:
            return TokenDelta(ids=ids)
        return TokenDelta(ids=ids, text=self._stops.feed(self._detok.feed(ids)))

    def _end(self, terminal: Finish | Failure) -> list[Event]:
        self.finished = True
        out: list[Event] = []
        if isinstance(terminal, Finish):
            if self._detok is not None and self._stops is not None:
                tail = self._stops.feed(self._detok.flush()) + self._stops.flush()
                if tail:
                    out.append(TokenDelta(text=tail))
            if self._prompt_tokens is not None:  # frames carry no usage; ids we counted
                out.append(Usage(prompt_tokens=self._prompt_tokens,
                                 completion_tokens=self._n_ids, source=UsageSource.GATEWAY))
        out.append(terminal)
        return out


_NATURAL = {ClientFinishReason.STOP, ClientFinishReason.EOS_TOKEN}
_FINISH_KINDS = {
    ClientFinishReason.STOP_SEQUENCE: FinishKind.STOP_SEQUENCE,
    ClientFinishReason.LENGTH: FinishKind.LENGTH,
    ClientFinishReason.POLICY_VIOLATION: FinishKind.POLICY_VIOLATION,
}


def terminal_for(raw: str | None, *, tools: bool = False) -> Finish | Failure:
    """The IR terminal for a ``finish_reason`` in the spec's or the engines' words (§5.7).

    The forks' ``stop`` (EOS or a stop string, undistinguished) is a natural end: ``eos``,
    or ``tool_calls`` when the stream carried tool calls. ``abort`` and ``error`` are
    failures: we did not ask the upstream to stop. Unknown or missing values are treated as
    ``error`` (§2.7).
    """
    if raw == "tool_calls":
        return Finish(reason=FinishKind.TOOL_CALLS)
    if raw == "content_filter":
        return Finish(reason=FinishKind.CONTENT_FILTER)
    reason = normalize_finish_reason(raw)
    if reason in _NATURAL:
        return Finish(reason=FinishKind.TOOL_CALLS if tools else FinishKind.EOS)
    if reason in _FINISH_KINDS:
        return Finish(reason=_FINISH_KINDS[reason])
    # The engine's word is named in the message, cut, and never becomes the failure's code:
    # as a code it reached clients, so an engine could answer the gateway's own
    # ``idle_timeout`` or ``server_shutting_down`` (as the OpenAI adapters do, ``broken``).
    what = "no finish_reason" if raw is None else f"finish_reason {raw[:100]!r}"
    return Failure(failure_class=FailureClass.UPSTREAM, status=502,
                   message=f"the upstream ended the generation with {what}")


# -- failures --------------------------------------------------------------------------------

def classify_http(status: int, headers: Mapping[str, str], body: bytes,
                  upstream: str) -> Failure:
    """A non-200 answer before any frame, classified from structured fields first."""
    if status == 426:
        return _version_failure(status, headers, body, upstream)
    failure = failure_from_response(status, headers, body)
    return msgspec.structs.replace(
        failure, message=f"upstream {upstream!r} answered {status}: {failure.message}")


def _version_failure(status: int, headers: Mapping[str, str], body: bytes,
                     upstream: str) -> Failure:
    """§5.4: the upstream mandates a newer Codec version than we declare. Not retryable;
    the operator must upgrade tokenwire or relax the upstream's mandate."""
    try:
        required = parse_version_required(status, headers, body)
    except RemoteProtocolError:
        required = None
    if required is None:
        want = headers.get("codec-min-version", "an unstated version")
        detail = f"Codec {want} (its 426 body is not the §5.4 shape)"
    else:
        feats = ", ".join(required.required_features) or "none listed"
        detail = f"Codec >= {required.minimum_version} (features: {feats})"
    return Failure(failure_class=FailureClass.UPSTREAM, status=502,
                   code="codec_version_required",
                   message=f"upstream {upstream!r} requires {detail}; this gateway declares "
                           f"Codec-Client-Version {DEFAULT_CLIENT_VERSION}: upgrade tokenwire "
                           "or relax the upstream's version mandate")


def classify_exception(exc: BaseException, upstream: str) -> Failure:
    """Transport and protocol errors after the request was sent (§2.7: abandon the stream)."""
    where = f"upstream {upstream!r}"
    if isinstance(exc, httpx.HTTPError):  # sent: a break is the upstream's, not a refusal
        return failure_from_exception(exc, started=True, where=where)
    if isinstance(exc, CodecTransportError):
        return Failure(failure_class=FailureClass.CONNECTION, status=502,
                       message=f"cannot connect to {where}: {exc}")
    if isinstance(exc, ContentTypeMismatch):
        return Failure(failure_class=FailureClass.UPSTREAM, status=502,
                       code="content_type_mismatch",
                       message=f"{where} does not speak Codec ({exc}); use kind = 'openai'")
    codes = ((TokenizerMapMismatch, "tokenizer_map_mismatch"),
             (RemoteProtocolError, "protocol_error"), (DiscoveryError, "discovery_failed"),
             (CodecVersionRequired, "codec_version_required"))
    for typ, code in codes:
        if isinstance(exc, typ):
            return Failure(failure_class=FailureClass.UPSTREAM, status=502, code=code,
                           message=f"{where}: {type(exc).__name__}: {exc}")
    return Failure(failure_class=FailureClass.INTERNAL, status=500,
                   message=f"internal error talking to {where}: {type(exc).__name__}")


