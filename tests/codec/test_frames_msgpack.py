"""Mode A msgpack frames (codec-spec.md §1.1): byte-exact encoding, incremental decoding.

Also holds the h11-style feeding helpers (whole, byte by byte, random chunkings, trailing
data) that the protobuf and delta suites import.
"""

from __future__ import annotations

import itertools
import json
import random
import struct
from collections.abc import Callable, Iterator

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.conftest import CODEC_FIXTURES
from tokenwire.codec import frames_msgpack
from tokenwire.codec.frames import MAX_FRAME_BYTES, Frame, StreamFormat, ToolCall
from tokenwire.codec.frames_msgpack import MAX_NESTING, FrameDecoder, FrameEncoder
from tokenwire.errors import (
    DataAfterDone,
    FrameTooLarge,
    LocalProtocolError,
    MalformedFrame,
    RemoteProtocolError,
    TruncatedStream,
)

VECTORS = json.loads((CODEC_FIXTURES / "derived" / "derived-vectors.json").read_text("utf-8"))
UINT32 = st.integers(0, 2**32 - 1)

# ---------------------------------------------------------------- shared feeding helpers


def chunkings(data: bytes, seed: int = 0) -> Iterator[tuple[str, list[bytes]]]:
    """The whole body, one byte at a time, and three random chunkings."""
    yield "whole", [data]
    yield "bytewise", [data[i : i + 1] for i in range(len(data))]
    rng = random.Random(seed)
    for n in range(3 if len(data) > 2 else 0):
        cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(1, 12))))
        bounds = [0, *cuts, len(data)]
        yield f"random{n}", [data[a:b] for a, b in itertools.pairwise(bounds)]


def decode_chunks(make: Callable[[], object], chunks: list[bytes], eof: bool = True) -> list:
    dec = make()
    out: list = []
    for chunk in chunks:
        out.extend(dec.feed(chunk))  # type: ignore[attr-defined]
    if eof:
        dec.feed_eof()  # type: ignore[attr-defined]
    return out


def assert_decodes(make: Callable[[], object], data: bytes, expected: list[Frame],
                   eof: bool = True) -> None:
    """Every chunking yields exactly ``expected``; then trailing junk is DataAfterDone."""
    for name, chunks in chunkings(data):
        got = decode_chunks(make, chunks, eof=eof)
        assert got == expected, name
    if expected and expected[-1].done:
        for junk in (b"\x00", b"\x82", data[:7] or b"\x01"):
            for name, chunks in chunkings(data + junk):
                with pytest.raises(DataAfterDone):
                    decode_chunks(make, chunks)
                    pytest.fail(name)


def assert_rejects(make: Callable[[], object], data: bytes, error: type[Exception]) -> None:
    """Every chunking raises ``error`` (from ``feed`` or ``feed_eof``)."""
    for name, chunks in chunkings(data):
        with pytest.raises(error):
            decode_chunks(make, chunks)
            pytest.fail(f"{name}: no error")


def outcome(make: Callable[[], object], chunks: list[bytes]) -> tuple:
    """(frames so far, error class or None) - what a fuzzed body does to a decoder."""
    dec = make()
    frames: list = []
    try:
        for chunk in chunks:
            frames.extend(dec.feed(chunk))  # type: ignore[attr-defined]
        dec.feed_eof()  # type: ignore[attr-defined]
    except RemoteProtocolError as exc:
        return None, type(exc)
    return frames, None


def frames_strategy(max_ids: int = 40, tool_calls: bool = True) -> st.SearchStrategy:
    """A valid stream: non-final frames, then one terminal frame."""
    text = st.text(max_size=20)
    call = st.builds(ToolCall, name=st.none() | text, arguments_json=text, id=st.none() | text)
    calls = st.lists(call, max_size=2).map(tuple) if tool_calls else st.just(())
    body = st.builds(Frame, ids=st.lists(UINT32, max_size=max_ids).map(tuple),
                     done=st.just(False), tool_calls=calls)
    last = st.builds(Frame, ids=st.lists(UINT32, max_size=max_ids).map(tuple),
                     done=st.just(True),
                     finish_reason=st.none() | st.text(min_size=1, max_size=20),
                     tool_calls=calls)
    return st.tuples(st.lists(body, max_size=8), last).map(lambda t: [*t[0], t[1]])


# ---------------------------------------------------------------- golden vectors


