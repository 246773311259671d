"""Lark grammars (a custom tool's ``syntax: "lark"`` format) -> :mod:`.grammar_ir` nodes.

The subset real tool grammars use (OpenAI's examples, Codex's ``apply_patch``): rules
(``lower``) and terminals (``UPPER``), ``?rule`` / ``!rule`` and ``.priority`` (accepted:
they shape Lark's tree, not its language), string literals (``"..."``, ``"..."i``), literal
ranges ``"a".."z"``, ``/regex/flags`` terminals (:mod:`.regex_syntax`), ``|``, ``( )``,
``[ ]``, ``?``, ``*``, ``+``, ``~ n`` and ``~ n..m``, ``-> alias``, ``%import common.X`` (the
terminals of Lark's ``common`` module, :data:`COMMON_TERMINALS`, written here for their
language) and ``%ignore``. The grammar's start rule is ``start``.

Anything else (templates, ``%declare``, ``%override``, ``%extend``, imports of other modules
or of rules) is refused by name (:class:`.UnsupportedGrammar`). The meaning of ``%ignore``
is :mod:`.escaped_gbnf`'s to decide (ignored text may follow each token of a rule).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tokenwire.gateway.upstreams.grammar_ir import (
    MAX_FOLD_WORK,
    Alt,
    Node,
    Ref,
    Repeat,
    Seq,
    Text,
    UnsupportedGrammar,
    char_set,
    fold_case,
    refs,
)
from tokenwire.gateway.upstreams.regex_syntax import MAX_NESTING, parse_regex

__all__ = ["COMMON_TERMINALS", "LarkGrammar", "is_terminal", "parse_lark"]

#: The terminals of Lark's ``common.lark`` that ``%import common.X`` brings in, each written
#: here for the strings it matches (Lark's own text uses lookbehind and lazy matching for
#: ESCAPED_STRING and C_COMMENT; these say the same without them, and an ESCAPED_STRING is
#: a whole string literal: its last quote is not escaped).
COMMON_TERMINALS = r"""
DIGIT: "0".."9"
HEXDIGIT: "a".."f" | "A".."F" | DIGIT
INT: DIGIT+
SIGNED_INT: ["+" | "-"] INT
DECIMAL: INT "." INT? | "." INT
_EXP: ("e" | "E") SIGNED_INT
FLOAT: INT _EXP | DECIMAL _EXP?
SIGNED_FLOAT: ["+" | "-"] FLOAT
NUMBER: FLOAT | INT
SIGNED_NUMBER: ["+" | "-"] NUMBER
ESCAPED_STRING: "\"" (/[^"\\\n]/ | "\\" /./)* "\""
LCASE_LETTER: "a".."z"
UCASE_LETTER: "A".."Z"
LETTER: UCASE_LETTER | LCASE_LETTER
WORD: LETTER+
CNAME: ("_" | LETTER) ("_" | LETTER | DIGIT)*
WS_INLINE: (" " | /\t/)+
WS: /[ \t\f\r\n]/+
CR: /\r/
LF: /\n/
NEWLINE: (CR? LF)+
SH_COMMENT: /#[^\n]*/
CPP_COMMENT: /\/\/[^\n]*/
C_COMMENT: /\/\*([^*]|\*+[^*\/])*\*+\//
SQL_COMMENT: /--[^\n]*/
"""

_TOKEN = re.compile(r"""
    (?P<space>[ \t\f\r]+|\\\n)
  | (?P<comment>//[^\n]*)
  | (?P<newline>\n)
  | (?P<string>"(?:\\.|[^"\\\n])*"i?)
  | (?P<regex>/(?!/)(?:\\.|[^/\\\n])+/[a-z]*)
  | (?P<directive>%[a-z]+)
  | (?P<name>[?!]?[_A-Za-z][_A-Za-z0-9]*(?:\.[_A-Za-z][_A-Za-z0-9]*)*)
  | (?P<number>-?\d+)
  | (?P<op>\.\.|->|[:|()\[\]?*+~,.{}])
""", re.VERBOSE)
_STRING_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a",
                   "b": "\b", "0": "\0", "\\": "\\", '"': '"'}
_HEX = {"x": 2, "u": 4, "U": 8}


def is_terminal(name: str) -> bool:
    return name.lstrip("_")[:1].isupper()


@dataclass
class LarkGrammar:
    """Rules and terminals by name; ``ignore``: the terminals ``%ignore`` names."""

    rules: dict[str, Node] = field(default_factory=dict)
    terminals: dict[str, Node] = field(default_factory=dict)
    ignore: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Tok:
    kind: str
    text: str
    line: int


def parse_lark(text: str) -> LarkGrammar:
    """``text``'s rules and terminals, imports resolved, names checked; raises
    :class:`.UnsupportedGrammar` naming what is outside the subset."""
    parser = _Parser(_tokens(text), [MAX_FOLD_WORK])
    parser.definitions()
    grammar = parser.grammar
    _resolve_imports(grammar, parser.imports, parser.budget)
    _check_names(grammar)
    return grammar


def _tokens(text: str) -> list[_Tok]:
    out: list[_Tok] = []
    pos, line, depth = 0, 1, 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise UnsupportedGrammar(f"{text[pos]!r}", f"on line {line} of the grammar",
                                     "not Lark syntax")
        kind, value = m.lastgroup or "", m.group()
        pos = m.end()
        if kind == "op" and value in "([":
            depth += 1
        elif kind == "op" and value in ")]":
            depth -= 1
        if kind == "newline":
            line += 1
            if depth <= 0 and out and out[-1].kind != "newline":
                out.append(_Tok("newline", value, line - 1))
        elif kind not in ("space", "comment"):
            if kind == "op" and value == "|" and out and out[-1].kind == "newline":
                out.pop()  # a line that starts with "|" continues the definition
            out.append(_Tok(kind, value, line))
    out.append(_Tok("newline", "", line))
    return out


class _Parser:
    def __init__(self, tokens: list[_Tok], budget: list[int]) -> None:
        self.toks, self.i, self.budget = tokens, 0, budget
        self.grammar = LarkGrammar()
        self.imports: dict[str, str] = {}  # local name -> common terminal
        self._anon: dict[Node, str] = {}

    @property
    def tok(self) -> _Tok:
        return self.toks[min(self.i, len(self.toks) - 1)]

    def error(self, what: str, why: str = "") -> UnsupportedGrammar:
        return UnsupportedGrammar(what, f"on line {self.tok.line} of the grammar", why)

    def take(self, kind: str, text: str | None = None) -> _Tok:
        tok = self.tok
        if tok.kind != kind or (text is not None and tok.text != text):
            raise self.error(f"{tok.text or 'the end'!r}",
                             f"expected {text or kind}: not Lark syntax")
        self.i += 1
        return tok

    def at(self, kind: str, *texts: str) -> bool:
        return self.tok.kind == kind and (not texts or self.tok.text in texts)

    def definitions(self) -> None:
        while self.i < len(self.toks):
            if self.at("newline"):
                self.i += 1
            elif self.at("directive"):
                self.directive()
            else:
                self.definition()

    def definition(self) -> None:
        name = self.take("name").text.lstrip("?!")
        if "." in name:  # NAME.2 reads as one dotted name; the priority changes no string
            name, _, priority = name.partition(".")
            if not priority.isdigit():
                raise self.error(f"name {name}.{priority}")
        elif self.at("op", "."):
            self.i += 1
            self.take("number")
        if self.at("op", "{"):
            raise self.error(f"template {name}{{...}}")
        self.take("op", ":")
        table = self.grammar.terminals if is_terminal(name) else self.grammar.rules
        if name in table or name in self.imports:
            raise self.error(f"{name} defined twice")
        table[name] = self.expansions(0, terminal=is_terminal(name))
        self.take("newline")

    def directive(self) -> None:
        word = self.take("directive").text
        if word == "%ignore":
            node = self.expansions(0, terminal=True)
            if isinstance(node, Ref) and is_terminal(node.name):
                self.grammar.ignore.append(node.name)
            else:
                self.grammar.ignore.append(self._anonymous(node))
        elif word == "%import":
            self.import_()
        else:
            raise self.error(f"directive {word}")
        self.take("newline")

    def import_(self) -> None:
        path = self.take("name").text
        module, _, name = path.partition(".")
        if module != "common":
            raise self.error(f"%import {path}", "only Lark's common terminals are available")
        names: list[tuple[str, str]] = []
        if name:
            alias = name
            if self.at("op", "->"):
                self.i += 1
                alias = self.take("name").text
            names.append((name, alias))
        else:
            self.take("op", "(")
            while True:
                one = self.take("name").text
                names.append((one, one))
                if not self.at("op", ","):
                    break
                self.i += 1
            self.take("op", ")")
        for name, alias in names:
            if not is_terminal(name) or not is_terminal(alias):
                raise self.error(f"%import common.{name}", "only terminals are imported")
            if alias in self.grammar.terminals or alias in self.imports:
                raise self.error(f"{alias} defined twice")
            self.imports[alias] = name

    def expansions(self, depth: int, *, terminal: bool) -> Node:
        if depth > MAX_NESTING:
            raise self.error("nesting", f"more than {MAX_NESTING} levels of parentheses")
        options = [self.alias(depth, terminal)]
        while self.at("op", "|"):
            self.i += 1
            options.append(self.alias(depth, terminal))
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def alias(self, depth: int, terminal: bool) -> Node:
        items: list[Node] = []
        while not (self.at("newline") or self.at("op", "|", ")", "]", "->")):
            items.append(self.expr(depth, terminal))
        if self.at("op", "->"):  # names the tree node; the strings are the same
            self.i += 1
            self.take("name")
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def expr(self, depth: int, terminal: bool) -> Node:
        atom = self.atom(depth, terminal)
        if self.at("op", "?", "*", "+"):
            low, high = {"?": (0, 1), "*": (0, None), "+": (1, None)}[self.take("op").text]
            return Repeat(atom, low, high)
        if self.at("op", "~"):
            self.i += 1
            low = high = self.count()
            if self.at("op", ".."):
                self.i += 1
                high = self.count()
            if high < low:
                raise self.error(f"~ {low}..{high}", "its maximum is below its minimum")
            return Repeat(atom, low, high)
        return atom

    def count(self) -> int:
        text = self.take("number").text
        if text.startswith("-"):
            raise self.error(f"~ {text}", "a count is not negative")
        return int(text)

    def atom(self, depth: int, terminal: bool) -> Node:
        tok = self.tok
        if self.at("op", "(", "["):
            self.i += 1
            inner = self.expansions(depth + 1, terminal=terminal)
            self.take("op", ")" if tok.text == "(" else "]")
            return Seq((inner,)) if tok.text == "(" else Repeat(inner, 0, 1)
        if tok.kind == "name":
            self.i += 1
            if "." in tok.text or tok.text[0] in "?!":
                raise self.error(f"name {tok.text}")
            if self.at("op", "{"):
                raise self.error(f"template {tok.text}{{...}}")
            return Ref(tok.text)
        if tok.kind == "string":
            self.i += 1
            node = self.string(tok.text)
            if self.at("op", ".."):
                self.i += 1
                node = self.char_range(tok.text, self.take("string").text)
            return node if terminal else Ref(self._anonymous(node))
        if tok.kind == "regex":
            self.i += 1
            body, _, flags = tok.text[1:].rpartition("/")
            node = parse_regex(body.replace("\\/", "/"), flags,
                               where=f"the regex {tok.text} on line {tok.line}",
                               fold_budget=self.budget)
            return node if terminal else Ref(self._anonymous(node))
        raise self.error(f"{tok.text or 'the end'!r}", "not Lark syntax")

    def string(self, quoted: str) -> Node:
        fold = quoted.endswith("i")
        text = _unescape(quoted[1:-2] if fold else quoted[1:-1], self.error)
        if not fold:
            return Text(text)
        return Seq(tuple(fold_case(char_set([(ord(c), ord(c))]), self.budget) for c in text))

    def char_range(self, low: str, high: str) -> Node:
        a, b = _unescape(low[1:-1], self.error), _unescape(high[1:-1], self.error)
        if len(a) != 1 or len(b) != 1 or a > b:
            raise self.error(f"range {low}..{high}", "its ends must be characters, in order")
        return char_set([(ord(a), ord(b))])

    def _anonymous(self, node: Node) -> str:
        """A literal or regex inside a rule is a token of its own, as in Lark."""
        if node not in self._anon:
            name = f"__ANON_{len(self._anon)}"
            self._anon[node] = name
            self.grammar.terminals[name] = node
        return self._anon[node]


def _unescape(body: str, error) -> str:
    out, i = [], 0
    while i < len(body):
        if body[i] != "\\":
            out.append(body[i])
            i += 1
            continue
        letter = body[i + 1: i + 2]
        if letter in _HEX:
            digits = body[i + 2: i + 2 + _HEX[letter]]
            if len(digits) != _HEX[letter] or int(digits, 16) > 0x10FFFF:
                raise error(f"escape '\\{letter}{digits}'")
            out.append(chr(int(digits, 16)))
            i += 2 + _HEX[letter]
        elif letter in _STRING_ESCAPES:
            out.append(_STRING_ESCAPES[letter])
            i += 2
        else:
            raise error(f"escape '\\{letter}' in a string")
    return "".join(out)


_common: LarkGrammar | None = None


def _resolve_imports(grammar: LarkGrammar, imports: dict[str, str], budget: list[int]) -> None:
    """Each imported terminal under its local name; the common terminals it uses under
    ``__COMMON_X`` (so that a grammar's own ``DIGIT`` does not change common ``INT``)."""
    global _common
    if not imports:
        return
    if _common is None:
        parser = _Parser(_tokens(COMMON_TERMINALS), budget)
        parser.definitions()
        _common = parser.grammar
    for alias, name in imports.items():
        if name not in _common.terminals:
            raise UnsupportedGrammar(f"%import common.{name}", "",
                                     "not a terminal of Lark's common module")
        grammar.terminals[alias] = _renamed(_common.terminals[name])
        todo = refs(_common.terminals[name])
        while todo:
            dep = todo.pop()
            if f"__COMMON_{dep}" not in grammar.terminals:
                grammar.terminals[f"__COMMON_{dep}"] = _renamed(_common.terminals[dep])
                todo += refs(_common.terminals[dep])


def _renamed(node: Node) -> Node:
    match node:
        case Ref(name):
            return Ref(f"__COMMON_{name}")
        case Seq(items):
            return Seq(tuple(_renamed(i) for i in items))
        case Alt(items):
            return Alt(tuple(_renamed(i) for i in items))
        case Repeat(item, low, high):
            return Repeat(_renamed(item), low, high)
    return node


def _check_names(grammar: LarkGrammar) -> None:
    if "start" not in grammar.rules:
        raise UnsupportedGrammar("a grammar without 'start'", "", "the start rule is 'start'")
    for table, kind in ((grammar.rules, "rule"), (grammar.terminals, "terminal")):
        for name, node in table.items():
            for ref in refs(node):
                if ref not in grammar.rules and ref not in grammar.terminals:
                    raise UnsupportedGrammar(f"{ref}", f"in {kind} {name}", "it is not defined")
                if table is grammar.terminals and ref in grammar.rules:
                    raise UnsupportedGrammar(f"rule {ref}", f"in terminal {name}",
                                             "a terminal is made of terminals only")
    for ref in grammar.ignore:  # (%ignore WS without %import common.WS)
        if ref not in grammar.terminals:
            raise UnsupportedGrammar(f"{ref}", "in %ignore", "it is not a defined terminal")
    _check_terminal_cycles(grammar)


def _check_terminal_cycles(grammar: LarkGrammar) -> None:
    """Terminals are regular: none may use itself (Lark refuses it too)."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    for root in grammar.terminals:
        stack = [(root, iter(refs(grammar.terminals[root])))]
        if state.get(root):
            continue
        state[root] = 1
        while stack:
            name, deps = stack[-1]
            dep = next(deps, None)
            if dep is None:
                state[name] = 2
                stack.pop()
            elif state.get(dep) == 1:
                raise UnsupportedGrammar(f"terminal {dep}", "", "a terminal may not use itself")
            elif not state.get(dep):
                state[dep] = 1
                stack.append((dep, iter(refs(grammar.terminals[dep]))))
