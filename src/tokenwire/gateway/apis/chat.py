"""OpenAI Chat Completions (``POST /v1/chat/completions``): parsing and the JSON renderer.

Stream shape (what the ``openai`` SDK's ``ChatCompletionChunk`` expects): a first chunk
with ``delta: {"role": "assistant", "content": ""}``, one chunk per text delta, tool-call
fragments as ``delta.tool_calls[{index, id, type, function: {name, arguments}}]``,
reasoning as ``delta.reasoning_content`` (the field vLLM, DeepSeek and llama.cpp use), a
last chunk with an empty delta and ``finish_reason``, an optional usage chunk, ``[DONE]``.
The non-streamed body is a ``chat.completion`` with the assembled message.

Binary ``stream_format`` values are accepted here too: the chat template is applied by the
engine and the answer's ids go out as Codec frames (codec-spec §2.2, sglang fork).
"""

from __future__ import annotations

from typing import Any

from tokenwire.codec.frames import StreamFormat
from tokenwire.gateway.affinity import affinity_hints
from tokenwire.gateway.apis.limits import (
    CHAT_SERVICE_TIERS,
    MAX_OPENAI_TOOLS,
    check_logit_bias,
    check_openai_attribution,
    check_openai_metadata,
    check_openai_service_tier,
    check_openai_tool_name,
    check_prompt_cache_key,
    check_tool_count,
)
from tokenwire.gateway.apis.logprobs import chat_entries
from tokenwire.gateway.apis.params import (
    bad_request,
    json_type,
    optional_bool,
    parse_logprobs,
    parse_openai_fields,
    refuse_binary_logprobs,
)
from tokenwire.gateway.apis.response_format import parse_chat_response_format
from tokenwire.gateway.apis.sse import (
    SSE_CONTENT_TYPE,
    SSE_DONE,
    SSE_KEEPALIVE,
    failure_output,
    internal_error_output,
    json_bytes,
    openai_finish_reason,
    sse_data,
)
from tokenwire.gateway.apis.usage_json import openai_usage
from tokenwire.gateway.ir import (
    ChatMessage,
    ChatPrompt,
    ContentPart,
    Event,
    Failure,
    Finish,
    GenerationRequest,
    Heartbeat,
    ImagePart,
    MessageToolCall,
    ReasoningDelta,
    ResponseMeta,
    TextPart,
    TokenDelta,
    TokenLogprob,
    ToolCallDelta,
    ToolSpec,
    Usage,
)
from tokenwire.gateway.request_fields import extensions_of, refuse_unsupported

__all__ = ["ChatCall", "ChatRenderer", "parse_chat_request"]

#: Roles a chat template understands; anything else is a client mistake worth a 400.
ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


class ChatCall:
    """A parsed chat body: the IR request plus how to answer it."""

    __slots__ = ("include_usage", "model", "request", "stream", "stream_format")

    def __init__(self, request: GenerationRequest, *, model: str | None, stream: bool,
                 stream_format: StreamFormat | None, include_usage: bool) -> None:
        self.request = request
        self.model = model
        self.stream = stream
        self.stream_format = stream_format
        self.include_usage = include_usage


def parse_chat_request(body: Any, *, request_id: str = "") -> ChatCall:
    """Validate a decoded JSON body. Chat documents no default ``max_tokens``: an omitted one
    stays unset (``gateway/defaults.py``)."""
    common = parse_openai_fields(body, default_max_tokens=None)
    sampling, fmt, model = common.sampling, common.stream_format, common.model
    refuse_unsupported("chat", body)  # fields no upstream can take here (request_fields.py)
    logprobs, top_logprobs = parse_logprobs(body, chat=True)
    refuse_binary_logprobs(fmt, logprobs)
    check_openai_metadata(body.get("metadata"))  # forwarded as hints: bounded here
    check_openai_attribution(body)
    check_logit_bias(body.get("logit_bias"))
    check_prompt_cache_key(body)  # before affinity_hints reads it
    check_openai_service_tier(body, CHAT_SERVICE_TIERS)
    request = GenerationRequest(
        prompt=ChatPrompt(messages=_messages(body.get("messages"))),
        model=model or "", **sampling.request_fields(),
        response_format=parse_chat_response_format(body.get("response_format")),
        logprobs=logprobs, top_logprobs=top_logprobs, api="chat",
        extensions=extensions_of("chat", body),
        request_id=request_id, tools=_tools(body.get("tools")),
        tool_choice=_tool_choice(body.get("tool_choice")),
        parallel_tool_calls=optional_bool(body, "parallel_tool_calls"),
        reasoning_effort=_reasoning_effort(body.get("reasoning_effort")),
        want_ids=fmt is not None,
        # prompt_cache_key picks a replica of a pool (routing/pool.py); the headers' hints
        # are added by the HTTP layer (GatewayState.supervise).
        affinity=affinity_hints(body, {}),
    )
    return ChatCall(request, model=model, stream=common.stream, stream_format=fmt,
                    include_usage=common.include_usage)


