"""Regexes whose character classes mean the same code points in every regex engine.

Two things make one pattern string read differently by different engines:

* **Unicode tables.** ``\\p{L}`` is whatever the engine's tables say. Rust ``regex-syntax``
  (tiktoken's fancy-regex) and Oniguruma (Hugging Face ``tokenizers``) are at Unicode
  16.0.0; the Python ``regex`` module 2026.x is at 17.0 and counts 17,144 more code points
  as letters (``'\\U000190b6濺'`` then splits differently on r50k).
* **Escapes.** Oniguruma reads ``\\x85`` inside a class as the *byte* 0x85, not U+0085, so
  ``[\\x85\\xa0]`` misses both characters; Oniguruma and JavaScript have no ``\\U0001F600``.

:func:`pin` rewrites a pattern so that neither matters: ``\\p{..}``, ``\\P{..}``, ``\\s``,
``\\S``, ``\\d``, ``\\D`` become explicit ranges from :mod:`tokenwire.codec.unicode_tables`
(Unicode 16.0.0, the engines' version), and every code point is spelled so that Python
``regex``, Rust ``regex``/fancy-regex, Oniguruma and JavaScript (with the ``u`` flag) read it
alike: printable ASCII as itself, other ASCII as ``\\xHH``, the rest of the BMP as
``\\uHHHH``, astral code points as the raw character (the one spelling all four share).
Character classes are parsed and their ranges merged, so ``[^\\s\\p{L}\\p{N}]`` becomes one
sorted list of ranges. Anything the rewriter does not understand (``\\w``, ``\\b``, POSIX or
nested classes) is left as it was: such a pattern is only as portable as its source.

Explicit ranges are the definition, but the ``regex`` module matches a 600-range class ~10x
slower than its own ``\\p{L}``. :class:`PinnedRegex` therefore keeps both compilations and
uses the module's own tables for a text unless the text contains a code point on which
those tables and the pinned ones disagree (found once per process by sweeping every code
point through the module: :func:`disputed_code_points`).

That sweep is ~160 ms, most of a fresh process's first map load (issue 15, BENCHMARKS.md
"Map load-to-ready"), so it is not run on the first non-ASCII text. Until it is known, a
text is decided on the smallest prefix of the code space (:data:`PREFIX_BOUNDS`) that holds
it, swept alone (1-2 ms once), else on the last and its code points above it one
by one (up to :data:`MAX_CHECKED` distinct): Latin, Cyrillic, CJK, emoji... take the fast
path at once, exactly. A text with more such code points uses the
pinned compilation while a sweep handed to a ``defer`` (:func:`defer_dispute_sweep`, which
``Tokenizer.from_map(defer=...)`` calls) is pending, or runs the sweep itself when none is.
"""

from __future__ import annotations

import array
import os
import re
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import cache, partial
from itertools import chain
from operator import gt, le

import regex

from tokenwire.codec.unicode_classes import WHITE_SPACE
from tokenwire.codec.unicode_tables import RANGES, RUST_NUMERIC, UNICODE_VERSION

__all__ = [
    "CATEGORY_GROUPS",
    "MAX_CHECKED",
    "PREFIX_BOUNDS",
    "UNICODE_VERSION",
    "PinnedRegex",
    "category_ranges",
    "defer_dispute_sweep",
    "disputed_code_points",
    "pin",
    "spell_class",
    "spell_literal",
]

Ranges = tuple[tuple[int, int], ...]

#: Which table ``\p{N}`` means. ``"regex"``: Unicode 16.0.0, what the engines' regexes use.
#: ``"rust"``: Rust ``char::is_numeric`` (Unicode 17.0.0 today), what HF's ``Digits``
#: pre-tokenizer uses; a program's ``digits_isolate`` stage is that pre-tokenizer.
Numeric = str

#: ``\p{X}`` names the rewriter pins: the General_Category groups and their members.
CATEGORY_GROUPS: dict[str, tuple[str, ...]] = {
    "L": ("Lu", "Ll", "Lt", "Lm", "Lo"),
    "M": ("Mn", "Mc", "Me"),
    "N": ("Nd", "Nl", "No"),
    "P": ("Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po"),
    "S": ("Sm", "Sc", "Sk", "So"),
} | {cat: (cat,) for cat in RANGES}

