"""The upstream SSE parser follows the WHATWG event-stream rules, whatever the chunking."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenwire.errors import FrameTooLarge, RemoteProtocolError, TruncatedStream
from tokenwire.gateway.upstreams.sse import SSEDecoder, SSEEvent


def whole(data: bytes, **kw) -> list[SSEEvent]:
    dec = SSEDecoder(**kw)
    return dec.feed(data) + dec.feed_eof()


def byte_by_byte(data: bytes, **kw) -> list[SSEEvent]:
    dec = SSEDecoder(**kw)
    out: list[SSEEvent] = []
    for i in range(len(data)):
        out += dec.feed(data[i : i + 1])
    return out + dec.feed_eof()


def both(data: bytes, **kw) -> list[SSEEvent]:
    a, b = whole(data, **kw), byte_by_byte(data, **kw)
    assert a == b
    return a


def test_blank_line_dispatches_data_events():
    assert both(b'data: {"a":1}\n\ndata: [DONE]\n\n') == [
        SSEEvent("message", '{"a":1}'),
        SSEEvent("message", "[DONE]"),
    ]


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
def test_every_line_terminator_is_accepted(eol):
    data = b"event: x" + eol + b"data: a" + eol + b"data: b" + eol + eol
    assert both(data) == [SSEEvent("x", "a\nb")]


def test_cr_at_chunk_end_and_lf_in_next_chunk_is_one_line_end():
    dec = SSEDecoder()
    assert dec.feed(b"data: a\r") == []
    # Were the LF a second line end, the event would dispatch here with only "a".
    assert dec.feed(b"\ndata: b\r\n\r\n") == [SSEEvent("message", "a\nb")]


def test_comment_lines_are_keepalives_and_ignored():
    assert both(b": ping\n\n: ping\ndata: x\n: more\n\n") == [SSEEvent("message", "x")]


def test_one_leading_space_is_stripped_from_the_value_only():
    assert both(b"data:x\n\ndata:  y\n\n") == [SSEEvent("message", "x"),
                                                SSEEvent("message", " y")]


def test_event_without_data_is_not_dispatched():
    assert both(b"event: ping\n\n") == []


def test_data_field_without_colon_is_an_empty_data_line():
    assert both(b"data\ndata\n\n") == [SSEEvent("message", "\n")]


def test_last_event_id_persists_and_nul_id_is_ignored():
    out = both(b"id: 7\ndata: a\n\ndata: b\n\nid: x\0y\ndata: c\n\n")
    assert [e.id for e in out] == ["7", "7", "7"]


def test_event_type_resets_after_dispatch():
    assert [e.event for e in both(b"event: error\ndata: a\n\ndata: b\n\n")] == [
        "error", "message"]


def test_leading_bom_is_dropped():
    assert both(b"\xef\xbb\xbfdata: a\n\n") == [SSEEvent("message", "a")]


def test_invalid_utf8_decodes_with_replacement_character():
    assert both(b"data: \xff\n\n") == [SSEEvent("message", "\ufffd")]


def test_final_event_without_blank_line_is_dispatched_at_eof():
    assert both(b"data: [DONE]\n") == [SSEEvent("message", "[DONE]")]


def test_line_cut_off_at_eof_is_truncated_stream():
    dec = SSEDecoder()
    assert dec.feed(b'data: {"choi') == []
    with pytest.raises(TruncatedStream):
        dec.feed_eof()


def test_line_over_the_limit_is_frame_too_large_whether_or_not_it_ends():
    with pytest.raises(FrameTooLarge):
        SSEDecoder(max_line_bytes=16).feed(b"data: " + b"x" * 32)
    with pytest.raises(FrameTooLarge):
        SSEDecoder(max_line_bytes=16).feed(b"data: " + b"x" * 32 + b"\n")


def test_event_over_the_limit_is_frame_too_large():
    dec = SSEDecoder(max_line_bytes=100, max_event_bytes=50)
    with pytest.raises(FrameTooLarge):
        dec.feed(b"data: " + b"x" * 30 + b"\ndata: " + b"y" * 30 + b"\n")


_LINE = st.sampled_from([b"data: a", b"data: {\"x\": 1}", b"event: e", b"id: 1", b": c",
                         b"data", b"retry: 5", b"", b"foo: bar"])
_EOL = st.sampled_from([b"\n", b"\r\n", b"\r"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_LINE, _EOL), max_size=30), st.data())
def test_any_chunking_yields_the_same_events(lines, data):
    body = b"".join(a + b for a, b in lines)
    expected = whole(body)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(body)), max_size=8)))
    dec = SSEDecoder()
    out: list[SSEEvent] = []
    prev = 0
    for c in [*cuts, len(body)]:
        out += dec.feed(body[prev:c])
        prev = c
    assert out + dec.feed_eof() == expected


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(_LINE, _EOL), min_size=1, max_size=4), max_size=12))
def test_one_chunk_per_event_yields_what_a_byte_at_a_time_does(events):
    # Each event its own chunk, as upstreams send tokens: whole ``data: ...\n\n`` chunks
    # take the single-event path, the rest the line walk; byte by byte takes neither.
    chunks = [b"".join(a + b for a, b in lines) + b"\n" for lines in events]
    dec = SSEDecoder()
    out: list[SSEEvent] = []
    for chunk in chunks:
        out += dec.feed(chunk)
    assert out + dec.feed_eof() == byte_by_byte(b"".join(chunks))


def test_single_event_chunks_keep_the_limits_and_the_last_id():
    dec = SSEDecoder()
    assert dec.feed(b"id: 7\n\n") == []
    assert dec.feed(b"data: x\n\n") == [SSEEvent("message", "x", "7")]
    assert dec.feed(b"data: \n\n") == [SSEEvent("message", "", "7")]
    small = SSEDecoder(max_line_bytes=16, max_event_bytes=8)
    small.feed(b": ping\n\n")
    with pytest.raises(FrameTooLarge):
        small.feed(b"data: " + b"x" * 11 + b"\n\n")  # line 17 bytes
    tight = SSEDecoder(max_event_bytes=8)
    tight.feed(b": a\n\n")
    assert tight.feed(b"data: " + b"x" * 7 + b"\n\n") == [SSEEvent("message", "x" * 7)]
    with pytest.raises(FrameTooLarge):
        tight.feed(b"data: " + b"x" * 8 + b"\n\n")  # with its joining newline, 9 bytes


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_yield_events_or_remote_protocol_error(data):
    for parse in (whole, byte_by_byte):
        try:
            events = parse(data, max_line_bytes=64, max_event_bytes=128)
        except RemoteProtocolError:
            continue
        assert all(isinstance(e, SSEEvent) for e in events)