def _messages(value: Any) -> tuple[ChatMessage, ...]:
    if value is None:
        raise bad_request("messages is required", param="messages",
                          code="missing_required_parameter")
    if not isinstance(value, list):
        raise bad_request(f"messages must be an array, got {json_type(value)}",
                          param="messages", code="invalid_type")
    if not value:
        raise bad_request("messages is an empty array; send at least one message",
                          param="messages", code="empty_array")
    out = []
    for i, msg in enumerate(value):
        if not isinstance(msg, dict):
            raise bad_request(f"messages[{i}] must be an object, got {json_type(msg)}",
                              param=f"messages[{i}]", code="invalid_type")
        if not isinstance(msg.get("role"), str) or msg["role"] not in ROLES:
            raise bad_request(f"messages[{i}].role must be one of {sorted(ROLES)}, got "
                              f"{msg.get('role')!r}", param=f"messages[{i}].role")
        tool_call_id = msg.get("tool_call_id")
        if msg["role"] == "tool" and not isinstance(tool_call_id, str):
            raise bad_request(f"messages[{i}]: a tool message needs tool_call_id",
                              param=f"messages[{i}].tool_call_id",
                              code="missing_required_parameter")
        name = msg.get("name")
        reasoning = msg.get("reasoning_content")
        out.append(ChatMessage(
            role=msg["role"], content=_content(msg.get("content"), i),
            tool_calls=_message_tool_calls(msg.get("tool_calls"), i),
            tool_call_id=tool_call_id if isinstance(tool_call_id, str) else None,
            name=name if isinstance(name, str) else None,
            reasoning=reasoning if isinstance(reasoning, str) else None,
        ))
    return tuple(out)


def _content(content: Any, i: int) -> str | tuple[ContentPart, ...]:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"messages[{i}].content must be a string or an array of parts",
                          param=f"messages[{i}].content", code="invalid_type")
    parts: list[ContentPart] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        where = f"messages[{i}].content[{j}]"
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append(TextPart(text=part["text"]))
        elif kind == "image_url" and isinstance(part.get("image_url"), dict) \
                and isinstance(part["image_url"].get("url"), str):
            image = part["image_url"]
            parts.append(ImagePart(url=image["url"], detail=image.get("detail"), param=where))
        else:
            raise bad_request(f"{where}: expected a text or image_url part", param=where)
    if all(isinstance(p, TextPart) for p in parts):  # plain text stays a string
        return "".join(p.text for p in parts)  # type: ignore[union-attr]
    return tuple(parts)


