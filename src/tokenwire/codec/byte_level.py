"""The GPT-2 ``bytes_to_unicode`` table that byte_level vocab keys are written in.

Byte-level BPE (GPT-2, Llama-3, Qwen-2, SmolLM2, the tiktoken encodings) never stores raw
bytes in its vocab: every byte is shown as one printable character. Bytes 0x21-0x7E,
0xA1-0xAC and 0xAE-0xFF stand for themselves; the other 68 bytes take the code points
U+0100..U+0143 in increasing byte order, so 0x20 (space) is ``Ġ`` U+0120 and 0x0A is
``Ċ`` U+010A (codec-spec §3.3). The tokenizer maps text to these characters before merging,
the detokenizer maps vocab keys back through :data:`CHAR_TO_BYTE`.
"""

from __future__ import annotations

import codecs
from itertools import accumulate

__all__ = [
    "BYTE_TO_CHAR",
    "CHAR_TO_BYTE",
    "chars_to_bytes",
    "chars_to_bytes_bulk",
]


def _bytes_to_unicode() -> list[str]:
    kept = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    kept_set = set(kept)
    table: list[str] = [""] * 256
    for b in kept:
        table[b] = chr(b)
    shifted = 0
    for b in range(256):
        if b not in kept_set:
            table[b] = chr(0x100 + shifted)
            shifted += 1
    return table


#: byte value -> the printable character that stands for it in byte_level vocab keys.
BYTE_TO_CHAR: list[str] = _bytes_to_unicode()

#: the inverse of :data:`BYTE_TO_CHAR`.
CHAR_TO_BYTE: dict[str, int] = {c: b for b, c in enumerate(BYTE_TO_CHAR)}


# A single-byte codec, exactly like cp1252's: characters of the table encode to their byte
# in C, any other character (a real space, U+2581, ...) raises UnicodeEncodeError.
_ENCODING_MAP = codecs.charmap_build("".join(BYTE_TO_CHAR))


def chars_to_bytes(key: str) -> bytes | None:
    """The raw bytes a byte_level vocab key stands for, or ``None`` if a character of the
    key is outside the table (added tokens such as ``<|im start|>`` with a real space)."""
    try:
        return codecs.charmap_encode(key, "strict", _ENCODING_MAP)[0]
    except UnicodeEncodeError:
        return None


def chars_to_bytes_bulk(keys: list[str]) -> list[bytes | None]:
    """:func:`chars_to_bytes` of every key with one encode of the joined keys.

    Map load-to-ready time is dominated by this conversion on 50k-200k vocabularies. Every
    table character is one byte, so the output splits back at the keys' character offsets.
    If some key is outside the table, every key takes the per-key path.
    """
    try:
        data = codecs.charmap_encode("".join(keys), "strict", _ENCODING_MAP)[0]
    except UnicodeEncodeError:
        return [chars_to_bytes(key) for key in keys]
    ends = list(accumulate(map(len, keys)))
    starts = [0, *ends[:-1]]
    return [data[a:b] for a, b in zip(starts, ends, strict=True)]
