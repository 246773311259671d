"""An upstream answer's ``Content-Encoding``, decoded in bounded pieces. Sans-IO.

The gateway asks upstreams for ``Accept-Encoding: identity`` (``sse_http.http_client``; a
token stream gains nothing from compression on the way to the gateway), so an honest server
sends plain bytes. One that compresses anyway is still read: gzip (``x-gzip``), ``deflate``
and ``br``. Anything else, or codings stacked, is a malformed answer (final, 502).

Why not httpx's decoders: they decode each network read whole, and a coded body expands
without bound. A 1.6 KB brotli body is 1 GB of zeros, in one call; a 420-byte one took a
gateway from 56 to 579 MB for one request. Here one read's output comes out in pieces of at
most about :data:`PIECE_BYTES` (brotli's limit is a hint: its pieces come at up to 1.5x),
each handed on before the next is made, so the reader's back-pressure
(``http_transport.MAX_BUFFERED_BYTES``, the SSE decoder's line limit) bounds what is held,
as it does for a plain body. The decoders are the Codec client's
(:class:`~tokenwire.codec.compression.Decompressor`, whose ``pieces`` do exactly that)
without their budget, plus HTTP's ``deflate``, which Codec does not use.

A coded body cut short is not an error here: whether the answer was whole is the stream's
own business (``[DONE]``, a ``finish_reason``), as it is for a plain body.
"""

from __future__ import annotations

import sys
import zlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

from tokenwire.codec.compression import (
    PIECE_BYTES,
    BrotliDecompressor,
    Decompressor,
    GzipDecompressor,
)
from tokenwire.errors import DecompressionError

__all__ = ["PIECE_BYTES", "UnsupportedCoding", "add_coding", "decoded_pieces"]

#: No budget: an answer's size is bounded where it is read (the reader's back-pressure, the
#: supervisor's ``MAX_ANSWER_SIZE``), not by its coding.
_UNBOUNDED = sys.maxsize


class UnsupportedCoding(ValueError):
    """A coding this module does not decode, or a body its coding cannot decode."""


class _DeflateDecompressor(Decompressor):
    """HTTP's ``deflate``: zlib's format (RFC 9110 §8.4.1.2), but some servers send raw
    deflate. Which one is told by the first two bytes (a zlib header names method 8 and
    checks as a multiple of 31), read before anything is decoded, however the body's reads
    split them."""

    encoding = "deflate"

    def __init__(self) -> None:
        super().__init__(max_output=_UNBOUNDED)
        self._z: Any = None  # a zlib decompressor, once the first two bytes are known
        self._head = b""

    def _pieces(self, data: bytes) -> Iterator[bytes]:
        if self._z is None:
            self._head += data
            if len(self._head) < 2:
                return
            data, self._head = self._head, b""
            zlib_format = data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
            self._z = zlib.decompressobj(zlib.MAX_WBITS if zlib_format else -zlib.MAX_WBITS)
        while data:
            if self._z.eof:
                raise DecompressionError("bytes after the end of the deflate stream")
            try:
                piece = self._z.decompress(data, self._room())
            except zlib.error as exc:
                raise DecompressionError(f"corrupt deflate body: {exc}") from exc
            yield self._account(piece)
            data = self._z.unconsumed_tail
            if not piece and data:  # pragma: no cover - zlib made no progress
                raise DecompressionError("the deflate body makes no progress")
        if self._z.unused_data:
            raise DecompressionError("bytes after the end of the deflate stream")

    def _finish(self) -> bytes:
        return b""  # a cut body is the stream's business (module doc)


def _decoder(coding: str) -> Decompressor:
    if coding in ("gzip", "x-gzip"):
        return GzipDecompressor(max_output=_UNBOUNDED)
    if coding == "deflate":
        return _DeflateDecompressor()
    if coding == "br":
        return BrotliDecompressor(max_output=_UNBOUNDED)
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
        try:
            for piece in decoder.pieces(raw):
                yield piece
        except DecompressionError as exc:
            raise UnsupportedCoding(f"the body is not valid {coding}: {exc}") from exc
