"""Sans-IO decoding of an HTTP/1.1 chunked body (RFC 9112 §7.1), for upstream streams.

Why not h11 here, when h11 parses the response head (:mod:`.http_transport`): a streamed
upstream answers one chunk per SSE event, and h11 spends two ``next_event`` calls (its
state machine, event objects, a bytearray copy) on each: 18 % of the gateway's busy CPU at
one stream in the profile (BENCHMARKS.md, "The hot path"). This decoder does one ``find``
and one slice per chunk. It is as strict as h11 where it matters: a hex size of at most
:data:`MAX_SIZE_DIGITS` digits, CRLF after every chunk's data, extensions ignored, the
trailer section read and bounded; anything else is :class:`ChunkedError`.
"""

from __future__ import annotations

import re

__all__ = ["MAX_LINE_BYTES", "MAX_SIZE_DIGITS", "ChunkedDecoder", "ChunkedError"]

#: A chunk-size line (with its extensions) or the whole trailer section longer than this is
#: refused: h11's limit for an incomplete event in this gateway (the response head's limit).
MAX_LINE_BYTES = 100 * 1024
#: 16 hex digits is a 64-bit size; a longer one is an attack on the size parse, not a body.
MAX_SIZE_DIGITS = 16

_SIZE = re.compile(rb"([0-9A-Fa-f]{1,%d})[ \t]*(?:;.*)?" % MAX_SIZE_DIGITS, re.DOTALL)
_SIZE_LINE, _DATA, _DATA_END, _TRAILER, _DONE = range(5)


class ChunkedError(ValueError):
    """The body is not valid chunked coding."""


class ChunkedDecoder:
    """Feed the bytes after the head; get the body's bytes back, one piece per chunk (as h11
    gives them: a reader that fails on one chunk has had every chunk before it); :attr:`done`
    once the last chunk and the trailer section have arrived. Bytes after the end are kept in
    :attr:`extra` (the connection then cannot carry another response)."""

    def __init__(self) -> None:
        self._buf = b""
        self._state = _SIZE_LINE
        self._left = 0  # bytes of the current chunk's data still to come
        self._trailer = 0  # bytes of trailer lines so far
        self.extra = b""

    @property
    def done(self) -> bool:
        return self._state == _DONE

    def feed(self, data: bytes) -> list[bytes]:
        if self._state == _DONE:
            self.extra += data
            return []
        buf = self._buf + data if self._buf else data
        out: list[bytes] = []
        pos, end = 0, len(buf)
        while pos < end:
            state = self._state
            if state == _DATA:
                take = min(self._left, end - pos)
                out.append(buf[pos:pos + take])
                pos += take
                self._left -= take
                if not self._left:
                    self._state = _DATA_END
            elif state == _DATA_END:
                if end - pos < 2:
                    break
                if buf[pos:pos + 2] != b"\r\n":
                    raise ChunkedError("chunk data is not followed by CRLF")
                pos += 2
                self._state = _SIZE_LINE
            elif state == _SIZE_LINE:
                line_end = self._line_end(buf, pos)
                if line_end < 0:
                    break
                self._size_line(buf[pos:line_end])
                pos = line_end + 2
                data_end = pos + self._left
                if self._state == _DATA and data_end + 2 <= end:
                    # The whole chunk and its CRLF are here (the common case: an upstream
                    # writes a chunk at a time): taken in this step, not in two more turns.
                    if buf[data_end:data_end + 2] != b"\r\n":
                        raise ChunkedError("chunk data is not followed by CRLF")
                    out.append(buf[pos:data_end])
                    pos = data_end + 2
                    self._left, self._state = 0, _SIZE_LINE
            elif state == _TRAILER:
                line_end = self._line_end(buf, pos)
                if line_end < 0:
                    break
                self._trailer += line_end - pos + 2
                if self._trailer > MAX_LINE_BYTES:
                    raise ChunkedError("the trailer section is too large")
                if line_end == pos:
                    self._state = _DONE
                pos = line_end + 2
            else:  # done: what follows belongs to no response of ours
                self.extra += buf[pos:]
                pos = end
        self._buf = buf[pos:]
        return out

    def _line_end(self, buf: bytes, pos: int) -> int:
        line_end = buf.find(b"\r\n", pos)
        if (line_end if line_end >= 0 else len(buf)) - pos > MAX_LINE_BYTES:
            raise ChunkedError("a chunk-size line is too long")
        return line_end

    def _size_line(self, line: bytes) -> None:
        match = _SIZE.fullmatch(line)
        if match is None:
            raise ChunkedError(f"bad chunk-size line {line[:40]!r}")
        size = int(match.group(1), 16)
        if size:
            self._left, self._state = size, _DATA
        else:
            self._state = _TRAILER
