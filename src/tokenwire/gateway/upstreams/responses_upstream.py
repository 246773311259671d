"""OpenAI Responses API upstreams (``kind = "responses"``): IR requests in, IR events out.

Request: ``POST {base_url}/responses`` with ``stream: true`` and ``store: false`` (we keep no
server-side state, so the whole conversation goes as ``input`` items every turn, as Codex
does; gateway-research §2). Call ids go back exactly as the client sent them
(``function_call`` / ``function_call_output``, ``custom_tool_call`` / ``..._output`` for
freeform tools). Reasoning items are replayed only from
:attr:`~tokenwire.gateway.ir.ChatMessage.reasoning_encrypted` pairs that name *this*
upstream: ``encrypted_content`` can only be decrypted by the organisation that produced it,
so another upstream's blob would be a 400 (``invalid_encrypted_content``).

Stream (gateway-research §5.3-§5.6): ``output_text.delta`` is text;
``output_item.added`` opens a function or custom tool call (our own index, counted per
call, with the upstream's ``call_id``), its argument / input deltas follow, and the
``.done`` events and ``output_item.done`` are authoritative: anything they hold beyond what
was streamed is sent as one more fragment (some servers stream no argument deltas at all,
vllm#36073). Reasoning summary and raw reasoning deltas are reasoning text; a finished
reasoning item with ``encrypted_content`` becomes an opaque ``(upstream, blob)`` pair.
Each assistant ``message`` item starts with a ``MessageStart`` carrying its ``phase`` when
that is a known one (seed, "Replayed items and turn terminals": boundaries and phases are
retained); a phase that changes between an item's snapshots is a failure, not a guess.
Terminals: ``response.completed`` (usage, then ``tool_calls`` or ``eos``),
``response.incomplete`` (``length`` / ``content_filter``), ``response.failed`` and ``error``
events (classified by ``error.code``). Facts about the response go out as one
``ResponseMeta``: the ``x-codex-turn-state`` response header (wrapped with this upstream's
name, as soon as the head arrives) and, just before a completion's ``Finish``, the served
``service_tier`` and the actual ``end_turn`` of the ``response.completed`` snapshot. EOF
or ``[DONE]`` without a terminal is a ``Failure(UPSTREAM)``, never a finish (§5.1).
Unknown event types are counted and ignored.

The Responses API has no stop sequences, so ``request.stop`` is applied here on the text
(:class:`~tokenwire.gateway.stops.StopMatcher`); a match ends the generation and closes the
upstream response.

The HTTP side (one request, SSE in, events out, cancellation, transport failures, status
classification) is :mod:`.sse_http`, shared with the Anthropic adapter; failures are classified
by :mod:`.failures`, shared with every HTTP adapter. With ``[upstreams.options] websocket =
true``, requests from a client's Responses WebSocket go over one upstream WebSocket held for
it (:mod:`.responses_socket`), each message fed to the same parser as an SSE event's data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec

from tokenwire.errors import ConfigError
from tokenwire.gateway.affinity import (
    TURN_STATE_HEADER,
    affinity_body,
    affinity_headers,
    wrap_turn_state,
)
from tokenwire.gateway.ir import (
    ChatMessage,
    ChatPrompt,
    Event,
    Failure,
    FailureClass,
    Finish,
    FinishKind,
    GenerationRequest,
    ImagePart,
    MessageStart,
    PromptText,
    ReasoningDelta,
    ResponseFormat,
    ResponseMeta,
    TokenDelta,
    TokenLogprob,
    ToolCallDelta,
)
from tokenwire.gateway.stops import StopMatcher
from tokenwire.gateway.upstreams.base import UpstreamConfig, unknown_option
from tokenwire.gateway.upstreams.failures import MALFORMED, classify_error, failure_from_response
from tokenwire.gateway.upstreams.logprobs_wire import entry_logprobs
from tokenwire.gateway.upstreams.responses_socket import (
    RefusalLog,
    SocketStream,
    UpstreamSocket,
    socket_url,
    upgrade_headers,
)
from tokenwire.gateway.upstreams.sse import SSEEvent
from tokenwire.gateway.upstreams.sse_http import (
    FailedStream,
    SSEUpstreamStream,
    TextUpstream,
    UnknownEvents,
)
from tokenwire.gateway.upstreams.usage_wire import responses_usage

__all__ = [
    "OPTIONS",
    "PUBLIC_SERVICE_TIERS",
    "ResponsesStreamParser",
    "ResponsesUpstream",
    "build_responses_body",
    "parse_options",
    "with_websocket",
]

#: What the upstream is told we accept; some proxies answer JSON without it.
_SSE_ACCEPT = "text/event-stream"


# -- request body ------------------------------------------------------------------------------


def build_responses_body(request: GenerationRequest, *, model: str,
                         upstream_name: str) -> dict[str, Any]:
    """The Responses API body for ``request``; raises ``ValueError`` for token-id prompts."""
    body: dict[str, Any] = {"model": model, "input": _input_items(request, upstream_name),
                            "stream": True, "store": False}
    # Only what the client set: the API's own defaults otherwise (no output cap; reasoning
    # models reject temperature / top_p outright, "Unsupported parameter").
    if request.max_tokens is not None:
        body["max_output_tokens"] = request.max_tokens
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.top_p is not None:
        body["top_p"] = request.top_p
    if request.tools:
        body["tools"] = [_tool(t) for t in request.tools]
    if request.tool_choice is not None:
        body["tool_choice"] = _tool_choice(request)
    if request.parallel_tool_calls is not None:
        body["parallel_tool_calls"] = request.parallel_tool_calls
    if request.reasoning_effort:
        body["reasoning"] = {"effort": request.reasoning_effort, "summary": "auto"}
        # store=false keeps no reasoning server-side: ask for it encrypted, to replay it.
        body["include"] = ["reasoning.encrypted_content"]
    if request.service_tier is not None:  # kept for Responses upstreams (seed: service tiers)
        body["service_tier"] = request.service_tier
    if request.response_format is not None:
        body["text"] = {"format": _text_format(request.response_format)}
    if request.logprobs:
        body["include"] = [*body.get("include", ()), LOGPROBS_INCLUDE]
        if request.top_logprobs is not None:
            body["top_logprobs"] = request.top_logprobs
    if request.api == "responses":  # the client's own fields of this wire, unchanged
        for key, value in request.extensions:
            if key == "text" and isinstance(value, dict):  # format is ours, the rest theirs
                value = {**value, **body.get("text", {})}
            body[key] = value
    return body


#: The ``include`` value that asks for the answer's log probabilities.
LOGPROBS_INCLUDE = "message.output_text.logprobs"


def _text_format(fmt: ResponseFormat) -> dict[str, Any]:
    """``text.format``: Chat's ``json_schema`` object, flattened."""
    if fmt.type != "json_schema":
        return {"type": fmt.type}
    out: dict[str, Any] = {"type": "json_schema", "name": fmt.name or "output",
                           "schema": fmt.schema}
    if fmt.strict is not None:
        out["strict"] = fmt.strict
    return out


