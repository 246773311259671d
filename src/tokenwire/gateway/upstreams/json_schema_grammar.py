"""JSON Schemas and tool calls -> llama.cpp grammars (GBNF), for constrained decoding.

The conversion itself is llama-cpp-python's ``SchemaConverter`` (a port of llama.cpp's
``json_schema_to_grammar``). It handles a subset of JSON Schema and *ignores* what it does
not know (``minimum``, ``format: email``, ``if``/``then``...), which would let an answer
that breaks the schema through. So every schema is first walked here (:func:`normalise`):
a keyword outside :data:`SUPPORTED` (or a supported one in a combination the converter
would mishandle) raises :class:`UnsupportedSchema` naming it, which the engine answers as a
400. What passes is copied without annotations, so the converter sees only what it enforces.

Three fixes over the converter's defaults: a JSON string's characters exclude the control
characters JSON forbids raw (the port allows a raw newline inside a string, which
``json.loads`` and Pydantic reject), literals (``enum``, ``const``, property names) are
escaped for GBNF whole (the port left a backslash raw), and ``$defs`` names are prefixed
per tool, so two tools with a ``$defs/Item`` each get their own rule.

Tool calls use the Hermes / Qwen convention, the fallback prompt of :mod:`.tool_prompt`::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Sans-IO: strings in, grammar text out; the engine parses each grammar once with llama.cpp
and caches it (``upstreams/embedded_tools.py``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from llama_cpp.llama_grammar import PRIMITIVE_RULES, SPACE_RULE, BuiltinRule, SchemaConverter

from tokenwire.gateway.ir import ToolSpec
from tokenwire.gateway.upstreams.escaped_gbnf import (
    check_format,
    format_rules,
    gbnf_literal,
    node_rules,
)
from tokenwire.gateway.upstreams.grammar_ir import MAX_OPEN_REPEATS, MAX_REPEATS
from tokenwire.gateway.upstreams.regex_syntax import parse_regex

__all__ = [
    "ANNOTATIONS",
    "CALL_CLOSE",
    "CALL_OPEN",
    "MAX_CALLS",
    "MAX_OPEN_REPEATS",
    "MAX_REPEATS",
    "MAX_UNBOUNDED_ITEMS",
    "STRING_FORMATS",
    "SUPPORTED",
    "SchemaTooLarge",
    "UnsupportedSchema",
    "call_grammar",
    "check_repeats",
    "describes_objects",
    "normalise",
    "response_grammar",
]

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
#: Calls one answer may make: a tiny model can repeat a call until max_tokens; eight covers
#: every parallel-call example in OpenAI's and Anthropic's documentation.
MAX_CALLS = 8

#: Keywords that describe and never constrain: accepted and dropped.
ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "$schema", "$id", "$comment",
    "deprecated", "readOnly", "writeOnly",
})
#: Keywords the grammar enforces (see the README's "Tools and structured output").
SUPPORTED = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "prefixItems",
    "minItems", "maxItems", "enum", "const", "anyOf", "$ref", "$defs", "definitions",
    "minLength", "maxLength", "pattern", "format",
})
#: ``format`` values the converter turns into rules; any other is refused, not ignored.
STRING_FORMATS = frozenset({"date", "time", "date-time", "uuid"})
#: Items of an array whose schema sets no ``maxItems``: the grammar closes the array there.
#: A small model can repeat an item until ``max_tokens`` (SmolLM2-135M did, on a list of
#: hobbies); a bound keeps every answer both closable and valid against the schema.
MAX_UNBOUNDED_ITEMS = 16
#: Characters of a string whose schema sets no ``maxLength`` (the same reason: SmolLM2 can
#: write one string forever). A custom tool's freeform input (a patch) is not bounded.
MAX_UNBOUNDED_STRING = 128
_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
_DEFS = ("$defs", "definitions")

#: JSON's string characters: no raw control characters (RFC 8259 §7), unlike the port.
_JSON_CHAR = BuiltinRule(
    r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] '
    r'[0-9a-fA-F])', [])
_BOUNDED_STRING = BuiltinRule(rf'"\"" char{{0,{MAX_UNBOUNDED_STRING}}} "\"" space', ["char"])
_FREEFORM_STRING = r'"\"" char* "\"" space'


class UnsupportedSchema(ValueError):
    """A schema the grammar cannot enforce: ``keyword`` at ``path`` (``$.properties.a``)."""

    def __init__(self, keyword: str, path: str, why: str = "") -> None:
        super().__init__(f"JSON Schema keyword {keyword!r} at {path} is not supported by "
                         f"this engine's constrained decoding{': ' + why if why else ''}")
        self.keyword, self.path = keyword, path


class SchemaTooLarge(UnsupportedSchema):
    """One request's schemas ask the grammar for more than :data:`MAX_REPEATS` copies."""

    def __init__(self, copies: int) -> None:
        ValueError.__init__(self, f"the schemas' lengths, item counts and pattern counts add "
                            f"up to {copies} repetitions, each written out in the grammar: "
                            f"at most {MAX_REPEATS} are supported by this engine's "
                            "constrained decoding")
        self.keyword, self.path = "maxLength", "$"