def _vector_frame(v: dict) -> Frame:
    calls = tuple(ToolCall(**c) for c in v["tool_calls"] or ())
    return Frame(ids=tuple(v["ids"]), done=v["done"], finish_reason=v["finish_reason"],
                 tool_calls=calls)


@pytest.mark.parametrize("vector", VECTORS["msgpack_frames"], ids=lambda v: v["desc"][:40])
def test_golden_vector_encodes_byte_exact(vector: dict) -> None:
    assert FrameEncoder().encode(_vector_frame(vector)).hex() == vector["hex"]


@pytest.mark.parametrize("vector", VECTORS["msgpack_frames"], ids=lambda v: v["desc"][:40])
def test_golden_vector_decodes_in_any_chunking(vector: dict) -> None:
    frame = _vector_frame(vector)
    assert_decodes(FrameDecoder, bytes.fromhex(vector["hex"]), [frame], eof=frame.done)


def test_worked_example_is_15_bytes() -> None:
    data = FrameEncoder().encode(Frame(ids=[9707], done=False))
    assert data == bytes.fromhex("82 a3 69 64 73 91 cd 25 eb a4 64 6f 6e 65 c2")


def test_all_vectors_as_one_stream() -> None:
    vectors = [v for v in VECTORS["msgpack_frames"] if not v["done"]]
    last = next(v for v in VECTORS["msgpack_frames"] if v["done"])
    body = b"".join(bytes.fromhex(v["hex"]) for v in [*vectors, last])
    assert_decodes(FrameDecoder, body, [_vector_frame(v) for v in [*vectors, last]])


# ---------------------------------------------------------------- emission rules


def _spec_uint(n: int) -> bytes:
    """§1.1 rule 4, written out independently of msgspec."""
    if n < 0x80:
        return bytes([n])
    if n < 0x100:
        return b"\xcc" + bytes([n])
    if n < 0x10000:
        return b"\xcd" + struct.pack(">H", n)
    return b"\xce" + struct.pack(">I", n)


def _spec_array(n: int) -> bytes:
    """§1.1 rule 3."""
    if n < 16:
        return bytes([0x90 | n])
    if n < 0x10000:
        return b"\xdc" + struct.pack(">H", n)
    return b"\xdd" + struct.pack(">I", n)


@settings(max_examples=200)
@given(ids=st.lists(UINT32, max_size=40), done=st.booleans())
@example(ids=list(range(0, 70_000)), done=False)
def test_ids_use_minimal_unsigned_widths(ids: list[int], done: bool) -> None:
    expected = (b"\x82\xa3ids" + _spec_array(len(ids)) + b"".join(map(_spec_uint, ids))
                + b"\xa4done" + (b"\xc3" if done else b"\xc2"))
    assert FrameEncoder().encode(Frame(ids=ids, done=done)) == expected


def test_finish_reason_written_only_when_not_none() -> None:
    enc = FrameEncoder()
    assert enc.encode(Frame(ids=[], done=True))[0] == 0x82
    data = enc.encode(Frame(ids=[], done=True, finish_reason="x" * 40))
    assert data[0] == 0x83 and b"\xad" + b"finish_reason" + b"\xd9\x28" in data  # str8


def test_tool_calls_written_only_when_non_empty() -> None:
    enc = FrameEncoder()
    assert b"tool_calls" not in enc.encode(Frame(ids=[1], done=False, tool_calls=[]))
    assert b"tool_calls" not in enc.encode(Frame(ids=[1], done=False, tool_calls=()))
    call = ToolCall(name=None, arguments_json="{}", id=None)
    data = enc.encode(Frame(ids=[1], done=False, tool_calls=(call,)))
    assert data.endswith(b"\xaatool_calls\x91\x83\xa4name\xc0\xaearguments_json\xa2{}\xa2id\xc0")


def test_encoder_refuses_ids_outside_uint32() -> None:
    for bad in (-1, 2**32):
        with pytest.raises(LocalProtocolError):
            FrameEncoder().encode(Frame(ids=[1, bad], done=False))
    with pytest.raises(LocalProtocolError):
        FrameEncoder().encode(Frame(ids=[*range(10), 2**40], done=False))


def test_stream_format_content_types() -> None:
    assert StreamFormat("msgpack").content_type == "application/x-msgpack"
    assert StreamFormat("protobuf").content_type == "application/x-protobuf"
    assert StreamFormat("msgpack-delta").content_type == "application/x-msgpack"
    assert MAX_FRAME_BYTES == 16 * 1024 * 1024


