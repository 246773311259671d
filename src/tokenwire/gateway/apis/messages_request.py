"""Anthropic Messages requests (``POST /v1/messages``) -> the IR :class:`GenerationRequest`.

``max_tokens`` is required (a 400 without it, as the API does); ``system`` is a string or text
blocks; ``messages`` hold user/assistant turns whose content is a string or blocks. Tool ids
(``tool_use.id``, ``tool_result.tool_use_id``) are kept exactly. A signed thinking block or a
redacted one is opaque state that only the Anthropic deployment that signed it can verify: it
becomes ``reasoning_encrypted`` tagged with the routed upstream's name when that upstream is
an Anthropic one, and is otherwise reduced to its readable text. Errors are
:class:`~tokenwire.errors.RemoteProtocolError` with the status in ``status_hint``; the
route renders them in Anthropic's shape.
"""

from __future__ import annotations

from typing import Any

import msgspec

from tokenwire.gateway.apis.limits import (
    MAX_MESSAGES_TOOLS,
    check_anthropic_metadata,
    check_anthropic_service_tier,
    check_anthropic_tool_name,
    check_tool_count,
)
from tokenwire.gateway.apis.params import (
    MAX_MAX_TOKENS,
    MAX_TOP_K,
    bad_request,
    json_type,
    optional_bool,
)
from tokenwire.gateway.ir import (
    ChatMessage,
    ChatPrompt,
    ContentPart,
    GenerationRequest,
    ImagePart,
    MessageToolCall,
    ResponseFormat,
    TextPart,
    ToolSpec,
)
from tokenwire.gateway.request_fields import extensions_of, refuse_unsupported
from tokenwire.gateway.stops import validate_stops

__all__ = ["MessagesCall", "parse_messages_request"]

#: ``thinking.budget_tokens`` -> ``reasoning_effort``: the inverse of the budgets the
#: Anthropic adapter sends (1024 / 4096 / 16384), so a budget survives a round trip.
_EFFORT_BY_BUDGET = ((2048, "low"), (8192, "medium"))
#: Newer clients send ``thinking: {type: adaptive}`` (or ``between_tools``) with an optional
#: ``output_config.effort``; the IR's levels end at "high" (ir.GenerationRequest).
_THINKING_TYPES = frozenset({"enabled", "disabled", "adaptive", "between_tools"})
_ADAPTIVE_EFFORT = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high",
                    "max": "high"}


class MessagesCall:
    """A parsed Messages body: the IR request plus how to answer it."""

    __slots__ = ("model", "notes", "request", "stream")

    def __init__(self, request: GenerationRequest, *, model: str | None, stream: bool,
                 notes: tuple[str, ...]) -> None:
        self.request, self.model, self.stream, self.notes = request, model, stream, notes