def _input_items(request: GenerationRequest, upstream_name: str) -> list[dict[str, Any]]:
    prompt = request.prompt
    if isinstance(prompt, PromptText):
        return [{"type": "message", "role": "user", "content": prompt.text}]
    if not isinstance(prompt, ChatPrompt):
        raise ValueError("a Responses API upstream takes text, not token ids")
    kinds = {c.id: c.kind for m in prompt.messages for c in m.tool_calls}
    items: list[dict[str, Any]] = []
    for msg in prompt.messages:
        items += _message_items(msg, kinds, upstream_name)
    return items


def _message_items(msg: ChatMessage, kinds: dict[str, str],
                   upstream_name: str) -> list[dict[str, Any]]:
    if msg.role == "tool":
        custom = kinds.get(msg.tool_call_id or "") == "custom"
        return [{"type": "custom_tool_call_output" if custom else "function_call_output",
                 "call_id": msg.tool_call_id or "", "output": msg.text}]
    if msg.role != "assistant":
        return [{"type": "message", "role": msg.role, "content": _content(msg)}]
    items = [msgspec.json.decode(blob) for name, blob in msg.reasoning_encrypted
             if name == upstream_name]
    if msg.text:
        items.append({"type": "message", "role": "assistant", "content": msg.text})
    for call in msg.tool_calls:
        if call.kind == "custom":
            items.append({"type": "custom_tool_call", "call_id": call.id, "name": call.name,
                          "input": call.arguments})
        else:
            items.append({"type": "function_call", "call_id": call.id, "name": call.name,
                          "arguments": call.arguments})
    return items