# ---------------------------------------------------------------- length-prefixed variant


def test_length_prefixed_stream_is_detected_and_held() -> None:
    frames = [Frame(ids=(1, 2), done=False), Frame(ids=(), done=True, finish_reason="stop")]
    enc = FrameEncoder(length_prefix=True)
    body = b"".join(map(enc.encode, frames))
    assert body[:4] == b"\x00\x00\x00\x0e"  # 14-byte map
    assert_decodes(FrameDecoder, body, frames)
    dec = FrameDecoder()
    dec.feed(body[:3])
    assert dec.mode == "4-byte length prefix"
    # Once prefixed, a bare map is read as a length: 0x82a36964 is far over the limit.
    bare = FrameEncoder().encode(frames[0])
    with pytest.raises(FrameTooLarge):
        FrameDecoder().feed(enc.encode(frames[0]) + bare)


def test_bare_stream_is_held_too() -> None:
    first = FrameEncoder().encode(Frame(ids=(1,), done=False))
    assert_rejects(FrameDecoder, first + FrameEncoder(length_prefix=True).encode(
        Frame(ids=(1,), done=True)), MalformedFrame)


def test_prefix_is_checked_before_the_body_is_buffered() -> None:
    dec = FrameDecoder(max_frame_bytes=100)
    with pytest.raises(FrameTooLarge):
        dec.feed(b"\x00\x00\x00\x65")  # 101 announced, no body sent


# ---------------------------------------------------------------- stream rules


def test_stream_without_done_is_truncated() -> None:
    body = FrameEncoder().encode(Frame(ids=(1,), done=False))
    assert_rejects(FrameDecoder, body, TruncatedStream)
    assert_rejects(FrameDecoder, b"", TruncatedStream)


def test_stream_ending_inside_a_frame_is_truncated() -> None:
    body = FrameEncoder().encode(Frame(ids=(1, 2, 300), done=True, finish_reason="stop"))
    for cut in range(1, len(body)):
        assert_rejects(FrameDecoder, body[:cut], TruncatedStream)


def test_errors_are_sticky() -> None:
    dec = FrameDecoder()
    with pytest.raises(MalformedFrame):
        dec.feed(b"\xa0")
    for call in (lambda: dec.feed(b"\x80"), dec.feed_eof):
        with pytest.raises(MalformedFrame):
            call()


def test_feed_after_eof_is_a_local_error() -> None:
    dec = FrameDecoder()
    dec.feed(FrameEncoder().encode(Frame(ids=(), done=True)))
    dec.feed_eof()
    with pytest.raises(LocalProtocolError):
        dec.feed(b"")


def test_unknown_keys_are_ignored() -> None:
    raw = msgspec.msgpack.encode({"x": {"y": [1, 2.5, None, b"\x00" * 300, "z" * 70]},
                                  "ids": [5], "meta": [[[]]], "done": True, "n": -3})
    assert_decodes(FrameDecoder, raw, [Frame(ids=(5,), done=True)])


def test_nil_finish_reason_is_absent() -> None:
    raw = msgspec.msgpack.encode({"ids": [], "done": True, "finish_reason": None})
    assert_decodes(FrameDecoder, raw, [Frame(ids=(), done=True)])


@pytest.mark.parametrize("obj", [
    {"done": True},                                   # missing ids
    {"ids": [1], "done": 1},                          # done not a bool
    {"ids": "abc", "done": True},                     # ids not an array
    {"ids": [-1], "done": True},                      # signed id
    {"ids": [2**32], "done": True},                   # id over uint32
    {"ids": [1.0], "done": True},                     # float id
    {"ids": [], "done": True, "finish_reason": 3},    # finish_reason not a string
    {"ids": [], "done": True, "tool_calls": [1]},     # tool call not a map
], ids=str)
def test_wrongly_typed_frames_are_malformed(obj: dict) -> None:
    assert_rejects(FrameDecoder, msgspec.msgpack.encode(obj), MalformedFrame)


def test_bad_utf8_in_finish_reason_is_malformed() -> None:
    raw = bytes.fromhex("83a369647390a4646f6e65c3ad66696e6973685f726561736f6ea2ff00")
    assert_rejects(FrameDecoder, raw, MalformedFrame)


