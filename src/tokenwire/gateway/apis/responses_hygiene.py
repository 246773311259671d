"""The seed's request hygiene for ``POST /v1/responses`` (its last sections, and its first).

Recent Codex builds carry internal transport state beside the conversation; the gateway
removes it once, before translation or any upstream sees the request:

* :func:`strip_internal_fields`: ``internal_chat_message_metadata_passthrough`` from every
  input item, ``encrypted_function_args`` from ``function_call`` items (their plaintext
  ``arguments`` stay), ``mcp_attribution`` from ``client_metadata`` (other keys untouched).
  Copy-on-write: when nothing is removed the very same object comes back, so the client's
  bytes can be forwarded untouched. Shapes that are not objects (``client_metadata`` null,
  an array or a string; an input item that is null, a number or an array) are not read as
  maps and are left for translation to accept or reject.
* :func:`remove_control_items`: ``configuration_update`` items are executor control, not
  model input: removed and counted (a count only, never their content). A
  ``compaction_trigger`` item refuses the request as final with :data:`COMPACTION_MESSAGE`
  (:class:`~tokenwire.errors.CompactionRefused`; a stream reports it as ``response.failed``
  with ``invalid_prompt``, a non-stream request as HTTP 400).
* :func:`flatten_agent_message`: a replayed ``agent_message`` becomes one user message whose
  text is its ``input_text`` / ``output_text`` parts joined in order; encrypted parts add
  nothing; an item without text adds no message; any other part type is a 400 before any
  upstream is called. Author and recipient are never rendered into the transcript.
* Collaboration tools (the seed's first section): :func:`strip_collaboration_marker` removes
  the encrypted JSON-Schema marker from ``parameters.properties.message`` of the
  ``collaboration`` namespace's ``spawn_agent`` / ``send_message`` / ``followup_task`` before a
  translated upstream, and :func:`collaboration_call_fields` gives the renderer the
  ``encrypted_function_args: []`` those calls' output items carry (plaintext arguments).
"""

from __future__ import annotations

from typing import Any

from tokenwire.errors import CompactionRefused
from tokenwire.gateway.apis.params import bad_request

__all__ = [
    "COLLABORATION_NAMESPACE",
    "COLLABORATION_TOOLS",
    "COMPACTION_MESSAGE",
    "ENCRYPTED_SCHEMA_MARKER",
    "collaboration_call_fields",
    "flatten_agent_message",
    "remove_control_items",
    "strip_collaboration_marker",
    "strip_internal_fields",
]

#: The seed's fixed refusal text for remote compaction (final: Codex must not retry it).
COMPACTION_MESSAGE = (
    "This gateway serves compaction inside the gateway executor; this Codex build sent "
    "remote compaction, which the gateway does not support yet.")
COLLABORATION_NAMESPACE = "collaboration"
COLLABORATION_TOOLS = frozenset({"spawn_agent", "send_message", "followup_task"})
#: The JSON-Schema key with which Codex asks its backend to encrypt an argument
#: (``with_encrypted()`` in codex-rs); a translated upstream cannot decrypt it.
ENCRYPTED_SCHEMA_MARKER = "encrypted"

_ITEM_INTERNAL = "internal_chat_message_metadata_passthrough"
_CALL_INTERNAL = "encrypted_function_args"
_METADATA_INTERNAL = "mcp_attribution"
#: Text part types an agent_message contributes; encrypted parts contribute nothing.
_AGENT_TEXT_PARTS = frozenset({"input_text", "output_text"})
_AGENT_SILENT_PARTS = frozenset({"encrypted_content", "encrypted_text"})


# -- internal fields ----------------------------------------------------------------------


def _strip_item(item: Any) -> Any:
    if not isinstance(item, dict):
        return item  # not a map: translation decides
    drop = [k for k in (_ITEM_INTERNAL,) if k in item]
    if item.get("type") == "function_call" and _CALL_INTERNAL in item:
        drop.append(_CALL_INTERNAL)
    return {k: v for k, v in item.items() if k not in drop} if drop else item


def strip_internal_fields(body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """``(body, removed)``: the body without Codex-internal fields; the same object when
    nothing was removed (``removed`` False)."""
    out = body
    items = body.get("input")
    if isinstance(items, list):
        stripped = [_strip_item(it) for it in items]
        if any(a is not b for a, b in zip(stripped, items, strict=True)):
            out = {**out, "input": stripped}
    meta = body.get("client_metadata")
    if isinstance(meta, dict) and _METADATA_INTERNAL in meta:
        out = {**out, "client_metadata": {k: v for k, v in meta.items()
                                          if k != _METADATA_INTERNAL}}
    return out, out is not body


# -- control items ------------------------------------------------------------------------


def remove_control_items(items: list[Any]) -> tuple[list[Any], int]:
    """``(items, dropped)``: ``configuration_update`` items removed and counted; raises
    :class:`CompactionRefused` for a ``compaction_trigger`` item."""
    kept: list[Any] = []
    dropped = 0
    for item in items:
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "compaction_trigger":
            raise CompactionRefused(COMPACTION_MESSAGE, status_hint=400)
        if kind == "configuration_update":
            dropped += 1
        else:
            kept.append(item)
    return kept, dropped


# -- agent_message ------------------------------------------------------------------------


def flatten_agent_message(item: dict[str, Any]) -> str | None:
    """The user-message text of a replayed ``agent_message``, or None when it has no text."""
    content = item.get("content")
    parts = [{"type": "input_text", "text": content}] if isinstance(content, str) else content
    if not isinstance(parts, list):
        raise bad_request("agent_message content must be a string or a list of parts")
    texts: list[str] = []
    for part in parts:
        kind = part.get("type") if isinstance(part, dict) else None
        kind = kind if isinstance(kind, str) else None  # unhashable JSON: a 400, not a crash
        if kind in _AGENT_TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind not in _AGENT_SILENT_PARTS:
            raise bad_request(f"agent_message part type {kind!r} is not supported; only "
                              "input_text, output_text and encrypted parts are")
    text = "".join(texts)
    return text or None


# -- collaboration tools -------------------------------------------------------------------


def _is_collaboration(name: object, namespace: object) -> bool:
    return namespace == COLLABORATION_NAMESPACE and name in COLLABORATION_TOOLS


def strip_collaboration_marker(tool: dict[str, Any], namespace: str | None) -> dict[str, Any]:
    """``tool`` without the encrypted marker on ``parameters.properties.message`` when it is
    one of the collaboration tools; the same object otherwise (copy-on-write)."""
    if not _is_collaboration(tool.get("name"), namespace or tool.get("namespace")):
        return tool
    params = tool.get("parameters")
    props = params.get("properties") if isinstance(params, dict) else None
    message = props.get("message") if isinstance(props, dict) else None
    if not isinstance(message, dict) or ENCRYPTED_SCHEMA_MARKER not in message:
        return tool
    assert isinstance(params, dict) and isinstance(props, dict)
    plain = {k: v for k, v in message.items() if k != ENCRYPTED_SCHEMA_MARKER}
    return {**tool, "parameters": {**params, "properties": {**props, "message": plain}}}


def collaboration_call_fields(name: str, collaboration_tools: frozenset[str]) -> dict[str, Any]:
    """Extra fields for a ``function_call`` output item named ``name``: the plaintext marker
    ``encrypted_function_args: []`` (and the namespace) when the client declared ``name`` as
    a collaboration tool (:attr:`ResponsesCall.collaboration_tools`); ``{}`` otherwise."""
    if name not in collaboration_tools:
        return {}
    return {"namespace": COLLABORATION_NAMESPACE, "encrypted_function_args": []}
