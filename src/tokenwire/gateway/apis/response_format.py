"""Structured-output request fields -> :class:`~tokenwire.gateway.ir.ResponseFormat`.

Two spellings of one idea: Chat Completions' ``response_format`` (``{"type": "json_schema",
"json_schema": {"name", "schema", "strict"}}``) and the Responses API's ``text.format``
(``{"type": "json_schema", "name", "schema", "strict"}``, flat). ``{"type": "text"}`` means
no format. Only the shape is checked here; whether an engine can enforce the schema is the
engine's decision (the embedded engine's subset: ``upstreams/json_schema_grammar.py``).
"""

from __future__ import annotations

from typing import Any

from tokenwire.gateway.apis.params import bad_request, json_type
from tokenwire.gateway.ir import ResponseFormat

__all__ = ["parse_chat_response_format", "parse_text_format"]

_TYPES = ("text", "json_object", "json_schema")


def parse_chat_response_format(value: Any) -> ResponseFormat | None:
    """Chat Completions' ``response_format``."""
    if value is None:
        return None
    kind = _kind(value, "response_format")
    if kind != "json_schema":
        return None if kind == "text" else ResponseFormat(type=kind, param="response_format")
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise bad_request("response_format.json_schema is required with type json_schema",
                          param="response_format.json_schema",
                          code="missing_required_parameter")
    return _schema_format(spec, "response_format.json_schema")


def parse_text_format(text: Any) -> ResponseFormat | None:
    """The Responses API's ``text`` object (its ``format``; ``verbosity`` is not ours)."""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise bad_request(f"text must be an object, got {json_type(text)}", param="text",
                          code="invalid_type")
    value = text.get("format")
    if value is None:
        return None
    kind = _kind(value, "text.format")
    if kind != "json_schema":
        return None if kind == "text" else ResponseFormat(type=kind, param="text.format")
    return _schema_format(value, "text.format")


def _kind(value: Any, where: str) -> str:
    if not isinstance(value, dict):
        raise bad_request(f"{where} must be an object, got {json_type(value)}", param=where,
                          code="invalid_type")
    kind = value.get("type")
    if kind not in _TYPES:
        raise bad_request(f"{where}.type must be one of {', '.join(_TYPES)}, got {kind!r}",
                          param=f"{where}.type")
    return str(kind)


def _schema_format(spec: dict[str, Any], where: str) -> ResponseFormat:
    schema, name, strict = spec.get("schema"), spec.get("name"), spec.get("strict")
    if schema is None:
        raise bad_request(f"{where}.schema is required", param=f"{where}.schema",
                          code="missing_required_parameter")
    if not isinstance(schema, dict):
        raise bad_request(f"{where}.schema must be an object, got {json_type(schema)}",
                          param=f"{where}.schema", code="invalid_type")
    if name is not None and not isinstance(name, str):
        raise bad_request(f"{where}.name must be a string", param=f"{where}.name",
                          code="invalid_type")
    if strict is not None and not isinstance(strict, bool):
        raise bad_request(f"{where}.strict must be a boolean", param=f"{where}.strict",
                          code="invalid_type")
    return ResponseFormat(type="json_schema", schema=schema, name=name, strict=strict,
                          param=f"{where}.schema")