def _content(msg: ChatMessage) -> str | list[dict[str, Any]]:
    if isinstance(msg.content, str):
        return msg.content
    return [{"type": "input_image", "image_url": p.url, "detail": p.detail or "auto"}
            if isinstance(p, ImagePart) else {"type": "input_text", "text": p.text}
            for p in msg.content]


def _tool(tool: Any) -> dict[str, Any]:
    if tool.kind == "custom":
        out = {"type": "custom", "name": tool.name, "description": tool.description}
        if tool.format is not None:
            out["format"] = tool.format
        return out
    # Responses function tools are strict unless told otherwise; Chat clients expect not.
    return {"type": "function", "name": tool.name, "description": tool.description,
            "parameters": tool.parameters or {"type": "object", "properties": {}},
            "strict": bool(tool.strict)}


def _tool_choice(request: GenerationRequest) -> str | dict[str, Any]:
    choice = request.tool_choice
    if isinstance(choice, str):
        return choice
    assert isinstance(choice, dict)
    name = choice.get("name") or (choice.get("function") or {}).get("name")
    kind = next((t.kind for t in request.tools if t.name == name), "function")
    return {"type": kind, "name": name}


# -- stream parser ---------------------------------------------------------------------------

#: ``incomplete_details.reason`` values that are a normal (if early) end.
_INCOMPLETE_FINISH = {"max_output_tokens": FinishKind.LENGTH,
                      "content_filter": FinishKind.CONTENT_FILTER}
#: The public ``service_tier`` values (seed, "Service tiers on Responses upstreams"): the tier
#: served is reported only when the upstream names one of these, never anything else.
PUBLIC_SERVICE_TIERS = frozenset({"auto", "default", "flex", "priority", "scale"})
#: The assistant message phases kept (seed, "Replayed items"); any other value is dropped.
_PHASES = frozenset({"commentary", "final_answer", "partial_answer"})
#: Event types we read nothing from (everything else unlisted is counted as unknown).
_IGNORED = frozenset({
    "response.created", "response.in_progress", "response.queued",
    "response.content_part.added", "response.content_part.done", "response.output_text.done",
    "response.refusal.done", "response.reasoning_summary_text.done",
    "response.reasoning_summary_part.done", "response.reasoning_text.done",
    "response.output_text.annotation.added", "response.metadata",
})


class _Call:
    __slots__ = ("args", "id", "index", "kind", "name")

    def __init__(self, index: int, kind: str, id: str | None, name: str | None) -> None:
        self.index, self.kind, self.id, self.name, self.args = index, kind, id, name, ""