def _message_tool_calls(value: Any, i: int) -> tuple[MessageToolCall, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise bad_request(f"messages[{i}].tool_calls must be an array",
                          param=f"messages[{i}].tool_calls", code="invalid_type")
    calls = []
    for j, call in enumerate(value):
        fn = call.get("function") if isinstance(call, dict) else None
        if not (isinstance(fn, dict) and isinstance(call.get("id"), str)
                and isinstance(fn.get("name"), str)):
            raise bad_request(f"messages[{i}].tool_calls[{j}] needs id and function.name",
                              param=f"messages[{i}].tool_calls[{j}]",
                              code="missing_required_parameter")
        check_openai_tool_name(fn["name"], f"messages[{i}].tool_calls[{j}].function.name")
        args = fn.get("arguments")
        if args is not None and not isinstance(args, str):  # (it became "": the call's
            # arguments never reached the prompt)
            where = f"messages[{i}].tool_calls[{j}].function.arguments"
            raise bad_request(f"{where} must be a string of JSON, got {json_type(args)}",
                              param=where, code="invalid_type")
        calls.append(MessageToolCall(id=call["id"], name=fn["name"], arguments=args or ""))
    return tuple(calls)


def _tools(value: Any) -> tuple[ToolSpec, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise bad_request("tools must be an array", param="tools", code="invalid_type")
    check_tool_count(value, MAX_OPENAI_TOOLS)
    specs = []
    for j, tool in enumerate(value):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" \
                or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad_request(f"tools[{j}] must be {{type: function, function: {{name, ...}}}}",
                              param=f"tools[{j}]")
        check_openai_tool_name(fn["name"], f"tools[{j}].function.name")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):  # (it was dropped in silence)
            raise bad_request(f"tools[{j}].function.parameters must be a JSON Schema object, "
                              f"got {json_type(params)}", param=f"tools[{j}].function.parameters",
                              code="invalid_type")
        specs.append(ToolSpec(
            name=fn["name"], description=str(fn.get("description") or ""),
            parameters=params,
            strict=fn.get("strict") if isinstance(fn.get("strict"), bool) else None,
        ))
    return tuple(specs)


def _tool_choice(value: Any) -> str | dict | None:
    if value is None or (isinstance(value, str) and value in ("auto", "none", "required")):
        return value
    if isinstance(value, dict) and isinstance(value.get("function"), dict) \
            and isinstance(value["function"].get("name"), str):
        check_openai_tool_name(value["function"]["name"], "tool_choice.function.name")
        return {"name": value["function"]["name"]}
    raise bad_request("tool_choice must be auto, none, required or {type: function, ...}",
                      param="tool_choice")


def _reasoning_effort(value: Any) -> str | None:
    if value is None or (isinstance(value, str)
                         and value in ("minimal", "low", "medium", "high")):
        return value
    raise bad_request("reasoning_effort must be minimal, low, medium or high",
                      param="reasoning_effort")


#: Stands for a delta's content while its chunk's envelope is encoded (``_content_chunk``).
_FRAME_MARKER = "\x00tokenwire content\x00"


