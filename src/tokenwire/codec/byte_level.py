"""The GPT-2 ``bytes_to_unicode`` table that byte_level vocab keys are written in.

Byte-level BPE (GPT-2, Llama-3, Qwen-2, SmolLM2, the tiktoken encodings) never stores raw
bytes in its vocab: every byte is shown as one printable character. Bytes 0x21-0x7E,
0xA1-0xAC and 0xAE-0xFF stand for themselves; the other 68 bytes take the code points
U+0100..U+0143 in increasing byte order, so 0x20 (space) is ``Ġ`` U+0120 and 0x0A is
``Ċ`` U+010A (codec-spec §3.3). The tokenizer maps text to these characters before merging,
the detokenizer maps vocab keys back through :data:`CHAR_TO_BYTE`.
"""

from __future__ import annotations

__all__ = ["BYTE_TO_CHAR", "CHAR_TO_BYTE", "chars_to_bytes"]


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


def chars_to_bytes(key: str) -> bytes | None:
    """The raw bytes a byte_level vocab key stands for, or ``None`` if a character of the
    key is outside the table (added tokens such as ``<|im start|>`` with a real space)."""
    try:
        return bytes([CHAR_TO_BYTE[c] for c in key])
    except KeyError:
        return None