class ResponsesStreamParser:
    """Sans-IO: one Responses SSE event in, IR events out (see the module docstring)."""

    def __init__(self, upstream_name: str, stop: tuple[str, ...] = ()) -> None:
        self._name = upstream_name
        self._calls: dict[int, _Call] = {}  # output_index -> call
        self._texts: dict[int, str] = {}  # output_index -> text sent (before stop trimming)
        self._messages: dict[int, str | None] = {}  # output_index -> phase, once announced
        self._reasoned: set[int] = set()  # reasoning items whose blob was sent
        self._item_ids: dict[str, int] = {}  # item id (or a call's call_id) -> output_index
        self._reasoning_text = False
        self._stops = StopMatcher(stop)
        self.unknown = UnknownEvents()
        self.done = False
        #: The upstream's own terminal event type once it arrived (the upstream's response is
        #: over; a stop sequence ends ``done`` earlier), and a completed response's snapshot:
        #: what an upstream WebSocket continues from (``responses_socket.py``).
        self.terminal: str | None = None
        self.completed: dict[str, Any] | None = None

    def on_sse(self, sse: SSEEvent) -> list[Event]:
        if self.done or sse.data.strip() == "[DONE]":
            return []  # [DONE] is not a terminal (§5.1): on_eof decides
        try:
            data = msgspec.json.decode(sse.data)
        except msgspec.DecodeError:
            return self._end(_upstream_failure(f"malformed JSON in a {sse.event!r} event",
                                               MALFORMED))
        if not isinstance(data, dict):
            return self._end(_upstream_failure("an event that is not a JSON object", MALFORMED))
        kind = str(data.get("type") or sse.event)
        handler = _HANDLERS.get(kind)
        if handler is None:
            if kind not in _IGNORED:
                self.unknown.add(kind)
            return []
        try:
            return handler(self, data)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            # A field of the wrong JSON type: the upstream broke its format, not us.
            return self._end(_upstream_failure(
                f"a malformed {kind!r} event: {type(exc).__name__}", MALFORMED))

    def on_head(self, headers: Mapping[str, str]) -> list[Event]:
        """The upstream's response head: its ``x-codex-turn-state``, wrapped with our name
        (``gateway/affinity.py``); a malformed or oversized value is dropped, unlogged."""
        value = headers.get(TURN_STATE_HEADER)
        wrapped = wrap_turn_state(self._name, value) if value else None
        return [ResponseMeta(turn_state=wrapped)] if wrapped else []

    def on_eof(self) -> list[Event]:
        if self.done:
            return []
        return self._end(_upstream_failure(
            "the upstream closed the stream before response.completed"))

    def _end(self, *events: Event) -> list[Event]:
        self.done = True
        return list(events)

    # -- text and reasoning ----------------------------------------------------------------

    def _text(self, data: dict[str, Any]) -> list[Event]:
        oi, delta = data.get("output_index", 0), str(data.get("delta", ""))
        self._saw(data.get("item_id"), oi)
        self._texts[oi] = self._texts.get(oi, "") + delta
        out = [] if oi in self._messages else self._announce(oi, {})  # no added event seen
        return out + self._show(delta, entry_logprobs(data.get("logprobs")))

    def _announce(self, oi: int, item: dict[str, Any]) -> list[Event]:
        """A ``MessageStart`` for message item ``oi`` the first time it is seen; later, only
        a check that its phase did not change (a contradiction fails, seed "Replayed items")."""
        phase = item.get("phase")
        phase = phase if isinstance(phase, str) and phase in _PHASES else None
        if oi not in self._messages:
            self._messages[oi] = phase
            return [MessageStart(phase=phase)]
        known = self._messages[oi]
        if phase is not None and known is not None and phase != known:
            return self._end(_upstream_failure(
                f"message item {oi}: its phase changed from {known!r} to {phase!r}"))
        return []

    def _show(self, text: str, logprobs: tuple[TokenLogprob, ...] = ()) -> list[Event]:
        # A stop string's tokens reach the client neither as text nor as logprobs: each
        # token's logprob goes with the text it begins (where, from the tokens' own texts).
        shown, kept = self._stops.feed_delta(text, logprobs, _token_starts(logprobs, text))
        out: list[Event] = [TokenDelta(text=shown, logprobs=tuple(kept))] \
            if shown or kept else []
        if self._stops.matched is not None:  # the API cannot stop itself: we do
            out += self._end(Finish(reason=FinishKind.STOP_SEQUENCE,
                                    matched_stop=self._stops.matched))
        return out

    def _reasoning(self, data: dict[str, Any]) -> list[Event]:
        self._reasoning_text = True
        return [ReasoningDelta(text=str(data.get("delta", "")))]

    def _summary_part(self, data: dict[str, Any]) -> list[Event]:
        # Summary parts are separate paragraphs; keep them apart in the one reasoning text.
        return [ReasoningDelta(text="\n\n")] if self._reasoning_text else []

    # -- tool calls ------------------------------------------------------------------------

    def _saw(self, item_id: Any, oi: int) -> None:
        """Item ``item_id`` streamed at ``oi``: where :meth:`_completed` finds it again."""
        if isinstance(item_id, str) and item_id:
            self._item_ids.setdefault(item_id, oi)

    def _item_added(self, data: dict[str, Any]) -> list[Event]:
        item = data.get("item") or {}
        self._saw(item.get("id"), data.get("output_index", 0))
        if item.get("type") in ("function_call", "custom_tool_call"):
            return self._open_call(data.get("output_index", 0), item)
        if item.get("type") == "message":
            return self._announce(data.get("output_index", 0), item)
        return []

    def _open_call(self, oi: int, item: dict[str, Any]) -> list[Event]:
        if oi in self._calls:
            return []
        kind = "custom" if item["type"] == "custom_tool_call" else "function"
        call = _Call(len(self._calls), kind, item.get("call_id") or item.get("id"),
                     item.get("name"))
        self._calls[oi] = call
        self._saw(call.id, oi)
        call.args = str(item.get("input" if kind == "custom" else "arguments") or "")
        return [ToolCallDelta(index=call.index, id=call.id, name=call.name,
                              arguments=call.args, kind=kind)]

    def _args_delta(self, data: dict[str, Any]) -> list[Event]:
        call = self._calls.get(data.get("output_index", -1))
        if call is None:  # a delta for a call never announced: nothing to attach it to
            self.unknown.add(str(data.get("type")) + " (unannounced item)")
            return []
        delta = str(data.get("delta", ""))
        call.args += delta
        return [ToolCallDelta(index=call.index, arguments=delta, kind=call.kind)]

    def _args_done(self, data: dict[str, Any]) -> list[Event]:
        call = self._calls.get(data.get("output_index", -1))
        full = data.get("input" if call and call.kind == "custom" else "arguments")
        return [] if call is None or full is None else self._complete(call, str(full))

    def _complete(self, call: _Call, full: str) -> list[Event]:
        """The final arguments: send what the deltas did not; a contradiction is a failure."""
        if not full.startswith(call.args):
            return self._end(_upstream_failure(
                f"tool call {call.id!r}: final arguments contradict the streamed ones"))
        rest, call.args = full[len(call.args):], full
        return [ToolCallDelta(index=call.index, arguments=rest, kind=call.kind)] if rest else []

    # -- finished items (also replayed from response.completed's output) --------------------

    def _item_done(self, data: dict[str, Any]) -> list[Event]:
        return self._finish_item(data.get("output_index", 0), data.get("item") or {})

    def _finish_item(self, oi: int, item: dict[str, Any]) -> list[Event]:
        kind = item.get("type")
        if kind in ("function_call", "custom_tool_call"):
            out = self._open_call(oi, item)
            full = item.get("input" if kind == "custom_tool_call" else "arguments")
            return out + ([] if full is None else self._complete(self._calls[oi], str(full)))
        if kind == "message":
            return self._finish_message(oi, item)
        if kind == "reasoning" and item.get("encrypted_content") and oi not in self._reasoned:
            self._reasoned.add(oi)
            keep = {k: item[k] for k in ("type", "summary", "encrypted_content") if k in item}
            blob = msgspec.json.encode(keep).decode()
            return [ReasoningDelta(text="", encrypted=((self._name, blob),))]
        return []

    def _finish_message(self, oi: int, item: dict[str, Any]) -> list[Event]:
        full = "".join(str(p.get("text") or p.get("refusal") or "")
                       for p in item.get("content") or () if isinstance(p, dict))
        sent = self._texts.get(oi, "")
        fresh = full.startswith(sent) and len(full) > len(sent)
        # Announced before (phase check only), or first seen here with text to show.
        out = self._announce(oi, item) if fresh or oi in self._messages else []
        if self.done or not fresh:
            return out
        self._texts[oi] = full
        return out + self._show(full[len(sent):])

    # -- terminals -------------------------------------------------------------------------

    def _completed(self, data: dict[str, Any]) -> list[Event]:
        response = data.get("response") or {}
        self.terminal, self.completed = "response.completed", response
        out = self._replay(response)
        if self.done:  # a stop sequence fired, or the snapshot contradicted the stream
            return out
        out += self._flush(response) + _completion_meta(response)
        reason = FinishKind.TOOL_CALLS if self._calls else FinishKind.EOS
        return out + self._end(Finish(reason=reason))

    def _replay(self, response: dict[str, Any]) -> list[Event]:
        """What a terminal snapshot's ``output`` holds beyond what was streamed (a server
        may stream no deltas at all): each item as its ``output_item.done`` would be."""
        out: list[Event] = []
        for position, item in enumerate(response.get("output") or ()):
            if isinstance(item, dict) and not self.done:
                out += self._finish_item(self._slot(position, item), item)
        return out

    def _slot(self, position: int, item: dict[str, Any]) -> int:
        """The ``output_index`` the stream gave a snapshot item: found by its id (a call's
        ``call_id`` too), else its position. A server whose snapshot lists items the stream
        never announced (or omits some it did) shifts the positions: by position alone, a
        streamed call came back as a second call with the same ``call_id`` (the client ran
        the tool twice) and a streamed message's text was shown twice."""
        keys = [k for k in (item.get("id"), item.get("call_id")) if isinstance(k, str) and k]
        for key in keys:
            if key in self._item_ids:
                return self._item_ids[key]
        # Unknown ids, and the stream showed another item with an id at this position: a
        # new item, in a slot of its own. (A stream without ids matches by position.)
        other = keys and position in self._item_ids.values()
        return -1 - position if other else position

    def _flush(self, response: dict[str, Any]) -> list[Event]:
        held, logprobs = self._stops.flush_delta()
        out: list[Event] = [TokenDelta(text=held, logprobs=tuple(logprobs))] \
            if held or logprobs else []
        usage = responses_usage(response.get("usage"))
        if usage is not None:
            out.append(usage)
        return out

    def _incomplete(self, data: dict[str, Any]) -> list[Event]:
        response = data.get("response") or {}
        self.terminal = "response.incomplete"
        reason = str((response.get("incomplete_details") or {}).get("reason") or "")
        if reason not in _INCOMPLETE_FINISH:
            return self._flush(response) + self._end(_upstream_failure(
                f"the upstream returned an incomplete response (reason {reason or 'unknown'})",
                code=reason or None))
        # The partial answer, as for response.completed: a server that streamed no deltas
        # had it only here, and the client got an incomplete response with no output.
        out = self._replay(response)
        if self.done:  # a stop sequence fired, or the snapshot contradicted the stream
            return out
        return out + self._flush(response) + self._end(
            Finish(reason=_INCOMPLETE_FINISH[reason]))

    def _failed(self, data: dict[str, Any]) -> list[Event]:
        self.terminal = "response.failed"
        response = data.get("response") or {}
        err = response.get("error") or {}
        # What the failed response used is kept (the client's usage, the key's token
        # limit): a failure after output was still generated, and is billed upstream.
        usage = responses_usage(response.get("usage"))
        return ([usage] if usage is not None else []) + self._end(
            classify_error(err if isinstance(err, dict) else {}, status=None))

    def _error(self, data: dict[str, Any]) -> list[Event]:
        self.terminal = "error"
        nested = data.get("error")  # the newer shape nests the fields under "error" (§5.6)
        # Over WebSocket the error message carries the HTTP status it stands for.
        status = data.get("status")
        status = status if isinstance(status, int) and not isinstance(status, bool) else None
        return self._end(classify_error(nested if isinstance(nested, dict) else data,
                                        status=status))


