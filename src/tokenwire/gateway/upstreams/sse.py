"""A sans-IO incremental parser for server-sent events, as upstreams send them.

Every HTTP upstream adapter (OpenAI-compatible, Responses, Anthropic) reads an
``text/event-stream`` body; this is the one parser they share (STYLE §6 item 2: an object fed
bytes, ``feed(data) -> list[SSEEvent]`` plus ``feed_eof()``). It follows the WHATWG HTML
"Server-sent events" parsing rules (§9.2.6 "Interpreting an event stream"):

* lines end with CRLF, LF or CR; a CR at the end of one chunk followed by LF at the start of
  the next is one line end, not two;
* ``:`` starts a comment line (engines send ``: ping`` keep-alives) and is ignored;
* ``field: value`` with one optional space after the colon removed; ``data`` lines of one
  event are joined with ``\\n``; a blank line dispatches the event; an event with no data
  is not dispatched;
* the event type defaults to ``message``; ``id`` persists to later events (the spec's "last
  event ID"), and an ``id`` containing NUL is ignored; unknown fields are ignored;
* a UTF-8 BOM at the very start is dropped; invalid UTF-8 decodes with U+FFFD.

One deliberate departure, at end of stream: the spec discards an event that was not
followed by a blank line. An upstream that closes right after ``data: [DONE]\\n`` (or after
an error payload) has still told us something, and the adapter decides whether the stream
ended properly from its own terminal (a ``finish_reason``), so :meth:`SSEDecoder.feed_eof`
dispatches such an event. A line cut off without its line end is different: that is a
partial frame, and ``feed_eof`` raises :class:`~tokenwire.errors.TruncatedStream`.

Another, for llama.cpp's ``llama-server``: builds of it send an error in a stream as a line
``error: {...}`` (a field the spec ignores) followed by ``data: [DONE]``. Ignored, the
error's message and class were lost and the stream read as one cut short; such a line is
read as ``event: error`` with that ``data``, the shape other servers send.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenwire.errors import FrameTooLarge, TruncatedStream

__all__ = ["DEFAULT_MAX_EVENT_BYTES", "DEFAULT_MAX_LINE_BYTES", "SSEDecoder", "SSEEvent"]

#: Longest line we buffer. A chunk is one JSON line; the largest legitimate ones carry a
#: whole prompt's ids (vLLM ``prompt_token_ids`` with ``return_token_ids``: ~8 bytes per id,
#: so 128k tokens is ~1 MiB) or logprobs. 8 MiB is far above that and still bounds the
#: memory a broken or hostile upstream can make us hold before a line end.
DEFAULT_MAX_LINE_BYTES = 8 * 1024 * 1024
#: Longest event (all its ``data`` lines joined): the same reasoning, a little more room.
DEFAULT_MAX_EVENT_BYTES = 16 * 1024 * 1024

_BOM = "\ufeff"


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched event. ``id`` is the last event ID seen so far (it persists)."""

    event: str
    data: str
    id: str | None = None


