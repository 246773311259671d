"""Anthropic Messages (``POST /v1/messages``): the sans-IO renderer and error shapes.

Requests are parsed by :mod:`.messages_request` (gateway-research §5.8); the routed
upstream's kind decides whether signed thinking may travel (only to and from an Anthropic
upstream, the only kind that can verify a signature).

Stream (what the ``anthropic`` SDK's accumulator expects): ``message_start``, then per block
``content_block_start`` / ``content_block_delta`` / ``content_block_stop`` with rising
``index``, ``message_delta`` (``stop_reason``, usage) and ``message_stop``. A heartbeat
(the gateway's keep-alive while queued, retrying or waiting for a slow first token) is a
``ping``; before the first output it does not open ``message_start``, which waits for the
first real event: the model it names is the one that serves (a fallback taken before any
output, README "Fallbacks"), and ``message_start`` is the only place the ``anthropic`` SDK
reads it from (``message_delta`` has no model). The SDK skips ``ping`` events wherever they
come. A failure after
the headers is one ``error`` event; before them, an HTTP error in Anthropic's shape
``{"type": "error", "error": {"type", "message"}}`` with Anthropic's statuses (529 for
overloaded). Every error of this route uses that shape, never OpenAI's. Anthropic's shape
has no code; when the gateway itself ended a request (shutdown, its own deadlines:
:data:`~tokenwire.gateway.ir.GATEWAY_FAILURE_CODES`) the error object also carries
``code``, the same word every other API shows (a field Anthropic's clients ignore).
"""

from __future__ import annotations

import json
import logging
import secrets
from typing import Any

import msgspec

from tokenwire.gateway.apis.errors import retry_after_header
from tokenwire.gateway.apis.sse import json_bytes
from tokenwire.gateway.apis.usage_json import anthropic_usage
from tokenwire.gateway.ir import (
    GATEWAY_FAILURE_CODES,
    Event,
    Failure,
    FailureClass,
    Finish,
    FinishKind,
    Heartbeat,
    ReasoningDelta,
    ResponseMeta,
    TokenDelta,
    ToolCallDelta,
    Usage,
)

__all__ = [
    "MESSAGES_PATH",
    "MessagesRenderer",
    "anthropic_error_body",
    "failure_error",
    "failure_response",
    "is_messages_path",
    "type_for_status",
]

log = logging.getLogger(__name__)

SSE_CONTENT_TYPE = "text/event-stream; charset=utf-8"
_ANTHROPIC_KIND = "anthropic"
_STOP_REASONS: dict[FinishKind, str] = {
    FinishKind.EOS: "end_turn",
    FinishKind.STOP_SEQUENCE: "stop_sequence",
    FinishKind.LENGTH: "max_tokens",
    FinishKind.TOOL_CALLS: "tool_use",
    FinishKind.POLICY_VIOLATION: "refusal",
    FinishKind.CONTENT_FILTER: "refusal",
    FinishKind.ABORT: "end_turn",  # only seen when the client has already gone
}
_ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
    529: "overloaded_error",
}
#: Anthropic's status for "overloaded" (its documented, non-standard 529).
OVERLOADED = 529
#: The Messages API and everything under it (``/v1/messages/count_tokens``).
MESSAGES_PATH = "/v1/messages"


# -- errors ------------------------------------------------------------------------------------


def is_messages_path(path: str) -> bool:
    """True for a path whose errors take Anthropic's shape (the route and its children)."""
    return path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/")


def anthropic_error_body(type_: str, message: str, *, code: str | None = None) -> dict[str, Any]:
    error: dict[str, Any] = {"type": type_, "message": message}
    if code is not None:
        error["code"] = code
    return {"type": "error", "error": error}


def _gateway_code(failure: Failure) -> str | None:
    return failure.code if failure.code in GATEWAY_FAILURE_CODES else None


def type_for_status(status: int) -> str:
    return _ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


_TOO_LONG = "prompt is too long: "