def _completion_meta(response: dict[str, Any]) -> list[Event]:
    """The served tier (a public value only) and the actual boolean ``end_turn`` of a completed
    snapshot; absent stays absent (seed, "Replayed items and turn terminals")."""
    tier = response.get("service_tier")
    tier = tier if isinstance(tier, str) and tier in PUBLIC_SERVICE_TIERS else None
    end_turn = response.get("end_turn")
    end_turn = end_turn if isinstance(end_turn, bool) else None
    if tier is None and end_turn is None:
        return []
    return [ResponseMeta(service_tier=tier, end_turn=end_turn)]


def _upstream_failure(message: str, code: str | None = None) -> Failure:
    return Failure(failure_class=FailureClass.UPSTREAM, message=message, status=502, code=code)


_P = ResponsesStreamParser
_HANDLERS: dict[str, Callable[[ResponsesStreamParser, dict[str, Any]], list[Event]]] = {
    "response.output_text.delta": _P._text,
    "response.refusal.delta": _P._text,
    "response.reasoning_summary_text.delta": _P._reasoning,
    "response.reasoning_text.delta": _P._reasoning,
    "response.reasoning_summary_part.added": _P._summary_part,
    "response.output_item.added": _P._item_added,
    "response.output_item.done": _P._item_done,
    "response.function_call_arguments.delta": _P._args_delta,
    "response.custom_tool_call_input.delta": _P._args_delta,
    "response.function_call_arguments.done": _P._args_done,
    "response.custom_tool_call_input.done": _P._args_done,
    "response.completed": _P._completed,
    "response.incomplete": _P._incomplete,
    "response.failed": _P._failed,
    "error": _P._error,
}