@pytest.mark.parametrize("raw", [b"\xa3ids", b"\x91\x01", b"\xc0", b"\xc1", b"\xff"],
                         ids=bytes.hex)
def test_non_map_values_are_malformed(raw: bytes) -> None:
    assert_rejects(FrameDecoder, raw, MalformedFrame)


def test_unused_lead_byte_inside_a_frame_is_malformed() -> None:
    assert_rejects(FrameDecoder, b"\x82\xa3ids\x91\xc1\xa4done\xc3", MalformedFrame)


def test_nesting_is_capped() -> None:
    deep = b"\x91" * (MAX_NESTING + 1) + b"\x90"
    assert_rejects(FrameDecoder, b"\x83\xa3ids\x90\xa4done\xc3\xa1x" + deep, MalformedFrame)


def test_frame_over_the_limit() -> None:
    big = FrameEncoder().encode(Frame(ids=tuple(range(1000, 1100)), done=True))
    assert_decodes(lambda: FrameDecoder(max_frame_bytes=len(big)), big,
                   [Frame(ids=tuple(range(1000, 1100)), done=True)])
    assert_rejects(lambda: FrameDecoder(max_frame_bytes=len(big) - 1), big, FrameTooLarge)
    # A declared string or array length over the limit fails before the bytes arrive.
    for head in (b"\x81\xa1x\xdb\x01\x00\x00\x00", b"\x81\xa1x\xdd\x01\x00\x00\x00"):
        with pytest.raises(FrameTooLarge):
            FrameDecoder(max_frame_bytes=1 << 20).feed(head)


def test_data_after_done_in_the_same_chunk() -> None:
    done = FrameEncoder().encode(Frame(ids=(1,), done=True))
    more = FrameEncoder().encode(Frame(ids=(2,), done=False))
    assert_rejects(FrameDecoder, done + more, DataAfterDone)
    assert_rejects(FrameDecoder, more + done + more + done, DataAfterDone)
    assert_rejects(FrameDecoder, done + b"\xc1", DataAfterDone)


# ---------------------------------------------------------------- properties


@settings(max_examples=80, suppress_health_check=[HealthCheck.too_slow])
@given(frames=frames_strategy(), prefixed=st.booleans(), data=st.data())
def test_round_trip_in_any_chunking(frames: list[Frame], prefixed: bool, data) -> None:
    body = b"".join(map(FrameEncoder(length_prefix=prefixed).encode, frames))
    cuts = data.draw(st.lists(st.integers(0, len(body)), max_size=10).map(sorted))
    bounds = [0, *cuts, len(body)]
    chunks = [body[a:b] for a, b in itertools.pairwise(bounds)]
    assert decode_chunks(FrameDecoder, chunks) == frames


def test_round_trip_of_a_70000_id_frame() -> None:
    ids = tuple(random.Random(1).randrange(2**32) for _ in range(70_000))
    frames = [Frame(ids=ids, done=False), Frame(ids=ids[:3], done=True, finish_reason="length")]
    body = b"".join(map(FrameEncoder().encode, frames))
    assert decode_chunks(FrameDecoder, [body]) == frames
    chunks = [body[i : i + 4096] for i in range(0, len(body), 4096)]
    assert decode_chunks(FrameDecoder, chunks) == frames


@settings(max_examples=300)
@given(raw=st.binary(max_size=64))
@example(raw=b"\x82\xa3ids\x91\x01\xa4done\xc3")
def test_fuzz_yields_frames_or_remote_errors(raw: bytes) -> None:
    whole = outcome(FrameDecoder, [raw])
    bytewise = outcome(FrameDecoder, [raw[i : i + 1] for i in range(len(raw))])
    assert whole == bytewise


@settings(max_examples=200)
@given(frames=frames_strategy(max_ids=5), flip=st.integers(0, 10_000), value=st.integers(0, 255))
def test_fuzz_corrupted_streams(frames: list[Frame], flip: int, value: int) -> None:
    body = bytearray(b"".join(map(FrameEncoder().encode, frames)))
    body[flip % len(body)] = value
    assert outcome(FrameDecoder, [bytes(body)]) == outcome(
        FrameDecoder, [bytes(body[i : i + 1]) for i in range(len(body))])


# ---------------------------------------------------------------- linear work