#: Unicode White_Space=Yes (the explicit table of unicode_classes) as ranges.
WHITE_SPACE_RANGES: Ranges = tuple((cp, cp) for cp in WHITE_SPACE)

_MAX_CP = 0x10FFFF
_SURROGATES = (0xD800, 0xDFFF)
_CLASS_SPECIAL = frozenset("\\]^-[")
_META = frozenset("\\.^$|?*+()[]{}")
_SIMPLE_ESCAPES = {"t": 0x09, "n": 0x0A, "r": 0x0D, "f": 0x0C}
_SHORTHANDS = {"s": (False, "WS"), "S": (True, "WS"), "d": (False, "Nd"), "D": (True, "Nd")}


# -- ranges ------------------------------------------------------------------------------


def _merge(ranges: Iterable[tuple[int, int]]) -> Ranges:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return tuple(out)


def _merge_flat(flats: Sequence[tuple[int, ...]]) -> Ranges:
    """:func:`_merge` of the flat ``(first, last, first, last, ...)`` tables of
    :mod:`~tokenwire.codec.unicode_tables`, faster: their ranges do not overlap (the
    categories of a group partition their code points), so sorting the firsts and the lasts
    apart pairs them as sorting the ranges would, and ints sort ~10x faster than tuples
    (the tuple sort was ~2 ms of a fresh process's first non-ASCII encode, issue 15).
    Exact whatever the tables hold: strictly interleaved sorted firsts and lasts can only
    come from those very ranges; anything else takes :func:`_merge`."""
    firsts = sorted(chain.from_iterable(flat[::2] for flat in flats))
    lasts = sorted(chain.from_iterable(flat[1::2] for flat in flats))
    if not (all(map(le, firsts, lasts)) and all(map(gt, firsts[1:], lasts))):
        return _merge(chain.from_iterable(zip(f[::2], f[1::2], strict=True) for f in flats))
    # A merged range starts where a range does not touch the one before, ends likewise.
    starts = [lo for lo, before in zip(firsts, [-2, *lasts], strict=False) if lo != before + 1]
    ends = [hi for hi, after in zip(lasts, [*firsts[1:], -2], strict=True) if after != hi + 1]
    return tuple(zip(starts, ends, strict=True))


def _complement(ranges: Ranges) -> Ranges:
    """Every scalar value (surrogates excluded) not in ``ranges``."""
    out: list[tuple[int, int]] = []
    nxt = 0
    for lo, hi in _merge([*ranges, _SURROGATES]):
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= _MAX_CP:
        out.append((nxt, _MAX_CP))
    return tuple(out)


@cache
def category_ranges(name: str, numeric: Numeric = "regex") -> Ranges:
    """The Unicode 16.0.0 ranges of ``\\p{name}`` (``L``, ``Lu``, ``N``, ...); ``WS`` is
    White_Space; ``numeric="rust"`` makes ``N`` Rust's ``is_numeric``. Raises ``KeyError``
    for a name we do not pin."""
    if name == "WS":
        return _merge(WHITE_SPACE_RANGES)
    if name == "N" and numeric == "rust":
        return _merge_flat([RUST_NUMERIC["N"]])
    return _merge_flat([RANGES[cat] for cat in CATEGORY_GROUPS[name]])


# -- spelling ----------------------------------------------------------------------------


def _spell(cp: int, special: frozenset[str]) -> str:
    ch = chr(cp)
    if ch in special:
        return "\\" + ch
    if 0x21 <= cp <= 0x7E:
        return ch
    if cp < 0x80:
        return f"\\x{cp:02x}"
    if cp <= 0xFFFF:
        return f"\\u{cp:04x}"
    return ch  # astral: only the raw character reads alike in all four engines


def spell_class(ranges: Ranges, *, negated: bool = False) -> str:
    """A bracketed class of ``ranges``, spelled for every engine."""
    body = "".join(
        _spell(lo, _CLASS_SPECIAL) if lo == hi
        else _spell(lo, _CLASS_SPECIAL) + ("" if hi == lo + 1 else "-") + _spell(hi, _CLASS_SPECIAL)
        for lo, hi in ranges
    )  # fmt: skip
    return f"[{'^' if negated else ''}{body}]"


def spell_literal(text: str) -> str:
    """``text`` as a literal, spelled for every engine (meta characters backslashed)."""
    return "".join(_spell(ord(c), _META) for c in text)


