"""OpenAI Responses (``POST /v1/responses``): the sans-IO renderer, IR events -> wire.

Stream shape (gateway-research §5.1-§5.6, what ``client.responses.stream()`` validates and
what Codex acts on, §2):

* every event is ``event: <type>\\ndata: <json>\\n\\n`` with the event name equal to the JSON
  ``type``; no ``[DONE]`` (OpenAI's own streams end with the terminal event, §5.1);
* ``sequence_number`` starts at 0 and rises by exactly one on every event, heartbeats
  included (§5.2): the counter is ours, never the upstream's;
* ``response.created`` + ``response.in_progress`` open the stream (:meth:`created_events`,
  sent by the route as soon as the request is validated, before the upstream answers);
* items: ``message`` (``output_item.added``, ``content_part.added``, ``output_text.delta``,
  ``.done`` events, ``output_item.done``, §5.3), ``function_call`` / ``custom_tool_call``
  (argument / input deltas, ``.done``, §5.4), ``reasoning`` (summary parts, §5.5). Item ids
  (``msg_``/``fc_``/``ctc_``/``rs_``) and ``output_index`` are ours, whatever the upstream
  does; a tool call's ``call_id`` is the upstream's tool-call id exactly (the client sends it
  back in ``function_call_output``), or ``call_<hex>`` when the upstream gave none;
* exactly one terminal: ``response.completed``, ``response.incomplete`` (``LENGTH`` ->
  ``max_output_tokens``, filters -> ``content_filter``) or ``response.failed``.

Ordering: text and reasoning are *flowing* items (a new kind of content closes the open
one, and so does a ``MessageStart``: an upstream's next assistant message is a new
``message`` item, its ``phase`` kept on every snapshot of it, seed "Replayed items"); tool
calls stay open until the terminal, because Chat Completions fragments of
parallel calls may interleave. A call is presented as complete (``.done`` events and
``output_item.done``, from which Codex runs it) only when the generation completed: after
``LENGTH`` or a failure its arguments may be cut, so it appears only in the terminal
snapshot with ``status: "incomplete"`` and is never dispatched (seed, "Replayed items").

Reasoning: reasoning text becomes summary text (nothing is invented: no reasoning, no
item); ``reasoning_summary="none"`` hides it. Opaque reasoning state goes into
``encrypted_content`` only when it came from a Responses upstream (its blob is a Responses
``reasoning`` item), wrapped with that upstream's name (:func:`wrap_encrypted`) so the
next turn's request (:func:`unwrap_encrypted`) restores it to that upstream and to no
other (seed, "Streaming, reasoning summaries").

``end_turn``: an upstream's actual boolean (a :class:`~tokenwire.gateway.ir.ResponseMeta`,
from a Responses upstream) is kept as is; without one, ``derive_end_turn=False`` (a Responses
upstream that did not say) omits it, and otherwise (translated upstreams) a completed
response says ``end_turn: true`` unless it ends with tool calls, which the client must answer
in the same turn (seed, "Replayed items and turn terminals").

``service_tier`` appears on a completed response only when the upstream reported the tier it
served (``ResponseMeta.service_tier``), never the requested one (seed, "Service tiers").
The upstream's turn state (already wrapped with its scope) goes to a streaming client as
Codex's ``response.metadata`` event, ``{"headers": {"x-codex-turn-state": ...}}``, since the
head went out before the upstream answered (gateway-research §2); a non-streaming route
reads :attr:`ResponsesRenderer.turn_state` and sends it as a response header.
"""

from __future__ import annotations

import base64
import binascii
import secrets
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from tokenwire.gateway.affinity import TURN_STATE_HEADER
from tokenwire.gateway.apis.errors import error_object
from tokenwire.gateway.apis.logprobs import chat_entries
from tokenwire.gateway.apis.sse import SSE_CONTENT_TYPE, json_bytes
from tokenwire.gateway.apis.usage_json import responses_usage
from tokenwire.gateway.ir import (
    GATEWAY_FAILURE_CODES,
    Event,
    Failure,
    FailureClass,
    Finish,
    FinishKind,
    Heartbeat,
    MessageStart,
    ReasoningDelta,
    ResponseMeta,
    TokenDelta,
    ToolCallDelta,
    Usage,
)
from tokenwire.gateway.supervision.retry import Budget, budget_for

