"""A custom tool's grammar ``format`` -> llama.cpp GBNF of its input *as a JSON string*.

A call's input travels inside the call, ``{"name": ..., "arguments": "<input>"}``
(:mod:`.json_schema_grammar`), so the model writes the input JSON-escaped: the grammar
written here accepts exactly the JSON string bodies whose decoded text is a sentence of the
tool's grammar. Each character has **one** spelling, the one ``json.dumps`` writes
(``ensure_ascii=False``), so no sentence has two encodings for the model to split its
probability between:

- ``"`` is ``\\"``, ``\\`` is ``\\\\``, newline, CR, tab, backspace and form feed are
  ``\\n \\r \\t \\b \\f``, the other control characters and DEL are ``\\u00xx`` (lower-case
  hex: DEL too, though JSON allows it raw: the schema grammars exclude it the same way);
- every other character is itself (``/`` is never ``\\/``, nothing is ``\\uXXXX``).

So a class such as ``[^a]`` becomes "any raw character but ``a``, ``"`` and ``\\``, or one
of the escapes above". The front ends (:mod:`.lark_syntax`, :mod:`.regex_syntax`) give the
language as :mod:`.grammar_ir` nodes; here it is checked and written out.

**What is enforced.** A rule's language as a context-free grammar whose terminals are the
strings their regexes match whole (what Lark's Earley parser accepts with
``lexer="dynamic_complete"``). ``%ignore``: one ignored token may follow each token of a
rule, and one may open the input (Lark allows any number; one is enough for any spacing a
grammar ignores, and a sentence without them is still a sentence).

**What is refused (a 400), before any grammar is written**: a definition longer than
:data:`MAX_DEFINITION_CHARS`; a ``~ n..m`` / ``{m,n}`` leaving more than
``MAX_OPEN_REPEATS`` open, or a grammar whose counts write out more than ``MAX_REPEATS``
copies (:mod:`.json_schema_grammar`'s bounds, shared with the request's schemas); left
recursion that is not a rule's own first symbol (``expr: expr "+" term | term`` is rewritten
as ``expr: term ("+" term)*``; llama.cpp's grammars cannot recurse on the left); ``*`` or
``+`` of something that can be empty (llama.cpp would loop on it); a ``start`` with no
finite sentence; a written grammar past :data:`MAX_GBNF_CHARS`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tokenwire.gateway.upstreams.grammar_ir import (
    ALL,
    MAX_OPEN_REPEATS,
    MAX_REPEATS,
    Alt,
    Chars,
    GrammarTooLarge,
    Node,
    Ref,
    Repeat,
    Seq,
    Text,
    UnsupportedGrammar,
    char_set,
    complement,
    refs,
)
from tokenwire.gateway.upstreams.lark_syntax import LarkGrammar, is_terminal, parse_lark
from tokenwire.gateway.upstreams.regex_syntax import parse_regex

__all__ = [
    "MAX_DEFINITION_CHARS",
    "MAX_GBNF_CHARS",
    "CheckedGrammar",
    "check_format",
    "format_rules",
    "gbnf_literal",
    "json_escape",
    "node_rules",
]

#: Characters of a grammar's ``definition``: Codex's apply_patch grammar is 700; OpenAI's
#: published examples are under 2k. A bound on the parse's work before anything else.
MAX_DEFINITION_CHARS = 64 * 1024
#: Characters of GBNF one format may write (~1 MB, the size ``MAX_REPEATS`` allows a
#: schema): a class of Unicode letters is ~10 KB, and distinct classes are each written.
MAX_GBNF_CHARS = 1_000_000
_FORMAT_SYNTAXES = ("lark", "regex")
_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t",
                  "\b": "\\b", "\f": "\\f"}
#: Characters a JSON string never holds raw here (control characters, DEL, quote, backslash).
_ESCAPED = char_set([(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0x7F, 0x7F)])
_RAW = complement(_ESCAPED)
_IGNORE = "__IGNORED"


def json_escape(text: str) -> str:
    """``text`` as the body of a JSON string, each character spelled the one way."""
    return "".join(_escape(c) for c in text)


def _escape(char: str) -> str:
    short = _SHORT_ESCAPES.get(char)
    if short is not None:
        return short
    return f"\\u{ord(char):04x}" if ord(char) < 0x20 or char == "\x7f" else char


@dataclass(frozen=True, slots=True)
class CheckedGrammar:
    """A format's rules, rewritten and checked; ``copies`` counts toward ``MAX_REPEATS``."""

    rules: Mapping[str, Node]  # "start" and every rule or terminal it reaches
    copies: int