# -- the rewriter ------------------------------------------------------------------------


class _Unpinnable(Exception):
    """A class item the rewriter does not model; the class is copied as written."""


def _read_escape(p: str, i: int) -> tuple[str, object, int]:
    """Parse the escape at ``p[i] == "\\\\"``: (kind, value, index after it).

    kinds: ``cp`` (a code point), ``set`` ((negated, name)), ``other`` (verbatim text).
    """
    if i + 1 >= len(p):
        return "other", p[i:], len(p)
    c = p[i + 1]
    if c in "pP":
        if i + 2 < len(p) and p[i + 2] == "{":
            end = p.find("}", i + 3)
            if end < 0:
                return "other", p[i:], len(p)
            name, nxt = p[i + 3 : end], end + 1
        else:
            name, nxt = p[i + 2 : i + 3], i + 3
        negated = c == "P"
        if name.startswith("^"):
            negated, name = not negated, name[1:]
        if name in CATEGORY_GROUPS:
            return "set", (negated, name), nxt
        return "other", p[i:nxt], nxt
    if c in _SHORTHANDS:
        return "set", _SHORTHANDS[c], i + 2
    if c in _SIMPLE_ESCAPES:
        return "cp", _SIMPLE_ESCAPES[c], i + 2
    hex_len = {"x": 2, "u": 4, "U": 8}.get(c)
    if hex_len is not None:
        if c == "x" and p[i + 2 : i + 3] == "{":
            end = p.find("}", i + 3)
            if end < 0:
                return "other", p[i:], len(p)
            digits, nxt = p[i + 3 : end], end + 1
        else:
            digits, nxt = p[i + 2 : i + 2 + hex_len], i + 2 + hex_len
        if digits and all(d in "0123456789abcdefABCDEF" for d in digits):
            return "cp", int(digits, 16), nxt
        return "other", p[i:nxt], nxt
    if c.isascii() and not c.isalnum():
        return "cp", ord(c), i + 2  # an escaped punctuation character is itself
    return "other", p[i : i + 2], i + 2


def _set_ranges(negated: bool, name: str, numeric: Numeric) -> Ranges:
    ranges = category_ranges(name, numeric)
    return _complement(ranges) if negated else ranges


def _parse_class(
    p: str, i: int, used: set[str], numeric: Numeric, spell: bool = True
) -> tuple[str, int]:
    """Rewrite the class starting at ``p[i] == "["``: (new spelling, index after it).
    Without ``spell``, only ``used`` and the index: the spelling is ``""``."""
    j = i + 1
    negated = p[j : j + 1] == "^"
    if negated:
        j += 1
    items: list[tuple[int, int]] | None = [] if spell else None
    names: set[str] = set()
    first = True
    try:
        while True:
            if j >= len(p):
                raise _Unpinnable
            c = p[j]
            if c == "]" and not first:
                break
            if c == "[":
                raise _Unpinnable  # nested / POSIX classes mean different things per engine
            lo, j = _class_atom(p, j, items, names, numeric)
            first = False
            if lo is None:
                continue
            if p[j : j + 1] == "-" and p[j + 1 : j + 2] not in ("]", ""):
                hi, j = _class_atom(p, j + 1, items, names, numeric)
                if hi is None or hi < lo:
                    raise _Unpinnable
                lo_hi = (lo, hi)
            else:
                lo_hi = (lo, lo)
            if items is not None:
                items.append(lo_hi)
    except _Unpinnable:
        end = _class_end(p, i)
        return p[i:end], end
    used |= names
    if items is None:
        return "", j + 1
    return spell_class(_merge(items), negated=negated), j + 1


def _class_atom(
    p: str, j: int, items: list[tuple[int, int]] | None, names: set[str], numeric: Numeric
) -> tuple[int | None, int]:
    """One class item at ``p[j]``: (its code point, next index), or (None, next index) when
    it was a whole set (``\\p{L}``), whose ranges go straight into ``items`` (if any)."""
    if p[j] != "\\":
        return ord(p[j]), j + 1
    kind, value, nxt = _read_escape(p, j)
    if kind == "cp":
        return value, nxt  # type: ignore[return-value]
    if kind == "set":
        negated, name = value  # type: ignore[misc]
        names.add(name)
        if items is not None:
            items.extend(_set_ranges(negated, name, numeric))
        return None, nxt
    raise _Unpinnable


