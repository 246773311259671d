"""The supported JSON Schema subset, and grammars llama.cpp's own parser accepts."""

from __future__ import annotations

import json
import time
from typing import Literal

import pytest
from pydantic import BaseModel

from tokenwire.gateway.ir import GenerationRequest, PromptText, ResponseFormat, ToolSpec
from tokenwire.gateway.upstreams.embedded_tools import (
    GrammarCache,
    ToolRequestError,
    plan_tools,
)
from tokenwire.gateway.upstreams.json_schema_grammar import (
    MAX_UNBOUNDED_ITEMS,
    MAX_UNBOUNDED_STRING,
    UnsupportedSchema,
    call_grammar,
    normalise,
    response_grammar,
)


class Leaf(BaseModel):
    label: Literal["a", "b"]
    score: float | None = None


class Tree(BaseModel):
    name: str
    tags: list[str]
    pair: tuple[int, str]
    leaves: list[Leaf]
    child: Tree | None = None


@pytest.fixture(scope="module")
def parses():
    """llama.cpp's grammar parser over the SmolLM2 vocabulary (vocab only: no weights)."""
    import llama_cpp

    from tokenwire.gguf_tokenizer import smollm2_gguf_path

    llm = llama_cpp.Llama(model_path=str(smollm2_gguf_path()), vocab_only=True, verbose=False)

    def check(text: str) -> bool:
        sampler = llama_cpp.llama_sampler_init_grammar(llm._model.vocab, text.encode(),
                                                       b"root")
        if sampler:
            llama_cpp.llama_sampler_free(sampler)
        return bool(sampler)

    return check


def test_pydantic_schemas_convert_and_parse(parses) -> None:
    schema = normalise(Tree.model_json_schema())  # $defs, $ref recursion, anyOf, tuples
    assert "title" not in json.dumps(schema)  # annotations dropped
    assert parses(response_grammar(schema))


def test_string_characters_exclude_raw_control_characters() -> None:
    grammar = response_grammar(normalise({"type": "string"}))
    assert r'[^"\\\x7F\x00-\x1F]' in grammar


def test_defs_of_two_tools_do_not_collide(parses) -> None:
    def item(kind: str) -> dict:
        return {"type": "object", "properties": {"v": {"type": kind}}, "required": ["v"]}

    a = {"$defs": {"Item": item("integer")}, "type": "object",
         "properties": {"x": {"$ref": "#/$defs/Item"}}, "required": ["x"]}
    b = {"$defs": {"Item": item("string")}, "type": "object",
         "properties": {"y": {"$ref": "#/$defs/Item"}}, "required": ["y"]}
    text = call_grammar([ToolSpec(name="a", parameters=normalise(a)),
                         ToolSpec(name="b", parameters=normalise(b))])
    assert parses(text)
    assert "tool0-args-def-Item-v ::= integer" in text or "tool0-args-def-Item-v-kv ::= " \
        '"\\"v\\"" space ":" space integer' in text
    assert '"\\"v\\"" space ":" space string' in text


@pytest.mark.parametrize(("schema", "keyword"), [
    ({"type": "number", "minimum": 0}, "minimum"),
    ({"type": "integer", "multipleOf": 2}, "multipleOf"),
    ({"type": "string", "format": "email"}, "format"),
    ({"type": "string", "pattern": "^(?=x)$"}, "pattern"),
    ({"type": "string", "pattern": "abc"}, "pattern"),  # unanchored
    ({"type": "string", "pattern": "^a+$", "maxLength": 3}, "maxLength"),
    ({"if": {}, "then": {}}, "if"),
    ({"oneOf": [{"type": "string"}]}, "oneOf"),
    ({"allOf": [{"type": "string"}]}, "allOf"),
    ({"not": {}}, "not"),
    ({"type": "array", "uniqueItems": True, "items": {}}, "uniqueItems"),
    ({"type": "array", "minItems": 1}, "minItems"),  # without items
    ({"type": "object", "patternProperties": {}}, "patternProperties"),
    ({"type": "object", "properties": {}, "required": ["a"]}, "required"),
    ({"$ref": "#/$defs/A", "maxLength": 3}, "maxLength"),
    ({"$ref": "https://example.com/s.json"}, "$ref"),
    ({"$ref": "#/$defs/missing"}, "$ref"),
    ({"type": ["string", "null"], "maxLength": 2}, "maxLength"),
    ({"enum": ["a"], "minLength": 1}, "minLength"),
    ({"type": "object", "properties": {"a": True}}, "type"),  # boolean schema
    ({"nullable": True}, "nullable"),
])
def test_what_the_grammar_would_not_enforce_is_refused_by_name(schema, keyword) -> None:
    with pytest.raises(UnsupportedSchema) as info:
        normalise(schema)
    assert info.value.keyword == keyword


def test_a_pattern_llama_cpp_cannot_parse_is_a_400_naming_pattern(parses) -> None:
    cache = GrammarCache(parses)
    fmt = ResponseFormat(type="json_schema", param="response_format.json_schema.schema",
                         schema={"type": "string", "pattern": r"^\d+$"})
    with pytest.raises(ToolRequestError) as info:
        plan_tools(GenerationRequest(prompt=PromptText(text="x"), response_format=fmt), cache)
    assert "'pattern'" in str(info.value)
    assert info.value.param == "response_format.json_schema.schema"


def test_grammars_are_built_once_per_schema(parses) -> None:
    """Also the measurement the README quotes (build = convert + llama.cpp parse)."""
    built = []
    cache = GrammarCache(parses)

    def build() -> str:
        built.append(1)
        return response_grammar(normalise(Tree.model_json_schema()))

    start = time.perf_counter()
    first = cache.get("k", build)
    cold = time.perf_counter() - start
    assert cache.get("k", build) == first and len(built) == 1
    print(f"grammar build for Tree: {cold * 1e3:.2f} ms")


def test_tool_choice_needs_tools_and_a_declared_name(parses) -> None:
    cache = GrammarCache(parses)
    bare = GenerationRequest(prompt=PromptText(text="x"), tool_choice="required")
    with pytest.raises(ToolRequestError, match="needs tools"):
        plan_tools(bare, cache)
    named = GenerationRequest(prompt=PromptText(text="x"), tool_choice={"name": "b"},
                              tools=(ToolSpec(name="a", parameters={"type": "object"}),))
    with pytest.raises(ToolRequestError, match="not among the declared tools"):
        plan_tools(named, cache)


def test_unbounded_arrays_and_strings_get_bounds_inside_the_schema(parses) -> None:
    schema = normalise({"type": "array", "items": {"type": "string"}})
    assert schema["maxItems"] == MAX_UNBOUNDED_ITEMS
    grammar = response_grammar(schema)
    assert f"char{{0,{MAX_UNBOUNDED_STRING}}}" in grammar and parses(grammar)
    assert normalise({"type": "array", "items": {}, "maxItems": 100})["maxItems"] == 100
    custom = call_grammar([ToolSpec(name="patch", kind="custom")])
    assert 'freeform-string ::= "\\"" char* "\\"" space' in custom and parses(custom)