__all__ = [
    "FRAMINGS",
    "ResponsesRenderer",
    "failure_code",
    "failure_error_body",
    "new_response_id",
    "unwrap_encrypted",
    "wrap_encrypted",
]

_encode = msgspec.json.Encoder().encode
#: How events are framed: SSE for ``POST /v1/responses``, bare JSON for the WebSocket.
FRAMINGS = ("sse", "json")

#: Codex's ``response.failed`` classification (gateway-research §2): a failure that would
#: repeat identically is ``invalid_prompt`` so Codex stops after one request instead of
#: spending its five stream retries; ``context_length_exceeded`` triggers its compaction.
_FAILURE_CODES: dict[FailureClass, str] = {
    FailureClass.CONTEXT_LENGTH: "context_length_exceeded",
    FailureClass.INVALID_REQUEST: "invalid_prompt",
    FailureClass.AUTHENTICATION: "invalid_prompt",
    FailureClass.QUOTA: "invalid_prompt",
    # Seed: "content_filter, max_output_tokens and unknown stream codes stay retryable, as
    # they are in native Codex"; the policy refusals that repeat are below.
    FailureClass.CONTENT_FILTER: "content_filter",
    FailureClass.RATE_LIMITED: "rate_limit_exceeded",
    FailureClass.CAPACITY: "server_is_overloaded",
}
#: Codes Codex itself treats as final: an upstream's own is passed on as it is (seed: "as
#: their own code when it is one of Codex's final codes, and as invalid_prompt otherwise").
_CODEX_FINAL_CODES = frozenset({"context_length_exceeded", "insufficient_quota",
                                "usage_not_included", "cyber_policy", "invalid_prompt",
                                "bio_policy"})
#: Seed: upstream rejections "that would repeat identically" are final with a fixed message
#: per class; the upstream's private prose is never shown.
_REJECTIONS = {
    "invalid_prompt": "The provider rejected this request as invalid.",
    "invalid_encrypted_content": "The provider could not use the encrypted content sent back "
                                 "to it; start a new conversation.",
    "cyber_policy": "The provider refused this request under its cybersecurity policy.",
    "bio_policy": "The provider refused this request under its biosecurity policy.",
    "misalignment_policy_violation": "The provider refused this request under its usage "
                                     "policy.",
    "usage_not_included": "Provider usage limit reached",
}
#: Seed: "Exhausted credits report ... ; a subscription usage limit reports ...".
_USAGE_LIMIT_CODES = frozenset({"usage_limit_reached", "subscription_sharing_usage_limit_exceeded"})
_QUOTA_MESSAGE = "Provider credits or quota are exhausted"
_USAGE_LIMIT_MESSAGE = "Provider usage limit reached"
#: Marks our wrapping of a Responses upstream's ``encrypted_content`` (versioned, so a
#: future format can be told apart from this one).
_WRAP_PREFIX = "twrs1."
_INCOMPLETE: dict[FinishKind, str] = {
    FinishKind.LENGTH: "max_output_tokens",
    FinishKind.CONTENT_FILTER: "content_filter",
    FinishKind.POLICY_VIOLATION: "content_filter",
    FinishKind.ABORT: "interrupted",  # only seen when the client has already gone
}


def new_response_id() -> str:
    """``resp_<32 hex>`` (seed, "Response ids")."""
    return "resp_" + secrets.token_hex(16)


def _new_item_id(prefix: str) -> str:
    return prefix + secrets.token_hex(16)


def wrap_encrypted(upstream: str, encrypted_content: str) -> str:
    """Tag an upstream's ``encrypted_content`` with its name, for the client to hold."""
    name = base64.urlsafe_b64encode(upstream.encode()).decode().rstrip("=")
    return f"{_WRAP_PREFIX}{name}.{encrypted_content}"