def check_format(fmt: Any) -> CheckedGrammar | None:
    """``None`` for free text (no format, ``{"type": "text"}``); else the checked grammar.
    Raises :class:`.UnsupportedGrammar` naming what cannot be enforced."""
    if fmt is None:
        return None
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind != "grammar":
        raise UnsupportedGrammar(f"format type {kind!r}", "", "use 'text' or 'grammar'")
    syntax, definition = fmt.get("syntax"), fmt.get("definition")
    if syntax not in _FORMAT_SYNTAXES:
        raise UnsupportedGrammar(f"grammar syntax {syntax!r}", "", "use 'lark' or 'regex'")
    if not isinstance(definition, str):
        raise UnsupportedGrammar("a grammar without a 'definition' string", "")
    if len(definition) > MAX_DEFINITION_CHARS:
        raise GrammarTooLarge(f"a definition of {len(definition)} characters (at most "
                              f"{MAX_DEFINITION_CHARS})")
    return _checked(syntax, definition)


@functools.lru_cache(maxsize=64)
def _checked(syntax: str, definition: str) -> CheckedGrammar:
    """Parsed and checked once per distinct grammar (Codex sends the same one each turn)."""
    if syntax == "regex":
        body = definition[1:] if definition.startswith("^") else definition
        if body.endswith("$") and not body.endswith("\\$"):
            body = body[:-1]
        grammar = LarkGrammar(rules={"start": parse_regex(body, where="the regex")})
    else:
        grammar = parse_lark(definition)
    rules = {**grammar.terminals, **{n: _without_left_self(n, b)
                                     for n, b in grammar.rules.items()}}
    if grammar.ignore:
        rules = _with_ignored(rules, grammar.ignore)
    rules = _reachable(rules)
    nullable = _nullable(rules)
    for name, body in rules.items():
        _check_repeats_of_empty(body, nullable, name)
    _check_left_recursion(rules, nullable)
    if "start" not in _productive(rules):
        raise UnsupportedGrammar("rule start", "", "it has no finite sentence")
    copies = 0
    for name, body in rules.items():
        copies += _copies(body, name)
    if copies > MAX_REPEATS:
        raise GrammarTooLarge(f"its repetitions write out {copies} copies (at most "
                              f"{MAX_REPEATS})")
    checked = CheckedGrammar(rules=rules, copies=copies)
    format_rules(checked, "tool00-input")  # raises past MAX_GBNF_CHARS, before any build
    return checked


# -- rewrites -----------------------------------------------------------------------------


def _options(node: Node) -> tuple[Node, ...]:
    return node.options if isinstance(node, Alt) else (node,)


def _without_left_self(name: str, body: Node) -> Node:
    """``a: a x | a y | b | c`` as ``a: (b | c) (x | y)*`` (immediate left recursion)."""
    tails, heads = [], []
    for option in _options(body):
        items = option.items if isinstance(option, Seq) else (option,)
        if items and items[0] == Ref(name):
            if len(items) > 1:  # a: a | ... adds no sentence
                tails.append(Seq(items[1:]))
        else:
            heads.append(option)
    if len(tails) + len(heads) == len(_options(body)) and not tails:
        return body
    head = heads[0] if len(heads) == 1 else Alt(tuple(heads))
    if not tails:
        return head
    tail = tails[0] if len(tails) == 1 else Alt(tuple(tails))
    return Seq((head, Repeat(tail, 0, None)))