def _class_end(p: str, i: int) -> int:
    """Index after the class that starts at ``p[i]`` (escapes and nesting honoured)."""
    depth, j = 0, i
    while j < len(p):
        c = p[j]
        if c == "\\":
            j += 2
            continue
        if c == "[":
            depth += 1
        elif c == "]" and j > i + 1 and not (j == i + 2 and p[i + 1] == "^"):
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return len(p)


def _pin(pattern: str, numeric: Numeric, spell: bool = True) -> tuple[str, frozenset[str]]:
    """(pinned spelling, names of the classes it pinned); without ``spell`` the same walk
    finds the names alone and the spelling is ``""`` (no ranges merged, nothing spelled)."""
    out: list[str] = []
    used: set[str] = set()
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "[":
            spelled, i = _parse_class(pattern, i, used, numeric, spell)
            out.append(spelled)
            continue
        if c != "\\":
            out.append(c)
            i += 1
            continue
        kind, value, nxt = _read_escape(pattern, i)
        if kind == "set":
            negated, name = value  # type: ignore[misc]
            used.add(name)
            if spell:
                out.append(spell_class(category_ranges(name, numeric), negated=negated))
        elif kind == "cp":
            if spell:  # (a code point past U+10FFFF has no spelling: the compile refuses it)
                out.append(_spell(value, _META))  # type: ignore[arg-type]
        else:
            out.append(value)  # type: ignore[arg-type]
        i = nxt
    return ("".join(out) if spell else ""), frozenset(used)


@cache
def _pin_cached(pattern: str, numeric: Numeric = "regex") -> tuple[str, frozenset[str]]:
    return _pin(pattern, numeric)


@cache
def _pinned_names(pattern: str) -> frozenset[str]:
    """The names :func:`_pin` pins in ``pattern`` (``numeric`` changes ranges, not names),
    without spelling it: what a PinnedRegex needs before its first disputed text."""
    return _pin(pattern, "regex", spell=False)[1]


def pin(pattern: str, numeric: Numeric = "regex") -> str:
    """``pattern`` with every Unicode class pinned to Unicode 16.0.0 (``\\p{N}`` to Rust's
    ``is_numeric`` with ``numeric="rust"``) and every code point spelled the same way for
    Python ``regex``, Rust, Oniguruma and JavaScript."""
    return _pin_cached(pattern, numeric)[0]


# -- where the regex module disagrees -------------------------------------------------------


#: Upper bounds (exclusive) of the prefixes of the code space that a text is decided on
#: before the whole sweep is known, if all its code points are below one: up to Arabic,
#: Indic... (~1 ms to sweep, two classes, quiet machine), then up to U+3000 (~2 ms), against
#: ~160 ms for every scalar. Above the last (CJK, emoji...), see MAX_CHECKED.
PREFIX_BOUNDS: tuple[int, ...] = (0x800, 0x3000)
#: Most distinct code points above the last prefix that a text may hold for them to be
#: checked one by one (~3 us each) before the sweep is known; a text with more takes the
#: pinned compilation while the sweep is pending (compiling SmolLM2's is ~20 ms, once).
MAX_CHECKED = 512

#: (class names, numeric) -> the search for its disputed code points (None: there are none),
#: once the whole code space is swept; filled by :func:`_dispute_search`, read lock-free.
_searches: dict[tuple[frozenset[str], Numeric], re.Pattern[str] | None] = {}
#: Keys of every PinnedRegex built, so that a deferred sweep covers them all.
_in_use: set[tuple[frozenset[str], Numeric]] = set()
#: Keys whose sweep was handed to a ``defer`` -> the pid that did it (a forked child has
#: no builder thread: it sweeps itself).
_deferred: dict[tuple[frozenset[str], Numeric], int] = {}


def _scalars_below(bound: int) -> str:
    """Every scalar value below ``bound``, surrogates excluded, as one string."""
    cps = chain(range(min(bound, _SURROGATES[0])), range(_SURROGATES[1] + 1, bound))
    return array.array("I", cps).tobytes().decode("utf-32-le")


@cache
def _all_scalars() -> str:
    return _scalars_below(_MAX_CP + 1)


def _ranges_text(ranges: Ranges) -> str:
    cps = chain.from_iterable(range(lo, hi + 1) for lo, hi in ranges)
    return array.array("I", cps).tobytes().decode("utf-32-le")