def parse_messages_request(body: Any, *, request_id: str = "",
                           encrypted_for: str | None = None,
                           counting: bool = False) -> MessagesCall:
    """Validate ``body``. ``encrypted_for`` names the routed upstream when it is an Anthropic
    one: signed thinking blocks are kept for it; otherwise only their text survives.
    ``counting``: a ``count_tokens`` body, which has no ``max_tokens``."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object", code="invalid_type")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("model: must be a string", param="model")
    max_tokens = body.get("max_tokens")
    if max_tokens is None and not counting:
        raise bad_request("max_tokens: Field required",
                          param="max_tokens", code="missing_required_parameter")
    if counting:
        max_tokens = None  # count_tokens has no such field; a stray one changes nothing
    elif not isinstance(max_tokens, int) or isinstance(max_tokens, bool) \
            or not 1 <= max_tokens <= MAX_MAX_TOKENS:
        raise bad_request(f"max_tokens: must be an integer between 1 and {MAX_MAX_TOKENS}",
                          param="max_tokens")
    notes: list[str] = []
    refuse_unsupported("messages", body)  # fields no upstream can take here
    output = body.get("output_config")
    messages = (*_system(body.get("system")), *_turns(body.get("messages"), encrypted_for))
    tools, choice, parallel = _tools(body.get("tools")), *_tool_choice(body.get("tool_choice"))
    request = GenerationRequest(
        prompt=ChatPrompt(messages=messages), model=model or "", max_tokens=max_tokens,
        temperature=_num(body, "temperature"), top_p=_num(body, "top_p"),
        top_k=_top_k(body.get("top_k")),
        stop=_stops(body.get("stop_sequences")), request_id=request_id, tools=tools,
        tool_choice=choice, parallel_tool_calls=parallel,
        reasoning_effort=_effort(body.get("thinking"), output),
        response_format=_output_format(output),
        api="messages", extensions=extensions_of("messages", body),
        client_body=body if encrypted_for is not None and not counting
        and _thinking_signed(body.get("messages")) else None)
    check_anthropic_metadata(body.get("metadata"))
    check_anthropic_service_tier(body)  # a hint sent on to an Anthropic upstream
    return MessagesCall(request, model=model, stream=bool(optional_bool(body, "stream")),
                        notes=tuple(notes))


def _thinking_signed(turns: Any) -> bool:
    """Every thinking block of the conversation is signed, so an Anthropic upstream may
    read the client's own body (``GenerationRequest.client_body``). An unsigned one (from
    another model's turn) is refused there; the IR keeps only its text."""
    for turn in turns if isinstance(turns, list) else ():
        content = turn.get("content") if isinstance(turn, dict) else None
        for block in content if isinstance(content, list) else ():
            if isinstance(block, dict) and block.get("type") == "thinking" \
                    and not block.get("signature"):
                return False
    return True


def _output_format(output: Any) -> ResponseFormat | None:
    """``output_config.format``: Anthropic's structured outputs, ``{"type": "json_schema",
    "schema": {...}}`` (the only type the API documents)."""
    if output is None:
        return None
    if not isinstance(output, dict):
        raise bad_request(f"output_config: must be an object, got {json_type(output)}",
                          param="output_config")
    fmt = output.get("format")
    if fmt is None:
        return None
    where = "output_config.format"
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise bad_request(f"{where}: must be {{type: json_schema, schema}}", param=where)
    if not isinstance(fmt.get("schema"), dict):
        raise bad_request(f"{where}.schema: must be a JSON schema object",
                          param=f"{where}.schema")
    return ResponseFormat(type="json_schema", schema=fmt["schema"], param=f"{where}.schema")


def _num(body: dict[str, Any], key: str) -> float | None:
    """A sampling field in Anthropic's range, or None when absent (the generator decides)."""
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= 1:
        raise bad_request(f"{key}: must be a number between 0 and 1", param=key)
    return float(value)