# -- the adapter -----------------------------------------------------------------------------
#: ``[upstreams.options]`` of a Responses upstream, and what each must be.
OPTIONS: dict[str, type] = {"websocket": bool}


def parse_options(upstream: str, options: Mapping[str, object]) -> dict[str, Any]:
    """Check a Responses upstream's options (README "The Responses API over WebSocket");
    an unknown key or a wrong type is a :class:`ConfigError` naming the key. Called when
    the config is read (``gateway/config.py``) and by ``from_config`` before any client
    exists, so a bad option never gets as far as building the adapter."""
    for key, value in options.items():
        if key not in OPTIONS:
            raise unknown_option("responses", upstream, key, OPTIONS)
        if not isinstance(value, OPTIONS[key]):
            raise ConfigError(f"upstream {upstream!r}: options.{key} must be true or false")
    return {"websocket": bool(options.get("websocket", False))}


def with_websocket(upstreams: Sequence[UpstreamConfig]) -> tuple[UpstreamConfig, ...]:
    """``--upstream-websocket``: ``websocket = true`` on every Responses upstream given; a
    :class:`ConfigError` when none is one (the flag would do nothing)."""
    if not any(u.kind == "responses" for u in upstreams):
        raise ConfigError("--upstream-websocket applies to Responses upstreams: add "
                          "--upstream-kind responses (or kind = \"responses\" in the file)")
    return tuple(dataclasses.replace(u, options={**u.options, "websocket": True})
                 if u.kind == "responses" else u for u in upstreams)


