"""Anthropic Messages API upstreams (``kind = "anthropic"``): IR requests in, IR events out.

Request: ``POST {base}/v1/messages`` with ``x-api-key`` and ``anthropic-version:
2023-06-01``. The Messages API differs from Chat in ways the body builder absorbs:

* ``system`` is a top-level string: system and developer turns are joined into it;
* turns alternate user / assistant: tool results are ``tool_result`` blocks in a user turn,
  and consecutive turns of one role are merged into one message;
* tool calls are ``tool_use`` blocks whose ``input`` is a JSON object (ids kept exactly);
  freeform (``custom``) tools do not exist, so one is declared as a tool with a single
  string property ``input``, and its call is unwrapped back to the raw text;
* ``max_tokens`` is required; extended thinking (``thinking: {type: enabled,
  budget_tokens}`` from ``reasoning_effort``) counts against it, so the budget is added on
  top of the client's ``max_tokens``, and thinking forbids changing temperature / top_p;
* images (of a user turn or a tool result) are ``base64`` sources (from ``data:`` URLs) or
  ``url`` sources;
* a request that came through the Messages API is sent as the client wrote it
  (``GenerationRequest.client_body``), with the gateway's model name, ``max_tokens`` and
  ``stream``: nothing the IR has no place for (block-level ``cache_control``, the thinking
  budget, ``is_error``) is lost on the way; the rules above are for the other APIs.

Signed thinking blocks (and ``redacted_thinking``) must be sent back unchanged on the next
turn when tools are involved; each finished block becomes an opaque ``(upstream, block
JSON)`` pair (:class:`~tokenwire.gateway.ir.ReasoningDelta` ``encrypted``), and only pairs
naming this upstream are replayed: a signature from another deployment does not verify.

Stream (gateway-research §5.8): ``message_start`` (input usage), per block
``content_block_start`` / ``content_block_delta`` (``text_delta``, ``input_json_delta``,
``thinking_delta``, ``signature_delta``) / ``content_block_stop``, ``message_delta``
(``stop_reason``, output usage), ``message_stop``; ``ping`` is ignored; an ``error`` event
(``overloaded_error`` is the streaming twin of HTTP 529) is a classified Failure, and so
is one whose data is a proxy's plain text instead of JSON (its words the message). EOF
without ``message_stop`` is ``Failure(UPSTREAM)``; so is a malformed stream (502
``protocol_error``): a delta for a block that is not open (never started, or already
stopped), a block started at an index still open, a delta of another block's kind (an
``input_json_delta`` in a text block), a ``tool_use`` whose input is not a JSON object (its
content would otherwise be dropped, cut, or reach the client as ``{}``). An input cut
short is that only when ``stop_reason`` is not ``max_tokens`` or ``refusal``, which cut the
answer's last block: then it is that finish with the arguments as far as they came. Blocks
still open at ``message_stop`` are closed there, their content checked as at a
``content_block_stop``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import httpx
import msgspec

from tokenwire.gateway.defaults import DEFAULT_MAX_TOKENS
from tokenwire.gateway.ir import (
    ChatMessage,
    ChatPrompt,
    ContentPart,
    Event,
    Failure,
    FailureClass,
    Finish,
    FinishKind,
    GenerationRequest,
    ImagePart,
    PromptText,
    ReasoningDelta,
    ResponseFormat,
    TokenDelta,
    ToolCallDelta,
    ToolSpec,
)
from tokenwire.gateway.upstreams.base import UpstreamConfig, new_call_id
from tokenwire.gateway.upstreams.failures import (
    MALFORMED,
    classify_error,
    failure_from_exception,
    failure_from_response,
    fetch_capped,
)
from tokenwire.gateway.upstreams.sse import SSEEvent
from tokenwire.gateway.upstreams.sse_http import (
    FailedStream,
    SSEUpstreamStream,
    TextUpstream,
    UnknownEvents,
)
from tokenwire.gateway.upstreams.usage_wire import anthropic_usage

__all__ = [
    "ANTHROPIC_VERSION",
    "DEFAULT_BASE_URL",
    "THINKING_BUDGETS",
    "AnthropicUpstream",
    "MessagesStreamParser",
    "build_messages_body",
]

#: The body fields ``/v1/messages/count_tokens`` takes (max_tokens, stream and sampling
#: fields are refused there).
_COUNT_FIELDS = frozenset({"model", "messages", "system", "tools", "tool_choice", "thinking"})
#: The API version every current Messages feature used here is available under.
ANTHROPIC_VERSION = "2023-06-01"
DEFAULT_BASE_URL = "https://api.anthropic.com"
#: ``reasoning_effort`` -> thinking ``budget_tokens``. 1024 is the API's minimum; the
#: others follow Anthropic's guidance to start small and raise for hard problems.
THINKING_BUDGETS = {"minimal": 1024, "low": 1024, "medium": 4096, "high": 16384,
                    "xhigh": 32768}
_DATA_URL = re.compile(r"^data:(?P<media>[^;,]+);base64,(?P<data>.*)$", re.S)
#: The one property a freeform (custom) tool is declared with.
_CUSTOM_INPUT = "input"


# -- request body ------------------------------------------------------------------------------


def build_messages_body(request: GenerationRequest, *, model: str,
                        upstream_name: str) -> dict[str, Any]:
    """The Messages API body for ``request``; raises ``ValueError`` when it cannot be sent."""
    if request.client_body is not None and request.api == "messages":
        return _client_body(request, request.client_body, model)
    system, messages = _conversation(request, upstream_name)
    # The API requires max_tokens: the gateway's default when the client set none.
    max_tokens = request.max_tokens if request.max_tokens is not None else DEFAULT_MAX_TOKENS
    body: dict[str, Any] = {"model": model, "messages": messages,
                            "max_tokens": max(max_tokens, 1), "stream": True}
    if system:
        body["system"] = system
    if request.stop:
        body["stop_sequences"] = list(request.stop)
    if request.reasoning_effort:
        for name in ("temperature", "top_p", "top_k"):  # thinking fixes the sampling itself
            if getattr(request, name) not in (None, 1.0) and not (name == "top_k"
                                                                   and request.top_k <= 0):
                raise _Refused(f"{name} cannot be sent to Anthropic with reasoning (extended "
                               "thinking samples at its own settings)", name)
        budget = THINKING_BUDGETS.get(request.reasoning_effort, THINKING_BUDGETS["medium"])
        body["thinking"] = {"type": "enabled", "budget_tokens": budget}
        body["max_tokens"] += budget  # budget_tokens must be < max_tokens; keep the answer's
    elif request.temperature is not None:  # Anthropic's range is 0..1 (OpenAI's 0..2)
        body["temperature"] = min(request.temperature, 1.0)
        if request.top_p is not None:  # newer models refuse the two together: say so
            raise _Refused("top_p is not sent to Anthropic beside temperature (newer Claude "
                           "models refuse the pair); send one of them", "top_p")
    elif request.top_p is not None:
        body["top_p"] = request.top_p
    if request.top_k is not None and request.top_k > 0 and not request.reasoning_effort:
        body["top_k"] = request.top_k  # 0 / -1 mean "off" to OpenAI-side clients
    if request.tools:
        body["tools"] = [_tool(t) for t in request.tools]
        choice = _tool_choice(request)
        if choice is not None:
            body["tool_choice"] = choice
    if request.response_format is not None:
        body["output_config"] = {**body.get("output_config", {}),
                                 "format": _output_format(request.response_format)}
    if request.api == "messages":  # the client's own fields of this wire, unchanged
        for key, value in request.extensions:
            if key == "output_config" and isinstance(value, dict):
                value = {**value, **body.get("output_config", {})}
            body[key] = value
    return body


def _client_body(request: GenerationRequest, client: dict[str, Any],
                 model: str) -> dict[str, Any]:
    """The client's own Messages body with what the gateway decides: the upstream's model
    name, a stream (the adapter reads SSE), and ``max_tokens`` as the gateway set it (a
    key's limit, the window). Built from the IR, a Claude Code request lost every block's
    ``cache_control`` (its prompt cache: each turn billed whole) and had its thinking
    budget rewritten (32,000 / 31,999 became 48,384 / 16,384, past some models' cap)."""
    body = {**client, "model": model, "stream": True}
    if request.max_tokens is not None:
        body["max_tokens"] = request.max_tokens
    return body


class _Refused(ValueError):
    """A request this adapter cannot send as asked; ``param`` is the client's field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def _output_format(fmt: ResponseFormat) -> dict[str, Any]:
    """Anthropic's structured outputs (``output_config.format``) take a JSON schema only:
    ``json_object`` is the schema of any object."""
    schema = fmt.schema if fmt.type == "json_schema" and fmt.schema is not None \
        else {"type": "object"}
    return {"type": "json_schema", "schema": schema}


def _conversation(request: GenerationRequest,
                  upstream_name: str) -> tuple[str, list[dict[str, Any]]]:
    prompt = request.prompt
    if isinstance(prompt, PromptText):
        return "", [{"role": "user", "content": [{"type": "text", "text": prompt.text}]}]
    if not isinstance(prompt, ChatPrompt):
        raise ValueError("an Anthropic Messages upstream takes text, not token ids")
    kinds = {c.id: c.kind for m in prompt.messages for c in m.tool_calls}
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for msg in prompt.messages:
        if msg.role in ("system", "developer"):
            system.append(msg.text)
            continue
        role = "assistant" if msg.role == "assistant" else "user"
        blocks = (_assistant_blocks(msg, kinds, upstream_name) if role == "assistant"
                  else _user_blocks(msg))
        if not blocks:
            continue  # the API refuses empty content
        if turns and turns[-1]["role"] == role:  # roles must alternate: merge
            turns[-1]["content"] += blocks
        else:
            turns.append({"role": role, "content": blocks})
    return "\n\n".join(s for s in system if s), turns


def _user_blocks(msg: ChatMessage) -> list[dict[str, Any]]:
    if msg.role == "tool":
        # A result's images (a screenshot a tool took) are blocks of its content too.
        content = msg.content if isinstance(msg.content, str) else _part_blocks(msg.content)
        return [{"type": "tool_result", "tool_use_id": msg.tool_call_id or "",
                 "content": content}]
    if isinstance(msg.content, str):
        return [{"type": "text", "text": msg.content}] if msg.content else []
    return _part_blocks(msg.content)


def _part_blocks(parts: tuple[ContentPart, ...]) -> list[dict[str, Any]]:
    """Text and image blocks of ``parts``; empty text parts left out (the API refuses them)."""
    return [_image(p) if isinstance(p, ImagePart) else {"type": "text", "text": p.text}
            for p in parts if isinstance(p, ImagePart) or p.text]


def _image(part: ImagePart) -> dict[str, Any]:
    if part.url.startswith("data:"):
        m = _DATA_URL.match(part.url)
        if m is None:
            raise ValueError("an image data: URL must be base64 (data:<type>;base64,...)")
        source = {"type": "base64", "media_type": m["media"], "data": m["data"]}
    else:
        source = {"type": "url", "url": part.url}
    return {"type": "image", "source": source}


def _assistant_blocks(msg: ChatMessage, kinds: dict[str, str],
                      upstream_name: str) -> list[dict[str, Any]]:
    # Thinking blocks first, exactly as produced: the API checks their signatures.
    blocks = [msgspec.json.decode(blob) for name, blob in msg.reasoning_encrypted
              if name == upstream_name]
    if msg.text:
        blocks.append({"type": "text", "text": msg.text})
    for call in msg.tool_calls:
        if kinds.get(call.id) == "custom" or call.kind == "custom":
            tool_input: Any = {_CUSTOM_INPUT: call.arguments}
        else:
            try:
                tool_input = msgspec.json.decode(call.arguments or "{}")
            except msgspec.DecodeError:
                raise ValueError(f"tool call {call.id!r}: arguments are not JSON") from None
            if not isinstance(tool_input, dict):
                raise ValueError(f"tool call {call.id!r}: arguments are not a JSON object")
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name,
                       "input": tool_input})
    return blocks


def _tool(tool: ToolSpec) -> dict[str, Any]:
    if tool.kind == "custom":
        schema: dict[str, Any] = {
            "type": "object", "required": [_CUSTOM_INPUT],
            "properties": {_CUSTOM_INPUT: {"type": "string",
                                           "description": "the tool's raw input text"}}}
    else:
        schema = tool.parameters or {"type": "object", "properties": {}}
    out: dict[str, Any] = {"name": tool.name, "input_schema": schema}
    if tool.description:
        out["description"] = tool.description
    return out


def _tool_choice(request: GenerationRequest) -> dict[str, Any] | None:
    choice = request.tool_choice
    out: dict[str, Any] | None
    if choice is None or choice == "auto":
        out = {"type": "auto"} if request.parallel_tool_calls is False else None
    elif choice == "none":
        return {"type": "none"}
    elif choice == "required":
        out = {"type": "any"}
    elif isinstance(choice, dict):
        name = choice.get("name") or (choice.get("function") or {}).get("name")
        out = {"type": "tool", "name": name}
    else:
        raise ValueError(f"tool_choice {choice!r} is not understood")
    if out is not None and request.parallel_tool_calls is False:
        out["disable_parallel_tool_use"] = True
    return out


# -- stream parser ---------------------------------------------------------------------------

_STOP_REASONS = {
    "end_turn": FinishKind.EOS,
    "pause_turn": FinishKind.EOS,  # a server tool paused the turn; the client continues it
    "stop_sequence": FinishKind.STOP_SEQUENCE,
    "max_tokens": FinishKind.LENGTH,
    "model_context_window_exceeded": FinishKind.LENGTH,
    "tool_use": FinishKind.TOOL_CALLS,
    "refusal": FinishKind.CONTENT_FILTER,
}


#: The stop reasons that may end the answer inside a block (a call's input cut short).
_CUTTING_STOPS = frozenset({FinishKind.LENGTH, FinishKind.CONTENT_FILTER})
#: The delta types of the blocks this adapter reads, and the block kind each belongs in.
#: A block of another kind (a server tool's) takes any delta: it is not shown.
_DELTA_BLOCKS = {"text_delta": "text", "input_json_delta": "tool_use",
                 "thinking_delta": "thinking", "signature_delta": "thinking"}
_READ_BLOCKS = frozenset({*_DELTA_BLOCKS.values(), "redacted_thinking"})


class _Block:
    __slots__ = ("call", "custom", "kind", "parts", "signature", "start")

    def __init__(self, kind: str, *, call: int = -1, custom: bool = False,
                 start: Any = None) -> None:
        self.kind, self.call, self.custom, self.start = kind, call, custom, start
        self.parts: list[str] = []  # streamed tool JSON or thinking text
        self.signature = ""


class MessagesStreamParser:
    """Sans-IO: one Messages SSE event in, IR events out (see the module docstring)."""

    def __init__(self, upstream_name: str, custom_tools: frozenset[str] = frozenset()) -> None:
        self._name = upstream_name
        self._custom = custom_tools
        self._blocks: dict[int, _Block] = {}
        self._calls = 0
        #: A call's input stopped short of whole JSON: only max_tokens (or a refusal, which
        #: stops an answer anywhere) explains it.
        self._cut_call = False
        self._usage_fields: dict[str, Any] = {}
        self._stop_reason: str | None = None
        self._stop_sequence: str | None = None
        self.unknown = UnknownEvents()
        self.done = False

    def on_sse(self, sse: SSEEvent) -> list[Event]:
        if self.done:
            return []
        try:
            data = msgspec.json.decode(sse.data)
        except msgspec.DecodeError:
            if sse.event == "error":  # a proxy's plain text: the failure it names
                return self._end(classify_error({"message": sse.data}, status=None))
            return self._end(_failure(FailureClass.UPSTREAM,
                                      f"malformed JSON in a {sse.event!r} event", 502, MALFORMED))
        if not isinstance(data, dict):
            return self._end(_failure(FailureClass.UPSTREAM, "an event that is not an object",
                                      502, MALFORMED))
        kind = str(data.get("type") or sse.event)
        handler = _HANDLERS.get(kind)
        if handler is None:
            self.unknown.add(kind)
            return []
        try:
            return handler(self, data)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            # A field of the wrong JSON type: the upstream broke its format, not us.
            return self._end(_failure(
                FailureClass.UPSTREAM, f"a malformed {kind!r} event: {type(exc).__name__}", 502,
                MALFORMED))

    def on_eof(self) -> list[Event]:
        if self.done:
            return []
        return self._end(_failure(FailureClass.UPSTREAM,
                                  "the upstream closed the stream before message_stop", 502))

    def _end(self, event: Event) -> list[Event]:
        self.done = True
        return [event]

    def _malformed(self, message: str) -> list[Event]:
        return self._end(_failure(FailureClass.UPSTREAM, message, 502, MALFORMED))

    def _usage(self, usage: Any) -> None:
        """message_delta's usage is cumulative: its figures replace message_start's."""
        if isinstance(usage, dict):
            self._usage_fields.update({k: v for k, v in usage.items() if v is not None})

    def _message_start(self, data: dict[str, Any]) -> list[Event]:
        self._usage((data.get("message") or {}).get("usage"))
        early = anthropic_usage(self._usage_fields, final=False)
        return [early] if early is not None else []

    def _block_start(self, data: dict[str, Any]) -> list[Event]:
        cb, i = data.get("content_block") or {}, int(data.get("index", 0))
        kind = str(cb.get("type"))
        if i in self._blocks:  # later deltas could belong to either block
            return self._malformed(f"a {kind!r} block started at index {i}, which is open")
        if self._cut_call:  # a cut is the answer's end: nothing comes after it
            return self._malformed("a content block after a call whose input was cut short")
        if kind == "tool_use":
            name, start = _string(cb.get("name")), cb.get("input")
            if not isinstance(start, dict | None):
                return self._malformed("a tool_use block's input is not a JSON object")
            block = _Block(kind, call=self._calls, custom=name in self._custom, start=start)
            self._blocks[i], self._calls = block, self._calls + 1
            # A call without an id could not be answered (Chat showed "id": null).
            return [ToolCallDelta(index=block.call, id=_string(cb.get("id")) or new_call_id(),
                                  name=name, kind="custom" if block.custom else "function")]
        self._blocks[i] = _Block(kind, start=cb)
        if kind == "text" and (text := _string(cb.get("text"))):
            return [TokenDelta(text=text)]
        if kind == "thinking":
            self._blocks[i].signature = _string(cb.get("signature"))
            if thought := _string(cb.get("thinking")):
                self._blocks[i].parts.append(thought)
                return [ReasoningDelta(text=thought)]
        elif kind not in ("text", "redacted_thinking"):
            self.unknown.add("content_block:" + kind)  # server tools etc.: not ours to show
        return []

    def _block_delta(self, data: dict[str, Any]) -> list[Event]:
        delta, block = data.get("delta") or {}, self._blocks.get(int(data.get("index", -1)))
        kind = str(delta.get("type"))
        if block is None:  # its content would have no block to go in: never dropped unseen
            return self._malformed(f"a {kind!r} delta for a content block that is not open "
                                   "(never started, or stopped)")
        belongs = _DELTA_BLOCKS.get(kind, block.kind)
        if belongs != block.kind and block.kind in _READ_BLOCKS:  # dropped, or shown wrongly
            return self._malformed(f"a {kind!r} delta in a {block.kind!r} block")
        if kind == "text_delta":
            return [TokenDelta(text=_string(delta.get("text")))]
        if kind == "input_json_delta" and block.kind == "tool_use":
            piece = _string(delta.get("partial_json"))
            block.parts.append(piece)
            if block.custom or not piece:  # custom input is unwrapped at content_block_stop
                return []
            return [ToolCallDelta(index=block.call, arguments=piece)]
        if kind == "thinking_delta":
            block.parts.append(_string(delta.get("thinking")))
            return [ReasoningDelta(text=block.parts[-1])]
        if kind == "signature_delta":
            block.signature += _string(delta.get("signature"))
            return []
        self.unknown.add(kind)
        return []

    def _block_stop(self, data: dict[str, Any]) -> list[Event]:
        return self._close(int(data.get("index", -1)))

    def _close(self, index: int) -> list[Event]:
        """The block at ``index`` ends: what it holds is checked and handed on; a later
        delta for it has no block to go in."""
        block = self._blocks.pop(index, None)
        if block is None:
            return []
        if block.kind == "tool_use":
            return self._finish_call(block)
        if block.kind == "thinking" and block.signature:
            keep = {"type": "thinking", "thinking": "".join(block.parts),
                    "signature": block.signature}
        elif block.kind == "redacted_thinking":
            keep = {"type": "redacted_thinking", "data": _string(block.start.get("data"))}
        else:
            return []
        blob = msgspec.json.encode(keep).decode()
        return [ReasoningDelta(text="", encrypted=((self._name, blob),))]

    def _finish_call(self, block: _Block) -> list[Event]:
        raw = "".join(block.parts)
        if not block.custom:
            # No deltas (or empty ones): the whole input came with content_block_start,
            # ``{}`` for a tool without parameters; sent as "" it was not JSON to a client.
            if not raw:
                return [ToolCallDelta(index=block.call,
                                      arguments=msgspec.json.encode(block.start or {}).decode())]
            try:
                whole = msgspec.json.decode(raw)
            except msgspec.DecodeError:
                # Cut short, as max_tokens cuts a call: the stop reason decides (message_stop).
                self._cut_call = True
                return []
            if not isinstance(whole, dict):  # the API's input is always an object
                return self._malformed("a tool_use block's input is not a JSON object")
            return []
        try:
            value = msgspec.json.decode(raw or "{}") if raw or not block.start else block.start
        except msgspec.DecodeError:
            return self._malformed("a custom tool call's input is not JSON")
        if not isinstance(value, dict) or value.keys() - {_CUSTOM_INPUT}:
            # Only ``input`` can be unwrapped to the call's text: the rest would be dropped.
            return self._malformed("a custom tool call's input is not an object holding "
                                   f"only {_CUSTOM_INPUT!r}")
        return [ToolCallDelta(index=block.call, arguments=_string(value.get(_CUSTOM_INPUT)),
                              kind="custom")]

    def _message_delta(self, data: dict[str, Any]) -> list[Event]:
        delta = data.get("delta") or {}
        self._stop_reason = delta.get("stop_reason") or self._stop_reason
        self._stop_sequence = _string(delta.get("stop_sequence")) or self._stop_sequence
        self._usage(data.get("usage"))
        return []

    def _message_stop(self, data: dict[str, Any]) -> list[Event]:
        closed: list[Event] = []
        for index in sorted(self._blocks):  # never stopped: a call's input is checked here
            closed += self._close(index)
            if self.done:
                return closed
        reason = _STOP_REASONS.get(self._stop_reason or "")
        if reason is None:
            reason = FinishKind.TOOL_CALLS if self._calls else FinishKind.EOS
        if self._cut_call and reason not in _CUTTING_STOPS:
            return self._malformed("a tool_use block's input is not a JSON object")
        matched = self._stop_sequence if reason is FinishKind.STOP_SEQUENCE else None
        usage = anthropic_usage(self._usage_fields)
        return [*closed, *([usage] if usage is not None else []),
                *self._end(Finish(reason=reason, matched_stop=matched))]

    def _ping(self, data: dict[str, Any]) -> list[Event]:
        return []

    def _error(self, data: dict[str, Any]) -> list[Event]:
        err = data.get("error")
        if isinstance(err, str):  # the reason alone, as text: kept as the message
            err = {"message": err}
        elif not isinstance(err, dict):
            err = data
        return self._end(classify_error({"type": "api_error", **err}, status=None))


def _string(value: Any) -> str:
    """A text field as sent (null: none). Another JSON type is the upstream's error (a
    ``TypeError``: the stream is malformed), never text made from it: ``str()`` showed the
    client ``None``, ``{'a': 1}``, a call id ``5``."""
    if value is None or isinstance(value, str):
        return value or ""
    raise TypeError(f"a text field holds {type(value).__name__}")


def _failure(cls: FailureClass, message: str, status: int, code: str | None = None) -> Failure:
    return Failure(failure_class=cls, message=message, status=status, code=code)


_P = MessagesStreamParser
_HANDLERS: dict[str, Callable[[MessagesStreamParser, dict[str, Any]], list[Event]]] = {
    "message_start": _P._message_start,
    "content_block_start": _P._block_start,
    "content_block_delta": _P._block_delta,
    "content_block_stop": _P._block_stop,
    "message_delta": _P._message_delta,
    "message_stop": _P._message_stop,
    "ping": _P._ping,
    "error": _P._error,
}


# -- the adapter -----------------------------------------------------------------------------


class AnthropicUpstream(TextUpstream):
    """Every model of one Anthropic Messages upstream (implements ``ir.Upstream``)."""

    kind = "anthropic"

    @staticmethod
    def api_base_for(config: UpstreamConfig) -> str:
        base = (config.base_url or DEFAULT_BASE_URL).rstrip("/")
        return base if base.endswith("/v1") else base + "/v1"

    @staticmethod
    def auth_headers(key: str | None) -> dict[str, str]:
        headers = {"Accept": "text/event-stream", "anthropic-version": ANTHROPIC_VERSION}
        if key is not None:
            headers["x-api-key"] = key
        return headers

    def submit(self, request: GenerationRequest) -> SSEUpstreamStream | FailedStream:
        try:
            body = build_messages_body(request, model=self.upstream_model(request.model),
                                       upstream_name=self.name)
        except ValueError as exc:
            return FailedStream(Failure(failure_class=FailureClass.INVALID_REQUEST,
                                        message=str(exc), status=400,
                                        param=getattr(exc, "param", None)))
        custom = frozenset(t.name for t in request.tools if t.kind == "custom")
        parser = MessagesStreamParser(self.name, custom)
        self._admit()
        return SSEUpstreamStream(
            client=self._client, url=f"{self.api_base}/messages", body=body, parser=parser,
            classify_http=failure_from_response, on_done=lambda: self._release(parser))

    async def count_tokens(self, request: GenerationRequest) -> int | Failure:
        """``POST /v1/messages/count_tokens`` asked of the upstream itself: only it knows
        how its model tokenizes (system, tools and thinking included)."""
        try:
            body = build_messages_body(request, model=self.upstream_model(request.model),
                                       upstream_name=self.name)
        except ValueError as exc:
            return Failure(failure_class=FailureClass.INVALID_REQUEST, message=str(exc),
                           status=400)
        counted = {k: v for k, v in body.items() if k in _COUNT_FIELDS}
        try:
            status, headers, content = await fetch_capped(
                self._client, "POST", f"{self.api_base}/messages/count_tokens", json=counted,
                headers={"Accept": "application/json"})
        except httpx.HTTPError as exc:
            return failure_from_exception(exc, started=False)
        if status != 200:
            return failure_from_response(status, headers, content)
        try:
            n = msgspec.json.decode(content).get("input_tokens")
        except (msgspec.DecodeError, AttributeError):
            n = None
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            return Failure(failure_class=FailureClass.UPSTREAM, status=502, code=MALFORMED,
                           message="the upstream's count_tokens answer has no input_tokens")
        return n
