"""``response_format`` (Chat) and ``text.format`` (Responses) into the IR's ResponseFormat."""

from __future__ import annotations

import pytest

from tokenwire.errors import InvalidRequest
from tokenwire.gateway.apis.chat import parse_chat_request
from tokenwire.gateway.apis.responses_request import parse_responses_request
from tokenwire.gateway.ir import ResponseFormat

SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}}
MESSAGES = [{"role": "user", "content": "hi"}]


def chat(response_format) -> ResponseFormat | None:
    body = {"messages": MESSAGES, "response_format": response_format}
    return parse_chat_request(body).request.response_format


def responses(text) -> ResponseFormat | None:
    return parse_responses_request({"input": "hi", "text": text},
                                   headers={}).request.response_format


def test_both_spellings_reach_the_ir_with_the_field_they_came_from() -> None:
    assert chat({"type": "json_schema", "json_schema": {
        "name": "x", "schema": SCHEMA, "strict": True}}) == ResponseFormat(
        type="json_schema", schema=SCHEMA, name="x", strict=True,
        param="response_format.json_schema.schema")
    assert responses({"format": {"type": "json_schema", "name": "x", "schema": SCHEMA}}) == \
        ResponseFormat(type="json_schema", schema=SCHEMA, name="x",
                       param="text.format.schema")
    assert chat({"type": "json_object"}).type == "json_object"
    assert chat({"type": "text"}) is None and chat(None) is None
    assert responses({"verbosity": "low"}) is None  # what Codex sends for models it knows


@pytest.mark.parametrize(("value", "param"), [
    ({"type": "yaml"}, "response_format.type"),
    ({"type": "json_schema"}, "response_format.json_schema"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "response_format.json_schema.schema"),
    ("json", "response_format"),
])
def test_a_malformed_response_format_is_a_400_naming_the_field(value, param) -> None:
    with pytest.raises(InvalidRequest) as info:
        chat(value)
    assert info.value.param == param


def test_a_malformed_text_format_is_a_400_naming_the_field() -> None:
    with pytest.raises(InvalidRequest) as info:
        responses({"format": {"type": "json_schema", "name": "x", "schema": []}})
    assert info.value.param == "text.format.schema"