def _with_ignored(rules: dict[str, Node], ignore: list[str]) -> dict[str, Node]:
    """One optional ignored token after each token a rule uses, and before ``start``."""
    gap = Repeat(Ref(_IGNORE), 0, 1)

    def wrap(node: Node) -> Node:
        match node:
            case Ref(name) if is_terminal(name):
                return Seq((node, gap))
            case Seq(items):
                return Seq(tuple(wrap(i) for i in items))
            case Alt(items):
                return Alt(tuple(wrap(i) for i in items))
            case Repeat(item, low, high):
                return Repeat(wrap(item), low, high)
        return node

    out = {n: (b if is_terminal(n) else wrap(b)) for n, b in rules.items()}
    out[_IGNORE] = Alt(tuple(Ref(t) for t in ignore)) if len(ignore) > 1 else Ref(ignore[0])
    out["start"] = Seq((gap, out["start"]))
    return out


def _reachable(rules: dict[str, Node]) -> dict[str, Node]:
    seen, todo = {"start"}, ["start"]
    while todo:
        for ref in refs(rules[todo.pop()]):
            if ref not in seen:
                seen.add(ref)
                todo.append(ref)
    return {n: b for n, b in rules.items() if n in seen}


# -- checks -------------------------------------------------------------------------------


def _fixpoint(rules: Mapping[str, Node], holds) -> set[str]:
    """The names for which ``holds(body, names so far)`` becomes true, iterated to rest.

    A rule is looked at again only when a rule it names was just found (a worklist): sweeping
    every rule until nothing changed took one sweep per link of a chain of rules, and a
    60 KB chain of 4,000 (``r0: r1``, ``r1: r2``...) held the event loop ~6 s."""
    users: dict[str, set[str]] = {}
    for name, body in rules.items():
        for ref in refs(body):
            users.setdefault(ref, set()).add(name)
    found: set[str] = set()
    todo = list(rules)
    while todo:
        name = todo.pop()
        if name not in found and holds(rules[name], found):
            found.add(name)
            todo.extend(users.get(name, ()))
    return found


def _can_be_empty(node: Node, empty: set[str]) -> bool:
    match node:
        case Text(text):
            return not text
        case Chars():
            return False
        case Ref(name):
            return name in empty
        case Seq(items):
            return all(_can_be_empty(i, empty) for i in items)
        case Alt(items):
            return any(_can_be_empty(i, empty) for i in items)
        case Repeat(item, low, high):
            return low == 0 or high == 0 or _can_be_empty(item, empty)
    raise AssertionError(node)


def _finite(node: Node, done: set[str]) -> bool:
    match node:
        case Text() | Chars():
            return not (isinstance(node, Chars) and not node.ranges)
        case Ref(name):
            return name in done
        case Seq(items):
            return all(_finite(i, done) for i in items)
        case Alt(items):
            return any(_finite(i, done) for i in items)
        case Repeat(item, low, high):
            return low == 0 or high == 0 or _finite(item, done)
    raise AssertionError(node)


def _nullable(rules: Mapping[str, Node]) -> set[str]:
    return _fixpoint(rules, _can_be_empty)


def _productive(rules: Mapping[str, Node]) -> set[str]:
    return _fixpoint(rules, _finite)


def _check_repeats_of_empty(node: Node, nullable: set[str], name: str) -> None:
    match node:
        case Repeat(item, _, None):
            if _can_be_empty(item, nullable):
                raise UnsupportedGrammar("'*' or '+'", f"in {_label(name)}", "it repeats "
                                         "something that can be empty (write the item so "
                                         "that it cannot)")
            _check_repeats_of_empty(item, nullable, name)
        case Repeat(item, _, _):
            _check_repeats_of_empty(item, nullable, name)
        case Seq(items) | Alt(items):
            for item in items:
                _check_repeats_of_empty(item, nullable, name)