def _top_k(value: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_TOP_K:
        raise bad_request(f"top_k: must be an integer between 0 and {MAX_TOP_K}",
                          param="top_k")
    return value


def _stops(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise bad_request("stop_sequences: must be a list of strings", param="stop_sequences")
    try:
        return validate_stops(value)
    except ValueError as exc:
        raise bad_request(f"stop_sequences: {exc}", param="stop_sequences") from None


def _effort(value: Any, output_config: Any) -> str | None:
    effort = output_config.get("effort") if isinstance(output_config, dict) else None
    if value is None:  # effort alone (no thinking field) still asks for that much effort
        return _ADAPTIVE_EFFORT.get(effort) if isinstance(effort, str) else None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str) \
            or value["type"] not in _THINKING_TYPES:
        raise bad_request("thinking: must be {type: enabled, budget_tokens}, adaptive or "
                          "disabled", param="thinking")
    if value["type"] == "disabled":
        return None
    if value["type"] != "enabled":  # adaptive: the model decides; output_config.effort hints
        return _ADAPTIVE_EFFORT.get(effort, "medium") if isinstance(effort, str) else "medium"
    budget = value.get("budget_tokens")
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
        raise bad_request("thinking.budget_tokens: must be a positive integer",
                          param="thinking.budget_tokens")
    return next((effort for limit, effort in _EFFORT_BY_BUDGET if budget <= limit), "high")


def _system(value: Any) -> tuple[ChatMessage, ...]:
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        return (ChatMessage(role="system", content=value),)
    if isinstance(value, list) and all(isinstance(b, dict) and b.get("type") == "text"
                                       and isinstance(b.get("text"), str) for b in value):
        return (ChatMessage(role="system", content="\n\n".join(b["text"] for b in value)),)
    raise bad_request("system: must be a string or a list of text blocks", param="system")


def _turns(value: Any, encrypted_for: str | None) -> tuple[ChatMessage, ...]:
    if not isinstance(value, list) or not value:
        raise bad_request("messages: must be a non-empty list", param="messages",
                          code="empty_array" if value == [] else "invalid_type")
    out: list[ChatMessage] = []
    for i, msg in enumerate(value):
        role = msg.get("role") if isinstance(msg, dict) else None
        if not isinstance(role, str) or role not in ("user", "assistant"):
            raise bad_request(f"messages.{i}.role: must be 'user' or 'assistant'",
                              param=f"messages.{i}.role")
        content = msg.get("content")
        if isinstance(content, str):
            out.append(ChatMessage(role=role, content=content))
            continue
        if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
            raise bad_request(f"messages.{i}.content: must be a string or a list of blocks",
                              param=f"messages.{i}.content")
        if role == "user":
            out += _user_turn(content, i)
        else:
            out.append(_assistant_turn(content, i, encrypted_for))
    return tuple(out)


def _image(block: dict[str, Any], where: str) -> ImagePart:
    src = block.get("source")
    if isinstance(src, dict) and src.get("type") == "base64" \
            and isinstance(src.get("data"), str) and isinstance(src.get("media_type"), str):
        return ImagePart(url=f"data:{src['media_type']};base64,{src['data']}", param=where)
    if isinstance(src, dict) and src.get("type") == "url" and isinstance(src.get("url"), str):
        return ImagePart(url=src["url"], param=where)
    raise bad_request(f"{where}.source: must be a base64 or url image source",
                      param=f"{where}.source")


def _parts(blocks: list[Any], where: str, start: int = 0) -> list[ContentPart]:
    """Text and image blocks; ``start`` is the first block's index in ``where``."""
    parts: list[ContentPart] = []
    for j, block in enumerate(blocks, start):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append(TextPart(text=block["text"]))
        elif kind == "image":
            parts.append(_image(block, f"{where}.{j}"))
        else:
            raise bad_request(f"{where}.{j}: expected a text or image block",
                              param=f"{where}.{j}")
    return parts


def _content(parts: list[ContentPart]) -> str | tuple[ContentPart, ...]:
    if all(isinstance(p, TextPart) for p in parts):  # plain text stays a string
        return "".join(p.text for p in parts)  # type: ignore[union-attr]
    return tuple(parts)


def _user_turn(blocks: list[dict[str, Any]], i: int) -> list[ChatMessage]:
    """A user turn: tool results become tool messages, in order, around the user's parts."""
    out: list[ChatMessage] = []
    pending: list[ContentPart] = []
    for j, block in enumerate(blocks):
        if block.get("type") != "tool_result":
            pending += _parts([block], f"messages.{i}.content", j)
            continue
        if pending:
            out.append(ChatMessage(role="user", content=_content(pending)))
            pending = []
        out.append(_tool_result(block, f"messages.{i}.content.{j}"))
    if pending or not out:
        out.append(ChatMessage(role="user", content=_content(pending)))
    return out


def _tool_result(block: dict[str, Any], where: str) -> ChatMessage:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str):
        raise bad_request(f"{where}.tool_use_id: Field required",
                          param=f"{where}.tool_use_id", code="missing_required_parameter")
    raw = block.get("content", "")
    parts = [TextPart(text=raw)] if isinstance(raw, str) else \
        _parts(raw, f"{where}.content") if isinstance(raw, list) else None
    if parts is None:
        raise bad_request(f"{where}.content: must be a string or a list of blocks",
                          param=f"{where}.content")
    if block.get("is_error") is True:
        # The IR's tool message has no error flag; a visible prefix keeps the meaning.
        parts.insert(0, TextPart(text="Error: "))
    return ChatMessage(role="tool", tool_call_id=call_id, content=_content(parts))


