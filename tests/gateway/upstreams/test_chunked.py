"""The chunked body decoder (gateway/upstreams/chunked.py), checked against h11's own
decoding of the same bytes, cut at every offset, and on the malformed cases it refuses."""

from __future__ import annotations

import h11
import pytest

from tokenwire.gateway.upstreams.chunked import (
    MAX_LINE_BYTES,
    ChunkedDecoder,
    ChunkedError,
)

FIRST = b"data: {\"a\":1}\n\ndata: b\r\n"  # a CRLF inside the data, too
BODY = (b"%x;name=value\r\n%s\r\n" % (len(FIRST), FIRST) + b"5 \r\nhello\r\n"
        b"A\r\n0123456789\r\n" b"0\r\nx-trailer: 1\r\n\r\n")


def _h11_body(wire: bytes) -> bytes:
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + wire)
    out = b""
    while type(event := conn.next_event()) is not h11.EndOfMessage:
        out += event.data if type(event) is h11.Data else b""
    return out


@pytest.mark.parametrize("step", [1, 2, 3, 7, len(BODY)])
def test_any_cut_of_the_bytes_decodes_as_h11_does(step: int) -> None:
    dec, out = ChunkedDecoder(), b""
    for i in range(0, len(BODY), step):
        assert not dec.done
        out += b"".join(dec.feed(BODY[i:i + step]))
    assert dec.done and dec.extra == b""
    assert out == _h11_body(BODY) == FIRST + b"hello0123456789"


def test_each_chunk_is_its_own_piece() -> None:
    """A reader that fails on one chunk (a malformed frame) has had every chunk before it."""
    assert ChunkedDecoder().feed(b"2\r\nab\r\n3\r\ncde\r\n1\r\n") == [b"ab", b"cde"]


@pytest.mark.parametrize("step", [1, 5, 13, 64, 10_000])
def test_many_chunks_in_one_read_or_cut_anywhere_are_the_same_pieces(step: int) -> None:
    events = [b"data: {\"n\": %d}\n\n" % i * (i % 3 + 1) for i in range(40)]
    wire = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"
    dec, pieces = ChunkedDecoder(), []
    for i in range(0, len(wire), step):
        pieces += dec.feed(wire[i:i + step])
    assert dec.done and b"".join(pieces) == b"".join(events) == _h11_body(wire)
    if step >= len(wire):
        assert pieces == events  # each chunk its own piece, also when all came in one read


def test_bytes_after_the_end_are_kept_apart() -> None:
    dec = ChunkedDecoder()
    assert dec.feed(b"2\r\nok\r\n0\r\n\r\nHTTP/1.1") == [b"ok"]
    assert dec.done and dec.extra == b"HTTP/1.1"


@pytest.mark.parametrize("wire", [
    b"zz\r\n",  # not hex
    b"\r\n",  # no size
    b"12345678901234567\r\n",  # 17 digits
    b"2\r\nokX\r\n",  # data not followed by CRLF
    b"-1\r\n",
])
def test_malformed_chunks_are_refused(wire: bytes) -> None:
    with pytest.raises(ChunkedError):
        ChunkedDecoder().feed(wire)


def test_an_endless_size_line_or_trailer_is_refused() -> None:
    with pytest.raises(ChunkedError, match="too long"):
        ChunkedDecoder().feed(b"1" + b";" * MAX_LINE_BYTES)
    dec = ChunkedDecoder()
    dec.feed(b"0\r\n")
    with pytest.raises(ChunkedError, match="trailer"):
        for _ in range(MAX_LINE_BYTES // 10 + 2):
            dec.feed(b"x-a: 1234\r\n")
