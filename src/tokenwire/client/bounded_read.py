"""Reading a whole response body within a budget of *decoded* bytes (issue 11 item 4).

``httpx``'s ``iter_bytes`` inflates each raw chunk whole before a caller can count it: a
1.6 KB brotli body that inflates to 1 GiB reached 2 GB of memory in discovery and
``fetch_map`` before their size checks ran. Here the raw bytes (``iter_raw``) go through the
codec core's budgeted decompressors (:mod:`tokenwire.codec.compression`), which bound
every call's output and count decoded bytes as they are produced, so memory stays near the
budget whatever the body claims (within twice the cap: what was kept, plus one decoder
call's output, itself within what is left of the cap). gzip, br and zstd (plain, without
a Codec dictionary, as any HTTP server may send it) are decoded; other codings are refused.
"""

from __future__ import annotations

import httpx

from tokenwire.client.deadline import NO_DEADLINE, Deadline
from tokenwire.codec.compression import (
    MAX_ZSTD_WINDOW,
    Decompressor,
    ZstdDecompressor,
    new_decompressor,
)
from tokenwire.errors import DecompressionLimitExceeded

__all__ = [
    "BodyOverBudget",
    "aread_bounded",
    "aread_error_body",
    "decoder_for",
    "read_bounded",
    "read_error_body",
]


#: Raw bytes handed to the decoder per call: at deflate's ~1032:1 ratio, ~1 MiB of output.
_FEED_SLICE = 1024


class BodyOverBudget(DecompressionLimitExceeded):
    """The body decodes to more than the caller's budget; ``partial`` is what fitted."""

    def __init__(self, message: str, parts: list[bytes], limit: int) -> None:
        super().__init__(message)
        self._parts, self._limit = parts, limit

    @property
    def partial(self) -> bytes:  # joined on demand: a map fetch never needs it
        return b"".join(self._parts)[: self._limit]


class _PlainZstdDecompressor(ZstdDecompressor):
    """``Content-Encoding: zstd`` without a dictionary (RFC 8878), with the core's budget,
    input slicing and 8 MiB window cap."""

    def __init__(self, *, max_output: int) -> None:  # no dictionary: skip the parent's
        Decompressor.__init__(self, max_output=max_output)
        import zstandard

        self._z = zstandard.ZstdDecompressor(max_window_size=MAX_ZSTD_WINDOW).decompressobj()


def decoder_for(content_encoding: str | None, limit: int) -> Decompressor:
    """A budgeted decoder for a response's ``Content-Encoding`` (one coding at most)."""
    token = (content_encoding or "identity").strip().lower()
    if token == "zstd":
        return _PlainZstdDecompressor(max_output=limit)
    return new_decompressor(token, max_output=limit)


class _Reader:
    """The sans-IO half shared by the sync and async readers."""

    def __init__(self, resp: httpx.Response, limit: int) -> None:
        self._dec = decoder_for(resp.headers.get("content-encoding"), limit)
        self._parts: list[bytes] = []
        self._limit = limit

    def feed(self, raw: bytes) -> None:
        try:
            # One call's output is only bounded by the budget (a gzip byte can be 1 KB);
            # small slices keep each call's output near a MiB, so memory stays at the cap.
            for i in range(0, len(raw), _FEED_SLICE):
                self._parts.append(self._dec.decompress(raw[i:i + _FEED_SLICE]))
        except DecompressionLimitExceeded:
            raise BodyOverBudget(f"the body decodes to more than {self._limit} bytes",
                                 self._parts, self._limit) from None

    def finish(self) -> bytes:
        self._parts.append(self._dec.finish())
        return b"".join(self._parts)


def read_bounded(resp: httpx.Response, limit: int,
                 deadline: Deadline = NO_DEADLINE) -> bytes:
    """The decoded body of a streamed ``resp``, at most ``limit`` bytes; raises
    :class:`BodyOverBudget` past it, ``DecompressionError`` on a corrupt body and
    ``CodecDeadlineExceeded`` once ``deadline`` has passed (checked at every chunk)."""
    reader = _Reader(resp, limit)
    for raw in resp.iter_raw():
        deadline.check()
        reader.feed(raw)
    return reader.finish()


async def aread_bounded(resp: httpx.Response, limit: int,
                        deadline: Deadline = NO_DEADLINE) -> bytes:
    """:func:`read_bounded` for an async streamed response."""
    reader = _Reader(resp, limit)
    async for raw in resp.aiter_raw():
        deadline.check()
        reader.feed(raw)
    return reader.finish()


def read_error_body(resp: httpx.Response, limit: int, deadline: Deadline = NO_DEADLINE) -> bytes:
    """An error answer's decoded body, read only as far as it explains the error: its first
    ``limit`` bytes when it is longer (a server compresses error answers as the request's
    ``Accept-Encoding`` allows, a proxy's gzip among them)."""
    try:
        return read_bounded(resp, limit, deadline)
    except BodyOverBudget as exc:
        return exc.partial


async def aread_error_body(resp: httpx.Response, limit: int,
                           deadline: Deadline = NO_DEADLINE) -> bytes:
    """:func:`read_error_body` for an async streamed response."""
    try:
        return await aread_bounded(resp, limit, deadline)
    except BodyOverBudget as exc:
        return exc.partial