class ResponsesUpstream(TextUpstream):
    """Every model of one Responses API upstream (implements ``ir.Upstream``).

    With ``websocket = true``, a request from a client's Responses WebSocket goes over one
    upstream WebSocket held for that client socket (:mod:`.responses_socket`); every other
    request, and every request once the upstream refused the upgrade, goes over HTTP."""

    kind = "responses"
    parse_options = staticmethod(parse_options)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Checked already (the config, then from_config before the client): cannot raise.
        self.websocket = parse_options(self.name, self.config.options)["websocket"]
        self._sockets: set[UpstreamSocket] = set()  # held for client sockets: closed at exit
        self._refusals = RefusalLog()

    @staticmethod
    def auth_headers(key: str | None) -> dict[str, str]:
        headers = {"Accept": _SSE_ACCEPT}
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def submit(self, request: GenerationRequest) -> SSEUpstreamStream | FailedStream:
        model = self.upstream_model(request.model)
        try:
            body: dict[str, Any] | bytes | None = _passthrough(request, model)
            if body is None:
                body = build_responses_body(request, model=model, upstream_name=self.name)
                body.update(affinity_body(self.kind, request.affinity))
            parser = ResponsesStreamParser(self.name, request.stop)
        except ValueError as exc:
            return FailedStream(Failure(failure_class=FailureClass.INVALID_REQUEST,
                                        message=str(exc), status=400))
        self._admit()
        http: dict[str, Any] = dict(
            client=self._client, url=f"{self.api_base}/responses", body=body, parser=parser,
            classify_http=failure_from_response, on_done=lambda: self._release(parser),
            headers=affinity_headers(self.kind, self.name, request.affinity))
        held = request.connection
        if self.websocket and held is not None and not held.closed:
            sock = held.held(f"responses-socket:{self.name}", lambda: self._socket_for(held))
            return SocketStream(socket=sock, read_timeout_s=self.config.read_timeout_s, **http)
        return SSEUpstreamStream(**http)

    def _socket_for(self, held: Any) -> UpstreamSocket:
        sock = UpstreamSocket(upstream=self.name, url=socket_url(self.api_base),
                              headers=upgrade_headers(self._client.headers),
                              open_timeout_s=self.config.connect_timeout_s, note=held.note,
                              refusals=self._refusals, on_close=self._sockets.discard)
        self._sockets.add(sock)
        return sock

    async def aclose(self) -> None:
        for sock in list(self._sockets):  # client sockets drained first (http/shutdown.py)
            await sock.aclose()
        await super().aclose()


def _token_starts(logprobs: tuple[TokenLogprob, ...], text: str) -> list[int]:
    """Where each token begins in a delta's ``text``, from the tokens' own texts (a token
    cut inside a UTF-8 character shows U+FFFD: the position is then near, never past the
    end)."""
    starts, at = [], 0
    for lp in logprobs:
        starts.append(min(at, max(len(text) - 1, 0)))
        at += len(lp.token)
    return starts


class _PassthroughHead(msgspec.Struct):
    """The two fields of a passthrough body that decide whether it can go as is."""

    model: str = ""
    stream: bool = False


def _passthrough(request: GenerationRequest, model: str) -> bytes | None:
    """The client's untouched bytes when this upstream serves the model under the client's
    own name and the client asked for a stream (we parse SSE only); else None."""
    raw = request.passthrough_body
    if raw is None or model != request.model:
        return None
    try:
        head = msgspec.json.decode(raw, type=_PassthroughHead)
    except msgspec.DecodeError:
        return None
    return raw if head.model == model and head.stream is True else None