def _first_refs(node: Node, nullable: set[str]) -> list[str]:
    """The names that can come first in ``node``'s sentences."""
    match node:
        case Ref(name):
            return [name]
        case Alt(items):
            return [r for i in items for r in _first_refs(i, nullable)]
        case Repeat(item, _, high):
            return [] if high == 0 else _first_refs(item, nullable)
        case Seq(items):
            out = []
            for item in items:
                out += _first_refs(item, nullable)
                if not _can_be_empty(item, nullable):
                    break
            return out
    return []


def _check_left_recursion(rules: Mapping[str, Node], nullable: set[str]) -> None:
    graph = {n: _first_refs(b, nullable) for n, b in rules.items()}
    state: dict[str, int] = {}  # 1: on the path, 2: done
    for root in graph:
        if state.get(root):
            continue
        state[root] = 1
        stack = [(root, iter(graph[root]))]
        while stack:
            name, nexts = stack[-1]
            nxt = next(nexts, None)
            if nxt is None:
                state[name] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                raise UnsupportedGrammar(f"left recursion through {_label(nxt)}", "",
                                         "only a rule's own first symbol is rewritten "
                                         "(expr: expr \"+\" term | term)")
            elif not state.get(nxt):
                state[nxt] = 1
                stack.append((nxt, iter(graph[nxt])))


def _copies(node: Node, name: str) -> int:
    match node:
        case Seq(items) | Alt(items):
            return sum(_copies(i, name) for i in items)
        case Repeat(item, low, high):
            if high is not None and high - low > MAX_OPEN_REPEATS:
                raise GrammarTooLarge(f"a repetition in {_label(name)} leaves {high - low} "
                                      f"open (at most {MAX_OPEN_REPEATS})")
            return _copies(item, name) * max(low, high or 0, 1)
    return 1


def _label(name: str) -> str:
    if name.startswith("__ANON_"):
        return "a literal or regex"
    return f"{'terminal' if is_terminal(name) else 'rule'} {name}"


# -- writing GBNF -------------------------------------------------------------------------


def format_rules(checked: CheckedGrammar, prefix: str) -> tuple[str, list[tuple[str, str]]]:
    """``(root rule, [(name, body), ...])``: GBNF of the input JSON-escaped, every rule
    named ``prefix-...`` (unique per tool)."""
    writer = _Writer(prefix)
    out = [(writer.name(n), writer.node(b)) for n, b in checked.rules.items()]
    out += writer.sets
    if writer.size > MAX_GBNF_CHARS:
        raise GrammarTooLarge(f"its GBNF would be {writer.size} characters (at most "
                              f"{MAX_GBNF_CHARS})")
    return writer.name("start"), out


def node_rules(node: Node, prefix: str) -> tuple[str, list[tuple[str, str]]]:
    """``(body, [(name, body), ...])``: one expression (a schema's ``pattern``) as GBNF of
    its JSON-escaped text, the character sets it needs named ``prefix-set<n>``."""
    writer = _Writer(prefix)
    return writer.node(node), writer.sets


