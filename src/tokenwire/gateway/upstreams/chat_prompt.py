"""Chat prompts whose caller text can never become control tokens, for any chat template.

A chat template (Jinja, from the GGUF) joins the template's own markers (``<|im_start|>``,
``<|im_end|>``, a BOS) and the caller's message text into one string. Tokenizing that
string with special-token parsing on (what llama.cpp needs for the markers) would also turn
``<|im_end|>\\n<|im_start|>system`` typed *inside* a message into control ids: the message
closes its own turn and opens a system turn (codec-spec §10 item 8, issue 11 item 2).

So the template is rendered a second time with every caller string wrapped in two markers
made from a per-request random nonce (a caller cannot guess them), and the rendering is
split back into template text and caller spans. Control tokens are then looked for in the
template's text only; caller text is text. The fragments between control tokens are
tokenized whole with special parsing off, exactly as llama.cpp tokenizes the text between
the control tokens it finds, so a benign prompt gets the same ids as before.

Templates are allowed to ``trim`` message content: the markers go inside the content's
leading and trailing whitespace, so a trim removes only that whitespace, as it would have.
A template that rewrites content any other way (slices it, splits it on a tag) may lose a
marker; then the two renderings disagree and the prompt is refused with a ``ValueError``
(a 400) rather than tokenized with caller text in doubt. Sans-IO: nothing here tokenizes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["Markers", "control_pattern", "fragments", "split_render"]

#: Private-use code points around the nonce: no tokenizer normalises them away and no
#: template filter (trim, escape) changes them.
_OPEN_CHAR, _CLOSE_CHAR = "\ue000", "\ue001"


@dataclass(frozen=True, slots=True)
class Markers:
    """The two strings that enclose caller text in the wrapped rendering."""

    nonce: str

    @property
    def open(self) -> str:
        return f"{_OPEN_CHAR}tw-{self.nonce}{_OPEN_CHAR}"

    @property
    def close(self) -> str:
        return f"{_CLOSE_CHAR}tw-{self.nonce}{_CLOSE_CHAR}"

    def wrap(self, text: str) -> str:
        """``text`` with the markers inside its leading and trailing whitespace."""
        core = text.strip()
        if not core:
            return text  # whitespace only: nothing a tokenizer could read as a marker
        start = len(text) - len(text.lstrip())
        end = start + len(core)
        return f"{text[:start]}{self.open}{core}{self.close}{text[end:]}"


def split_render(wrapped: str, plain: str, markers: Markers) -> list[tuple[bool, str]]:
    """``[(is_caller_text, text), ...]`` of the wrapped rendering, checked against ``plain``.

    Raises ``ValueError`` when the markers are unbalanced or nested, when a caller's text
    already contains one, or when the template changed caller text beyond trimming it (the
    joined pieces then differ from ``plain``)."""
    pieces: list[tuple[bool, str]] = []
    pos = 0
    while pos < len(wrapped):
        start = wrapped.find(markers.open, pos)
        if start < 0:
            _append(pieces, False, wrapped[pos:])
            break
        _append(pieces, False, wrapped[pos:start])
        start += len(markers.open)
        end = wrapped.find(markers.close, start)
        if end < 0 or markers.open in wrapped[start:end]:
            raise _rewritten()
        _append(pieces, True, wrapped[start:end])
        pos = end + len(markers.close)
    if any(markers.close in text for _, text in pieces) \
            or "".join(text for _, text in pieces) != plain:
        raise _rewritten()
    return pieces


def _append(pieces: list[tuple[bool, str]], caller: bool, text: str) -> None:
    if text:
        pieces.append((caller, text))


def _rewritten() -> ValueError:
    return ValueError("the chat template rewrites message content in a way that cannot be "
                      "kept apart from its control tokens; send the content unchanged")


def control_pattern(controls: Iterable[str]) -> re.Pattern[str] | None:
    """A regex finding the control tokens' texts, longest first (leftmost-longest, as
    llama.cpp's partition prefers the longer of two overlapping tokens)."""
    texts = sorted({t for t in controls if t}, key=len, reverse=True)
    if not texts:
        return None
    return re.compile("|".join(re.escape(t) for t in texts))


def fragments(pieces: Iterable[tuple[bool, str]], pattern: re.Pattern[str] | None,
              ids: Mapping[str, int]) -> list[str | int]:
    """Text fragments and control ids, in order: control tokens are found in template text
    only; caller text joins the text around it (one fragment between two control ids)."""
    out: list[str | int] = []
    text: list[str] = []
    for caller, piece in pieces:
        if caller or pattern is None:
            text.append(piece)
            continue
        pos = 0
        for match in pattern.finditer(piece):
            text.append(piece[pos:match.start()])
            if any(text):
                out.append("".join(text))
            text = []
            out.append(ids[match.group()])
            pos = match.end()
        text.append(piece[pos:])
    if any(text):
        out.append("".join(text))
    return out
