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
    MAX_OPEN_REPEATS,
    MAX_REPEATS,
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


@pytest.mark.parametrize("pattern", [r"^\bx$", r"^(a)\1$", "^(a*)*$"])
def test_a_pattern_that_cannot_be_enforced_is_a_400_naming_pattern(parses, pattern) -> None:
    cache = GrammarCache(parses)
    fmt = ResponseFormat(type="json_schema", param="response_format.json_schema.schema",
                         schema={"type": "string", "pattern": pattern})
    with pytest.raises(ToolRequestError) as info:
        plan_tools(GenerationRequest(prompt=PromptText(text="x"), response_format=fmt), cache)
    assert "'pattern'" in str(info.value)
    assert info.value.param == "response_format.json_schema.schema"


def _fmt(schema: dict) -> ResponseFormat:
    return ResponseFormat(type="json_schema", param="response_format.json_schema.schema",
                          schema=schema)


@pytest.mark.parametrize(("schema", "keyword"), [
    ({"type": "string", "maxLength": MAX_OPEN_REPEATS + 1}, "maxLength"),
    ({"type": "string", "minLength": 5, "maxLength": MAX_OPEN_REPEATS + 6}, "maxLength"),
    ({"type": "array", "items": {}, "maxItems": 10**9}, "maxItems"),
    ({"type": "string", "pattern": "^a{0,5000}$"}, "pattern"),
])
def test_a_count_left_more_open_than_llama_cpp_parses_is_refused_by_name(schema, keyword,
                                                                         parses) -> None:
    """Each open repetition nests once more; llama.cpp's parser refuses the grammar past
    about a thousand (so these were 400s before, after writing the grammar out)."""
    with pytest.raises(UnsupportedSchema) as info:
        normalise(schema)
    assert info.value.keyword == keyword
    bound = {**schema, "maxLength": MAX_OPEN_REPEATS} if "maxLength" in schema else None
    if bound is not None and "minLength" not in bound:  # the bound itself still parses
        assert parses(response_grammar(normalise(bound)))


@pytest.mark.parametrize("schema", [
    {"type": "string", "minLength": 10**9},  # a 200-byte request grew the server to 24 GB
    {"type": "array", "items": {"type": "integer"}, "minItems": MAX_REPEATS + 1},
    {"type": "string", "pattern": "^(a{1000}){1000}$"},  # nested: a million copies
    {"type": "object", "properties": {f"p{i}": {"type": "string", "minLength": 30_000}
                                      for i in range(4)}},
])
def test_schemas_asking_the_grammar_for_too_many_copies_are_a_400(schema) -> None:
    """Before any grammar is written: the size is counted on the schema."""
    cache = GrammarCache(lambda text: pytest.fail("a grammar was built"))
    with pytest.raises(ToolRequestError) as info:
        plan_tools(GenerationRequest(prompt=PromptText(text="x"),
                                     response_format=_fmt(schema)), cache)
    assert info.value.param == "response_format.json_schema.schema"
    assert str(MAX_REPEATS) in str(info.value)