def _one_id_stream(n: int) -> tuple[bytes, list[Frame]]:
    frames = [Frame(ids=(i * 7919 % 150_000,), done=False) for i in range(n)]
    frames.append(Frame(ids=(), done=True, finish_reason="stop"))
    return b"".join(map(FrameEncoder().encode, frames)), frames


def test_60k_frames_bytewise_equal_whole_and_buffer_never_recopied() -> None:
    body, frames = _one_id_stream(60_000)
    assert decode_chunks(FrameDecoder, [body]) == frames
    dec = FrameDecoder()
    out: list[Frame] = []
    retained_max = 0
    view = memoryview(body)
    for i in range(len(body)):
        out.extend(dec.feed(view[i : i + 1]))
        retained_max = max(retained_max, dec._buffered())
    dec.feed_eof()
    assert out == frames
    # Only the partial frame is ever kept, so compaction never moves more than one frame.
    assert retained_max < max(len(FrameEncoder().encode(f)) for f in frames[-2:])


class _CountingScanner(frames_msgpack._Scanner):
    calls: list[tuple[int, int]]

    def scan(self, buf: bytearray) -> int:
        before = self.pos
        end = super().scan(buf)
        self.calls.append((before, self.pos if end < 0 else end))
        return end


def test_a_large_frame_fed_bytewise_is_scanned_once() -> None:
    ids = tuple(range(100_000, 120_000))
    body = FrameEncoder().encode(Frame(ids=ids, done=True))
    dec = FrameDecoder()
    scanner = _CountingScanner(dec.max_frame_bytes)
    scanner.calls = []
    dec._scanner = scanner
    out: list[Frame] = []
    for i in range(len(body)):
        out.extend(dec.feed(body[i : i + 1]))
    dec.feed_eof()
    assert out == [Frame(ids=ids, done=True)]
    # Every call resumes where the previous one stopped: no byte is read twice.
    scanned = sum(stop - start for start, stop in scanner.calls)
    assert scanned == len(body)
    assert all(a[1] == b[0] for a, b in zip(scanner.calls, scanner.calls[1:], strict=False))


# ---------------------------------------------------------------- the speculative fast path

TRICKY_IDS = st.sampled_from([0, 0x64, 0x65, 0x6E, 0x6F, 0x7F, 0x80, 0xA4, 0xC2, 0xFF,
                              0xA464, 0x6FA4, 0x646F6E65, 0xA4646F6E, 0x6E65C2A4, 2**32 - 1])


@settings(max_examples=150)
@given(ids_per_frame=st.lists(st.lists(TRICKY_IDS | UINT32, max_size=40).map(tuple),
                              min_size=1, max_size=12))
def test_fast_path_never_rejects_valid_frames(ids_per_frame: list[tuple[int, ...]]) -> None:
    frames = [Frame(ids=ids, done=False) for ids in ids_per_frame]
    frames.append(Frame(ids=(), done=True))
    dec = FrameDecoder()
    assert dec.feed(b"".join(map(FrameEncoder().encode, frames))) == frames
    assert dec._fast is not None  # the regex boundaries were confirmed, never dropped


@pytest.mark.parametrize("liar", [
    b"\x82\xa3ids\x92\x01\xa4done\xc2",            # fixarray says 2, holds 1
    b"\x82\xa3ids\x91\x01\x02\xa4done\xc2",        # fixarray says 1, holds 2
    b"\x82\xa3ids\xdc\x00\x11" + b"\x01" * 16 + b"\xa4done\xc2",  # array16 says 17
], ids=["short", "long", "array16"])
def test_array_headers_that_lie_fail_the_same_in_any_chunking(liar: bytes) -> None:
    good = FrameEncoder().encode(Frame(ids=(5,), done=False))
    end = FrameEncoder().encode(Frame(ids=(), done=True))
    body = good + liar + good * 3 + end
    results = {outcome(FrameDecoder, chunks) for _, chunks in chunkings(body)}
    assert len(results) == 1
    frames, error = results.pop()
    assert frames is None and issubclass(error, RemoteProtocolError)


def test_fast_frames_respect_a_small_limit() -> None:
    frame = FrameEncoder().encode(Frame(ids=tuple(range(1000, 1100)), done=False))
    dec = FrameDecoder(max_frame_bytes=len(frame) - 1)
    with pytest.raises(FrameTooLarge):
        dec.feed(frame + FrameEncoder().encode(Frame(ids=(), done=True)))
