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
from tokenwire.gateway.apis.errors import error_object
from tokenwire.gateway.apis.params import bad_request, parse_sampling, parse_stream_format
from tokenwire.gateway.apis.sse import (
    SSE_CONTENT_TYPE,
    SSE_DONE,
    json_bytes,
    openai_finish_reason,
    sse_data,
)
from tokenwire.gateway.ir import (
    ChatMessage,
    ChatPrompt,
    Event,
    Failure,
    Finish,
    GenerationRequest,
    ReasoningDelta,
    TokenDelta,
    ToolCallDelta,
    Usage,
)

__all__ = ["ChatCall", "ChatRenderer", "parse_chat_request"]

#: Chat has no documented default; vLLM uses the remaining context, which for an agent that
#: forgot the field means minutes of generation. A bounded default is kinder.
DEFAULT_MAX_TOKENS = 512
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


def parse_chat_request(
    body: Any, *, request_id: str = "", default_max_tokens: int = DEFAULT_MAX_TOKENS
) -> ChatCall:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    sampling = parse_sampling(body, default_max_tokens=default_max_tokens)
    fmt = parse_stream_format(body.get("stream_format"), n=sampling.n)
    if sampling.n != 1:
        raise bad_request("this engine generates one choice per request; n must be 1")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("model must be a string")
    options = body.get("stream_options") or {}
    request = GenerationRequest(
        prompt=ChatPrompt(messages=_messages(body.get("messages"))),
        max_tokens=sampling.max_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
        seed=sampling.seed, stop=sampling.stop, ignore_eos=sampling.ignore_eos,
        request_id=request_id,
    )
    return ChatCall(
        request, model=model, stream=bool(body.get("stream", False)) or fmt is not None,
        stream_format=fmt,
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
    )


def _messages(value: Any) -> tuple[ChatMessage, ...]:
    if not isinstance(value, list) or not value:
        raise bad_request("messages must be a non-empty list")
    out = []
    for i, msg in enumerate(value):
        if not isinstance(msg, dict) or msg.get("role") not in ROLES:
            raise bad_request(f"messages[{i}] needs a role, one of {sorted(ROLES)}")
        out.append(ChatMessage(role=msg["role"], content=_content(msg.get("content"), i)))
    return tuple(out)


def _content(content: Any, i: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: only text reaches a text-only model
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise bad_request(f"messages[{i}]: only text content parts are supported")
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise bad_request(f"messages[{i}].content must be a string or a list of parts")


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
        self.done = False

    def on_event(self, event: Event) -> list[bytes]:
        match event:
            case TokenDelta(text=text) if text:
                self._text.append(text)
                return self._delta({"content": text})
            case ReasoningDelta(text=text):
                self._reasoning.append(text)
                return self._delta({"reasoning_content": text})
            case ToolCallDelta():
                return self._delta({"tool_calls": [self._tool_fragment(event)]})
            case Usage():
                self._usage = event
            case Finish(reason=reason):
                self.done = True
                return self._finish(openai_finish_reason(reason, chat=True))
            case Failure(message=message, status=status):
                self.done = True
                err = error_object(message, status=status, code=event.failure_class.value)
                return [sse_data(err), SSE_DONE] if self.stream else [json_bytes(err)]
        return []

    def on_error(self, exc: BaseException) -> list[bytes]:
        if self.done:
            return []
        self.done = True
        err = error_object(f"the generation failed: {type(exc).__name__}", status=500,
                           code="internal")
        return [sse_data(err), SSE_DONE] if self.stream else [json_bytes(err)]

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
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        out.append(sse_data(self._envelope([choice], "chat.completion.chunk")))
        return out

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

    def _usage_dict(self) -> dict[str, int] | None:
        if self._usage is None:
            return None
        p, c = self._usage.prompt_tokens, self._usage.completion_tokens
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def _finish(self, reason: str) -> list[bytes]:
        if not self.stream:
            message: dict[str, Any] = {"role": "assistant", "content": "".join(self._text)}
            if self._reasoning:
                message["reasoning_content"] = "".join(self._reasoning)
            if self._tools:
                message["tool_calls"] = [self._tools[i] for i in sorted(self._tools)]
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": reason}
            body = self._envelope([choice], "chat.completion")
            body["usage"] = self._usage_dict()
            return [json_bytes(body)]
        out = self._delta({}) if not self._started else []
        out = out[:1]  # a stream that produced nothing still opens with the role chunk
        last = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": reason}
        out.append(sse_data(self._envelope([last], "chat.completion.chunk")))
        if self._include_usage:
            out.append(sse_data({**self._envelope([], "chat.completion.chunk"),
                                 "usage": self._usage_dict()}))
        out.append(SSE_DONE)
        return out
