"""The model's text -> plain text and tool calls (the ``<tool_call>`` convention).

:class:`CallScanner` is fed the answer's text as it is generated and returns what can be
shown: text as soon as it cannot be the start of ``<tool_call>`` (only a possible prefix of
the tag, at most 10 characters, is held back), and one :class:`ParsedCall` per complete
``<tool_call>...</tool_call>`` whose body is ``{"name": <declared tool>, "arguments":
<object>}`` (a string for a custom tool). Anything else, an unknown name, a body that is not
that JSON, a call cut off by the end of the answer, comes back as the text it was: a
malformed call is never passed on as a call. Whitespace between and after calls is dropped.

Sans-IO: no engine, no clock; the engine decides when a started call is constrained
(``in_call``, ``call_start``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from tokenwire.gateway.ir import ToolSpec
from tokenwire.gateway.upstreams.json_schema_grammar import CALL_CLOSE, CALL_OPEN

__all__ = ["CallScanner", "ParsedCall"]


@dataclass(frozen=True, slots=True)
class ParsedCall:
    """One well-formed call: ``arguments`` is JSON text (function) or the input (custom)."""

    name: str
    arguments: str
    kind: str = "function"


class CallScanner:
    """See the module docstring. ``feed`` and ``flush`` return text pieces and calls."""

    def __init__(self, tools: Sequence[ToolSpec]) -> None:
        self._tools = {t.name: t for t in tools}
        self._buf = ""
        self._offset = 0  # characters of the answer before ``_buf``
        self.in_call = False
        #: Where the open call's ``<tool_call>`` starts in the answer's text.
        self.call_start = -1
        self.calls = 0

    def feed(self, text: str) -> list[str | ParsedCall]:
        self._buf += text
        out: list[str | ParsedCall] = []
        while True:
            if not self.in_call:
                at = self._buf.find(CALL_OPEN)
                if at < 0:
                    keep = _prefix_len(self._buf, CALL_OPEN)
                    self._text(out, len(self._buf) - keep)
                    return out
                self._text(out, at)
                self.in_call, self.call_start = True, self._offset
                continue
            end = self._buf.find(CALL_CLOSE)
            if end < 0:
                return out
            whole = self._buf[:end + len(CALL_CLOSE)]
            call = self._parse(self._buf[len(CALL_OPEN):end])
            if call is not None:
                self.calls += 1
            out.append(call if call is not None else whole)
            self._consume(len(whole))
            self.in_call = False

    def restart_call(self) -> None:
        """Forget what followed ``<tool_call>`` (the engine regenerates it, constrained)."""
        if self.in_call:
            self._buf = CALL_OPEN

    def flush(self) -> list[str | ParsedCall]:
        """The end of the answer: held text and an unfinished call come back as text."""
        out: list[str | ParsedCall] = []
        self._text(out, len(self._buf))
        self.in_call = False
        return out

    def _text(self, out: list[str | ParsedCall], n: int) -> None:
        piece = self._buf[:n]
        self._consume(n)
        if piece and not (self.calls and not piece.strip()):
            out.append(piece)

    def _consume(self, n: int) -> None:
        self._buf = self._buf[n:]
        self._offset += n

    def _parse(self, body: str) -> ParsedCall | None:
        try:
            value = json.loads(body)
        except ValueError:
            return None
        if not isinstance(value, dict) or set(value) != {"name", "arguments"}:
            return None
        tool = self._tools.get(value["name"]) if isinstance(value["name"], str) else None
        args = value["arguments"]
        if tool is None:
            return None
        if tool.kind == "custom":
            return ParsedCall(tool.name, args, "custom") if isinstance(args, str) else None
        if not isinstance(args, dict):
            return None
        return ParsedCall(tool.name, json.dumps(args, ensure_ascii=False))


def _prefix_len(text: str, tag: str) -> int:
    """The longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