# -- the supported subset ----------------------------------------------------------------


def normalise(schema: Any, path: str = "$") -> dict[str, Any]:
    """A copy of ``schema`` holding only enforced keywords; raises :class:`UnsupportedSchema`
    for anything the grammar would not enforce."""
    if not isinstance(schema, dict):
        raise UnsupportedSchema("type", path, "a schema must be an object (boolean schemas "
                                "are not supported)")
    out = _node(schema, path)
    _check_refs(out, out)
    return out


def describes_objects(schema: dict[str, Any]) -> bool:
    """Every value ``schema`` (:func:`normalise`-d) allows is a JSON object: what a function's
    parameters must be, since a call's ``arguments`` is an object in every API."""
    return _objects_only(schema, schema, frozenset())


def _objects_only(node: dict[str, Any], root: dict[str, Any], seen: frozenset[str]) -> bool:
    ref = node.get("$ref")
    if isinstance(ref, str):
        if ref in seen:
            return True  # a cycle adds no other kind of value
        target: Any = root
        for part in ref[2:].split("/"):  # resolvable: normalise checked
            target = target[part]
        return _objects_only(target, root, seen | {ref})
    if "anyOf" in node:
        return all(_objects_only(s, root, seen) for s in node["anyOf"])
    if "const" in node or "enum" in node:
        return all(isinstance(v, dict) for v in node.get("enum", [node.get("const")]))
    kind = node.get("type")
    return kind == "object" or (kind is None and ("properties" in node
                                                  or "additionalProperties" in node))


def _node(schema: dict[str, Any], path: str) -> dict[str, Any]:
    for key in schema:
        if key not in ANNOTATIONS and key not in SUPPORTED:
            raise UnsupportedSchema(key, path)
    out = {k: v for k, v in schema.items() if k in SUPPORTED}
    _check_combinations(out, path)
    for key in ("properties", *_DEFS):
        if key in out:
            if not isinstance(out[key], dict):
                raise UnsupportedSchema(key, path, "must be an object of schemas")
            out[key] = {n: _child(s, f"{path}.{key}.{n}") for n, s in out[key].items()}
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = _child(out["additionalProperties"],
                                             f"{path}.additionalProperties")
    for key in ("anyOf", "prefixItems"):
        if key in out:
            if not isinstance(out[key], list) or not out[key]:
                raise UnsupportedSchema(key, path, "must be a non-empty array of schemas")
            out[key] = [_child(s, f"{path}.{key}[{i}]") for i, s in enumerate(out[key])]
    items = out.get("items")
    if isinstance(items, dict):
        out["items"] = _child(items, f"{path}.items")
        out.setdefault("maxItems", max(MAX_UNBOUNDED_ITEMS, out.get("minItems", 0)))
    elif isinstance(items, list):
        out["items"] = [_child(s, f"{path}.items[{i}]") for i, s in enumerate(items)]
    return out


def _child(schema: Any, path: str) -> dict[str, Any]:
    if not isinstance(schema, dict):
        raise UnsupportedSchema("type", path, "a schema must be an object (boolean schemas "
                                "are not supported)")
    return _node(schema, path)


def _structural(node: dict[str, Any]) -> set[str]:
    return set(node) - {*_DEFS}


def _check_combinations(node: dict[str, Any], path: str) -> None:
    """Combinations the converter would silently get wrong (one keyword wins, the others
    are dropped) are refused, naming the keyword that would be lost."""
    keys = _structural(node)
    for lead, allowed in (("$ref", set()), ("anyOf", set()), ("const", {"type"}),
                          ("enum", {"type"})):
        if lead in keys:
            extra = sorted(keys - {lead} - allowed)
            if extra:
                raise UnsupportedSchema(extra[0], path, f"beside {lead!r}")
    kind = node.get("type")
    if isinstance(kind, list):
        if not kind or any(t not in _TYPES for t in kind):
            raise UnsupportedSchema("type", path, f"unknown type in {kind!r}")
        extra = sorted(keys - {"type"})
        if extra:
            raise UnsupportedSchema(extra[0], path, "beside a list of types")
    elif kind is not None and kind not in _TYPES:
        raise UnsupportedSchema("type", path, f"unknown type {kind!r}")
    _check_strings(node, keys, path)
    _check_arrays(node, keys, path)
    _check_objects(node, path)
    ref = node.get("$ref")
    if ref is not None and not (isinstance(ref, str) and ref.startswith("#/")):
        raise UnsupportedSchema("$ref", path, "only local references (#/...) are supported")


