"""OpenAI Responses requests (``POST /v1/responses``) into one IR ``GenerationRequest``.

The order is the seed's: the hygiene of :mod:`.responses_hygiene` first (internal fields,
control items, ``compaction_trigger``), then ``previous_response_id`` (the stored conversation
is prepended, :mod:`tokenwire.gateway.state.response_store`), then translation of the items:

* ``message`` (roles user, system, developer, assistant; parts ``input_text``,
  ``input_image`` with ``image_url`` or a ``file_data`` data URL, ``output_text``,
  ``refusal``); ``instructions`` become a leading system message (not stored: OpenAI does not
  carry instructions over to a continuation either).
* ``function_call`` / ``custom_tool_call`` join the assistant turn they belong to, call ids
  kept exactly; ``function_call_output`` / ``custom_tool_call_output`` become tool turns
  (output a string or a content array).
* ``reasoning``: summary text becomes :attr:`ChatMessage.reasoning`; ``encrypted_content``
  that tokenwire tagged with its upstream (:func:`.responses_render.wrap_encrypted`)
  becomes a ``reasoning_encrypted`` pair, which only that upstream gets back; untagged state
  (another client's) is dropped and counted, its readable summary kept.
* ``agent_message`` is flattened into one user message.
* Hosted tools (``web_search``, ``file_search``, ...) and their replayed call items cannot be
  served by a model behind an IR upstream: they are **dropped and counted**, not refused, so
  Codex (which declares ``web_search`` by default) still works through any upstream. A
  Responses upstream that gets the client's bytes untouched still sees them.

``raw_body`` is the client's exact bytes when nothing at all was removed or rewritten (no
internal field, control item, ``previous_response_id``, tagged reasoning, ``agent_message``
or collaboration marker): a Responses upstream serving the model under the client's name
then receives them byte-identical (seed: "forwarded as the same object").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from tokenwire.errors import PreviousResponseNotFound
from tokenwire.gateway.affinity import affinity_hints
from tokenwire.gateway.apis.limits import (
    MAX_OPENAI_TOOLS,
    RESPONSES_SERVICE_TIERS,
    check_openai_attribution,
    check_openai_metadata,
    check_openai_service_tier,
    check_openai_tool_name,
    check_prompt_cache_key,
    check_tool_count,
)
from tokenwire.gateway.apis.params import (
    MAX_MAX_TOKENS,
    bad_request,
    json_type,
    optional_bool,
    parse_logprobs,
    parse_sampling,
)
from tokenwire.gateway.apis.response_format import parse_text_format
from tokenwire.gateway.apis.responses_hygiene import (
    COLLABORATION_NAMESPACE,
    COLLABORATION_TOOLS,
    flatten_agent_message,
    remove_control_items,
    strip_collaboration_marker,
    strip_internal_fields,
)
from tokenwire.gateway.apis.responses_render import unwrap_encrypted
from tokenwire.gateway.ir import (
    ChatMessage,
    ChatPrompt,
    ContentPart,
    GenerationRequest,
    ImagePart,
    MessageToolCall,
    TextPart,
    ToolSpec,
)
from tokenwire.gateway.request_fields import extensions_of, refuse_unsupported
from tokenwire.gateway.state.response_store import ResponseNotStored, ResponseStore, StoredResponse

__all__ = [
    "HOSTED_ITEMS",
    "HOSTED_TOOLS",
    "MAX_RESPONSE_ID_CHARS",
    "ResponsesCall",
    "load_previous",
    "parse_responses_request",
    "previous_response_not_found",
]

#: The longest ``previous_response_id`` looked up. Ours are ``resp_`` + 32 hex (37), OpenAI's
#: about 55; a longer one names no response, and is refused before it becomes a store key
#: or is repeated back in an error message.
MAX_RESPONSE_ID_CHARS = 256

#: Tools the provider runs itself: no IR upstream can, so they are dropped and counted.
#: ``tool_search`` is Codex's deferred-tool lookup (sent for models it knows, even with
#: ``execution: "client"``); it only works against OpenAI's own tool-search protocol.
HOSTED_TOOLS = frozenset({
    "web_search", "web_search_preview", "web_search_preview_2025_03_11", "file_search",
    "code_interpreter", "image_generation", "computer_use_preview", "computer_use", "mcp",
    "local_shell", "tool_search",
})
#: Replayed items of those tools: the model behind an IR upstream never made them.
HOSTED_ITEMS = frozenset({
    "web_search_call", "file_search_call", "code_interpreter_call", "image_generation_call",
    "computer_call", "computer_call_output", "mcp_call", "mcp_list_tools",
    "mcp_approval_request", "mcp_approval_response", "local_shell_call",
    "local_shell_call_output", "tool_search_call", "tool_search_output",
})
_MESSAGE_ROLES = frozenset({"user", "system", "developer", "assistant"})
_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "summary_text"})
_CALLS = {"function_call": "function", "custom_tool_call": "custom"}
_OUTPUTS = frozenset({"function_call_output", "custom_tool_call_output"})


class ResponsesCall:
    """A parsed Responses body: the IR request plus how to answer and store it.

    ``input_items`` is the conversation this request sends (stored conversation first, then
    the cleaned new items, instructions excluded): what a stored response keeps as its input.
    ``dropped`` counts what translation removed (``control_items``, ``hosted_tools``,
    ``hosted_items``, ``reasoning_state``), never its content. ``collaboration_tools`` names
    the collaboration tools the client declared (for
    :func:`.responses_hygiene.collaboration_call_fields`).
    """

    __slots__ = ("body", "collaboration_tools", "dropped", "input_items", "instructions",
                 "model", "previous_response_id", "prompt_cache_key", "raw_body",
                 "reasoning_summary", "request", "service_tier", "store", "stream")

    def __init__(self, **fields: Any) -> None:
        for name in self.__slots__:
            setattr(self, name, fields[name])

    request: GenerationRequest
    body: dict[str, Any]
    model: str | None
    stream: bool
    store: bool
    reasoning_summary: str | None
    previous_response_id: str | None
    service_tier: str | None
    prompt_cache_key: str | None
    instructions: str | None
    input_items: list[Any]
    dropped: dict[str, int]
    collaboration_tools: frozenset[str]
    raw_body: bytes | None


def previous_response_not_found(response_id: str) -> PreviousResponseNotFound:
    """OpenAI's exact 400 for an unknown or expired ``previous_response_id``."""
    return PreviousResponseNotFound(f"Previous response with id '{response_id}' not found.",
                                    status_hint=400, param="previous_response_id")


