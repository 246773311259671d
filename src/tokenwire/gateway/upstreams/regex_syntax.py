"""Regular expressions -> :mod:`.grammar_ir` nodes: a custom tool's ``syntax: "regex"``
format, and the ``/regex/`` terminals of a Lark grammar.

The subset is the regular part of Python's ``re`` (which Lark uses): literals and escapes,
``.``, classes ``[...]`` (ranges, negation, ``\\d \\w \\s`` and their negations with their
Unicode meaning), groups ``( )`` ``(?: )`` ``(?P<name> )``, ``|``, and the quantifiers
``? * + {m} {m,} {m,n} {,n}`` (lazy ``?`` suffixes allowed: a lazy quantifier matches the
same strings when the whole input must match). Flags ``i`` (case-insensitive) and ``s``
(``.`` matches a newline); ``m`` and ``u`` change nothing here. What is not regular or not
in Python's ``re`` (anchors inside, ``\\b``, back-references, lookaround, inline flags,
possessive quantifiers, ``x``) is refused by name (:class:`.UnsupportedGrammar`).
"""

from __future__ import annotations

import re

from tokenwire.gateway.upstreams.grammar_ir import (
    ALL,
    MAX_FOLD_WORK,
    Alt,
    Chars,
    Node,
    Repeat,
    Seq,
    Text,
    UnsupportedGrammar,
    char_set,
    class_escape,
    complement,
    fold_case,
    union,
)

__all__ = ["MAX_NESTING", "parse_regex"]

#: Groups one expression may nest (and Lark's parentheses): the parsers and the grammar
#: writer recurse once per level, so a deep input must be refused, not hit Python's limit.
MAX_NESTING = 64
_FLAGS = frozenset("imsu")
_QUANTIFIER = re.compile(r"\{(\d*)(,(\d*))?\}")
_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a"}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}
_NEWLINE = char_set([(10, 10)])


def parse_regex(pattern: str, flags: str = "", *, where: str = "regex",
                fold_budget: list[int] | None = None) -> Node:
    """The language of strings ``pattern`` matches whole, under ``flags``."""
    for flag in flags:
        if flag not in _FLAGS:
            raise UnsupportedGrammar(f"regex flag {flag!r}", f"in {where}")
    parser = _Parser(pattern, flags, where,
                     fold_budget if fold_budget is not None else [MAX_FOLD_WORK])
    node = parser.alternatives(0)
    if parser.i < len(pattern):  # an unbalanced ")"
        raise parser.error("unbalanced ')'")
    return node


