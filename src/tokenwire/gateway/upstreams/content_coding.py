"""An upstream answer's ``Content-Encoding``, decoded in bounded pieces. Sans-IO.

The gateway asks upstreams for ``Accept-Encoding: identity`` (``sse_http.http_client``; a
token stream gains nothing from compression on the way to the gateway), so an honest server
sends plain bytes. One that compresses anyway is still read: gzip (``x-gzip``), ``deflate``
and ``br``. Anything else, or codings stacked, is a malformed answer (final, 502).

Why not httpx's decoders: they decode each network read whole, and a coded body expands
without bound. A 1.6 KB brotli body is 1 GB of zeros, in one call; a 420-byte one took a
gateway from 56 to 579 MB for one request. Here one read's output comes out in pieces of at
most about :data:`PIECE_BYTES` (brotli's limit is a hint: its pieces come at up to 1.5x),
each handed on before the next is made, so the reader's
back-pressure (``http_transport.MAX_BUFFERED_BYTES``, the SSE decoder's line limit) bounds
what is held, as it does for a plain body.

A coded body cut short is not an error here: whether the answer was whole is the stream's
own business (``[DONE]``, a ``finish_reason``), as it is for a plain body.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Iterator

import brotli

__all__ = ["PIECE_BYTES", "UnsupportedCoding", "add_coding", "decoded_pieces"]

#: The most one step of decoding makes before the piece is handed on.
PIECE_BYTES = 64 * 1024


class UnsupportedCoding(ValueError):
    """A coding this module does not decode, or a body its coding cannot decode."""


class _Zlib:
    def __init__(self, name: str, wbits: int, *, raw_fallback: bool = False) -> None:
        self._name = name
        self._z = zlib.decompressobj(wbits)
        # ``deflate`` is zlib's format (RFC 9110 §8.4.1.2), but some servers send raw
        # deflate: tried once, before any output, as httpx does.
        self._raw_fallback = raw_fallback
        self._any = False

    def feed(self, data: bytes) -> Iterator[bytes]:
        while data:
            if self._z.eof:
                raise UnsupportedCoding("bytes after the end of the coded body")
            try:
                piece = self._z.decompress(data, PIECE_BYTES)
            except zlib.error as exc:
                if self._raw_fallback and not self._any:
                    self._raw_fallback = False
                    self._z = zlib.decompressobj(-zlib.MAX_WBITS)
                    continue
                raise UnsupportedCoding(f"the body is not valid {self._name}: {exc}") from exc
            self._any = True
            if piece:
                yield piece
            data = self._z.unconsumed_tail
            if not piece and data:  # pragma: no cover - zlib made no progress
                raise UnsupportedCoding("the coded body makes no progress")
        if self._z.unused_data:
            raise UnsupportedCoding("bytes after the end of the coded body")


class _Brotli:
    def __init__(self) -> None:
        self._b = brotli.Decompressor()

    def feed(self, data: bytes) -> Iterator[bytes]:
        try:
            if data and self._b.is_finished():
                raise UnsupportedCoding("bytes after the end of the coded body")
            piece = self._b.process(data, output_buffer_limit=PIECE_BYTES)
            while True:
                if piece:
                    yield piece
                if self._b.can_accept_more_data():
                    return
                piece = self._b.process(b"", output_buffer_limit=PIECE_BYTES)
        except brotli.error as exc:
            raise UnsupportedCoding(f"the body is not valid brotli: {exc}") from exc


def _decoder(coding: str) -> _Zlib | _Brotli:
    if coding in ("gzip", "x-gzip"):
        return _Zlib("gzip", 16 + zlib.MAX_WBITS)
    if coding == "deflate":
        return _Zlib("deflate", zlib.MAX_WBITS, raw_fallback=True)
    if coding == "br":
        return _Brotli()
    raise UnsupportedCoding(f"unsupported Content-Encoding {coding!r}")


def add_coding(codings: str, value: str) -> str:
    """``codings`` (the ``Content-Encoding`` values read so far, joined) with one more
    header value: lower case, ``identity`` and empty values left out, so that ``""`` is a
    plain body; values repeated are joined, which :func:`decoded_pieces` refuses."""
    coding = value.strip().lower()
    if coding in ("", "identity"):
        return codings
    return f"{codings}, {coding}" if codings else coding


async def decoded_pieces(body: AsyncIterator[bytes], coding: str) -> AsyncIterator[bytes]:
    """``body``'s bytes decoded from ``coding`` (the header's value, lower case), about
    :data:`PIECE_BYTES` at a time. Raises :class:`UnsupportedCoding` for a coding it does
    not decode (before reading) or bytes that coding cannot decode."""
    decoder = _decoder(coding.strip())
    async for raw in body:
        for piece in decoder.feed(raw):
            yield piece