async def load_previous(body: Any, store: ResponseStore | None) -> StoredResponse | None:
    """The stored response ``body``'s ``previous_response_id`` names (None when it names
    none; a malformed one is left to :func:`parse_responses_request`). Raises
    ``PreviousResponseNotFound`` (unknown, expired, never stored or too large to store) or
    ``StoreUnavailable`` (the store cannot be read now: never a guess at the conversation)."""
    previous = body.get("previous_response_id") if isinstance(body, dict) else None
    if not isinstance(previous, str) or not previous:
        return None
    if len(previous) > MAX_RESPONSE_ID_CHARS:
        raise bad_request(f"previous_response_id is {len(previous)} characters long; a "
                          f"response id has at most {MAX_RESPONSE_ID_CHARS}",
                          param="previous_response_id", code="string_above_max_length")
    if store is None:
        raise previous_response_not_found(previous)
    try:
        stored = await store.get(previous)
    except ResponseNotStored as exc:
        raise PreviousResponseNotFound(str(exc), status_hint=400,
                                       param="previous_response_id") from None
    if stored is None:
        raise previous_response_not_found(previous)
    return stored


def parse_responses_request(
    body: Any, *, headers: Mapping[str, str], previous: StoredResponse | None = None,
    raw: bytes | None = None, request_id: str = "",
) -> ResponsesCall:
    """Parse ``body`` (the decoded JSON of ``raw``); ``previous`` is what
    :func:`load_previous` read for it. Raises ``RemoteProtocolError`` (400),
    ``CompactionRefused`` or ``PreviousResponseNotFound``."""
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {json_type(body)}",
                          code="invalid_type")
    body, removed = strip_internal_fields(body)
    model = _opt_str(body, "model")
    items, n_control = remove_control_items(_input_items(body.get("input")))
    previous_id = _opt_str(body, "previous_response_id")
    history: list[Any] = []
    if previous_id is not None:
        if previous is None or previous.id != previous_id:
            raise previous_response_not_found(previous_id)
        history = previous.conversation()
    conv = _Conversation()  # each item with where it came from, for errors
    for item, path in [*((h, "previous_response_id") for h in history),
                       *((it, f"input[{i}]") for i, it in enumerate(items))]:
        conv.add(item, path)
    messages = conv.finish()
    instructions = _opt_str(body, "instructions")
    if instructions:
        messages.insert(0, ChatMessage(role="system", content=instructions))
    if not messages:
        raise bad_request("input is empty: send at least one message", param="input",
                          code="empty_array")
    tools = _Tools(body.get("tools"))
    check_openai_metadata(body.get("metadata"))  # forwarded as hints: bounded here
    check_openai_attribution(body)
    check_prompt_cache_key(body)  # before affinity_hints reads it
    check_openai_service_tier(body, RESPONSES_SERVICE_TIERS)
    reasoning = body.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, dict):
        raise bad_request(f"reasoning must be an object, got {json_type(reasoning)}",
                          param="reasoning", code="invalid_type")
    reasoning = reasoning or {}
    rewritten = (removed or n_control or previous_id is not None or conv.rewritten
                 or tools.rewritten)
    raw_body = raw if raw is not None and not rewritten else None
    sampling = parse_sampling({k: body.get(k) for k in ("temperature", "top_p")},
                              default_max_tokens=None)
    refuse_unsupported("responses", body)  # fields no upstream can take here
    logprobs, top_logprobs = _logprobs(body)
    request = GenerationRequest(
        prompt=ChatPrompt(messages=tuple(messages)), model=model or "",
        max_tokens=_max_output_tokens(body.get("max_output_tokens")),
        temperature=sampling.temperature, top_p=sampling.top_p, request_id=request_id,
        tools=_allowed_tools(body.get("tool_choice"), tools.specs),
        tool_choice=_tool_choice(body.get("tool_choice")),
        parallel_tool_calls=optional_bool(body, "parallel_tool_calls"),
        response_format=parse_text_format(body.get("text")),
        reasoning_effort=_opt_str(reasoning, "effort"),
        service_tier=_opt_str(body, "service_tier"),
        logprobs=logprobs, top_logprobs=top_logprobs, api="responses",
        extensions=extensions_of("responses", body),
        passthrough_body=raw_body, affinity=affinity_hints(body, headers))
    store_flag = optional_bool(body, "store")
    return ResponsesCall(
        request=request, body=body, model=model, stream=bool(optional_bool(body, "stream")),
        store=True if store_flag is None else store_flag,
        reasoning_summary=_opt_str(reasoning, "summary"), previous_response_id=previous_id,
        service_tier=_opt_str(body, "service_tier"),
        prompt_cache_key=_opt_str(body, "prompt_cache_key"), instructions=instructions,
        input_items=[*history, *items],
        dropped={"control_items": n_control, "hosted_tools": tools.hosted,
                 "hosted_items": conv.hosted, "reasoning_state": conv.untagged},
        collaboration_tools=tools.collaboration, raw_body=raw_body)


