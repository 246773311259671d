"""Every documented request field of every API, and what tokenwire does with it per upstream.

The rule (issue 12): a field the routed upstream cannot honour is passed through unchanged to
an upstream that takes it, or refused with a 400 naming the field; nothing is dropped
silently. This module is that rule as data, in one place:

* :data:`API_FIELDS` lists, per API, each field its reference documents (the ``openai`` and
  ``anthropic`` SDKs' ``*CreateParams`` types list them exactly; the engines' extensions
  that tokenwire parses are rows too) with its :class:`Handling`.
* :data:`IR_SUPPORT` says, for each :class:`~tokenwire.gateway.ir.GenerationRequest` field a
  ``HONOURED`` row maps to, what each upstream kind does with it and where it lands in that
  upstream's request (``wire``).

The parsers call :func:`refuse_unsupported` (fields no upstream can take here) and
:func:`extensions_of` (fields for an upstream that speaks the same API); the HTTP layer calls
:func:`refusal` once the upstream is known. ``docs/request-fields.md`` is generated from these
tables (:func:`render_markdown`) and a test keeps it current; another walks every row against
every upstream kind.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tokenwire.errors import InvalidRequest

__all__ = [
    "APIS",
    "API_FIELDS",
    "IR_SUPPORT",
    "SAME_WIRE",
    "UPSTREAM_KINDS",
    "ApiField",
    "Cell",
    "Handling",
    "Support",
    "cell_for",
    "extensions_of",
    "field",
    "ir_value_set",
    "refusal",
    "refuse_unsupported",
    "render_markdown",
]

UPSTREAM_KINDS = ("embedded", "openai", "responses", "anthropic", "codec")
APIS = ("chat", "completions", "responses", "messages", "codec")
#: The upstream kind that speaks each API's own wire: ``PASSED`` fields reach only it.
SAME_WIRE = {"chat": "openai", "completions": "openai", "responses": "responses",
             "messages": "anthropic", "codec": "codec"}


class Handling(enum.StrEnum):
    """What the gateway does with an API field, before any upstream is chosen."""

    HONOURED = "honoured"  # parsed into the IR; each upstream kind per IR_SUPPORT
    API = "api"  # the API layer itself serves it (routing, framing, the response store)
    PASSED = "passed"  # sent unchanged to an upstream of the same API; 400 for any other
    HINT = "hint"  # sent unchanged to an upstream of the same API; ignored by the others,
    #                because it changes nothing in the answer (caching, attribution, billing)
    IGNORED = "ignored"  # ignored by design, for the reason in ``note``
    REFUSED = "refused"  # 400 naming the field, unless the value is a neutral one


class Support(enum.StrEnum):
    """What one upstream kind does with one IR field."""

    HONOURED = "honoured"  # sent in the upstream's own form (``wire``), or done by us
    IGNORED = "ignored"  # nothing to change for this kind (``note`` says why)
    REFUSED = "refused"  # a 400 naming the client's field


@dataclass(frozen=True, slots=True)
class ApiField:
    """One documented request field. ``name`` is dotted for a nested field
    (``text.format``); ``example`` is a value a client may send that is not ``neutral``
    (the walking test sends it); ``neutral`` values mean "off" and are accepted by every
    upstream."""

    name: str
    handling: Handling
    ir: str = ""
    note: str = ""
    example: Any = None
    neutral: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class Cell:
    support: Support
    wire: str = ""
    note: str = ""


def field(name: str, handling: Handling, ir: str = "", note: str = "", *, example: Any = None,
          neutral: tuple[Any, ...] = ()) -> ApiField:
    return ApiField(name, handling, ir, note, example, neutral)


H, A, P, N, R = (Handling.HONOURED, Handling.API, Handling.PASSED, Handling.HINT,
                 Handling.REFUSED)
_SCHEMA = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
_CHAT_TOOL = [{"type": "function", "function": {"name": "f", "parameters": _SCHEMA}}]

#: Sampling rows shared by Chat and Completions (OpenAI's, then vLLM's / llama.cpp's).
_OPENAI_SAMPLING = (
    field("temperature", H, "temperature", example=0.5),
    field("top_p", H, "top_p", example=0.9),
    field("presence_penalty", H, "presence_penalty", example=1.5),
    field("frequency_penalty", H, "frequency_penalty", example=1.5),
    field("seed", H, "seed", example=7),
    field("stop", H, "stop", example=["\n\n"]),
    field("top_k", H, "top_k", "vLLM / llama.cpp extension", example=20),
    field("min_p", H, "min_p", "vLLM / llama.cpp extension", example=0.1),
    field("repeat_penalty", H, "repeat_penalty", "llama.cpp extension (vLLM: "
          "repetition_penalty, also accepted)", example=1.3),
    field("repetition_penalty", H, "repeat_penalty", "vLLM's name for repeat_penalty",
          example=1.3),
    field("ignore_eos", H, "ignore_eos", "vLLM extension", example=True, neutral=(False,)),
)

_CHAT = (
    field("messages", H, "prompt", example=[{"role": "user", "content": "hi"}]),
    field("model", A, note="picks the served model (404 model_not_found if unknown)"),
    field("stream", A, note="SSE or one JSON body"),
    field("stream_options", A, note="include_usage adds the usage chunk; include_obfuscation "
          "is OpenAI's padding against side channels, not sent by a local server"),
    field("stream_format", A, note="tokenwire's: json or a Codec binary format"),
    field("max_tokens", H, "max_tokens", example=8),
    field("max_completion_tokens", H, "max_tokens", "wins over max_tokens", example=8),
    *_OPENAI_SAMPLING,
    field("n", R, note="one choice per request", example=2, neutral=(1,)),
    field("tools", H, "tools", example=_CHAT_TOOL),
    field("tool_choice", H, "tool_choice", example="none"),
    field("parallel_tool_calls", H, "parallel_tool_calls", example=False),
    field("response_format", H, "response_format", example={
        "type": "json_schema", "json_schema": {"name": "o", "schema": _SCHEMA}},
        neutral=({"type": "text"},)),
    field("logprobs", H, "logprobs", example=True, neutral=(False,)),
    field("top_logprobs", H, "top_logprobs", "needs logprobs: true", example=2),
    field("reasoning_effort", H, "reasoning_effort", example="low"),
    field("logit_bias", P, note="token ids are the upstream's own", example={"42": -100}),
    field("verbosity", N, note="a length hint to OpenAI's reasoning models; other models "
          "have no such setting", example="low", neutral=("medium",)),
    field("web_search_options", P, note="OpenAI's hosted web search", example={}),
    field("moderation", P, note="OpenAI's hosted moderation", example={}),
    field("prediction", N, note="predicted output: speed only, the answer is the same",
          example={"type": "content", "content": "x"}),
    field("audio", R, note="audio output is not rendered by this gateway",
          example={"voice": "alloy", "format": "wav"}),
    field("modalities", R, note="text output only", example=["text", "audio"],
          neutral=(["text"],)),
    field("functions", R, note="deprecated; send tools", example=[
        {"name": "f", "parameters": _SCHEMA}]),
    field("function_call", R, note="deprecated; send tool_choice", example="auto"),
    field("store", N, note="OpenAI's stored completions; nothing is stored here",
          example=True, neutral=(False,)),
    field("metadata", N, note="for OpenAI's stored completions", example={"k": "v"}),
    field("service_tier", N, note="OpenAI's billing tier; a local engine has one",
          example="auto"),
    field("prompt_cache_key", N, note="a cache-routing hint", example="k"),
    field("prompt_cache_retention", N, note="a cache hint", example="24h"),
    field("prompt_cache_options", N, note="a cache hint", example={"mode": "explicit"}),
    field("safety_identifier", N, note="attribution for OpenAI's abuse checks", example="u"),
    field("user", N, note="attribution (deprecated by OpenAI)", example="u"),
)

_COMPLETIONS = (
    field("prompt", H, "prompt", "one string or one list of ids", example="Once"),
    field("model", A, note="picks the served model"),
    field("stream", A, note="SSE or one JSON body"),
    field("stream_options", A, note="include_usage adds the usage chunk"),
    field("stream_format", A, note="tokenwire's: json or a Codec binary format"),
    field("return_token_ids", A, note="vLLM's: token_ids on each choice"),
    field("max_tokens", H, "max_tokens", "default 16", example=8),
    *_OPENAI_SAMPLING,
    field("logprobs", H, "logprobs", "an integer 0..5: the top alternatives per token",
          example=2),
    field("n", R, note="one choice per request", example=2, neutral=(1,)),
    field("best_of", R, note="one candidate per request", example=2, neutral=(1,)),
    field("echo", R, note="the prompt is not echoed back", example=True, neutral=(False,)),
    field("suffix", P, note="insertion; not every engine supports it", example="end"),
    field("logit_bias", P, note="token ids are the upstream's own", example={"42": -100}),
    field("user", N, note="attribution", example="u"),
)

_RESPONSES = (
    field("input", H, "prompt", example="hi"),
    field("instructions", H, "prompt", "a system message first", example="Be brief."),
    field("model", A, note="picks the served model"),
    field("stream", A, note="SSE or one JSON body"),
    field("stream_options", A, note="include_obfuscation: padding OpenAI adds against side "
          "channels, not added here"),
    field("previous_response_id", A, note="replayed from the response store"),
    field("store", A, note="keeps the response for previous_response_id and GET"),
    field("prompt_cache_key", A, note="a cache-affinity hint (routing, and a Responses "
          "upstream)"),
    field("max_output_tokens", H, "max_tokens", example=8),
    field("temperature", H, "temperature", example=0.5),
    field("top_p", H, "top_p", example=0.9),
    field("top_logprobs", H, "top_logprobs", "with include message.output_text.logprobs",
          example=2),
    field("include", H, "logprobs", "message.output_text.logprobs asks for logprobs; "
          "reasoning.encrypted_content is kept per upstream", example=[
              "message.output_text.logprobs"], neutral=([],)),
    field("tools", H, "tools", example=[{"type": "function", "name": "f",
                                        "parameters": _SCHEMA}]),
    field("tool_choice", H, "tool_choice", example="none"),
    field("parallel_tool_calls", H, "parallel_tool_calls", example=False),
    field("reasoning", H, "reasoning_effort", "effort; summary is the API's own",
          example={"effort": "low"}),
    field("text.format", H, "response_format", example={
        "type": "json_schema", "name": "o", "schema": _SCHEMA}, neutral=({"type": "text"},)),
    field("text.verbosity", N, note="a length hint to OpenAI's reasoning models (the Codex "
          "CLI sends it); other models have no such setting", example="low",
          neutral=("medium",)),
    field("service_tier", H, "service_tier", example="flex"),
    field("truncation", P, note="auto lets the upstream drop items; here an overflow is a "
          "400", example="auto", neutral=("disabled",)),
    field("max_tool_calls", P, note="a bound on hosted tool calls", example=3),
    field("context_management", P, note="OpenAI's server-side compaction", example=[
        {"type": "compaction"}]),
    field("background", R, note="background responses are not served (stream instead)",
          example=True, neutral=(False,)),
    field("background_options", R, note="needs background", example={}),
    field("conversation", R, note="the Conversations API is not served; use "
          "previous_response_id", example="conv_1"),
    field("prompt", R, note="stored prompt templates live on OpenAI", example={"id": "p"}),
    field("access_programs", P, note="OpenAI's access programs", example={}),
    field("image", P, note="OpenAI's image options", example={}),
    field("moderation", P, note="OpenAI's hosted moderation", example={}),
    field("metadata", N, note="kept by OpenAI with the response", example={"k": "v"}),
    field("prompt_cache_retention", N, note="a cache hint", example="24h"),
    field("prompt_cache_options", N, note="a cache hint", example={"mode": "explicit"}),
    field("safety_identifier", N, note="attribution for OpenAI's abuse checks", example="u"),
    field("user", N, note="attribution (deprecated by OpenAI)", example="u"),
)

_MESSAGES = (
    field("messages", H, "prompt", example=[{"role": "user", "content": "hi"}]),
    field("system", H, "prompt", example="Be brief."),
    field("model", A, note="picks the served model"),
    field("stream", A, note="SSE or one JSON body"),
    field("max_tokens", H, "max_tokens", "required", example=8),
    field("stop_sequences", H, "stop", example=["\n\n"]),
    field("temperature", H, "temperature", "0..1", example=0.5),
    field("top_p", H, "top_p", example=0.9),
    field("top_k", H, "top_k", example=20),
    field("tools", H, "tools", example=[{"name": "f", "input_schema": _SCHEMA}]),
    field("tool_choice", H, "tool_choice", "disable_parallel_tool_use is "
          "parallel_tool_calls: false", example={"type": "none"}),
    field("thinking", H, "reasoning_effort", "budget_tokens as an effort level",
          example={"type": "enabled", "budget_tokens": 1024}),
    field("output_config.effort", H, "reasoning_effort", example="low"),
    field("output_config.format", H, "response_format", example={
        "type": "json_schema", "schema": _SCHEMA}),
    field("container", P, note="Anthropic's code-execution container", example="c"),
    field("context_management", P, note="Anthropic's server-side context editing",
          example={"edits": []}),
    field("mcp_servers", P, note="Anthropic's hosted MCP connector", example=[]),
    field("cache_control", N, note="a cache hint", example={"type": "ephemeral"}),
    field("metadata", N, note="metadata.user_id: attribution", example={"user_id": "u"}),
    field("service_tier", N, note="Anthropic's capacity tier", example="auto"),
    field("inference_geo", N, note="Anthropic's processing region", example="us"),
    field("speed", N, note="Anthropic's fast mode: speed only", example="fast",
          neutral=("standard",)),
    field("diagnostics", N, note="Anthropic's cache diagnostics", example={}),
    field("user_profile_id", N, note="attribution", example="u"),
    field("workspace_id", N, note="Anthropic workspace selection", example="w"),
)

#: Path C ``CodecRequest`` (codec-spec §1.3): five fields, all served.
_CODEC = (
    field("prompt_ids", H, "prompt", example=[1, 2]),
    field("max_tokens", H, "max_tokens", example=8),
    field("temperature", H, "temperature", example=0.5),
    field("stop", H, "stop", example=["\n\n"]),
    field("stream_format", A, note="msgpack or protobuf frames"),
)

API_FIELDS: dict[str, tuple[ApiField, ...]] = {
    "chat": _CHAT, "completions": _COMPLETIONS, "responses": _RESPONSES,
    "messages": _MESSAGES, "codec": _CODEC,
}


def _all(wire: str = "", note: str = "", **override: Cell) -> dict[str, Cell]:
    cells = {k: Cell(Support.HONOURED, wire, note) for k in UPSTREAM_KINDS}
    cells.update(override)
    return cells


def _ok(wire: str, note: str = "") -> Cell:
    return Cell(Support.HONOURED, wire, note)


def _no(note: str) -> Cell:
    return Cell(Support.REFUSED, note=note)


_NO_RESPONSES = _no("the Responses API has no such field")
_NO_ANTHROPIC = _no("the Messages API has no such field")
_CODEC_LOGPROBS = _no("Codec frames carry ids, not log probabilities")

#: IR field -> upstream kind -> what happens (a refusal names the first field set, in this
#: order: ``top_logprobs`` before ``logprobs``, so a Responses client that sent only
#: ``top_logprobs`` reads that name, not ``include``). ``wire`` is the key in the upstream's request
#: (the embedded engine: llama.cpp's sampler argument); a leading ``~`` marks a gateway-side
#: translation (the note says which).
IR_SUPPORT: dict[str, dict[str, Cell]] = {
    "prompt": _all(embedded=_ok("chat template / tokens"), openai=_ok("messages / prompt"),
                   responses=_ok("input / instructions"), anthropic=_ok("messages / system"),
                   codec=_ok("prompt_ids / messages")),
    "max_tokens": _all("max_tokens", responses=_ok("max_output_tokens")),
    "temperature": _all("temperature", embedded=_ok("temp"), anthropic=_ok(
        "temperature", "capped at Anthropic's 1.0; refused beside thinking, which fixes it")),
    "top_p": _all("top_p", anthropic=_ok("top_p", "refused beside temperature, as newer "
                                                  "Claude models do")),
    "top_k": _all("top_k", responses=_NO_RESPONSES),
    "min_p": _all("min_p", responses=_NO_RESPONSES, anthropic=_NO_ANTHROPIC),
    "presence_penalty": _all("presence_penalty", responses=_NO_RESPONSES,
                             anthropic=_NO_ANTHROPIC),
    "frequency_penalty": _all("frequency_penalty", responses=_NO_RESPONSES,
                              anthropic=_NO_ANTHROPIC),
    "repeat_penalty": _all("repeat_penalty", openai=_ok(
        "repeat_penalty", "and repetition_penalty, vLLM's name"), responses=_NO_RESPONSES,
        anthropic=_NO_ANTHROPIC, codec=_ok("repetition_penalty", "the vLLM / sglang forks' "
                                                                 "name")),
    "seed": _all("seed", responses=_NO_RESPONSES, anthropic=_NO_ANTHROPIC),
    "stop": _all("stop", responses=_ok("~stop", "applied by the gateway to the text"),
                 anthropic=_ok("stop_sequences")),
    "ignore_eos": _all("ignore_eos", responses=_NO_RESPONSES, anthropic=_NO_ANTHROPIC),
    "tools": _all("tools", embedded=_ok("chat template", "calls parsed back from the "
                                                         "answer"), anthropic=_ok(
        "tools", "parameters as input_schema")),
    "tool_choice": _all("tool_choice", embedded=_ok("chat template"), anthropic=_ok(
        "tool_choice", "required: any; a name: tool; none: none")),
    "parallel_tool_calls": _all("parallel_tool_calls", embedded=Cell(
        Support.IGNORED, note="the engine's calls are parsed as the model makes them"),
        anthropic=_ok("tool_choice.disable_parallel_tool_use")),
    "reasoning_effort": _all("reasoning_effort", embedded=Cell(
        Support.IGNORED, note="SmolLM2 does not reason: the effort has nothing to change"),
        responses=_ok("reasoning.effort"), anthropic=_ok("thinking.budget_tokens")),
    "service_tier": _all("service_tier", embedded=Cell(Support.IGNORED, note="one tier"),
                         openai=Cell(Support.IGNORED, note="a billing hint"),
                         anthropic=Cell(Support.IGNORED, note="a billing hint"),
                         codec=Cell(Support.IGNORED, note="a billing hint")),
    "response_format": _all(
        "response_format", embedded=_ok("grammar", "a llama.cpp grammar from the schema "
                                                  "(upstreams/json_schema_grammar.py)"),
        responses=_ok("text.format"), anthropic=_ok(
            "output_config.format", "json_object as a schema of type object"),
        codec=_ok("response_format", "Paths A and B (Chat's form)")),
    "top_logprobs": _all("top_logprobs", embedded=_ok("~logits", "the most likely tokens"),
                         openai=_ok("top_logprobs", "Completions: logprobs: N"),
                         anthropic=_no("the Messages API returns no log probabilities"),
                         codec=_CODEC_LOGPROBS),
    "logprobs": _all("logprobs", embedded=_ok("~logits", "log-softmax of the logits that "
                                                         "sampled each token"),
                     openai=_ok("logprobs"), responses=_ok(
                         "include", "message.output_text.logprobs"),
                     anthropic=_no("the Messages API returns no log probabilities"),
                     codec=_CODEC_LOGPROBS),
}

_DEFAULTS: dict[str, Any] = {"prompt": None, "logprobs": False, "ignore_eos": False,
                             "stop": (), "tools": ()}


def ir_value_set(request: Any, ir: str) -> bool:
    """True when ``request`` (a GenerationRequest) sets IR field ``ir`` (not its default)."""
    value = getattr(request, ir)
    return value is not None and value != _DEFAULTS.get(ir)


def cell_for(api_field: ApiField, kind: str) -> Cell | Handling:
    """What happens to ``api_field`` when the upstream is of ``kind``."""
    if api_field.handling is Handling.HONOURED:
        return IR_SUPPORT[api_field.ir][kind]
    return api_field.handling


def _value(body: Mapping[str, Any], name: str) -> tuple[bool, Any]:
    head, _, rest = name.partition(".")
    if head not in body:
        return False, None
    value = body[head]
    if not rest:
        return True, value
    return _value(value, rest) if isinstance(value, Mapping) else (False, None)


def _present(body: Mapping[str, Any], f: ApiField) -> tuple[bool, Any]:
    """(sent with a non-neutral value, the value); JSON null counts as not sent."""
    found, value = _value(body, f.name)
    return found and value is not None and value not in f.neutral, value


def _rows_by_top_name(api: str, handlings: frozenset[Handling]) -> dict[str, tuple[ApiField, ...]]:
    """``api``'s rows with one of ``handlings``, by their top-level name (built once)."""
    key = (api, handlings)
    rows = _BY_TOP_NAME.get(key)
    if rows is None:
        grouped: dict[str, list[ApiField]] = {}
        for f in API_FIELDS[api]:
            if f.handling in handlings:
                grouped.setdefault(f.name.partition(".")[0], []).append(f)
        rows = _BY_TOP_NAME[key] = {k: tuple(v) for k, v in grouped.items()}
    return rows