class _Writer:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.sets: list[tuple[str, str]] = []
        self._set_names: dict[Chars, str] = {}
        self.size = 0

    def name(self, rule: str) -> str:
        return f"{self.prefix}-{rule.replace('_', '-')}"

    def node(self, node: Node) -> str:
        text = self._node(node)
        self.size += len(text)
        if self.size > MAX_GBNF_CHARS:
            raise GrammarTooLarge(f"its GBNF would pass {MAX_GBNF_CHARS} characters")
        return text

    def _node(self, node: Node) -> str:
        match node:
            case Text(text):
                return gbnf_literal(json_escape(text))
            case Chars():
                return self.chars(node)
            case Ref(name):
                return self.name(name)
            case Seq(items):
                if len(items) == 1:
                    return self._node(items[0])
                return f"({' '.join(self._node(i) for i in items)})" if items else '""'
            case Alt(items):
                return f"({' | '.join(self._node(i) for i in items)})"
            case Repeat(item, low, high):
                return _repeat(self._node(item), low, high)
        raise AssertionError(node)

    def chars(self, chars: Chars) -> str:
        text = _chars(chars)
        if len(text) <= 48:
            return text
        if chars not in self._set_names:  # written once, however often used
            self._set_names[chars] = name = f"{self.prefix}-set{len(self._set_names)}"
            self.sets.append((name, text))
            self.size += len(text)
        return self._set_names[chars]


def _repeat(atom: str, low: int, high: int | None) -> str:
    if high == 0:
        return '""'
    suffix = {(0, 1): "?", (0, None): "*", (1, None): "+"}.get((low, high))
    if suffix is None:
        suffix = f"{{{low}}}" if low == high else f"{{{low},{'' if high is None else high}}}"
    return atom + suffix


_GBNF_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r"}
_GBNF_ESCAPE = re.compile(r'[\\"\n\r]')


def gbnf_literal(text: str) -> str:
    """A GBNF string literal matching exactly ``text`` (GBNF reads a backslash as an escape,
    so it is escaped too, as are a quote and line breaks)."""
    return '"' + _GBNF_ESCAPE.sub(lambda m: _GBNF_ESCAPES[m.group(0)], text) + '"'


def _intersect(a: Chars, b: Chars) -> Chars:
    return complement(char_set([*complement(a).ranges, *complement(b).ranges]))


def _chars(chars: Chars) -> str:
    """One character of ``chars``, JSON-escaped: a raw class, or an escape sequence."""
    raw, escaped = _intersect(chars, _RAW), _intersect(chars, _ESCAPED)
    options = []
    if raw.ranges:
        positive = "[" + "".join(_class_range(lo, hi) for lo, hi in raw.ranges) + "]"
        negative = "[^" + "".join(_class_range(lo, hi) for lo, hi in
                                  complement(raw).ranges) + "]"
        options.append(min(positive, negative, key=len))
    codes = [c for lo, hi in escaped.ranges for c in range(lo, hi + 1)]
    options += [gbnf_literal(_SHORT_ESCAPES[chr(c)]) for c in codes if chr(c) in _SHORT_ESCAPES]
    long = [f"{c:02x}" for c in codes if chr(c) not in _SHORT_ESCAPES]
    if long:
        by_first: dict[str, list[str]] = {}
        for code in long:
            by_first.setdefault(code[0], []).append(code[1])
        tails = [f'"{d}" [{"".join(s)}]' if len(s) > 1 else f'"{d}{s[0]}"'
                 for d, s in by_first.items()]
        options.append('"\\\\u00" ' + (tails[0] if len(tails) == 1
                                       else f"({' | '.join(tails)})"))
    if not options:
        return _chars_none()
    return options[0] if len(options) == 1 else f"({' | '.join(options)})"


def _chars_none() -> str:
    """A class no character matches (``[^\\s\\S]``): every code point excluded."""
    return "[^" + "".join(_class_range(lo, hi) for lo, hi in ALL.ranges) + "]"


def _class_range(lo: int, hi: int) -> str:
    if lo == hi:
        return _class_char(lo)
    if hi == lo + 1:
        return _class_char(lo) + _class_char(hi)
    return f"{_class_char(lo)}-{_class_char(hi)}"


def _class_char(code: int) -> str:
    if chr(code).isascii() and chr(code).isalnum():
        return chr(code)
    if code < 0x100:
        return f"\\x{code:02X}"
    return f"\\u{code:04X}" if code < 0x10000 else f"\\U{code:08X}"