# -- scalar fields ------------------------------------------------------------------------

#: The ``include`` value that asks for the answer's log probabilities.
LOGPROBS_INCLUDE = "message.output_text.logprobs"


def _logprobs(body: Mapping[str, Any]) -> tuple[bool, int | None]:
    """``include`` with :data:`LOGPROBS_INCLUDE` asks for logprobs; ``top_logprobs`` (0..20)
    for alternatives, which OpenAI returns only with that include (so it implies it)."""
    include = body.get("include")
    if include is not None and (not isinstance(include, list)
                                or not all(isinstance(v, str) for v in include)):
        raise bad_request("include must be an array of strings", param="include",
                          code="invalid_type")
    top = parse_logprobs({"logprobs": True, "top_logprobs": body.get("top_logprobs")},
                         chat=True)[1]
    return LOGPROBS_INCLUDE in (include or ()) or top is not None, top



def _opt_str(body: Mapping[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise bad_request(f"{key} must be a string, got {json_type(value)}", param=key,
                          code="invalid_type")
    return value


def _max_output_tokens(value: Any) -> int | None:
    """The client's bound, or None: the API documents no default (``gateway/defaults.py``)."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise bad_request(f"max_output_tokens must be an integer, got {json_type(value)}",
                          param="max_output_tokens", code="invalid_type")
    if not 1 <= value <= MAX_MAX_TOKENS:
        raise bad_request(f"max_output_tokens must be an integer between 1 and "
                          f"{MAX_MAX_TOKENS}, got {value!r}", param="max_output_tokens",
                          code="integer_below_min_value" if value < 1
                          else "integer_above_max_value")
    return value


def _input_items(value: Any) -> list[Any]:
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if isinstance(value, list):
        return value
    if value is None:
        raise bad_request("input is required", param="input", code="missing_required_parameter")
    raise bad_request(f"input must be a string or an array of items, got {json_type(value)}",
                      param="input", code="invalid_type")


# -- items -> messages --------------------------------------------------------------------


class _Conversation:
    """Items in order -> chat messages; an assistant turn gathers its reasoning, text and
    calls until a non-assistant item arrives."""

    def __init__(self) -> None:
        self.messages: list[ChatMessage] = []
        self.rewritten = False  # an agent_message or tagged reasoning was turned into IR
        self.hosted = 0
        self.untagged = 0
        self._text: list[str] = []
        self._calls: list[MessageToolCall] = []
        self._reasoning: list[str] = []
        self._encrypted: list[tuple[str, str]] = []

    def add(self, item: Any, path: str) -> None:
        """Add one item; ``path`` is where it came from (``input[3]``), for errors."""
        if not isinstance(item, dict):
            raise bad_request(f"{path} must be an object, got {json_type(item)}", param=path,
                              code="invalid_type")
        if item.get("type") is not None and _type_of(item) is None:
            raise bad_request(f"{path}.type must be a string", param=f"{path}.type",
                              code="invalid_type")
        kind = _type_of(item) or ("message" if "role" in item else None)
        if kind == "message" and item.get("role") == "assistant":
            self._text.append(_text_of(item.get("content"), "assistant message", path))
        elif kind in _CALLS:
            self._calls.append(_call(item, _CALLS[kind], path))
        elif kind == "reasoning":
            self._add_reasoning(item, path)
        elif kind in HOSTED_ITEMS:
            self.hosted += 1
        else:
            self._flush()
            self._add_other(kind, item, path)

    def _add_other(self, kind: Any, item: dict[str, Any], path: str) -> None:
        if kind == "message":
            self.messages.append(_message(item, path))
        elif kind in _OUTPUTS:
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise bad_request(f"{kind} needs a call_id string", param=f"{path}.call_id",
                                  code="missing_required_parameter")
            self.messages.append(ChatMessage(role="tool", tool_call_id=call_id,
                                             content=_output(item.get("output"), path)))
        elif kind == "agent_message":
            self.rewritten = True
            text = flatten_agent_message(item)
            if text is not None:
                self.messages.append(ChatMessage(role="user", content=text))
        elif kind == "item_reference":
            raise bad_request("item_reference input items are not supported; send the item "
                              "itself, or continue with previous_response_id",
                              param=f"{path}.type", code="unsupported_value")
        else:
            raise bad_request(f"input item type {kind!r} is not supported",
                              param=f"{path}.type", code="unsupported_value")

    def _add_reasoning(self, item: dict[str, Any], path: str) -> None:
        texts: list[str] = []
        for key in ("summary", "content"):
            parts = item.get(key)
            if parts is not None and not isinstance(parts, list):
                raise bad_request(f"reasoning {key} must be an array of parts",
                                  param=f"{path}.{key}", code="invalid_type")
            texts += [p["text"] for p in parts or ()
                      if isinstance(p, dict) and isinstance(p.get("text"), str)]
        if texts:
            self._reasoning.append("\n\n".join(texts))
        value = item.get("encrypted_content")
        if value is None:
            return
        pair = unwrap_encrypted(value) if isinstance(value, str) else None
        if pair is None:  # untagged: we cannot know which upstream could decrypt it
            self.untagged += 1
            return
        # The IR blob is the reasoning item the upstream adapter replays as is.
        self.rewritten = True
        item_blob = {"type": "reasoning", "summary": item.get("summary") or [],
                     "encrypted_content": pair[1]}
        self._encrypted.append((pair[0], msgspec.json.encode(item_blob).decode()))

    def _flush(self) -> None:
        text = "".join(self._text)
        if text or self._calls or self._encrypted:
            self.messages.append(ChatMessage(
                role="assistant", content=text, tool_calls=tuple(self._calls),
                reasoning="\n\n".join(self._reasoning) or None,
                reasoning_encrypted=tuple(self._encrypted)))
        self._text, self._calls, self._reasoning, self._encrypted = [], [], [], []

    def finish(self) -> list[ChatMessage]:
        self._flush()
        return self.messages


def _call(item: dict[str, Any], kind: str, path: str) -> MessageToolCall:
    call_id, name = item.get("call_id"), item.get("name")
    field = "input" if kind == "custom" else "arguments"
    args = item.get(field, "")
    if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
        raise bad_request(f"{item.get('type')} needs call_id and name strings", param=path,
                          code="missing_required_parameter")
    if not isinstance(args, str):
        raise bad_request(f"{item.get('type')}.{field} must be a string",
                          param=f"{path}.{field}", code="invalid_type")
    return MessageToolCall(id=call_id, name=name, arguments=args, kind=kind)


def _type_of(obj: Any) -> str | None:
    """An object's ``type`` when it is a string: client JSON may put anything there, and an
    unhashable value must be a 400, not a crash in a set lookup."""
    kind = obj.get("type") if isinstance(obj, dict) else None
    return kind if isinstance(kind, str) else None


def _message(item: dict[str, Any], path: str) -> ChatMessage:
    role = item.get("role")
    if not isinstance(role, str) or role not in _MESSAGE_ROLES:
        raise bad_request(f"message role {role!r} is not one of "
                          + ", ".join(sorted(_MESSAGE_ROLES)), param=f"{path}.role")
    return ChatMessage(role=role, content=_content(item.get("content"), f"{role} message",
                                                   f"{path}.content"))


def _text_of(content: Any, where: str, path: str) -> str:
    parsed = _content(content, where, f"{path}.content")
    if isinstance(parsed, str):
        return parsed
    image = next((p for p in parsed if isinstance(p, ImagePart)), None)
    if image is not None:
        raise bad_request(f"the {where} cannot hold images", param=image.param,
                          code="unsupported_value")
    return "".join(p.text for p in parsed if isinstance(p, TextPart))


def _output(output: Any, path: str) -> str | tuple[ContentPart, ...]:
    if output is None:
        return ""
    return _content(output, "tool output", f"{path}.output")


def _content(content: Any, where: str, path: str) -> str | tuple[ContentPart, ...]:
    """A string, or parts; all-text parts collapse to one string. ``where`` says what holds
    the content (for messages), ``path`` where it is in the request (for ``param``)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where} content must be a string or an array of parts",
                          param=path, code="invalid_type")
    parts = tuple(_part(p, where, f"{path}[{j}]") for j, p in enumerate(content))
    if all(isinstance(p, TextPart) for p in parts):
        return "".join(p.text for p in parts if isinstance(p, TextPart))
    return parts