def _check_strings(node: dict[str, Any], keys: set[str], path: str) -> None:
    lengths = keys & {"minLength", "maxLength"}
    if "pattern" in keys:
        pattern = node["pattern"]
        if lengths or "format" in keys:
            raise UnsupportedSchema(sorted(lengths or {"format"})[0], path, "beside 'pattern'")
        if not isinstance(pattern, str) or not pattern.startswith("^") \
                or not pattern.endswith("$") or "(?" in pattern:
            raise UnsupportedSchema("pattern", path, "a pattern must be anchored (^...$) and "
                                    "use no lookaround or (?...) groups")
    if "format" in keys:
        if node["format"] not in STRING_FORMATS:
            raise UnsupportedSchema("format", path, f"format {node['format']!r} (supported: "
                                    + ", ".join(sorted(STRING_FORMATS)) + ")")
        if lengths:
            raise UnsupportedSchema(sorted(lengths)[0], path, "beside 'format'")
    if lengths and node.get("type") != "string":
        raise UnsupportedSchema(sorted(lengths)[0], path, "needs type 'string'")
    for key in lengths:
        if not isinstance(node[key], int) or isinstance(node[key], bool) or node[key] < 0:
            raise UnsupportedSchema(key, path, "must be a non-negative integer")
    _check_open(node, "minLength", "maxLength", path)
    if "pattern" in keys:
        _pattern_repeats(node["pattern"], path)  # (raises for a count left too open)


