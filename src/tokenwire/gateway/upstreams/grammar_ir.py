"""The expression tree a custom tool's grammar is read into, and sets of characters.

Both front ends (:mod:`.lark_syntax` for ``syntax: "lark"``, :mod:`.regex_syntax` for
``syntax: "regex"`` and Lark's ``/regex/`` terminals) produce these nodes;
:mod:`.escaped_gbnf` writes them out as llama.cpp GBNF. A node stands for a language (a set
of strings): characters are sets of code points (:class:`Chars`), never regex text, so what
the grammar means is decided here once, not again by llama.cpp's parser.

Sets hold Unicode scalar values only (no surrogates: they cannot be in UTF-8 text).
"""

from __future__ import annotations

import bisect
import functools
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "ALL",
    "MAX_CODE_POINT",
    "MAX_FOLD_WORK",
    "MAX_OPEN_REPEATS",
    "MAX_REPEATS",
    "Alt",
    "Chars",
    "GrammarTooLarge",
    "Node",
    "Ref",
    "Repeat",
    "Seq",
    "Text",
    "UnsupportedGrammar",
    "char_set",
    "class_escape",
    "complement",
    "fold_case",
    "refs",
    "union",
]

MAX_CODE_POINT = sys.maxunicode
_SURROGATES = (0xD800, 0xDFFF)
#: Copies of a rule that one request's schemas and grammars may have the grammar write out
#: in all: each unit of ``minLength`` / ``maxLength`` / ``minItems`` / ``maxItems``, of a
#: pattern's ``{m,n}`` and of a grammar's ``~ n..m`` is one copy in the grammar's text (and
#: in llama.cpp's parse of it), so a 200-byte schema asking for 10**9 grew the server past
#: 24 GB. 100,000 is ~1 MB of grammar.
MAX_REPEATS = 100_000
#: Optional repetitions one count may leave open (``maxLength`` - ``minLength``; a pattern's
#: ``{m,n}``, a grammar's ``~ n..m``): each is one more level of nesting, and llama.cpp's
#: grammar parser refuses the grammar past about a thousand (measured: 1,000 parses, 1,020
#: does not).
MAX_OPEN_REPEATS = 1_000
#: Work allowed folding case (``i`` flags) in one grammar, in cased characters looked at:
#: each folded set costs the cased characters inside it (up to ~2,900), so a grammar of
#: many large ``[...]``i classes would otherwise spend seconds here before any check.
MAX_FOLD_WORK = 200_000

#: No code point at or past this one has another case (Unicode 16's last is in U+1E9xx).
_CASED_BELOW = 0x20000

Ranges = tuple[tuple[int, int], ...]


class UnsupportedGrammar(ValueError):
    """A grammar this engine cannot enforce: ``construct`` names what, ``where`` where."""

    def __init__(self, construct: str, where: str, why: str = "") -> None:
        super().__init__(f"{construct} {where} is not supported by this engine's constrained "
                         f"decoding{': ' + why if why else ''}")
        self.construct = construct


class GrammarTooLarge(UnsupportedGrammar):
    """A grammar past one of the size bounds (:mod:`.escaped_gbnf`)."""

    def __init__(self, what: str) -> None:
        ValueError.__init__(self, f"the grammar is too large for this engine's constrained "
                            f"decoding: {what}")
        self.construct = "size"


@dataclass(frozen=True, slots=True)
class Chars:
    """One character of a set: sorted, disjoint, non-adjacent inclusive ranges."""

    ranges: Ranges


@dataclass(frozen=True, slots=True)
class Text:
    """A literal string (the empty string is the empty sequence)."""

    text: str


@dataclass(frozen=True, slots=True)
class Seq:
    items: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Alt:
    options: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Repeat:
    """``item`` from ``low`` to ``high`` times (``None``: unbounded)."""

    item: Node
    low: int
    high: int | None


@dataclass(frozen=True, slots=True)
class Ref:
    """A named rule or terminal of the grammar."""

    name: str


Node = Chars | Text | Seq | Alt | Repeat | Ref