def _part(part: Any, where: str, path: str) -> ContentPart:
    kind = _type_of(part)
    if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
        return TextPart(text=part["text"])
    if kind == "refusal" and isinstance(part.get("refusal"), str):
        return TextPart(text=part["refusal"])
    if kind == "input_image":
        url = part.get("image_url") or part.get("file_data")
        if isinstance(url, str) and url.startswith(("https:", "http:", "data:")):
            detail = part.get("detail")
            return ImagePart(url=url, detail=detail if isinstance(detail, str) else None,
                             param=path)
        raise bad_request("input_image needs an image_url (a URL or a data: URL); file_id "
                          "references are not supported", param=path,
                          code="unsupported_value")
    raise bad_request(f"content part type {kind!r} is not supported in the {where}",
                      param=f"{path}.type", code="unsupported_value")


# -- tools --------------------------------------------------------------------------------


class _Tools:
    """The ``tools`` array: function and custom tools (namespaces flattened), hosted tools
    counted, collaboration tools noted and their encrypted marker removed."""

    def __init__(self, raw: Any) -> None:
        self.specs: tuple[ToolSpec, ...] = ()
        self.hosted = 0
        self.rewritten = False
        self.collaboration: frozenset[str] = frozenset()
        if raw is None:
            return
        if not isinstance(raw, list):
            raise bad_request("tools must be an array", param="tools", code="invalid_type")
        check_tool_count(raw, MAX_OPENAI_TOOLS)  # early: before a huge array is walked
        specs: list[ToolSpec] = []
        collab: set[str] = set()
        for i, tool in enumerate(raw):
            for ns, inner, path in _flatten(tool, f"tools[{i}]"):
                spec = self._one(inner, ns, path)
                if spec is not None:
                    specs.append(spec)
                    if ns == COLLABORATION_NAMESPACE and spec.name in COLLABORATION_TOOLS:
                        collab.add(spec.name)
        # Counted as OpenAI counts them, hosted tools too (a namespace's members one each).
        check_tool_count(range(len(specs) + self.hosted), MAX_OPENAI_TOOLS)
        self.specs, self.collaboration = tuple(specs), frozenset(collab)

    def _one(self, tool: dict[str, Any], ns: str | None, path: str) -> ToolSpec | None:
        """One tool at ``path`` (``tools[3]``, or ``tools[3].tools[0]`` in a namespace)."""
        kind = _type_of(tool)
        if kind in HOSTED_TOOLS:
            self.hosted += 1
            return None
        if kind not in ("function", "custom"):
            raise bad_request(f"tool type {kind!r} is not supported", param=f"{path}.type",
                              code="unsupported_value")
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise bad_request(f"a {kind} tool needs a name", param=f"{path}.name",
                              code="missing_required_parameter")
        check_openai_tool_name(name, f"{path}.name")
        description = tool.get("description") or ""
        field = "format" if kind == "custom" else "parameters"
        value = tool.get(field)
        if value is not None and not isinstance(value, dict):  # (it was dropped in silence)
            raise bad_request(f"{path}.{field} must be an object, got {json_type(value)}",
                              param=f"{path}.{field}", code="invalid_type")
        if kind == "custom":
            return ToolSpec(name=name, description=str(description), kind="custom",
                            format=value)
        plain = strip_collaboration_marker(tool, ns)
        self.rewritten = self.rewritten or plain is not tool
        strict = tool.get("strict")
        return ToolSpec(name=name, description=str(description),
                        parameters=plain.get("parameters"),
                        strict=strict if isinstance(strict, bool) else None)


