"""Explicit character classes for the pre-tokenizer, written as regex class bodies.

The oracle is Hugging Face ``tokenizers``: its Split/ByteLevel regexes run on Oniguruma,
where ``\\s`` is Unicode White_Space; ``Digits`` uses Rust ``char::is_numeric`` (general
categories Nd, Nl, No = ``\\p{N}``); ``Punctuation`` uses ``is_ascii_punctuation`` or a
Unicode ``P*`` category. codec-spec.md §3.5 (caveats) and §10 item 7 ask for explicit
tables instead of the runtime's notion of "space": Python's ``str.isspace()`` also accepts
U+001C..U+001F, which are not White_Space, and JavaScript's ``\\s`` adds U+FEFF.

Every class here is written so the same text means the same set in the ``regex`` module
and in Rust ``regex``/``fancy-regex`` (what tiktoken compiles): code points are spelled
``\\xHH`` / ``\\uHHHH``, never as raw characters, and ``\\s`` is never used.
"""

from __future__ import annotations

__all__ = [
    "ASCII_PUNCT",
    "ASCII_PUNCT_CLASS",
    "CJK_CLASS",
    "CJK_RANGES",
    "NOT_WS_CLASS",
    "WHITE_SPACE",
    "WS",
    "WS_CLASS",
    "class_escape",
    "escape_chars",
]

#: Unicode White_Space=Yes (PropList.txt; unchanged since Unicode 6.3, when U+180E left).
#: The 25 code points Oniguruma's and Rust's ``\s`` match. U+001C..U+001F, U+180E, U+200B
#: and U+FEFF are deliberately absent.
WHITE_SPACE: tuple[int, ...] = (
    0x0009, 0x000A, 0x000B, 0x000C, 0x000D, 0x0020, 0x0085, 0x00A0,
    0x1680, 0x2000, 0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006,
    0x2007, 0x2008, 0x2009, 0x200A, 0x2028, 0x2029, 0x202F, 0x205F,
    0x3000,
)  # fmt: skip

#: Class body (no brackets) for White_Space, to splice into larger classes.
WS = r"\t-\r\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
WS_CLASS = f"[{WS}]"
NOT_WS_CLASS = f"[^{WS}]"

#: The 32 characters of Rust/HF ``is_ascii_punctuation``: ``!``..``/``, ``:``..``@``,
#: ``[``..backtick, ``{``..``~`` (several are Unicode symbols, Sm/Sc/Sk, not P*).
ASCII_PUNCT: frozenset[str] = frozenset(
    chr(c)
    for lo, hi in ((0x21, 0x2F), (0x3A, 0x40), (0x5B, 0x60), (0x7B, 0x7E))
    for c in range(lo, hi + 1)
)
ASCII_PUNCT_CLASS = r"[!-/:-@\[-`{-~]"

#: DeepSeek-V3's literal ranges ``[一-龥぀-ゟ゠-ヿ]``: CJK ideographs up to U+9FA5 only (not
#: the whole block), Hiragana, Katakana. Literal ranges, not categories (§3.5).
CJK_RANGES: tuple[tuple[int, int], ...] = ((0x4E00, 0x9FA5), (0x3040, 0x309F), (0x30A0, 0x30FF))
CJK_CLASS = "[" + "".join(f"\\u{lo:04x}-\\u{hi:04x}" for lo, hi in CJK_RANGES) + "]"

# Characters that need a backslash inside a class in both regex dialects.
_CLASS_SPECIAL = frozenset("\\]^-[")


def escape_chars(chars: str, special: frozenset[str]) -> str:
    """Spell ``chars`` portably for the ``regex`` module and Rust regex: a backslash before
    each ``special`` character, printable ASCII as is, everything else as a hex escape
    (never ``\\'``-style escapes, which Rust rejects)."""
    out = []
    for ch in chars:
        cp = ord(ch)
        if ch in special:
            out.append("\\" + ch)
        elif 0x21 <= cp <= 0x7E:
            out.append(ch)
        elif cp <= 0xFF:
            out.append(f"\\x{cp:02x}")
        elif cp <= 0xFFFF:
            out.append(f"\\u{cp:04x}")
        else:
            out.append(f"\\U{cp:08x}")
    return "".join(out)


def class_escape(chars: str) -> str:
    """Spell ``chars`` as the body of a character class, portable across regex dialects."""
    return escape_chars(chars, _CLASS_SPECIAL)
