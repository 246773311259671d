"""Tools, tool calls and tool results in a chat prompt, for any chat template.

A template that knows tools (its source uses a ``tools`` variable, as Qwen 2.5's, Llama
3.1's and Hermes' do) gets them as Hugging Face's ``apply_chat_template`` passes them:
``tools`` in OpenAI's function shape, assistant turns with ``tool_calls`` (arguments as an
object), ``tool`` turns with ``tool_call_id``. A template that does not (SmolLM2's renders
role and content only) gets the **fallback**, the Hermes / Qwen 2.5 convention in plain
messages:

* a system message block listing each tool as its JSON function signature inside
  ``<tools></tools>``, asking for ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``
  (appended to the first system message, or a new first message);
* an assistant turn's calls as that same ``<tool_call>`` text after its content;
* a tool result as a user turn ``<tool_response>...</tool_response>``.

Caller text never becomes control tokens (:mod:`.chat_prompt`): in the fallback every piece
is message content, wrapped like any other; for a template with tools, every caller string
inside tools and call arguments is wrapped by :func:`wrap_strings` (the template's
``tojson`` keeps the markers, so the split still finds them). Sans-IO.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from tokenwire.gateway.ir import ChatMessage, MessageToolCall, ToolSpec
from tokenwire.gateway.upstreams.json_schema_grammar import CALL_CLOSE, CALL_OPEN

__all__ = ["fallback_messages", "function_json", "native_message", "template_takes_tools",
           "wrap_strings"]

_TOOLS_VARIABLE = re.compile(r"\btools\b")

_FALLBACK_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n")
_FALLBACK_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def template_takes_tools(template: str | None) -> bool:
    """True when the chat template renders a ``tools`` variable itself."""
    return bool(template) and _TOOLS_VARIABLE.search(template or "") is not None


def function_json(tool: ToolSpec) -> dict[str, Any]:
    """A tool in OpenAI's function shape (a custom tool takes one string, ``input``)."""
    params = tool.parameters if tool.parameters is not None else {
        "type": "object", "properties": {}}
    if tool.kind == "custom":
        params = {"type": "string", "description": _input_description(tool.format)}
    fn: dict[str, Any] = {"name": tool.name, "parameters": params}
    if tool.description:
        fn["description"] = tool.description
    return {"type": "function", "function": fn}


def _input_description(fmt: dict | None) -> str:
    """A custom tool's input, as the model is told it: the grammar decoding enforces
    (``upstreams/escaped_gbnf.py``) is shown, so that the model writes toward it."""
    if not fmt or fmt.get("type") != "grammar" or not isinstance(fmt.get("definition"), str):
        return "the tool's freeform input"
    return (f"the tool's input: text in this {fmt.get('syntax')} grammar (not JSON):\n"
            + fmt["definition"])


def _call_text(call: MessageToolCall) -> str:
    args: Any = call.arguments
    if call.kind != "custom":
        try:
            args = json.loads(call.arguments) if call.arguments.strip() else {}
        except ValueError:
            args = call.arguments  # what the client sent, kept rather than dropped
    body = json.dumps({"name": call.name, "arguments": args}, ensure_ascii=False)
    return f"{CALL_OPEN}\n{body}\n{CALL_CLOSE}"


def fallback_messages(messages: Sequence[ChatMessage],
                      tools: Sequence[ToolSpec]) -> list[ChatMessage]:
    """``messages`` for a template without tool support: tools in the system message,
    calls and results as text (see the module docstring)."""
    out: list[ChatMessage] = []
    for m in messages:
        if m.role == "tool":
            out.append(ChatMessage(role="user", content=(
                f"<tool_response>\n{m.text}\n</tool_response>")))
        elif m.role == "assistant" and m.tool_calls:
            text = "\n".join([*([m.text] if m.text else []), *map(_call_text, m.tool_calls)])
            out.append(ChatMessage(role="assistant", content=text))
        else:
            out.append(m)
    if not tools:
        return out
    block = _FALLBACK_HEAD + "\n".join(json.dumps(function_json(t), ensure_ascii=False)
                                       for t in tools) + _FALLBACK_TAIL
    if out and out[0].role == "system":
        first = out[0]
        out[0] = ChatMessage(role="system", content=f"{first.text}\n\n{block}"
                             if first.text else block)
    else:
        out.insert(0, ChatMessage(role="system", content=block))
    return out


def wrap_strings(value: Any, wrap: Callable[[str], str]) -> Any:
    """``value`` with every string (keys too) passed through ``wrap``."""
    if isinstance(value, str):
        return wrap(value)
    if isinstance(value, list):
        return [wrap_strings(v, wrap) for v in value]
    if isinstance(value, dict):
        return {wrap_strings(k, wrap): wrap_strings(v, wrap) for k, v in value.items()}
    return value


def native_message(m: ChatMessage, wrap: Callable[[str], str]) -> dict[str, Any]:
    """One message for a template that knows tools (Hugging Face's message shape)."""
    out: dict[str, Any] = {"role": m.role, "content": wrap(m.text)}
    if m.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function", "function": {
            "name": wrap(c.name), "arguments": wrap_strings(_arguments(c), wrap)}}
            for c in m.tool_calls]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = wrap(m.name)
    return out


def _arguments(call: MessageToolCall) -> Any:
    if call.kind == "custom":
        return {"input": call.arguments}
    try:
        return json.loads(call.arguments) if call.arguments.strip() else {}
    except ValueError:
        return call.arguments