def _flatten(tool: Any, path: str) -> list[tuple[str | None, dict[str, Any], str]]:
    """``(namespace, tool, path)``: a ``namespace`` tool's members (``tools[3].tools[0]``),
    or the tool itself at ``path``."""
    if not isinstance(tool, dict):
        raise bad_request("each tool must be an object", param=path, code="invalid_type")
    if tool.get("type") != "namespace":
        ns = tool.get("namespace")
        return [(ns if isinstance(ns, str) else None, tool, path)]
    name, members = tool.get("name"), tool.get("tools")
    if not isinstance(name, str) or not isinstance(members, list):
        raise bad_request("a namespace tool needs a name and a tools list", param=path,
                          code="missing_required_parameter")
    check_openai_tool_name(name, f"{path}.name")  # sent on to a Responses upstream
    out: list[tuple[str | None, dict[str, Any], str]] = []
    for k, member in enumerate(members):
        if not isinstance(member, dict):
            raise bad_request("each tool must be an object", param=f"{path}.tools[{k}]",
                              code="invalid_type")
        out.append((name, member, f"{path}.tools[{k}]"))
    return out


def _allowed_tools(choice: Any, specs: tuple[ToolSpec, ...]) -> tuple[ToolSpec, ...]:
    """The tools the model is offered: ``tool_choice: {"type": "allowed_tools", "tools":
    [...]}`` keeps only those it names (hosted ones were dropped already). Only its
    ``mode`` reached the IR before, so every declared tool stayed callable: a client that
    allowed ``read_file`` alone could get a ``delete_file`` call."""
    if not isinstance(choice, dict) or choice.get("type") != "allowed_tools":
        return specs
    entries = choice.get("tools")
    if not isinstance(entries, list):
        raise bad_request("tool_choice.tools must be an array of tools", code="invalid_type",
                          param="tool_choice.tools")
    declared = {spec.name for spec in specs}
    names: set[str] = set()
    for i, entry in enumerate(entries):
        kind = _type_of(entry)
        if kind in HOSTED_TOOLS:
            continue
        name = entry.get("name") if kind in ("function", "custom") else None
        if not isinstance(name, str) or name not in declared:
            raise bad_request(f"tool_choice.tools[{i}] names no tool declared in tools",
                              param=f"tool_choice.tools[{i}]", code="invalid_value")
        names.add(name)
    return tuple(spec for spec in specs if spec.name in names)


def _tool_choice(choice: Any) -> str | dict | None:
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict):
        kind, name = choice.get("type"), choice.get("name")
        if kind in ("function", "custom") and isinstance(name, str):
            check_openai_tool_name(name, "tool_choice.name")
            return {"name": name}
        if kind == "allowed_tools" and choice.get("mode") in ("auto", "required"):
            return str(choice["mode"])
    raise bad_request(f"tool_choice {choice!r} is not supported; use auto, none, required, "
                      "or {\"type\": \"function\", \"name\": ...}", param="tool_choice")