def failure_error(failure: Failure) -> tuple[int, str, str]:
    """(HTTP status, Anthropic error type, message) for an IR failure."""
    cls, message = failure.failure_class, failure.message
    if cls is FailureClass.CAPACITY:
        return OVERLOADED, "overloaded_error", message
    if cls is FailureClass.RATE_LIMITED:
        return 429, "rate_limit_error", message
    if cls is FailureClass.CONTEXT_LENGTH:
        # Anthropic's own wording, which Claude clients match to trigger compaction: with
        # the counts when they are known, else before the upstream's own words (which
        # were sent as they were, and no client compacted).
        if failure.prompt_tokens is not None and failure.context_tokens is not None:
            message = (f"prompt is too long: {failure.prompt_tokens} tokens > "
                       f"{failure.context_tokens} maximum")
        elif not message.startswith(_TOO_LONG):
            message = _TOO_LONG + message
        return 400, "invalid_request_error", message
    if cls in (FailureClass.INVALID_REQUEST, FailureClass.CONTENT_FILTER):
        status = failure.status if 400 <= failure.status < 500 else 400
        return status, type_for_status(status), message
    status = failure.status if 400 <= failure.status <= 599 else 500
    return status, type_for_status(status) if status < 500 else "api_error", message


def failure_response(failure: Failure) -> tuple[int, list[tuple[str, str]], bytes]:
    status, type_, message = failure_error(failure)
    headers = [("Content-Type", "application/json"), *retry_after_header(failure.retry_after)]
    body = anthropic_error_body(type_, message, code=_gateway_code(failure))
    return status, headers, json_bytes(body)


# -- the renderer ------------------------------------------------------------------------------


def _sse(type_: str, data: dict[str, Any]) -> bytes:
    return b"event: " + type_.encode() + b"\ndata: " + json_bytes({"type": type_, **data}) \
        + b"\n\n"


class _Tool:
    __slots__ = ("args", "block", "id", "kind", "name", "sent")

    def __init__(self, d: ToolCallDelta) -> None:
        self.id = d.id if d.id else "toolu_" + secrets.token_hex(12)
        self.name, self.kind, self.args = d.name or "", d.kind, [d.arguments]
        self.block: int | None = None  # the content block index, once opened
        self.sent = 0  # how many argument fragments went out

    def input_json(self) -> str:
        raw = "".join(self.args)
        if self.kind == "custom":  # freeform input has no JSON form; wrap it in one
            return msgspec.json.encode({"input": raw}).decode()
        return raw

    def whole(self) -> bool:
        """Its input is complete: a JSON object (freeform input cannot tell)."""
        if self.kind == "custom":
            return True
        tail = next((a for a in reversed(self.args) if a.strip()), "")
        if not tail.rstrip().endswith("}"):  # cheap: no object ends otherwise
            return False
        try:
            return isinstance(msgspec.json.decode("".join(self.args)), dict)
        except msgspec.DecodeError:
            return False


def _opens_message(event: Event) -> bool:
    """Output or the terminal: what ``message_start`` waits for (module docstring). Facts
    (usage, the serving model) are kept for it; a heartbeat is only a ``ping``."""
    return not isinstance(event, Heartbeat | Usage | ResponseMeta)


