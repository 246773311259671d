"""IR requests -> OpenAI Chat Completions and Completions request bodies (pure functions).

Only what the request sets is sent: local servers reject or mis-handle fields they do not
know less often than they mis-handle explicit defaults. Options read here (upstream
``options``): ``max_tokens_field`` (``"max_tokens"``, or ``"max_completion_tokens"`` for
hosted reasoning models), ``developer_role`` (send ``developer`` turns as is; by default they
become ``system``, which every OpenAI-compatible server knows).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokenwire.gateway.ir import (
    ChatMessage,
    ChatPrompt,
    GenerationRequest,
    ImagePart,
    MessageToolCall,
    PromptIds,
    PromptText,
    ResponseFormat,
    TextPart,
    ToolSpec,
)

__all__ = ["chat_body", "completions_body", "message_json", "response_format_json",
           "tool_json"]

#: OpenAI's logit_bias value that bans a token outright.
_BANNED_BIAS = -100


def _common(request: GenerationRequest, model: str, opts: Mapping[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "stream": True,
                            "stream_options": {"include_usage": True}}
    if request.max_tokens is not None:
        body[str(opts.get("max_tokens_field", "max_tokens"))] = request.max_tokens
    # Sampling the client left out stays out: the upstream's own defaults (vLLM's come from
    # the model's generation_config.json, llama.cpp's from its GGUF) are better than ours.
    for key in ("temperature", "top_p", "top_k", "min_p",  # top_k / min_p: vLLM, llama.cpp
                "presence_penalty", "frequency_penalty", "repeat_penalty"):
        if (value := getattr(request, key)) is not None:
            body[key] = value
    if request.repeat_penalty is not None:  # llama.cpp's name above, vLLM's here
        body["repetition_penalty"] = request.repeat_penalty
    if request.seed is not None:
        body["seed"] = request.seed
    if request.stop:
        body["stop"] = list(request.stop)
    if request.n != 1:
        body["n"] = request.n
    if request.ignore_eos:
        body["ignore_eos"] = True  # vLLM / llama.cpp extension
    if request.banned_ids:
        # The deployment policy (codec-spec §5.5) as OpenAI's logit_bias; the ids are in the
        # model's vocabulary, which is the upstream's when the route has the right map.
        body["logit_bias"] = {str(i): _BANNED_BIAS for i in sorted(request.banned_ids)}
    if request.api in ("chat", "completions"):  # the client's own fields of this wire
        for key, value in request.extensions:
            if key == "logit_bias" and isinstance(value, dict):
                value = {**value, **body.get("logit_bias", {})}  # the policy's bans win
            body[key] = value
    return body


def completions_body(request: GenerationRequest, model: str,
                     opts: Mapping[str, Any]) -> dict[str, Any]:
    """A ``/completions`` body: a text prompt, or ids (vLLM, llama.cpp and OpenAI take a
    list of ints as one tokenized prompt)."""
    body = _common(request, model, opts)
    prompt = request.prompt
    if isinstance(prompt, PromptIds):
        body["prompt"] = list(prompt.ids)
    elif isinstance(prompt, PromptText):
        body["prompt"] = prompt.text
    else:
        raise TypeError("completions_body needs a text or ids prompt")
    if request.logprobs:  # the legacy shape: an integer, the alternatives per token
        body["logprobs"] = request.top_logprobs or 0
    return body


def chat_body(request: GenerationRequest, model: str, opts: Mapping[str, Any]) -> dict[str, Any]:
    """A ``/chat/completions`` body for a :class:`ChatPrompt` request."""
    if not isinstance(request.prompt, ChatPrompt):
        raise TypeError("chat_body needs a chat prompt")
    body = _common(request, model, opts)
    developer = bool(opts.get("developer_role", False))
    body["messages"] = [message_json(m, developer_role=developer)
                        for m in request.prompt.messages]
    if request.tools:
        body["tools"] = [tool_json(t) for t in request.tools]
        if request.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = request.parallel_tool_calls
    if request.tool_choice is not None:
        body["tool_choice"] = _tool_choice(request.tool_choice)
    if request.reasoning_effort is not None:
        body["reasoning_effort"] = request.reasoning_effort
    if request.response_format is not None:
        body["response_format"] = response_format_json(request.response_format)
    if request.logprobs:
        body["logprobs"] = True
        if request.top_logprobs is not None:
            body["top_logprobs"] = request.top_logprobs
    return body


def response_format_json(fmt: ResponseFormat) -> dict[str, Any]:
    """Chat's ``response_format`` for the IR's structured-output request."""
    if fmt.type != "json_schema":
        return {"type": fmt.type}
    spec: dict[str, Any] = {"name": fmt.name or "output", "schema": fmt.schema}
    if fmt.strict is not None:
        spec["strict"] = fmt.strict
    return {"type": "json_schema", "json_schema": spec}


def message_json(m: ChatMessage, *, developer_role: bool = False) -> dict[str, Any]:
    """One Chat Completions message. Reasoning of earlier turns is not sent back: the API
    has no field for it, and servers that render it differ on where it goes."""
    role = "system" if m.role == "developer" and not developer_role else m.role
    out: dict[str, Any] = {"role": role}
    if isinstance(m.content, str):
        out["content"] = m.content
    else:
        out["content"] = [_part(p) for p in m.content]
    if m.tool_calls:
        out["tool_calls"] = [_call(c) for c in m.tool_calls]
        if out["content"] == "":
            out["content"] = None  # OpenAI's shape for an assistant turn that only calls
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    return out


def _part(p: TextPart | ImagePart) -> dict[str, Any]:
    if isinstance(p, TextPart):
        return {"type": "text", "text": p.text}
    image: dict[str, Any] = {"url": p.url}
    if p.detail is not None:
        image["detail"] = p.detail
    return {"type": "image_url", "image_url": image}


def _call(c: MessageToolCall) -> dict[str, Any]:
    if c.kind == "custom":
        return {"id": c.id, "type": "custom", "custom": {"name": c.name, "input": c.arguments}}
    return {"id": c.id, "type": "function",
            "function": {"name": c.name, "arguments": c.arguments}}


def tool_json(t: ToolSpec) -> dict[str, Any]:
    """A ``tools`` entry: ``function`` with JSON-schema parameters, or ``custom``."""
    if t.kind == "custom":
        custom: dict[str, Any] = {"name": t.name}
        if t.description:
            custom["description"] = t.description
        if t.format is not None:
            custom["format"] = t.format
        return {"type": "custom", "custom": custom}
    fn: dict[str, Any] = {"name": t.name}
    if t.description:
        fn["description"] = t.description
    fn["parameters"] = t.parameters if t.parameters is not None else {
        "type": "object", "properties": {}}
    if t.strict is not None:
        fn["strict"] = t.strict
    return {"type": "function", "function": fn}


def _tool_choice(choice: str | dict) -> str | dict:
    if isinstance(choice, str) or "type" in choice:
        return choice
    return {"type": "function", "function": {"name": choice["name"]}}