def refs(node: Node) -> list[str]:
    """The rule and terminal names ``node`` uses, in order (with repeats)."""
    match node:
        case Ref(name):
            return [name]
        case Seq(items) | Alt(items):
            return [r for item in items for r in refs(item)]
        case Repeat(item, _, _):
            return refs(item)
    return []


# -- sets of characters -------------------------------------------------------------------


def char_set(pairs: Iterable[tuple[int, int]]) -> Chars:
    """The set of the inclusive ``pairs`` (any order, overlapping), surrogates removed."""
    out: list[list[int]] = []
    for lo, hi in sorted(pairs):
        for a, b in _without_surrogates(lo, hi):
            if out and a <= out[-1][1] + 1:
                out[-1][1] = max(out[-1][1], b)
            else:
                out.append([a, b])
    return Chars(tuple((a, b) for a, b in out))


def _without_surrogates(lo: int, hi: int) -> list[tuple[int, int]]:
    s_lo, s_hi = _SURROGATES
    if hi < s_lo or lo > s_hi:
        return [(lo, hi)]
    return [(a, b) for a, b in ((lo, s_lo - 1), (s_hi + 1, hi)) if a <= b]


ALL = char_set([(0, MAX_CODE_POINT)])


def union(*sets: Chars) -> Chars:
    return char_set(r for s in sets for r in s.ranges)


def complement(chars: Chars) -> Chars:
    """Every scalar value not in ``chars``."""
    out, start = [], 0
    for lo, hi in chars.ranges:
        if lo > start:
            out.append((start, lo - 1))
        start = hi + 1
    if start <= MAX_CODE_POINT:
        out.append((start, MAX_CODE_POINT))
    return char_set(out)


@functools.cache
def _cased() -> tuple[list[int], list[tuple[int, ...]]]:
    """Every code point with another case, and the others of its case class: the closure of
    one-character ``lower()``, ``upper()`` and ``casefold()``, both ways (``re.I`` matches
    the KELVIN SIGN with ``k`` though neither maps to the other's upper case)."""
    classes: dict[int, set[int]] = {}
    for cp in range(_CASED_BELOW):
        char = chr(cp)
        for other in (char.lower(), char.upper(), char.casefold()):
            if len(other) == 1 and other != char:
                merged = classes.get(cp, {cp}) | classes.get(ord(other), {ord(other)})
                for member in merged:
                    classes[member] = merged
    points = sorted(classes)
    return points, [tuple(sorted(classes[p] - {p})) for p in points]


def fold_case(chars: Chars, budget: list[int]) -> Chars:
    """``chars`` with every character's case variants; ``budget`` (one mutable count, see
    :data:`MAX_FOLD_WORK`) pays for the cased characters looked at."""
    points, variants = _cased()
    extra = []
    for lo, hi in chars.ranges:
        first, last = bisect.bisect_left(points, lo), bisect.bisect_right(points, hi)
        budget[0] -= last - first
        if budget[0] < 0:
            raise GrammarTooLarge("case-insensitive classes cover too many characters")
        extra += [(v, v) for i in range(first, last) for v in variants[i]]
    return union(chars, char_set(extra)) if extra else chars


@functools.cache
def _class_of(pattern: str) -> Chars:
    """The characters Python's ``re`` matches with ``pattern`` (``\\d``, ``\\w``, ``\\s``)."""
    text = "".join(chr(c) for c in range(MAX_CODE_POINT + 1)
                   if not _SURROGATES[0] <= c <= _SURROGATES[1])
    return char_set((ord(m.group()[0]), ord(m.group()[-1]))
                    for m in re.finditer(pattern + "+", text))


def class_escape(letter: str) -> Chars | None:
    """``\\d \\w \\s`` and their negations, exactly as Python's ``re`` reads them in a
    ``str`` pattern (Unicode digits, letters, spaces): ``None`` for another letter."""
    base = {"d": r"\d", "w": r"\w", "s": r"\s"}.get(letter.lower())
    if base is None:
        return None
    chars = _class_of(base)
    return complement(chars) if letter.isupper() else chars