def test_the_copies_of_every_schema_of_a_request_add_up() -> None:
    """Tools and the response format share one budget: each alone fits."""
    half = {"type": "object", "properties": {"s": {"type": "string",
                                                   "minLength": MAX_REPEATS // 2 + 1}}}
    tools = (ToolSpec(name="a", parameters=half), ToolSpec(name="b", parameters=half))
    cache = GrammarCache(lambda text: True)
    plan_tools(GenerationRequest(prompt=PromptText(text="x"), tools=tools[:1]), cache)
    with pytest.raises(ToolRequestError) as info:
        plan_tools(GenerationRequest(prompt=PromptText(text="x"), tools=tools), cache)
    assert info.value.param == "tools"


@pytest.mark.parametrize(("pattern", "copies"), [
    (r"^\d{4}-\d{2}-\d{2}$", 2 + 4 + 1 + 2 + 1 + 2), ("^[A-Z]{2}[0-9]{6}$", 2 + 2 + 6),
    (r"^(\d{1,3}\.){3}\d{1,3}$", 2 + 3 * (3 + 1) + 3),
    ("^(ab|cd){10}$", 2 + 10 * 5),  # (the bar counted too: an upper bound)
    (r"^[\]x]{3}$", 2 + 3),
])
def test_a_patterns_copies_are_counted_with_its_groups(pattern, copies) -> None:
    from tokenwire.gateway.upstreams.json_schema_grammar import _pattern_repeats

    assert _pattern_repeats(pattern, "$") == copies


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


@pytest.mark.parametrize("parameters", [
    {"type": "string"}, {"type": "integer"}, {"type": ["object", "null"]}, {"enum": [1]},
    {"type": "array", "items": {"type": "integer"}},
    {"anyOf": [{"type": "object"}, {"type": "string"}]},
    {"$defs": {"s": {"type": "string"}}, "$ref": "#/$defs/s"},
])
def test_a_function_whose_parameters_are_not_an_object_is_a_400(parses, parameters) -> None:
    """The grammar forced a call such as ``{"name": "g", "arguments": "g"}``, which no API
    can carry as a call: it came back as text, repeated until max_tokens, even under
    ``tool_choice: required``."""
    request = GenerationRequest(prompt=PromptText(text="x"), tool_choice="required", tools=(
        ToolSpec(name="ok", parameters={"type": "object"}),
        ToolSpec(name="g", parameters=parameters)))
    with pytest.raises(ToolRequestError, match='"type": "object"') as caught:
        plan_tools(request, GrammarCache(parses))
    assert caught.value.param == "tools[1]"


@pytest.mark.parametrize("parameters", [
    {}, {"properties": {"a": {"type": "string"}}}, {"enum": [{"a": 1}]},
    {"anyOf": [{"type": "object"}, {"$ref": "#/$defs/o"}],
     "$defs": {"o": {"type": "object", "properties": {"n": {"$ref": "#/$defs/o"}}}}},
])
def test_parameters_that_allow_only_objects_are_served(parses, parameters) -> None:
    request = GenerationRequest(prompt=PromptText(text="x"), tool_choice="required",
                                tools=(ToolSpec(name="g", parameters=parameters),))
    assert plan_tools(request, GrammarCache(parses)).grammar


def test_unbounded_arrays_and_strings_get_bounds_inside_the_schema(parses) -> None:
    schema = normalise({"type": "array", "items": {"type": "string"}})
    assert schema["maxItems"] == MAX_UNBOUNDED_ITEMS
    grammar = response_grammar(schema)
    assert f"char{{0,{MAX_UNBOUNDED_STRING}}}" in grammar and parses(grammar)
    assert normalise({"type": "array", "items": {}, "maxItems": 100})["maxItems"] == 100
    custom = call_grammar([ToolSpec(name="patch", kind="custom")])
    assert 'freeform-string ::= "\\"" char* "\\"" space' in custom and parses(custom)


def test_a_pattern_string_is_json_whatever_the_pattern_allows() -> None:
    """The port wrote a pattern's characters raw: ``^a.*$`` let the answer be ``"a"x"``,
    ``"a\\"`` or hold a raw control character (not JSON). Now each character is the one
    JSON spelling of it, and ``\\d`` is read as ``re`` reads it."""
    from .gbnf_oracle import GbnfOracle

    oracle = GbnfOracle()
    grammar = response_grammar(normalise({"type": "string", "pattern": '^a.*"[^x]\\d$'}))
    for text in ('"a"x"', '"a\\"', '"a\x01"', '"a\\u00"', '"a\\n\\"y1"'):
        assert not oracle.accepts(grammar, text), text  # (. is not a newline)
    for value in ('a\\"\t"y1', 'ab\x01"\u00e9\u0663'):  # \u0663: an Arabic-Indic 3
        assert oracle.accepts(grammar, json.dumps(value, ensure_ascii=False)), value
    # Two patterns, and a property whose rule name is what a set would be called.
    schema = normalise({"type": "object", "properties": {
        "p": {"type": "string", "pattern": "^.$"}, "p-set0": {"type": "integer"},
        "q": {"type": "string", "pattern": "^[^a]$"}}, "required": ["p", "p-set0", "q"]})
    assert oracle.accepts(response_grammar(schema), '{"p": "\\"", "p-set0": 1, "q": "b"}')


@pytest.mark.parametrize("value", ["back\\slash", "tab\there", "line\nbreak", '"quoted"',
                                   "a\\nb", "\u65e5\u672c", "\u2028"])
def test_an_enum_or_const_value_is_its_json_and_nothing_else(value) -> None:
    """The port left a backslash raw in the grammar, where GBNF reads it as an escape:
    ``back\\slash`` allowed ``"back\\slash"`` with one backslash (not JSON), ``tab\\there``
    a raw tab, ``a\\nb`` (a backslash, then n) a newline, and a quote made a grammar
    llama.cpp cannot parse, a 400 for a supported schema."""
    from .gbnf_oracle import GbnfOracle

    oracle = GbnfOracle()
    spelled = json.dumps(value, ensure_ascii=False)
    for schema in ({"enum": [value, "other"]}, {"const": value}):
        grammar = response_grammar(normalise(schema))
        assert oracle.accepts(grammar, spelled), schema
        if spelled != f'"{value}"':
            assert not oracle.accepts(grammar, f'"{value}"'), schema  # the value unescaped
    if value.isascii():  # a property of that name: its key is the name's JSON
        grammar = response_grammar(normalise({"type": "object", "properties": {
            value: {"type": "integer"}}, "required": [value]}))
        assert oracle.accepts(grammar, json.dumps({value: 1}))