class _Parser:
    def __init__(self, pattern: str, flags: str, where: str, budget: list[int]) -> None:
        self.p, self.i, self.where, self.budget = pattern, 0, where, budget
        self.ignore_case, self.dotall = "i" in flags, "s" in flags

    def error(self, what: str, why: str = "") -> UnsupportedGrammar:
        return UnsupportedGrammar(what, f"at offset {self.i} of {self.where}", why)

    def peek(self, ahead: int = 0) -> str:
        at = self.i + ahead
        return self.p[at] if at < len(self.p) else ""

    def alternatives(self, depth: int) -> Node:
        if depth > MAX_NESTING:
            raise self.error("nesting", f"more than {MAX_NESTING} levels of groups")
        options = [self.sequence(depth)]
        while self.peek() == "|":
            self.i += 1
            options.append(self.sequence(depth))
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def sequence(self, depth: int) -> Node:
        items: list[Node] = []
        while self.peek() not in ("", "|", ")"):
            atom = self.atom(depth)
            items.append(self.quantified(atom))
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def quantified(self, atom: Node) -> Node:
        char = self.peek()
        if char in ("?", "*", "+"):
            self.i += 1
            low, high = {"?": (0, 1), "*": (0, None), "+": (1, None)}[char]
        elif char == "{" and (m := _QUANTIFIER.match(self.p, self.i)) and (m[1] or m[3]):
            self.i = m.end()
            low = int(m[1] or 0)
            high = low if m[2] is None else (int(m[3]) if m[3] else None)
            if high is not None and high < low:
                raise self.error(f"quantifier {m[0]}", "its maximum is below its minimum")
        else:
            return atom
        if self.peek() == "+":
            raise self.error("possessive quantifier", "it changes what matches")
        if self.peek() == "?":  # lazy: the same strings, when the whole input must match
            self.i += 1
        if self.peek() in ("?", "*", "+") or (
                self.peek() == "{" and _QUANTIFIER.match(self.p, self.i)):
            raise self.error("multiple repeat", "as in Python's re")
        return Repeat(atom, low, high)

    def atom(self, depth: int) -> Node:
        char = self.peek()
        if char == "(":
            return self.group(depth)
        if char in ("*", "+", "?"):
            raise self.error(f"quantifier {char!r}", "it follows nothing")
        if char == "[":
            return self.char_class()
        if char == ".":
            self.i += 1
            return ALL if self.dotall else complement(_NEWLINE)
        if char in ("^", "$"):
            raise self.error(f"anchor {char!r}", "only the whole input is matched")
        if char == "\\":
            return self.escape(in_class=False)
        self.i += 1
        return self.literal(char)

    def literal(self, char: str) -> Node:
        if self.ignore_case:
            return fold_case(char_set([(ord(char), ord(char))]), self.budget)
        return Text(char)

    def group(self, depth: int) -> Node:
        self.i += 1
        if self.peek() == "?":
            if self.p.startswith("?:", self.i):
                self.i += 2
            elif (m := re.compile(r"\?P<[A-Za-z_]\w*>").match(self.p, self.i)) is not None:
                self.i = m.end()
            else:
                raise self.error(f"group '(?{self.peek(1)}'", "lookaround, inline flags and "
                                 "back-references are not regular")
        inner = self.alternatives(depth + 1)
        if self.peek() != ")":
            raise self.error("unbalanced '('")
        self.i += 1
        return Seq((inner,))  # a group is one atom for the quantifier that follows

    def escape(self, *, in_class: bool) -> Node:
        """The escape at ``self.i`` (a backslash): a set, or a literal character."""
        letter = self.peek(1)
        if not letter:
            raise self.error("trailing backslash")
        self.i += 2
        chars = class_escape(letter)
        if chars is not None:
            return chars
        if letter in _SIMPLE_ESCAPES:
            return self.literal(_SIMPLE_ESCAPES[letter])
        if letter == "b" and in_class:
            return self.literal("\b")
        if letter in _HEX_ESCAPES:
            digits = self.p[self.i:self.i + _HEX_ESCAPES[letter]]
            if len(digits) != _HEX_ESCAPES[letter] or not all(
                    c in "0123456789abcdefABCDEF" for c in digits):
                raise self.error(f"escape '\\{letter}{digits}'", "incomplete")
            self.i += len(digits)
            code = int(digits, 16)
            if code > 0x10FFFF:
                raise self.error(f"escape '\\{letter}{digits}'", "past Unicode")
            return self.literal(chr(code))
        if letter == "0" and not self.peek().isdigit():
            return self.literal("\0")
        if letter.isalnum():  # \b \B \A \Z, back-references, \N{...}, \p
            raise self.error(f"escape '\\{letter}'")
        return self.literal(letter)  # escaped punctuation or space is itself

    def char_class(self) -> Chars:
        self.i += 1
        negated = self.peek() == "^"
        if negated:
            self.i += 1
        parts: list[Chars] = []
        first = True
        while True:
            char = self.peek()
            if not char:
                raise self.error("unbalanced '['")
            if char == "]" and not first:
                self.i += 1
                break
            first = False
            low = self.class_item()
            if self.peek() == "-" and self.peek(1) not in ("]", ""):
                self.i += 1
                high = self.class_item()
                if not (_single(low) and _single(high)) or high.ranges[0][0] < low.ranges[0][0]:
                    raise self.error("class range", "its ends must be characters, in order")
                parts.append(char_set([(low.ranges[0][0], high.ranges[0][0])]))
            else:
                parts.append(low)
        chars = union(*parts) if parts else Chars(())
        if self.ignore_case:
            chars = fold_case(chars, self.budget)
        return complement(chars) if negated else chars

    def class_item(self) -> Chars:
        if self.peek() == "\\":
            was, self.ignore_case = self.ignore_case, False  # folded with the whole class
            try:
                node = self.escape(in_class=True)
            finally:
                self.ignore_case = was
            if isinstance(node, Text):
                return char_set([(ord(node.text), ord(node.text))])
            assert isinstance(node, Chars)
            return node
        char = self.peek()
        self.i += 1
        return char_set([(ord(char), ord(char))])


def _single(chars: Chars) -> bool:
    return len(chars.ranges) == 1 and chars.ranges[0][0] == chars.ranges[0][1]