class SSEDecoder:
    """Feed it body bytes as they arrive; it returns the events completed by each chunk."""

    def __init__(
        self,
        *,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    ) -> None:
        self._max_line = max_line_bytes
        self._max_event = max_event_bytes
        self._buf = bytearray()
        self._skip_lf = False  # the previous chunk ended in CR: a leading LF is its pair
        self._first_line = True  # for the BOM check
        self._data: list[str] = []
        self._data_len = 0
        self._has_data = False
        self._event = ""
        self._last_id: str | None = None
        self._closed = False

    def feed(self, data: bytes) -> list[SSEEvent]:
        """Parse ``data``; return every event it completed (possibly none)."""
        if self._closed:
            raise TruncatedStream("SSE data fed after feed_eof()")
        if not data:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if data[:1] == b"\n":
                data = data[1:]
        if not self._buf and data[-1:] == b"\n" and b"\r" not in data:
            if data[:6] == b"data: " and data.find(b"\n") == len(data) - 2 \
                    and not (self._has_data or self._event or self._first_line):
                return [self._single_event(data)]
            return self._whole_lines(data)
        self._buf += data
        out: list[SSEEvent] = []
        start = 0
        buf = self._buf
        while True:
            end, after = _find_line_end(buf, start)
            if end < 0:
                break
            if after < 0:  # a CR that ends the buffer: its LF, if any, is in the next chunk
                self._skip_lf = True
                after = end + 1
            if end - start > self._max_line:
                raise FrameTooLarge(f"SSE line longer than {self._max_line} bytes")
            self._line(bytes(buf[start:end]), out)
            start = after
        del buf[:start]
        if len(buf) > self._max_line:
            raise FrameTooLarge(
                f"SSE line longer than {self._max_line} bytes without a line end"
            )
        return out

    def feed_eof(self) -> list[SSEEvent]:
        """The body ended. Returns a final event not followed by a blank line (see module
        docstring); raises :class:`TruncatedStream` if a line was cut off mid-way."""
        self._closed = True
        if self._buf:
            size = len(self._buf)
            self._buf.clear()
            raise TruncatedStream(f"SSE stream ended inside a line ({size} bytes buffered)")
        out: list[SSEEvent] = []
        self._dispatch(out)
        return out

    # -- internals ----------------------------------------------------------------------

    def _whole_lines(self, data: bytes) -> list[SSEEvent]:
        """The common chunk (BENCHMARKS.md, "The hot path"): whole LF-ended lines and no
        CR, nothing buffered before it, so no line end can straddle a chunk; the same
        events as the general loop, without copying through the buffer."""
        out: list[SSEEvent] = []
        lines = data.split(b"\n")
        lines.pop()  # the empty piece after the final LF
        for raw in lines:
            if len(raw) > self._max_line:
                raise FrameTooLarge(f"SSE line longer than {self._max_line} bytes")
            if raw[:6] == b"data: " and not self._first_line:
                self._data_line(raw[6:].decode("utf-8", "replace"))
            else:
                self._line(raw, out)
        return out

    def _single_event(self, data: bytes) -> SSEEvent:
        """``data: <value>\\n\\n`` and nothing before it: the chunk an upstream sends for
        each token. Its event at once, as :meth:`_whole_lines` would dispatch it (the two
        lines' walk was ~10 % of the gateway's profiled CPU per token at 64 streams)."""
        if len(data) - 2 > self._max_line:
            raise FrameTooLarge(f"SSE line longer than {self._max_line} bytes")
        value = data[6:-2].decode("utf-8", "replace")
        if len(value) + 1 > self._max_event:
            raise FrameTooLarge(f"SSE event longer than {self._max_event} bytes")
        return SSEEvent("message", value, self._last_id)

    def _data_line(self, value: str) -> None:
        self._data_len += len(value) + 1
        if self._data_len > self._max_event:
            raise FrameTooLarge(f"SSE event longer than {self._max_event} bytes")
        self._data.append(value)
        self._has_data = True

    def _line(self, raw: bytes, out: list[SSEEvent]) -> None:
        line = raw.decode("utf-8", "replace")
        if self._first_line:
            self._first_line = False
            if line.startswith(_BOM):
                line = line[1:]
        if not line:
            self._dispatch(out)
            return
        if line[0] == ":":
            return  # a comment: keep-alive pings
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data_line(value)
        elif name == "event":
            self._event = value
        elif name == "error":  # llama-server's error line (module docstring)
            self._event = "error"
            self._data_line(value)
        elif name == "id":
            if "\0" not in value:
                self._last_id = value
        # "retry" only matters to a reconnecting browser; other fields are ignored (spec).

    def _dispatch(self, out: list[SSEEvent]) -> None:
        if self._has_data:
            out.append(SSEEvent(self._event or "message", "\n".join(self._data), self._last_id))
        self._data = []
        self._data_len = 0
        self._has_data = False
        self._event = ""


def _find_line_end(buf: bytearray, start: int) -> tuple[int, int]:
    """(index of the line end, index after it); (-1, -1) if none; (i, -1) for a final CR."""
    lf = buf.find(b"\n", start)
    cr = buf.find(b"\r", start, lf if lf >= 0 else len(buf))
    if cr < 0:
        return (lf, lf + 1) if lf >= 0 else (-1, -1)
    if cr + 1 < len(buf):
        return cr, cr + 2 if buf[cr + 1] == 0x0A else cr + 1
    return cr, -1