def _text_below(name: str, numeric: Numeric, bound: int) -> str:
    """The code points of ``\\p{name}`` below ``bound``, in order, as one string: from the
    start of each flat table, without merging the whole group (:func:`category_ranges`,
    ~1 ms of the first non-ASCII encode of a fresh process, issue 15)."""
    if name == "WS":
        flats: list[tuple[int, ...]] = [tuple(chain.from_iterable(WHITE_SPACE_RANGES))]
    elif name == "N" and numeric == "rust":
        flats = [RUST_NUMERIC["N"]]
    else:
        flats = [RANGES[cat] for cat in CATEGORY_GROUPS[name]]
    cps: set[int] = set()
    for flat in flats:
        end = 2 * ((bisect_left(flat, bound) + 1) // 2)  # the ranges that start below bound
        for lo, hi in zip(flat[0:end:2], flat[1:end:2], strict=True):
            cps.update(range(lo, min(hi, bound - 1) + 1))
    return array.array("I", sorted(cps)).tobytes().decode("utf-32-le")


@cache
def _disputed_below(name: str, numeric: Numeric, bound: int) -> frozenset[int]:
    """:func:`disputed_code_points` among the scalars below ``bound``."""
    every = _all_scalars() if bound > _MAX_CP else _scalars_below(bound)
    if name == "WS":
        theirs = regex.sub(r"\S+", "", every)
    else:
        theirs = regex.sub(rf"\P{{{name}}}+", "", every)
    ours = _ranges_text(category_ranges(name, numeric)) if bound > _MAX_CP else (
        _text_below(name, numeric, bound))  # fmt: skip
    if theirs == ours:
        return frozenset()
    return frozenset(map(ord, theirs)) ^ frozenset(map(ord, ours))


def disputed_code_points(name: str, numeric: Numeric = "regex") -> frozenset[int]:
    """Code points the installed ``regex`` module puts in ``\\p{name}`` (or ``\\s`` for
    ``WS``) and Unicode 16.0.0 does not, or the reverse. ~80 ms per class, once."""
    return _disputed_below(name, numeric, _MAX_CP + 1)


def _search_of(cps: Iterable[int]) -> re.Pattern[str] | None:
    ranges = _merge((cp, cp) for cp in cps)
    return re.compile(spell_class(ranges)) if ranges else None


def _dispute_search(names: frozenset[str], numeric: Numeric) -> re.Pattern[str] | None:
    """The search for every code point disputed in any of ``names``, sweeping now if need be;
    published with one dict store (PinnedRegex switches to the fast path on it)."""
    key = (names, numeric)
    if key not in _searches:
        disputed = set().union(*(disputed_code_points(n, numeric) for n in names))
        _searches[key] = _search_of(disputed)
    return _searches[key]


@cache
def _prefix_search(names: frozenset[str], numeric: Numeric, bound: int) -> re.Pattern[str] | None:
    """The search for the code points below ``bound`` disputed in any of ``names``."""
    return _search_of(set().union(*(_disputed_below(n, numeric, bound) for n in names)))


@cache
def _band(lo: int, hi: int) -> regex.Pattern[str]:
    """The search for any code point in ``lo..hi``: the ``regex`` module's (``re`` takes
    ~7 ms to compile a class that wide, ``regex`` 0.1 ms)."""
    return regex.compile(spell_class(((lo, hi),)))


@cache
def _member(name: str) -> regex.Pattern[str]:
    return regex.compile(r"\s" if name == "WS" else rf"\p{{{name}}}")


def _is_disputed(cp: int, names: frozenset[str], numeric: Numeric) -> bool:
    """Whether the ``regex`` module and Unicode 16.0.0 disagree on ``cp`` in any of
    ``names``: one code point of :func:`disputed_code_points`, without the sweep."""
    ch = chr(cp)
    for name in names:
        ranges = category_ranges(name, numeric)
        i = bisect_right(ranges, (cp, _MAX_CP)) - 1
        ours = i >= 0 and ranges[i][0] <= cp <= ranges[i][1]
        if ours != (_member(name).match(ch) is not None):
            return True
    return False


def _sweep(keys: tuple[tuple[frozenset[str], Numeric], ...]) -> None:
    for names, numeric in keys:
        _dispute_search(names, numeric)


def defer_dispute_sweep(defer: Callable[[Callable[[], object]], object]) -> None:
    """Hand the whole-space sweep of every PinnedRegex built so far to ``defer`` (e.g.
    ``tokenwire.background.in_background``); until it has run, a text with more than
    :data:`MAX_CHECKED` distinct code points above the prefixes uses the pinned compilation
    instead of sweeping on the caller."""
    pid = os.getpid()
    keys = tuple(k for k in tuple(_in_use) if k not in _searches and _deferred.get(k) != pid)
    if not keys:
        return
    for key in keys:
        _deferred[key] = pid
    # Queued twice over: the first build only queues the sweep again, so that on a FIFO
    # builder (tokenwire.background) it runs after the builds the same load queues next (the
    # detokenizer's tables), which matter more: until then, every decode is per id.
    defer(partial(defer, partial(_sweep, keys)))


class PinnedRegex:
    """One pattern, compiled by the ``regex`` module, with pinned Unicode classes.

    ``pattern`` is the pinned spelling (what tiktoken and other engines are given). Matching
    uses the module's own tables when the text has no code point they dispute, else the
    pinned compilation; the two give the same matches on every text by construction.

    The spelling is made when first asked for (by the pinned compilation, or by whoever
    reads ``pattern``: the tiktoken build, on the builder thread after a deferred load):
    merging and spelling the ranges was ~3-10 ms of a fresh process's first map load
    (issue 15), and a text needs it only if it holds a disputed code point. Until then only
    the names of the pinned classes are known, from the same walk without the ranges.
    """

    __slots__ = ("_exact", "_fast", "_key", "_names", "_numeric", "_pattern", "source")

    def __init__(self, source: str, numeric: Numeric = "regex") -> None:
        self.source = source
        self._numeric = numeric
        self._pattern: str | None = None
        self._names = _pinned_names(source)
        self._key = (self._names, numeric)
        if self._names:
            _in_use.add(self._key)
        self._fast = regex.compile(source)
        self._exact: regex.Pattern[str] | None = None

    @property
    def pattern(self) -> str:
        """The pinned spelling (made on first use; a race spells twice, alike)."""
        if self._pattern is None:
            self._pattern = _pin_cached(self.source, self._numeric)[0]
        return self._pattern

    def compiled_for(self, text: str) -> regex.Pattern[str]:
        if not self._names or text.isascii():
            return self._fast
        if self._key not in _searches:  # entries are only ever added
            return self._before_sweep(text)
        return self._fast_unless(_searches[self._key], text)

    def _before_sweep(self, text: str) -> regex.Pattern[str]:
        """The whole sweep is not known: decide on the first prefix of the code space that
        holds the text, else on the last one and the code points above it one by one."""
        names, numeric = self._names, self._numeric
        for bound in PREFIX_BOUNDS:
            if _band(bound, _MAX_CP).search(text) is None:
                return self._fast_unless(_prefix_search(names, numeric, bound), text)
        bound = PREFIX_BOUNDS[-1]
        search = _prefix_search(names, numeric, bound)
        if search is not None and search.search(text) is not None:
            return self._exact_compiled()
        cps = set(_band(bound, _MAX_CP).findall(text))
        if len(cps) <= MAX_CHECKED:
            disputed = any(_is_disputed(ord(c), names, numeric) for c in cps)
            return self._exact_compiled() if disputed else self._fast
        if _deferred.get(self._key) == os.getpid():
            return self._exact_compiled()  # the sweep is queued: exact by construction
        return self._fast_unless(_dispute_search(names, numeric), text)

    def _fast_unless(self, disputed: re.Pattern[str] | None, text: str) -> regex.Pattern[str]:
        if disputed is None or disputed.search(text) is None:
            return self._fast
        return self._exact_compiled()

    def _exact_compiled(self) -> regex.Pattern[str]:
        if self._exact is None:  # a race compiles twice, harmlessly
            self._exact = regex.compile(self.pattern)
        return self._exact

    def finditer(self, text: str) -> Iterator[regex.Match[str]]:
        return self.compiled_for(text).finditer(text)

    def findall(self, text: str) -> list[str]:
        return self.compiled_for(text).findall(text)

    @property
    def groups(self) -> int:
        return self._fast.groups

    def fullmatch(self, text: str) -> regex.Match[str] | None:
        return self.compiled_for(text).fullmatch(text)
