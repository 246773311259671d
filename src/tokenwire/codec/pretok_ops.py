"""Pre-tokenizer ops (codec-spec.md §3.5): validate one op dict, spell it as a regex.

Every op of the instruction set is defined in §3.5 by its regex equivalent, and the
equivalence requirement says a v1 program's pieces MUST equal its pattern regex's pieces.
So an op is compiled to exactly that regex (with the explicit classes of
:mod:`tokenwire.codec.unicode_classes`) and executed by the ``regex`` module, whose ordered
alternation and backtracking are the semantics Hugging Face's Oniguruma patterns have.
Hand-written matchers were tried by the reference clients and drifted from their own regexes
(e.g. a lead char that can also be a body char); a regex cannot drift from itself.

Two spellings are produced for each op:

* the plain fragment, used to run the op and to build ``single_regex``;
* a *digit-segment* fragment (``digit_boundary=True``): the same op as it behaves inside
  a piece that a preceding ``digits_isolate individual`` stage cut at every ``\\p{N}``.
  Evaluated on the whole text it never consumes a digit and treats a digit like the end
  of the piece (``(?!\\S)`` becomes ``(?![^\\s\\p{N}])``). That is what lets the SmolLM2
  program ``[digits_isolate individual, alternation(...)]`` be one regex. ``None`` means the
  op cannot be spelled that way (a literal containing a digit); the caller then gives up
  on a single regex rather than guess.

An unknown op, an unknown parameter or a parameter of the wrong type raises
:class:`UnsupportedProgram` naming it: never guess (§3.5).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tokenwire.codec.pinned_regex import PinnedRegex, spell_literal
from tokenwire.codec.unicode_classes import (
    ASCII_PUNCT_CLASS,
    NOT_WS_CLASS,
    WS,
    WS_CLASS,
    escape_chars,
)
from tokenwire.errors import UnsupportedProgram

__all__ = ["OP_PARAMS", "CompiledOp", "case_insensitive", "compile_op", "escape_literal"]

#: Parameters each op accepts (codec-spec.md §3.5 table). Anything else is refused.
OP_PARAMS: dict[str, frozenset[str]] = {
    "literals_ci": frozenset({"patterns"}),
    "literals": frozenset({"patterns"}),
    "letters": frozenset({"lead_other", "lead_space", "lead_other_class", "body"}),
    "numbers": frozenset({"max_run", "lead_space"}),
    "punct_run": frozenset({"lead_space", "trailing_newlines", "trailing_chars", "charset"}),
    "punct_ascii_letters": frozenset(),
    "newline_block": frozenset(),
    "trailing_ws": frozenset(),
    "ws_run": frozenset(),
    "letters_cased": frozenset({"kind", "lead_other", "trailing_ci"}),
    "metaspace_split": frozenset({"prefix_first"}),
}

_META = frozenset("\\.^$|?*+()[]{}")
_UPPER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_LEAD_OTHER = {"l_n": r"[^\r\n\p{L}\p{N}]?", "l_p_s": r"[^\r\n\p{L}\p{P}\p{S}]?"}
# Inside a digit-free segment the lead can never be a digit: l_p_s admits \p{N}, so
# exclude it explicitly (l_n already does).
_LEAD_OTHER_NO_DIGIT = {"l_n": r"[^\r\n\p{L}\p{N}]?", "l_p_s": r"[^\r\n\p{L}\p{P}\p{S}\p{N}]?"}
_BODY = {"L": r"\p{L}+", "L_M": r"[\p{L}\p{M}]+"}
_PUNCT_CHARSET = {"not_ws_L_N": f"[^{WS}\\p{{L}}\\p{{N}}]+", "p_s": r"[\p{P}\p{S}]+"}
_DIGIT = PinnedRegex(r"\p{N}")


@dataclass(frozen=True, slots=True)
class CompiledOp:
    """One op: its regex, its digit-segment regex, and which classes it always covers."""

    kind: str
    fragment: str | None  # None: the op can never match (an empty literal list)
    digit_fragment: str | None
    digit_safe: bool  # False: no digit-segment spelling exists
    covers: frozenset[str]  # subset of {"L", "N", "WS", "OTHER"}


def escape_literal(text: str) -> str:
    """Spell a literal for both the ``regex`` module and Rust regex (no ``\\'``-style escapes)."""
    return escape_chars(text, _META)


# Simple case folding (what every engine's (?i) uses) joins exactly two non-ASCII code
# points to ASCII letters: U+017F LONG S to s and U+212A KELVIN SIGN to k.
_ASCII_FOLDS = {"s": "\u017f", "k": "\u212a"}


def case_insensitive(text: str) -> str:
    """``(?i:text)`` without an inline flag group, which JavaScript before ES2025 cannot
    parse: each ASCII letter becomes the class of its case-fold equivalents (``[sS\u017f]``).
    A non-ASCII cased character keeps a one-character ``(?i:..)`` group."""
    out = []
    for ch in text:
        low = ch.lower()
        if ch.isascii() and ch.isalpha():
            out.append(f"[{low}{low.upper()}{_ASCII_FOLDS.get(low, '')}]")
        elif low != ch.upper() or low != ch:
            out.append(f"(?i:{spell_literal(ch)})")
        else:
            out.append(spell_literal(ch))
    return "".join(out)


def _flag(op: Mapping[str, Any], name: str) -> bool:
    value = op.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise UnsupportedProgram(f"op {op['op']!r}: `{name}` must be a boolean, got {value!r}")
    return value


def _choice(op: Mapping[str, Any], name: str, choices: Mapping[str, str], default: str) -> str:
    value = op.get(name)
    if value is None:
        return default
    if value not in choices:
        raise UnsupportedProgram(
            f"op {op['op']!r}: unknown `{name}` {value!r} (known: {', '.join(choices)})"
        )
    return value


def _literal_list(op: Mapping[str, Any], name: str) -> list[str]:
    value = op.get(name)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise UnsupportedProgram(f"op {op['op']!r}: `{name}` must be a list of strings")
    # Longest first: the op matches the longest listed literal (§3.5), while a regex
    # alternation takes the first one that matches.
    unique = dict.fromkeys(p for p in value if p)
    return sorted(unique, key=len, reverse=True)


def _max_run(op: Mapping[str, Any]) -> int | None:
    value = op.get("max_run")
    if value is None or value == 0:  # 0 = unbounded, as the reference clients read it
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise UnsupportedProgram(f"op {op['op']!r}: `max_run` must be an integer >= 1")
    return value


def _literals(op: Mapping[str, Any], *, ci: bool) -> CompiledOp:
    patterns = _literal_list(op, "patterns")
    if not patterns:
        return CompiledOp(op["op"], None, None, True, frozenset())
    spell = case_insensitive if ci else escape_literal
    fragment = "(?:" + "|".join(map(spell, patterns)) + ")"
    safe = not any(_DIGIT.findall(p) for p in patterns)
    return CompiledOp(op["op"], fragment, fragment if safe else None, safe, frozenset())


def _letters(op: Mapping[str, Any]) -> CompiledOp:
    lead_other, lead_space = _flag(op, "lead_other"), _flag(op, "lead_space")
    if lead_other and lead_space:
        raise UnsupportedProgram("op 'letters': `lead_other` and `lead_space` are exclusive")
    cls = _choice(op, "lead_other_class", _LEAD_OTHER, "l_n")
    body = _BODY[_choice(op, "body", _BODY, "L")]
    if lead_other:
        frag, dfrag = _LEAD_OTHER[cls] + body, _LEAD_OTHER_NO_DIGIT[cls] + body
    else:
        frag = dfrag = (" ?" if lead_space else "") + body
    return CompiledOp("letters", frag, dfrag, True, frozenset({"L"}))


def _letters_cased(op: Mapping[str, Any]) -> CompiledOp:
    kind = _choice(op, "kind", {"title": "", "upper": ""}, "")
    if not kind:
        raise UnsupportedProgram("op 'letters_cased': `kind` is required (title or upper)")
    run = f"{_UPPER}*{_LOWER}+" if kind == "title" else f"{_UPPER}+{_LOWER}*"
    lead = _LEAD_OTHER["l_n"] if _flag(op, "lead_other") else ""
    trailing = _literal_list(op, "trailing_ci")
    tail = "(?:" + "|".join(map(case_insensitive, trailing)) + ")?" if trailing else ""
    safe = not any(_DIGIT.findall(p) for p in trailing)
    frag = lead + run + tail
    return CompiledOp("letters_cased", frag, frag if safe else None, safe, frozenset({kind}))


def _numbers(op: Mapping[str, Any]) -> CompiledOp:
    k = _max_run(op)
    run = r"\p{N}+" if k is None else rf"\p{{N}}{{1,{k}}}"
    frag = (" ?" if _flag(op, "lead_space") else "") + run
    # Inside a digit-free segment the op can never match: drop it (digit_fragment None,
    # digit_safe True).
    return CompiledOp("numbers", frag, None, True, frozenset({"N"}))


def _punct_run(op: Mapping[str, Any]) -> CompiledOp:
    charset = _choice(op, "charset", _PUNCT_CHARSET, "not_ws_L_N")
    frag = (" ?" if _flag(op, "lead_space") else "") + _PUNCT_CHARSET[charset]
    trailing_chars = op.get("trailing_chars")
    safe = True
    if trailing_chars is not None:
        if not isinstance(trailing_chars, str):
            raise UnsupportedProgram("op 'punct_run': `trailing_chars` must be a string")
        if trailing_chars:
            frag += "[" + "".join(escape_literal(c) if c not in "]^-" else "\\" + c
                                  for c in trailing_chars) + "]*"
        safe = not _DIGIT.findall(trailing_chars)
    elif _flag(op, "trailing_newlines"):
        frag += r"[\r\n]*"
    covers = frozenset({"OTHER"}) if charset == "not_ws_L_N" else frozenset()
    return CompiledOp("punct_run", frag, frag if safe else None, safe, covers)


def _fixed(kind: str, frag: str, digit_frag: str, covers: frozenset[str]) -> CompiledOp:
    return CompiledOp(kind, frag, digit_frag, True, covers)


def compile_op(op: Any) -> CompiledOp:
    """Validate one op dict and return its regex spellings; refuse anything unknown."""
    if not isinstance(op, Mapping) or not isinstance(op.get("op"), str):
        raise UnsupportedProgram(f"an op must be an object with a string `op`, got {op!r}")
    kind = op["op"]
    if kind not in OP_PARAMS:
        raise UnsupportedProgram(f"unknown pre-tokenizer op {kind!r}")
    unknown = set(op) - OP_PARAMS[kind] - {"op"}
    if unknown:
        raise UnsupportedProgram(f"op {kind!r}: unknown parameter(s) {sorted(unknown)}")
    match kind:
        case "literals_ci" | "literals":
            return _literals(op, ci=kind == "literals_ci")
        case "letters":
            return _letters(op)
        case "letters_cased":
            return _letters_cased(op)
        case "numbers":
            return _numbers(op)
        case "punct_run":
            return _punct_run(op)
        case "punct_ascii_letters":
            return _fixed(kind, ASCII_PUNCT_CLASS + "[A-Za-z]+", ASCII_PUNCT_CLASS + "[A-Za-z]+",
                          frozenset())
        case "newline_block":
            frag = f"{WS_CLASS}*[\\r\\n]+"
            return _fixed(kind, frag, frag, frozenset())
        case "trailing_ws":
            # \s+(?!\S): inside a digit segment a following digit is the piece's end.
            return _fixed(kind, f"{WS_CLASS}+(?!{NOT_WS_CLASS})",
                          f"{WS_CLASS}+(?![^{WS}\\p{{N}}])", frozenset())
        case "ws_run":
            return _fixed(kind, f"{WS_CLASS}+", f"{WS_CLASS}+", frozenset({"WS"}))
    # metaspace_split is not a regex op; the program compiler handles it before us.
    raise UnsupportedProgram(f"op {kind!r} is only valid as the single op of a v1 program")