def _sent_rows(api: str, body: Mapping[str, Any],
               handlings: frozenset[Handling]) -> list[ApiField]:
    """The rows with one of ``handlings`` that ``body`` sends, in ``API_FIELDS`` order. Only
    the body's own keys are looked up: a request sends a handful of the table's ~40 rows,
    and walking the whole table per request was ~4 % of a short request's CPU (cProfile)."""
    rows = _rows_by_top_name(api, handlings)
    sent = [f for key in body if key in rows for f in rows[key] if _present(body, f)[0]]
    if len(sent) > 1:
        order = _ROW_ORDER[api]
        sent.sort(key=lambda f: order[f.name])
    return sent


def refuse_unsupported(api: str, body: Mapping[str, Any]) -> None:
    """Raise the 400 for the first ``REFUSED`` field ``body`` sends (a neutral value such as
    ``n: 1`` or ``echo: false`` is fine)."""
    for f in _sent_rows(api, body, _REFUSED):
        raise InvalidRequest(f"{f.name} is not supported by this server ({f.note})",
                             status_hint=400, code="unsupported_parameter", param=f.name)


def extensions_of(api: str, body: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """The ``PASSED`` and ``HINT`` fields ``body`` sends, for
    :attr:`GenerationRequest.extensions` (top-level names: a nested row is sent whole)."""
    out: dict[str, Any] = {}
    for f in _sent_rows(api, body, _EXTENSIONS):
        top = f.name.partition(".")[0]
        out[top] = body[top]
    return tuple(out.items())


_REFUSED = frozenset({Handling.REFUSED})
_EXTENSIONS = frozenset({Handling.PASSED, Handling.HINT})
_BY_TOP_NAME: dict[tuple[str, frozenset[Handling]], dict[str, tuple[ApiField, ...]]] = {}
_ROW_ORDER = {api: {f.name: i for i, f in enumerate(rows)} for api, rows in API_FIELDS.items()}


def _api_field(api: str, ir: str) -> str:
    """The client's name for IR field ``ir`` in ``api`` (the first row that maps to it)."""
    names = [f.name for f in API_FIELDS.get(api, ()) if f.ir == ir]
    if ir == "top_logprobs" and api == "completions":
        return "logprobs"
    if ir == "max_tokens" and "max_completion_tokens" in names:
        return "max_tokens"
    return names[0] if names else ir


def refusal(request: Any, kind: str) -> InvalidRequest | None:
    """The 400 for a request an upstream of ``kind`` cannot honour, naming the client's
    field, or None. ``request`` is a GenerationRequest whose ``api`` says where it came
    from."""
    for ir, cell in _refused_by(kind):
        if ir_value_set(request, ir):
            name = _api_field(request.api, ir)
            return InvalidRequest(f"{name} is not supported by this model's upstream "
                                  f"({kind}: {cell.note})", status_hint=400,
                                  code="unsupported_parameter", param=name)
    if request.extensions and SAME_WIRE.get(request.api) != kind:
        passed = {f.name.partition(".")[0] for f in API_FIELDS.get(request.api, ())
                  if f.handling is Handling.PASSED}
        name = next((k for k, _ in request.extensions if k in passed), None)
        if name is not None:
            return InvalidRequest(f"{name} is passed only to an upstream that speaks this API "
                                  f"itself; this model's upstream is {kind}", status_hint=400,
                                  code="unsupported_parameter", param=name)
    return None


def _refused_by(kind: str) -> tuple[tuple[str, Cell], ...]:
    """The IR fields an upstream of ``kind`` refuses, in ``IR_SUPPORT`` order (built once:
    :func:`refusal` runs for every request)."""
    rows = _REFUSED_BY.get(kind)
    if rows is None:
        rows = _REFUSED_BY[kind] = tuple(
            (ir, cells[kind]) for ir, cells in IR_SUPPORT.items()
            if kind in cells and cells[kind].support is Support.REFUSED)
    return rows


_REFUSED_BY: dict[str, tuple[tuple[str, Cell], ...]] = {}


# -- the user documentation (docs/request-fields.md is this, checked by a test) ------------

_KIND_TITLES = {"embedded": "embedded", "openai": "openai", "responses": "responses",
                "anthropic": "anthropic", "codec": "codec"}
_API_TITLES = {"chat": "Chat Completions (`POST /v1/chat/completions`)",
               "completions": "Completions (`POST /v1/completions`)",
               "responses": "Responses (`POST /v1/responses`)",
               "messages": "Anthropic Messages (`POST /v1/messages`)",
               "codec": "Codec Path C (`POST /v1/completions/codec`, `CodecRequest`)"}
_HANDLING_TEXT = {
    Handling.API: "served by the API layer",
    Handling.PASSED: "passed unchanged to an `{wire}` upstream; 400 for any other",
    Handling.HINT: "passed unchanged to an `{wire}` upstream; ignored by the others",
    Handling.IGNORED: "ignored",
    Handling.REFUSED: "400",
}


def _cell_text(f: ApiField, kind: str, api: str) -> str:
    got = cell_for(f, kind)
    if isinstance(got, Handling):
        if got in (Handling.PASSED, Handling.HINT):
            return "passed" if SAME_WIRE[api] == kind else (
                "400" if got is Handling.PASSED else "ignored")
        return {Handling.API: "API", Handling.IGNORED: "ignored",
                Handling.REFUSED: "400"}[got]
    if got.support is Support.HONOURED:
        if api == "messages" and kind == "anthropic":  # GenerationRequest.client_body
            return "as sent"
        return f"`{got.wire}`" if got.wire and not got.wire.startswith("~") else "yes"
    return {Support.IGNORED: "ignored", Support.REFUSED: "400"}[got.support]


def _notes(f: ApiField, api: str) -> str:
    parts = [f.note] if f.note else []
    if f.handling is Handling.HONOURED:
        for kind in UPSTREAM_KINDS:
            cell = IR_SUPPORT[f.ir][kind]
            if cell.note:
                parts.append(f"{kind}: {cell.note}")
    elif f.handling in (Handling.PASSED, Handling.HINT):
        parts.insert(0, _HANDLING_TEXT[f.handling].format(wire=SAME_WIRE[api]))
    if f.neutral:
        parts.append("accepted everywhere: " + ", ".join(
            f"`{_json(v)}`" for v in f.neutral))
    return "; ".join(parts)


def _json(value: Any) -> str:
    import json

    return json.dumps(value, separators=(", ", ": "))


def render_markdown() -> str:
    """``docs/request-fields.md``: one table per API, a column per upstream kind."""
    out = [
        "# Request fields, per API and per upstream",
        "",
        "<!-- generated from src/tokenwire/gateway/request_fields.py by "
        "`python -m tokenwire.gateway.request_fields`; tests/gateway/test_request_fields.py "
        "checks it is current -->",
        "",
        "Every field each API's reference documents, and what tokenwire does with it for each "
        "upstream kind. The rule: a field the upstream cannot honour is passed unchanged to "
        "an upstream that takes it, or refused with a 400 whose `param` names the field "
        "(code `unsupported_parameter`, in the API's own error shape). Nothing is dropped "
        "silently. A cell is where the field lands in that upstream's request "
        "(the embedded engine: llama.cpp's sampler argument), `yes` when the gateway "
        "does it itself, `passed` when it is sent unchanged, `API` when the API layer "
        "serves it (routing, framing, the response store), `ignored` when it changes "
        "nothing in the answer (the note says why), `400` when it is refused. Fields of "
        "the wire format that are not listed (a typo, a newer field) are ignored, as "
        "OpenAI and Anthropic themselves ignore unknown fields. A Messages request in "
        "front of an Anthropic upstream goes as the client wrote it (`as sent`), with the "
        "upstream's model name, `max_tokens` when the gateway lowered it, and `stream`; "
        "unless a thinking block in it has no signature, which Anthropic refuses: that "
        "request is built from the gateway's reading, as the other columns say.",
        "",
    ]
    head = "| field | " + " | ".join(_KIND_TITLES[k] for k in UPSTREAM_KINDS) + " | notes |"
    rule = "|---" * (len(UPSTREAM_KINDS) + 2) + "|"
    for api in APIS:
        out += [f"## {_API_TITLES[api]}", "", head, rule]
        for f in API_FIELDS[api]:
            cells = " | ".join(_cell_text(f, k, api) for k in UPSTREAM_KINDS)
            out.append(f"| `{f.name}` | {cells} | {_notes(f, api)} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":  # regenerate the docs page
    print(render_markdown())