def _assistant_turn(blocks: list[dict[str, Any]], i: int,
                    encrypted_for: str | None) -> ChatMessage:
    text: list[str] = []
    calls: list[MessageToolCall] = []
    reasoning: list[str] = []
    kept: list[tuple[str, str]] = []
    for j, block in enumerate(blocks):
        kind, where = block.get("type"), f"messages.{i}.content.{j}"
        if kind == "text" and isinstance(block.get("text"), str):
            text.append(block["text"])
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise bad_request(f"{where}: tool_use needs id and name", param=where,
                                  code="missing_required_parameter")
            args = msgspec.json.encode(block.get("input", {})).decode()
            calls.append(MessageToolCall(id=block["id"], name=block["name"], arguments=args))
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            reasoning.append(block["thinking"])
            if encrypted_for is not None and block.get("signature"):
                keep = {"type": "thinking", "thinking": block["thinking"],
                        "signature": block["signature"]}
                kept.append((encrypted_for, msgspec.json.encode(keep).decode()))
        elif kind == "redacted_thinking" and isinstance(block.get("data"), str):
            if encrypted_for is not None:
                keep = {"type": "redacted_thinking", "data": block["data"]}
                kept.append((encrypted_for, msgspec.json.encode(keep).decode()))
        else:
            raise bad_request(f"{where}: expected text, tool_use, thinking or "
                              "redacted_thinking in an assistant turn", param=where)
    return ChatMessage(role="assistant", content="".join(text), tool_calls=tuple(calls),
                       reasoning="".join(reasoning) or None, reasoning_encrypted=tuple(kept))


def _tools(value: Any) -> tuple[ToolSpec, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise bad_request("tools: must be a list", param="tools")
    check_tool_count(value, MAX_MESSAGES_TOOLS)
    specs = []
    for j, tool in enumerate(value):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) \
                or tool.get("type", "custom") != "custom":
            raise bad_request(f"tools.{j}: needs a name; server tools are not supported",
                              param=f"tools.{j}")
        check_anthropic_tool_name(tool["name"], f"tools.{j}.name")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise bad_request(f"tools.{j}.input_schema: Field required",
                              param=f"tools.{j}.input_schema",
                              code="missing_required_parameter")
        specs.append(ToolSpec(name=tool["name"], description=str(tool.get("description") or ""),
                              parameters=schema))
    return tuple(specs)


def _tool_choice(value: Any) -> tuple[str | dict | None, bool | None]:
    """(IR ``tool_choice``, ``parallel_tool_calls``) from Anthropic's ``tool_choice``."""
    if value is None:
        return None, None
    kind = value.get("type") if isinstance(value, dict) else None
    kind = kind if isinstance(kind, str) else None
    parallel = None
    if isinstance(value, dict) and value.get("disable_parallel_tool_use") is True:
        parallel = False
    if kind in ("auto", "none"):
        return kind, parallel
    if kind == "any":
        return "required", parallel
    if kind == "tool" and isinstance(value.get("name"), str):
        check_anthropic_tool_name(value["name"], "tool_choice.name")
        return {"name": value["name"]}, parallel
    raise bad_request("tool_choice: must be {type: auto | any | none} or {type: tool, name}",
                      param="tool_choice")