class MessagesRenderer:
    """IR -> Messages SSE events, or one ``message`` JSON body when not streaming.

    Blocks never interleave: tool calls that start while another is open wait (buffered)
    until it closes, because Anthropic streams one block at a time. Text and thinking that
    come while a call's JSON input is unfinished wait too (an upstream may send them between
    its fragments): a closed block takes no more deltas, so closing the call for them would
    cut its input short in the stream. ``signed_by`` names the
    upstream whose opaque thinking blobs may go to the client (an Anthropic upstream).
    """

    def __init__(self, *, message_id: str, model: str, stream: bool,
                 signed_by: str | None = None) -> None:
        self.stream = stream
        self.content_type = SSE_CONTENT_TYPE if stream else "application/json"
        self._id, self._model, self._signed_by = message_id, model, signed_by
        self._started = False
        self.done = False
        self._blocks: list[dict[str, Any]] = []  # the assembled content, by index
        self._open: str | None = None  # kind of the open block: text, thinking, tool_use
        self._signed = False  # the open thinking block got its signature
        self._tools: dict[int, _Tool] = {}
        self._tool_order: list[int] = []
        self._block_tool: dict[int, _Tool] = {}  # content block index -> its call
        self._held: list[TokenDelta | ReasoningDelta] = []  # behind an unfinished call
        self._usage: Usage | None = None
        self._body: dict[str, Any] | None = None  # the non-streamed answer, when complete

    # -- events --

    def on_event(self, event: Event) -> list[bytes]:
        if isinstance(event, Usage):  # before _start: an early count goes in message_start
            self._usage = event
        if isinstance(event, ResponseMeta) and event.model:  # a fallback model serves it
            self._model = event.model
        out = self._start() if not self._started and _opens_message(event) else []
        match event:
            case TokenDelta() | ReasoningDelta() if self._open == "tool_use" \
                    and self._calls_unfinished():
                self._held.append(event)
            case TokenDelta(text=text) if text:
                out += self._text(text)
            case ReasoningDelta():
                out += self._reasoning(event)
            case ToolCallDelta():
                out += self._tool(event)
                if self._held and (self._open != "tool_use" or not self._calls_unfinished()):
                    out += self._release()
            case Finish():
                out += self._finish(event)
            case Failure():
                out += self._fail(*failure_error(event)[1:], code=_gateway_code(event))
            case Heartbeat() if self.stream:  # Anthropic's own keep-alive event
                out.append(_sse("ping", {}))
        return out if self.stream else self._take_body()

    def on_error(self, exc: BaseException) -> list[bytes]:
        if self.done:
            return []
        out = self._start() if not self._started else []
        # The exception's type and message stay in the server log, never on the wire.
        out += self._fail("api_error", "the generation failed inside the gateway")
        return out if self.stream else self._take_body()

    def _take_body(self) -> list[bytes]:
        """The one JSON body of a non-streamed answer, once the terminal event has come."""
        body, self._body = self._body, None
        return [] if body is None else [json_bytes(body)]

    # -- blocks --

    def _start(self) -> list[bytes]:
        self._started = True
        return [_sse("message_start", {"message": {
            "id": self._id, "type": "message", "role": "assistant", "model": self._model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            # The prompt's count when it is known this early (README "Usage");
            # message_delta has the final counts.
            "usage": anthropic_usage(self._usage, output=False)}})]

    def _open_block(self, block: dict[str, Any]) -> bytes:
        self._blocks.append(block)
        self._open = block["type"]
        start = {**block, "input": {}} if block["type"] == "tool_use" else dict(block)
        return _sse("content_block_start", {"index": len(self._blocks) - 1,
                                            "content_block": start})

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return _sse("content_block_delta", {"index": len(self._blocks) - 1, "delta": delta})

    def _calls_unfinished(self) -> bool:
        """A call is open, or waits behind the open one, whose input is not whole yet
        (asked only while a ``tool_use`` block is open: no call per token otherwise)."""
        last = len(self._blocks) - 1
        return any(not tool.whole() for tool in self._tools.values()
                   if tool.block is None or tool.block == last)

    def _release(self) -> list[bytes]:
        """The text and thinking held behind unfinished calls, in their order."""
        held, self._held = self._held, []
        out: list[bytes] = []
        for event in held:
            if isinstance(event, ReasoningDelta):
                out += self._reasoning(event)
            elif event.text:
                out += self._text(event.text)
        return out

    def _close(self) -> list[bytes]:
        """Close the open block, then every tool call waiting behind it."""
        out = self._stop()
        for tool in (self._tools[i] for i in self._tool_order):
            if tool.block is None:
                out += self._open_tool(tool)
                out += self._stop()
        return out

    def _stop(self) -> list[bytes]:
        if self._open is None:
            return []
        last = len(self._blocks) - 1
        out = []
        tool = self._block_tool.get(last)
        if tool is not None and tool.kind == "custom":  # its one delta, now it is whole
            out.append(self._delta({"type": "input_json_delta",
                                    "partial_json": tool.input_json()}))
        self._open, self._signed = None, False
        return [*out, _sse("content_block_stop", {"index": last})]

    def _text(self, text: str) -> list[bytes]:
        out = [] if self._open == "text" else [
            *self._close(), self._open_block({"type": "text", "text": ""})]
        self._blocks[-1]["text"] += text
        return [*out, self._delta({"type": "text_delta", "text": text})]

    def _reasoning(self, event: ReasoningDelta) -> list[bytes]:
        out: list[bytes] = []
        if event.text:
            if self._open != "thinking" or self._signed:
                out += self._close()
                out.append(self._open_block({"type": "thinking", "thinking": "",
                                             "signature": ""}))
            self._blocks[-1]["thinking"] += event.text
            out.append(self._delta({"type": "thinking_delta", "thinking": event.text}))
        for name, blob in event.encrypted:
            if name == self._signed_by:  # other upstreams' blobs mean nothing to a client
                out += self._signed_blob(blob)
        return out

    def _signed_blob(self, blob: str) -> list[bytes]:
        try:
            block = json.loads(blob)
        except ValueError:
            return []
        if block.get("type") == "redacted_thinking":
            out = self._close()
            out.append(self._open_block({"type": "redacted_thinking",
                                         "data": str(block.get("data", ""))}))
            return [*out, *self._close()]
        signature = str(block.get("signature", ""))
        if block.get("type") != "thinking" or not signature:
            return []
        out = []
        if self._open != "thinking" or self._signed:  # a signed block with no text seen
            out = [*self._close(), self._open_block({"type": "thinking", "thinking": "",
                                                     "signature": ""})]
        self._blocks[-1]["signature"] = signature
        self._signed = True
        return [*out, self._delta({"type": "signature_delta", "signature": signature})]

    def _tool(self, d: ToolCallDelta) -> list[bytes]:
        tool = self._tools.get(d.index)
        if tool is None:
            tool = self._tools[d.index] = _Tool(d)
            if self._open == "tool_use":
                self._tool_order.append(d.index)
                return []  # waits until the open call closes
            out = self._close()
            self._tool_order.append(d.index)
            return out + self._open_tool(tool)
        tool.name = tool.name or d.name or ""
        tool.args.append(d.arguments)
        if tool.block is not None and tool.block == len(self._blocks) - 1 \
                and self._open == "tool_use":
            return self._flush_args(tool)
        # Waiting calls send their fragments when they open. A call whose block has
        # closed (its input was whole JSON, then text came, then more fragments) cannot
        # stream them any more; the non-streamed body still has them.
        return []

    def _open_tool(self, tool: _Tool) -> list[bytes]:
        out = [self._open_block({"type": "tool_use", "id": tool.id, "name": tool.name,
                                 "input": {}})]
        tool.block = len(self._blocks) - 1
        self._block_tool[tool.block] = tool
        return out + self._flush_args(tool)

    def _flush_args(self, tool: _Tool) -> list[bytes]:
        if tool.kind == "custom":
            return []  # sent whole at the end (its JSON wrapper needs all of it)
        new = "".join(tool.args[tool.sent:])
        tool.sent = len(tool.args)
        return [self._delta({"type": "input_json_delta", "partial_json": new})] if new else []

    # -- the end --

    def _finish(self, event: Finish) -> list[bytes]:
        self.done = True
        out = [*self._close(), *self._release(), *self._close()]
        reason = _STOP_REASONS[event.reason]
        if reason == "end_turn" and self._tools:  # some upstreams say "stop" after calls
            reason = "tool_use"
        stop_seq = event.matched_stop if reason == "stop_sequence" else None
        usage = self._usage_dict()
        if not self.stream:
            self._body = self._message(reason, stop_seq, usage)
            return []
        out.append(_sse("message_delta", {
            "delta": {"stop_reason": reason, "stop_sequence": stop_seq}, "usage": usage}))
        return [*out, _sse("message_stop", {})]

    def _fail(self, type_: str, message: str, *, code: str | None = None) -> list[bytes]:
        self.done = True
        body = anthropic_error_body(type_, message, code=code)
        if not self.stream:
            self._body = body
            return []
        out = [*self._close(), *self._release(), *self._close()]
        return [*out, _sse("error", {"error": body["error"]})]

    def _usage_dict(self) -> dict[str, Any]:
        return anthropic_usage(self._usage)

    def _message(self, reason: str, stop_seq: str | None,
                 usage: dict[str, Any]) -> dict[str, Any]:
        content = [{**block, "input": _parse_input(self._block_tool[i].input_json())}
                   if block["type"] == "tool_use" else block
                   for i, block in enumerate(self._blocks)]
        return {"id": self._id, "type": "message", "role": "assistant", "model": self._model,
                "content": content, "stop_reason": reason, "stop_sequence": stop_seq,
                "usage": usage}


def _parse_input(raw: str) -> Any:
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except ValueError:
        return {}  # malformed arguments cannot be an input object; the stream shows them