def unwrap_encrypted(value: str) -> tuple[str, str] | None:
    """``(upstream, encrypted_content)`` from :func:`wrap_encrypted`; None when not ours
    (then it is some other server's state and goes to no upstream)."""
    if not value.startswith(_WRAP_PREFIX):
        return None
    name, sep, inner = value[len(_WRAP_PREFIX):].partition(".")
    if not sep:
        return None
    try:
        upstream = base64.urlsafe_b64decode(name + "=" * (-len(name) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    return upstream, inner


def _responses_content(blob: str) -> str | None:
    """The ``encrypted_content`` of opaque state a Responses upstream produced (its blob is
    a ``reasoning`` item), else None: an Anthropic signed thinking block is not a Responses
    client's to hold, so nothing is handed out for it."""
    try:
        item = msgspec.json.decode(blob)
    except msgspec.DecodeError:
        return None
    if isinstance(item, dict) and item.get("type") == "reasoning":
        content = item.get("encrypted_content")
        return content if isinstance(content, str) and content else None
    return None


def _is_final(failure: Failure) -> bool:
    """A failure the same request would meet again (the retry module's own verdict)."""
    return budget_for(failure) is Budget.FINAL


def failure_code(failure: Failure) -> str:
    """The Responses ``error.code`` for a failure, chosen for what Codex does with it: its
    own final codes as they are, any other final failure ``invalid_prompt``, retryable ones
    a retryable code (``rate_limit_exceeded`` paces Codex's retry with "try again in")."""
    if failure.code in _CODEX_FINAL_CODES or failure.code in GATEWAY_FAILURE_CODES:
        # Codex's final codes, and the gateway's own (retryable for Codex: not final codes).
        return failure.code  # type: ignore[return-value]  # checked just above
    cls = failure.failure_class
    if cls is FailureClass.CONTENT_FILTER:
        return "invalid_prompt" if failure.code in _REJECTIONS else "content_filter"
    if cls is FailureClass.RATE_LIMITED and _is_final(failure):
        return "invalid_prompt"  # a named quota, or a 429 asking for more than a minute
    return _FAILURE_CODES.get(cls, "server_error")


def _failure_message(failure: Failure) -> str:
    code = failure.code or ""
    if code in _REJECTIONS:
        return _REJECTIONS[code]
    if failure.failure_class is FailureClass.QUOTA or (
            failure.failure_class is FailureClass.RATE_LIMITED and _is_final(failure)):
        return _USAGE_LIMIT_MESSAGE if code in _USAGE_LIMIT_CODES else _QUOTA_MESSAGE
    if failure.failure_class is FailureClass.RATE_LIMITED and failure.retry_after:
        # Codex parses "try again in N s" for rate_limit_exceeded to pace its retry.
        return f"{failure.message} (try again in {failure.retry_after:g}s)"
    return failure.message


def failure_error_body(failure: Failure) -> tuple[int, bytes]:
    """A failure before any byte was sent: HTTP status and the OpenAI error shape."""
    status = failure.status if 400 <= failure.status <= 599 else 500
    return status, json_bytes(error_object(_failure_message(failure), status=status,
                                           code=failure_code(failure), param=failure.param))


class _Item:
    """One output item as it is built; ``wire()`` is its JSON at any moment."""

    __slots__ = ("call_id", "encrypted", "extra", "id", "index", "kind", "logprobs", "name",
                 "opened", "parts", "phase", "status", "text")

    def __init__(self, kind: str, item_id: str, index: int) -> None:
        self.kind, self.id, self.index = kind, item_id, index
        self.text = ""  # message text, call arguments / input
        self.logprobs: list[dict[str, Any]] = []  # a message's, when the request asked
        self.parts: list[str] = []  # reasoning summary parts
        self.call_id = self.name = self.encrypted = None  # type: str | None
        self.phase: str | None = None  # a message's phase, as the upstream labelled it
        self.status = "in_progress"
        self.opened = False  # output_item.added was sent
        self.extra: dict[str, Any] = {}  # call fields the request asked for (collaboration)

    def wire(self) -> dict[str, Any]:
        if self.kind == "message":
            content = [] if not self.opened else [_text_part(self.text, self.logprobs)]
            out = {"type": "message", "id": self.id, "status": self.status,
                   "role": "assistant", "content": content}
            return out if self.phase is None else {**out, "phase": self.phase}
        if self.kind == "reasoning":
            out: dict[str, Any] = {"type": "reasoning", "id": self.id, "summary": [
                {"type": "summary_text", "text": t} for t in self.parts]}
            if self.encrypted is not None:
                out["encrypted_content"] = self.encrypted
            return out
        key, kind = (("input", "custom_tool_call") if self.kind == "custom"
                     else ("arguments", "function_call"))
        return {"type": kind, "id": self.id, "call_id": self.call_id, "name": self.name or "",
                key: self.text, "status": self.status, **self.extra}


class ResponsesRenderer:
    """IR -> Responses SSE events, or one ``response`` JSON body when not streaming."""

    def __init__(
        self, *, response_id: str, model: str, created_at: int, stream: bool,
        reasoning_summary: str = "auto", echo: Mapping[str, Any] | None = None,
        derive_end_turn: bool = True, new_item_id: Callable[[str], str] = _new_item_id,
        call_fields: Callable[[str], Mapping[str, Any]] = lambda name: {},
        framing: str = "sse",
    ) -> None:
        if framing not in FRAMINGS:
            raise ValueError(f"framing must be one of {', '.join(FRAMINGS)}, got {framing!r}")
        self.stream = stream
        self.content_type = SSE_CONTENT_TYPE if stream else "application/json"
        #: ``"sse"``: each event is ``event: <type>\ndata: <json>\n\n``; ``"json"``: the bare
        #: JSON of the event, one WebSocket text message each (``http/responses_ws.py``).
        self._framing = framing
        self.response_id, self._model, self._created_at = response_id, model, created_at
        self._hide_summary = reasoning_summary == "none"
        self._echo = dict(echo or {})
        self._derive_end_turn = derive_end_turn
        self._new_id = new_item_id
        #: Extra fields for a function_call item by tool name, on every snapshot of it (the
        #: seed's ``encrypted_function_args: []`` marker on collaboration tools).
        self._call_fields = call_fields
        self._seq = 0
        self._started = False
        self._items: list[_Item] = []
        self._flow: _Item | None = None  # the open message or reasoning item
        self._phase: str | None = None  # the phase of the next message item (MessageStart)
        self._pending_logprobs: list[dict[str, Any]] = []  # tokens whose text is held back
        self._calls: dict[int, _Item] = {}  # IR tool-call index -> item
        self._usage: Usage | None = None
        self._service_tier: str | None = None  # the tier served, as the upstream said
        self._end_turn: bool | None = None  # the upstream's actual end_turn
        #: The upstream's wrapped turn state, for a non-streaming route's response header.
        self.turn_state: str | None = None
        #: The final ``response`` object once a terminal was rendered (for the store).
        self.final_response: dict[str, Any] | None = None
        self.done = False

    # -- public ----------------------------------------------------------------------------

    def created_events(self) -> list[bytes]:
        """``response.created`` (seq 0) and ``response.in_progress`` (seq 1), once."""
        if self._started or not self.stream:
            return []
        self._started = True
        return [self._sse("response.created", response=self._snapshot("in_progress")),
                self._sse("response.in_progress", response=self._snapshot("in_progress"))]

    def served_by(self, model: str) -> None:
        """The model that serves (a fallback's), named from the next event on."""
        self._model = model

    def heartbeat(self) -> list[bytes]:
        """A genuine ``response.in_progress`` data event: Codex's idle timer ignores SSE
        comments, so a quiet stream is kept alive by data events (gateway-research §5.1)."""
        if self.done or not self.stream:
            return []
        out = self.created_events()
        return [*out, self._sse("response.in_progress", response=self._snapshot("in_progress"))]

    def on_event(self, event: Event) -> list[bytes]:
        if self.done:
            return []
        if isinstance(event, ResponseMeta) and event.model:  # a fallback model serves it
            self._model = event.model
        out = self.created_events()
        match event:
            case TokenDelta(text=text, logprobs=logprobs) if text or logprobs:
                self._pending_logprobs += chat_entries(logprobs)
                if text:
                    out += self._text(text)
            case ReasoningDelta():
                out += self._reasoning(event)
            case ToolCallDelta():
                out += self._tool(event)
            case Usage():
                self._usage = event
            case ResponseMeta():
                out += self._meta(event)
            case MessageStart(phase=phase):
                out += self._message_start(phase)
            case Finish(reason=reason):
                out += self._finish(reason)
            case Failure():
                out += self._failed(event)
            case Heartbeat() if self.stream:
                out += self.heartbeat()
        return out if self.stream else self._whole_body()

    def on_error(self, exc: BaseException) -> list[bytes]:
        """A bug or broken stream after the headers: ``response.failed`` in-stream."""
        if self.done:
            return []
        del exc  # its type and message stay in the server log, never on the wire
        return self.on_event(Failure(failure_class=FailureClass.INTERNAL, status=500,
                                     message="the generation failed inside the gateway"))

    # -- events ----------------------------------------------------------------------------

    def _sse(self, type_: str, **fields: Any) -> bytes:
        data = {"type": type_, "sequence_number": self._seq, **fields}
        self._seq += 1
        if self._framing == "json":
            return _encode(data)
        return b"event: " + type_.encode() + b"\ndata: " + _encode(data) + b"\n\n"

    def _whole_body(self) -> list[bytes]:
        return [json_bytes(self.final_response)] if self.final_response is not None else []

    def _open(self, kind: str, prefix: str) -> _Item:
        return _Item(kind, self._new_id(prefix), -1)  # indexed when announced

    def _added(self, item: _Item) -> bytes:
        # output_index in announcement order: a call waiting for its name must not leave a
        # gap that a later item's events would reach first.
        item.index = len(self._items)
        self._items.append(item)
        item.opened = False  # the added snapshot shows no content part yet
        out = self._sse("response.output_item.added", output_index=item.index,
                        item=item.wire())
        item.opened = True
        return out

    def _ref(self, item: _Item) -> dict[str, Any]:
        return {"item_id": item.id, "output_index": item.index}

    def _text(self, text: str) -> list[bytes]:
        out: list[bytes] = []
        item = self._flow
        if item is None or item.kind != "message":
            out += self._close_flow("completed")
            item = self._flow = self._open("message", "msg_")
            item.phase, self._phase = self._phase, None
            out.append(self._added(item))
            out.append(self._sse("response.content_part.added", **self._ref(item),
                                 content_index=0, part=_text_part("")))
        item.text += text
        logprobs, self._pending_logprobs = self._pending_logprobs, []
        item.logprobs += logprobs
        out.append(self._sse("response.output_text.delta", **self._ref(item), content_index=0,
                             delta=text, logprobs=logprobs))
        return out

    def _message_start(self, phase: str | None) -> list[bytes]:
        """The upstream began another message: the open one is complete, the next text opens
        a new item (opened lazily, so an empty message adds nothing)."""
        self._phase = phase
        if self._flow is not None and self._flow.kind == "message":
            return self._close_flow("completed")
        return []

    def _reasoning(self, event: ReasoningDelta) -> list[bytes]:
        out: list[bytes] = []
        if event.text and not self._hide_summary:
            item = self._reasoning_item(out, need_summary=True)
            item.parts[-1] += event.text
            out.append(self._sse("response.reasoning_summary_text.delta", **self._ref(item),
                                 summary_index=len(item.parts) - 1, delta=event.text))
        for upstream, blob in event.encrypted:
            content = _responses_content(blob)
            if content is None:
                continue  # not a Responses upstream's state: nothing is invented
            item = self._reasoning_item(out, need_summary=False)
            if item.encrypted is not None:  # a second reasoning item upstream: a new one here
                out += self._close_flow("completed")
                item = self._reasoning_item(out, need_summary=False)
            item.encrypted = wrap_encrypted(upstream, content)
        return out

    def _reasoning_item(self, out: list[bytes], *, need_summary: bool) -> _Item:
        item = self._flow
        if item is None or item.kind != "reasoning":
            out += self._close_flow("completed")
            item = self._flow = self._open("reasoning", "rs_")
            out.append(self._added(item))
        if need_summary and not item.parts:
            item.parts.append("")
            out.append(self._sse("response.reasoning_summary_part.added", **self._ref(item),
                                 summary_index=0, part={"type": "summary_text", "text": ""}))
        return item

    def _tool(self, d: ToolCallDelta) -> list[bytes]:
        out: list[bytes] = []
        item = self._calls.get(d.index)
        if item is None:
            out += self._close_flow("completed")
            custom = d.kind == "custom"
            item = self._open("custom" if custom else "function", "ctc_" if custom else "fc_")
            self._calls[d.index] = item
        item.call_id = item.call_id or d.id
        if item.name is None and d.name is not None:
            item.name = d.name
            if item.kind != "custom":
                item.extra = dict(self._call_fields(d.name))
        if not item.opened:
            if item.name is None:  # wait for the name: an added item must say what it calls
                item.text += d.arguments
                return out
            item.call_id = item.call_id or _new_item_id("call_")
            pending, item.text = item.text + d.arguments, ""
            out.append(self._added(item))
            return out + self._tool_delta(item, pending)
        return out + self._tool_delta(item, d.arguments)

    def _tool_delta(self, item: _Item, delta: str) -> list[bytes]:
        if not delta:
            return []
        item.text += delta
        type_ = ("response.custom_tool_call_input.delta" if item.kind == "custom"
                 else "response.function_call_arguments.delta")
        return [self._sse(type_, **self._ref(item), delta=delta)]

    def _meta(self, meta: ResponseMeta) -> list[bytes]:
        if meta.service_tier is not None:
            self._service_tier = meta.service_tier
        if meta.end_turn is not None:
            self._end_turn = meta.end_turn
        if meta.turn_state is None or self.turn_state is not None:
            return []  # one turn state per response: the first the upstream gave
        self.turn_state = meta.turn_state
        if not self.stream:
            return []
        return [self._sse("response.metadata",
                          headers={TURN_STATE_HEADER: meta.turn_state})]

    # -- closing items ---------------------------------------------------------------------

    def _close_flow(self, status: str) -> list[bytes]:
        item, self._flow = self._flow, None
        if item is None:
            return []
        item.status = status
        ref = self._ref(item)
        out: list[bytes] = []
        if item.kind == "message":
            item.logprobs += self._pending_logprobs  # of held-back text that came to nothing
            self._pending_logprobs = []
            out += [self._sse("response.output_text.done", **ref, content_index=0,
                              text=item.text, logprobs=item.logprobs),
                    self._sse("response.content_part.done", **ref, content_index=0,
                              part=_text_part(item.text, item.logprobs))]
        else:
            for i, text in enumerate(item.parts):
                part = {"type": "summary_text", "text": text}
                out += [self._sse("response.reasoning_summary_text.done", **ref,
                                  summary_index=i, text=text),
                        self._sse("response.reasoning_summary_part.done", **ref,
                                  summary_index=i, part=part)]
        out.append(self._sse("response.output_item.done", output_index=item.index,
                             item=item.wire()))
        return out

    def _close_calls(self, complete: bool) -> list[bytes]:
        """Present finished calls as complete; unfinished ones only in the snapshot."""
        out: list[bytes] = []
        for item in self._calls.values():
            if not item.opened:  # never named: show it anyway, it cannot be run
                item.call_id = item.call_id or _new_item_id("call_")
                out.append(self._added(item))
        for item in sorted(self._calls.values(), key=lambda it: it.index):
            if not complete:
                item.status = "incomplete"
                continue
            item.status = "completed"
            if item.kind == "custom":
                out.append(self._sse("response.custom_tool_call_input.done", **self._ref(item),
                                     input=item.text))
            else:
                out.append(self._sse("response.function_call_arguments.done",
                                     **self._ref(item), name=item.name or "",
                                     arguments=item.text))
            out.append(self._sse("response.output_item.done", output_index=item.index,
                                 item=item.wire()))
        return out

    # -- terminals -------------------------------------------------------------------------

    def _finish(self, reason: FinishKind) -> list[bytes]:
        self.done = True
        incomplete = _INCOMPLETE.get(reason)
        status = "completed" if incomplete is None else "incomplete"
        out = self._close_flow(status) + self._close_calls(complete=incomplete is None)
        response = self._snapshot(status)
        if incomplete is not None:
            response["incomplete_details"] = {"reason": incomplete}
        else:
            if self._service_tier is not None:
                response["service_tier"] = self._service_tier
            if self._end_turn is not None:
                response["end_turn"] = self._end_turn
            elif self._derive_end_turn:
                response["end_turn"] = not self._calls
        self.final_response = response
        return [*out, self._sse(f"response.{status}", response=response)]

    def _failed(self, failure: Failure) -> list[bytes]:
        self.done = True
        out = self._close_flow("incomplete") + self._close_calls(complete=False)
        response = self._snapshot("failed")
        response["error"] = {"code": failure_code(failure),
                             "message": _failure_message(failure)}
        self.final_response = response
        return [*out, self._sse("response.failed", response=response)]

    def _snapshot(self, status: str) -> dict[str, Any]:
        """The ``response`` object: our identity and state, the request's echoed fields."""
        response: dict[str, Any] = {
            "id": self.response_id, "object": "response", "created_at": self._created_at,
            "status": status, "background": False, "error": None, "incomplete_details": None,
            "instructions": None, "max_output_tokens": None, "model": self._model,
            "output": [it.wire() for it in self._items] if status != "in_progress" else [],
            "parallel_tool_calls": True, "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None}, "store": False,
            "temperature": 1.0, "text": {"format": {"type": "text"}}, "tool_choice": "auto",
            "tools": [], "top_p": 1.0, "truncation": "disabled", "usage": None, "user": None,
            "metadata": {},
        }
        response.update(self._echo)
        response["usage"] = responses_usage(self._usage) if status != "in_progress" else None
        return response


def _text_part(text: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