class ChatRenderer:
    """IR -> Chat Completions SSE chunks or one ``chat.completion`` JSON body."""

    def __init__(self, *, completion_id: str, model: str, created: int, stream: bool,
                 include_usage: bool = False) -> None:
        self.stream = stream
        self.content_type = SSE_CONTENT_TYPE if stream else "application/json"
        self._id, self._model, self._created = completion_id, model, created
        self._include_usage = include_usage
        self._started = False
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._tools: dict[int, dict[str, Any]] = {}
        self._usage: Usage | None = None
        #: Logprobs of tokens whose text is not shown yet (held back) / of the whole answer.
        self._pending: list[TokenLogprob] = []
        self._logprobs: list[TokenLogprob] = []
        self.done = False
        #: The bytes around a text delta's content, once the stream has started: see
        #: :meth:`_content_chunk` (None: not made yet; False: this stream cannot use them).
        self._content_frame: tuple[bytes, bytes] | bool | None = None

    def on_event(self, event: Event) -> list[bytes]:
        if type(event) is TokenDelta and event.text and self._started \
                and not (event.logprobs or self._pending):
            self._text.append(event.text)  # nearly every event of a stream
            return [self._content_chunk(event.text)]
        match event:
            case TokenDelta(text=text, logprobs=logprobs) if text or logprobs:
                self._logprobs += logprobs
                self._pending += logprobs
                if not text:
                    return []
                self._text.append(text)
                return self._delta({"content": text})
            case ReasoningDelta(text=text) if text:  # an opaque-only delta has nothing to show
                self._reasoning.append(text)
                return self._delta({"reasoning_content": text})
            case ToolCallDelta():
                return self._delta({"tool_calls": [self._tool_fragment(event)]})
            case Usage():
                self._usage = event
            case ResponseMeta(model=model) if model:  # a fallback model serves the request
                self._model = model
                self._content_frame = None
            case Finish(reason=reason):
                self.done = True
                return self._finish(openai_finish_reason(reason, chat=True))
            case Failure():
                self.done = True
                return failure_output(event, stream=self.stream)
            case Heartbeat() if self.stream:
                return [SSE_KEEPALIVE]
        return []

    def on_error(self, exc: BaseException) -> list[bytes]:
        if self.done:
            return []
        self.done = True
        return internal_error_output(exc, stream=self.stream)

    def _envelope(self, choices: list[dict[str, Any]], obj: str) -> dict[str, Any]:
        return {"id": self._id, "object": obj, "created": self._created, "model": self._model,
                "choices": choices}

    def _delta(self, delta: dict[str, Any]) -> list[bytes]:
        if not self.stream:
            return []
        out = []
        if not self._started:
            self._started = True
            first = {"index": 0, "delta": {"role": "assistant", "content": ""},
                     "logprobs": None, "finish_reason": None}
            out.append(sse_data(self._envelope([first], "chat.completion.chunk")))
        choice = {"index": 0, "delta": delta, "logprobs": self._take_pending(),
                  "finish_reason": None}
        out.append(sse_data(self._envelope([choice], "chat.completion.chunk")))
        return out

    def _content_chunk(self, text: str) -> bytes:
        """``_delta({"content": text})``'s bytes, without building and encoding its envelope
        per token: the envelope is encoded once around a marker, and each token's chunk is
        its two sides with the text's JSON between (the chunk render was ~5 % of a token's
        CPU at 64 streams). A stream whose id or model would hold the marker uses
        :meth:`_delta` (a test compares the two on arbitrary text)."""
        frame = self._content_frame
        if frame is None:
            marker = json_bytes(_FRAME_MARKER)
            whole = sse_data(self._envelope([{"index": 0, "delta": {"content": _FRAME_MARKER},
                                              "logprobs": None, "finish_reason": None}],
                                            "chat.completion.chunk"))
            head, _, tail = whole.partition(marker)
            frame = self._content_frame = (head, tail) if whole.count(marker) == 1 else False
        if frame is False:
            return b"".join(self._delta({"content": text}))
        return frame[0] + json_bytes(text) + frame[1]  # type: ignore[index]

    def _take_pending(self) -> dict[str, Any] | None:
        if not self._pending:
            return None
        entries, self._pending = chat_entries(self._pending), []
        return {"content": entries, "refusal": None}

    def _tool_fragment(self, d: ToolCallDelta) -> dict[str, Any]:
        slot = self._tools.setdefault(d.index, {"id": d.id, "type": "function",
                                                "function": {"name": d.name, "arguments": ""}})
        slot["id"] = slot["id"] or d.id
        slot["function"]["name"] = slot["function"]["name"] or d.name
        slot["function"]["arguments"] += d.arguments
        frag: dict[str, Any] = {"index": d.index, "function": {"arguments": d.arguments}}
        if d.id is not None:
            frag["id"], frag["type"] = d.id, "function"
        if d.name is not None:
            frag["function"]["name"] = d.name
        return frag

    def _usage_dict(self) -> dict[str, Any] | None:
        return openai_usage(self._usage)

    def _finish(self, reason: str) -> list[bytes]:
        if not self.stream:
            message: dict[str, Any] = {"role": "assistant", "content": "".join(self._text)}
            if self._reasoning:
                message["reasoning_content"] = "".join(self._reasoning)
            if self._tools:
                message["tool_calls"] = [self._tools[i] for i in sorted(self._tools)]
            logprobs = ({"content": chat_entries(self._logprobs), "refusal": None}
                        if self._logprobs else None)
            choice = {"index": 0, "message": message, "logprobs": logprobs,
                      "finish_reason": reason}
            body = self._envelope([choice], "chat.completion")
            body["usage"] = self._usage_dict()
            return [json_bytes(body)]
        out = self._delta({}) if not self._started else []
        out = out[:1]  # a stream that produced nothing still opens with the role chunk
        last = {"index": 0, "delta": {}, "logprobs": self._take_pending(),
                "finish_reason": reason}
        out.append(sse_data(self._envelope([last], "chat.completion.chunk")))
        if self._include_usage:
            out.append(sse_data({**self._envelope([], "chat.completion.chunk"),
                                 "usage": self._usage_dict()}))
        out.append(SSE_DONE)
        return out