def _check_arrays(node: dict[str, Any], keys: set[str], path: str) -> None:
    prefix, items = node.get("prefixItems"), node.get("items")
    if prefix is not None and items is not None:
        raise UnsupportedSchema("items", path, "beside 'prefixItems'")
    if items is not None and not isinstance(items, dict | list):
        raise UnsupportedSchema("items", path, "must be a schema")
    for key in keys & {"minItems", "maxItems"}:
        value = node[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise UnsupportedSchema(key, path, "must be a non-negative integer")
        if items is None and prefix is None:
            raise UnsupportedSchema(key, path, "needs 'items'")
    _check_open(node, "minItems", "maxItems", path)
    fixed = prefix if prefix is not None else items if isinstance(items, list) else None
    if fixed is not None:  # a tuple has exactly len(fixed) items: the bounds must allow it
        if node.get("minItems", 0) > len(fixed) or node.get("maxItems", len(fixed)) < len(fixed):
            raise UnsupportedSchema("minItems" if node.get("minItems", 0) > len(fixed)
                                    else "maxItems", path, "a tuple's length is fixed")


def _check_open(node: dict[str, Any], low: str, high: str, path: str) -> None:
    if high in node and node[high] - node.get(low, 0) > MAX_OPEN_REPEATS:
        raise UnsupportedSchema(high, path, f"at most {MAX_OPEN_REPEATS} above {low!r} (each "
                                "optional repetition nests once more in the grammar)")


def check_repeats(schemas: Sequence[dict[str, Any] | None], grammars: int = 0) -> None:
    """Raise :class:`UnsupportedSchema` when ``schemas`` (one request's, :func:`normalise`-d)
    ask the grammar for more than :data:`MAX_REPEATS` copies in all (a ``$defs`` entry counts
    once: the converter writes one rule per definition), with ``grammars`` copies that the
    request's custom tool grammars write (:class:`.CheckedGrammar`)."""
    total = grammars + sum(_copies(schema) for schema in schemas if schema is not None)
    if total > MAX_REPEATS:
        raise SchemaTooLarge(total)


def _copies(node: Any) -> int:
    if isinstance(node, list):
        return sum(_copies(n) for n in node)
    if not isinstance(node, dict):
        return 0
    own = max(node.get("minLength", 0), node.get("maxLength", 0),
              node.get("minItems", 0), node.get("maxItems", 0))
    if isinstance(node.get("pattern"), str):
        own += _pattern_repeats(node["pattern"], "$")
    nested = [node.get(k) for k in ("items", "prefixItems", "anyOf", "additionalProperties")]
    nested += [s for k in ("properties", *_DEFS) for s in (node.get(k) or {}).values()]
    return own + sum(_copies(n) for n in nested)


_QUANTIFIER = re.compile(r"\{(\d+)(,(\d*))?\}")


def _pattern_repeats(pattern: str, path: str) -> int:
    """The atoms the converter writes for ``pattern``, each times its quantifier's count, a
    group's content times the group's (an upper bound: alternatives add up); raises for a
    ``{m,n}`` that leaves more than :data:`MAX_OPEN_REPEATS` open."""
    groups, last, i = [0], 0, 0
    while i < len(pattern):
        char = pattern[i]
        if char == "(":
            groups.append(0)
            i += 1
            continue
        if char == ")" and len(groups) > 1:
            last = groups.pop()
            groups[-1] += last
            i += 1
            continue
        quantifier = _QUANTIFIER.match(pattern, i) if char == "{" else None
        if quantifier is not None:
            low = int(quantifier[1])
            high = low if quantifier[2] is None else int(quantifier[3] or low)
            if high - low > MAX_OPEN_REPEATS:
                raise UnsupportedSchema("pattern", path, f"{quantifier[0]} leaves more than "
                                        f"{MAX_OPEN_REPEATS} repetitions open")
            groups[-1] += last * (max(low, high) - 1)
            last *= max(low, high)
            i = quantifier.end()
            continue
        if char == "\\":
            i += 2
        elif char == "[":  # a class is one atom: up to its closing bracket
            i += 1
            while i < len(pattern) and pattern[i] != "]":
                i += 2 if pattern[i] == "\\" else 1
            i += 1
        else:
            i += 1
        last = 1
        groups[-1] += 1
    return sum(groups)


def _check_objects(node: dict[str, Any], path: str) -> None:
    required = node.get("required")
    if required is None:
        return
    props = node.get("properties") or {}
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise UnsupportedSchema("required", path, "must be an array of property names")
    missing = [r for r in required if r not in props]
    if missing:
        raise UnsupportedSchema("required", path, f"{missing[0]!r} is required but not "
                                "defined in 'properties'")


def _check_refs(node: Any, root: dict[str, Any]) -> None:
    if isinstance(node, list):
        for item in node:
            _check_refs(item, root)
        return
    if not isinstance(node, dict):
        return
    ref = node.get("$ref")
    if isinstance(ref, str):
        target: Any = root
        for part in ref[2:].split("/"):
            if not isinstance(target, dict) or part not in target:
                raise UnsupportedSchema("$ref", "$", f"{ref!r} does not resolve")
            target = target[part]
    for value in node.values():
        if isinstance(value, dict | list):
            _check_refs(value, root)


# -- grammar text ------------------------------------------------------------------------


class _Converter(SchemaConverter):
    """The port, with JSON-correct strings, ``{}`` meaning any value, prefixed ``$defs``."""

    def __init__(self) -> None:
        super().__init__(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
        self._ref_prefix = ""

    def _add_primitive(self, name: str, rule: BuiltinRule) -> str:
        fixed = {"char": _JSON_CHAR, "string": _BOUNDED_STRING}.get(name, rule)
        return super()._add_primitive(name, fixed)

    def _format_literal(self, literal: str) -> str:
        """The port escapes only a quote and line breaks: a backslash went into the grammar
        raw, where GBNF reads it as an escape. So an ``enum`` / ``const`` value holding a
        backslash allowed an answer that is not JSON (backslash, then ``s``), one holding a
        tab a raw tab, and one holding a quote a grammar llama.cpp cannot parse (a 400 for
        a supported schema). Property names go through here too."""
        return gbnf_literal(literal)

    def _generate_constant_rule(self, value: Any) -> str:
        """An ``enum`` / ``const`` value as JSON text, non-ASCII characters as themselves
        (the port's ASCII escapes are JSON too, but not what a model writes)."""
        return gbnf_literal(json.dumps(value, ensure_ascii=False))

    def visit(self, schema: dict[str, Any], name: str) -> str:
        if not schema:  # JSON Schema's "anything" (the port would allow objects only)
            return self._add_rule(name or "root", self._add_primitive(
                "value", PRIMITIVE_RULES["value"]))
        return str(super().visit(schema, name))

    def _visit_pattern(self, pattern: str, name: str) -> str:
        """A string matching ``pattern`` (anchored: :func:`normalise` checked), its text
        JSON-escaped (:mod:`.escaped_gbnf`): the port copies the pattern's characters raw,
        so ``.``, ``[^x]`` or a ``"`` in it let the answer hold a raw quote, backslash or
        control character, and so not be JSON."""
        node = parse_regex(pattern[1:-1], where="the 'pattern' after its '^'")
        body, sets = node_rules(node, name)
        for set_name, set_body in sets:
            added = self._add_rule(set_name, set_body)
            if added != set_name:  # the name was taken (a property called "set0"): renamed
                body = re.sub(rf"(?<![\w-]){re.escape(set_name)}(?![\w-])", added, body)
        return str(self._add_rule(name, f'"\\"" {body} "\\"" space'))

    def _resolve_ref(self, ref: str) -> str:
        rule = self._ref_prefix + ref.split("/")[-1]
        if rule not in self._rules and ref not in self._refs_being_resolved:
            self._refs_being_resolved.add(ref)
            rule = self.visit(self._refs[ref], rule)
            self._refs_being_resolved.remove(ref)
        return rule

    def add_schema(self, schema: dict[str, Any], name: str) -> str:
        """The rule name for ``schema`` (already :func:`normalise`-d), its refs scoped."""
        self._ref_prefix = f"{name}-def-"
        copy = json.loads(json.dumps(schema))
        if "$ref" in copy:  # the port's resolve_refs stops at a root $ref, missing $defs'
            copy = {k: v for k, v in copy.items() if k != "$ref"} | {
                "anyOf": [{"$ref": copy["$ref"]}]}
        resolved = self.resolve_refs(copy, name)
        return self.visit(resolved, name)

    def literal(self, text: str) -> str:
        return str(self._format_literal(text))

    def rule(self, name: str, body: str) -> str:
        return str(self._add_rule(name, body))

    def text(self) -> str:
        return str(self.format_grammar())


def response_grammar(schema: dict[str, Any] | None) -> str:
    """The grammar of an answer that is JSON matching ``schema`` (``None``: any object)."""
    conv = _Converter()
    answer = conv.add_schema(schema if schema is not None else {"type": "object"}, "answer")
    conv.rule("root", answer)
    return conv.text()


def _custom_input(conv: _Converter, tool: ToolSpec, i: int) -> str:
    """The rule of a custom tool's input: any JSON string, or one whose text is a sentence
    of the tool's grammar ``format`` (:mod:`.escaped_gbnf`)."""
    checked = check_format(tool.format)
    if checked is None:
        conv.add_schema({"type": "string"}, f"tool{i}-args")  # defines char
        return conv.rule("freeform-string", _FREEFORM_STRING)
    root, rules = format_rules(checked, f"tool{i}-input")
    for name, body in rules:
        conv.rule(name, body)  # (names are unique to this tool: none is renamed)
    conv.rule("space", SPACE_RULE)
    return conv.rule(f"tool{i}-args", f'"\\"" {root} "\\"" space')


def call_grammar(tools: Sequence[ToolSpec], *, parallel: bool = True, after_open: bool = False,
                 or_schema: dict[str, Any] | None = None, or_object: bool = False) -> str:
    """The grammar of an answer made of tool calls (one of ``tools`` each).

    ``after_open``: the answer already holds ``<tool_call>`` (a call the model began
    unconstrained); ``or_schema`` / ``or_object`` allow instead an answer that is JSON (a
    response format with ``tool_choice: auto``). Parameters must be :func:`normalise`-d."""
    conv = _Converter()
    names = []
    for i, tool in enumerate(tools):
        if tool.kind == "custom":  # its input travels as one JSON string
            args = _custom_input(conv, tool, i)
        else:
            args = conv.add_schema(tool.parameters or {"type": "object"}, f"tool{i}-args")
        names.append(conv.rule(f"tool{i}", (
            '"{" space ' + conv.literal('"name"') + ' space ":" space '
            + conv.literal(json.dumps(tool.name)) + ' space "," space '
            + conv.literal('"arguments"') + f' space ":" space {args} "}}" space')))
    conv.rule("call", " | ".join(names))
    body = conv.rule("call-body", '"\\n"? call "\\n"? ' + conv.literal(CALL_CLOSE))
    block = conv.rule("call-block", f"{conv.literal(CALL_OPEN)} {body}")
    more = f' ("\\n"? {block}){{0,{MAX_CALLS - 1}}}' if parallel else ""
    root = conv.rule("calls", f"{body if after_open else block}{more}")
    if or_schema is not None or or_object:
        answer = conv.add_schema(or_schema if or_schema is not None else {"type": "object"},
                                 "answer")
        root = f"{answer} | {root}"
    conv.rule("root", root)
    return conv.text()
