"""Mode B protobuf frames (codec-spec.md §1.2): canonical and legacy emission, tolerant and
bounded decoding."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.codec.test_frames_msgpack import (
    VECTORS,
    _vector_frame,
    assert_decodes,
    assert_rejects,
    decode_chunks,
    frames_strategy,
    outcome,
)
from tokenwire.codec.frames import Frame, ToolCall
from tokenwire.codec.frames_protobuf import (
    FrameDecoder,
    FrameEncoder,
    decode_frame_body,
    encode_frame_body,
)
from tokenwire.codec.varint import encode_uvarint
from tokenwire.errors import (
    DataAfterDone,
    FrameTooLarge,
    LocalProtocolError,
    MalformedFrame,
    TruncatedStream,
    VarintOverflow,
)


def prefixed(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


# ---------------------------------------------------------------- golden vectors


@pytest.mark.parametrize("vector", VECTORS["protobuf_frames"], ids=lambda v: v["desc"][:40])
def test_golden_vector_encodes_byte_exact(vector: dict) -> None:
    enc = FrameEncoder(legacy_done_false=vector["legacy_explicit_done_false"])
    assert enc.encode(_vector_frame(vector)).hex() == vector["hex_with_4byte_BE_prefix"]


@pytest.mark.parametrize("vector", VECTORS["protobuf_frames"], ids=lambda v: v["desc"][:40])
def test_golden_vector_decodes_in_any_chunking(vector: dict) -> None:
    frame = _vector_frame(vector)
    data = bytes.fromhex(vector["hex_with_4byte_BE_prefix"])
    assert_decodes(FrameDecoder, data, [frame], eof=frame.done)


def test_canonical_output_omits_done_false_and_legacy_writes_10_00() -> None:
    frame = Frame(ids=[1], done=False)
    assert FrameEncoder().encode(frame).hex() == "000000030a0101"
    assert FrameEncoder(legacy_done_false=True).encode(frame).hex() == "000000050a01011000"
    assert FrameEncoder().encode(Frame(ids=[], done=True)).hex() == "000000021001"


def test_finish_reason_written_only_when_non_empty() -> None:
    assert b"\x1a" not in encode_frame_body(Frame(ids=[], done=True, finish_reason=""))


def test_tool_call_arguments_always_written_name_and_id_optional() -> None:
    call = ToolCall(name=None, arguments_json="", id=None)
    assert encode_frame_body(Frame(ids=[], done=False, tool_calls=(call,))) == b"\x22\x02\x12\x00"


def test_encoder_refuses_ids_outside_uint32() -> None:
    with pytest.raises(LocalProtocolError):
        FrameEncoder().encode(Frame(ids=[-1], done=False))
    with pytest.raises(LocalProtocolError):
        FrameEncoder().encode(Frame(ids=[2**32], done=False))


# ---------------------------------------------------------------- tolerant decoding


def test_unpacked_ids_are_accepted() -> None:
    # ids 1 and 300 as two unpacked varint fields, then a packed field: all concatenate.
    body = b"\x08\x01" + b"\x08\xac\x02" + b"\x0a\x01\x07" + b"\x10\x01"
    assert_decodes(FrameDecoder, prefixed(body), [Frame(ids=(1, 300, 7), done=True)])


@pytest.mark.parametrize("done", [b"", b"\x10\x00"], ids=["omitted", "explicit"])
def test_both_done_false_encodings(done: bytes) -> None:
    assert decode_frame_body(b"\x0a\x01\x05" + done) == Frame(ids=(5,), done=False)


def test_done_is_any_nonzero_varint() -> None:
    assert decode_frame_body(b"\x10\x81\x01").done is True


@pytest.mark.parametrize("unknown", [
    b"\x30\x96\x01",                         # field 6, varint
    b"\x30" + b"\xff" * 9 + b"\x01",         # field 6, 10-byte (int64) varint
    b"\x39" + b"\x00" * 8,                   # field 7, fixed64
    b"\x42\x03abc",                          # field 8, length-delimited
    b"\x4d" + b"\x00" * 4,                   # field 9, fixed32
    b"\xf8\xff\xff\xff\x0f\x00",             # field 2**29-1, varint
], ids=bytes.hex)
def test_unknown_fields_of_every_wire_type_are_skipped(unknown: bytes) -> None:
    body = unknown + b"\x0a\x01\x05" + unknown + b"\x10\x01"
    assert_decodes(FrameDecoder, prefixed(body), [Frame(ids=(5,), done=True)])


def test_base_id_field_5_is_accepted() -> None:
    assert decode_frame_body(b"\x28\xe8\x07\x0a\x01\x05") == Frame(ids=(5,), done=False)


def test_unknown_fields_inside_tool_calls_are_skipped() -> None:
    call = b"\x0a\x01f" + b"\x20\x05" + b"\x12\x02{}"
    frame = decode_frame_body(b"\x22" + bytes([len(call)]) + call)
    assert frame.tool_calls == (ToolCall(name="f", arguments_json="{}", id=None),)


def test_last_finish_reason_wins() -> None:
    assert decode_frame_body(b"\x1a\x01a\x1a\x01b\x10\x01").finish_reason == "b"


# ---------------------------------------------------------------- bounded decoding


@pytest.mark.parametrize("wire_type", [3, 4, 6, 7])
def test_groups_and_undefined_wire_types_are_rejected(wire_type: int) -> None:
    assert_rejects(FrameDecoder, prefixed(bytes([(6 << 3) | wire_type, 0])), MalformedFrame)


@pytest.mark.parametrize("body", [
    b"\x0a\x06" + b"\x80" * 5 + b"\x01",      # packed id: 6-byte varint
    b"\x08" + b"\x80" * 5 + b"\x01",          # unpacked id: 6-byte varint
    b"\x0a\x05\xff\xff\xff\xff\x1f",          # 5 bytes but over 2**32-1
    b"\x80\x80\x80\x80\x80\x01",              # tag: 6-byte varint
    b"\x1a" + b"\x80" * 5 + b"\x01",          # length: 6-byte varint
    b"\x30" + b"\xff" * 10 + b"\x01",         # unknown field: 11-byte varint
], ids=bytes.hex)
def test_varint_overflow(body: bytes) -> None:
    assert_rejects(FrameDecoder, prefixed(body), VarintOverflow)


def test_five_byte_uint32_max_is_fine() -> None:
    assert decode_frame_body(b"\x0a\x05\xff\xff\xff\xff\x0f").ids == (2**32 - 1,)


@pytest.mark.parametrize("body", [
    b"\x0a\x05\x01",                # packed ids longer than the message
    b"\x0a\x01\x80",                # packed ids end inside a varint
    b"\x1a\x03ab",                  # string longer than the message
    b"\x1a\x02\xff\xfe",            # finish_reason not UTF-8
    b"\x22\x04\x0a\x02\xc3\x28",    # tool call name not UTF-8
    b"\x39\x00\x00",                # fixed64 past the end
    b"\x4d\x00",                    # fixed32 past the end
    b"\x00\x01",                    # field number 0
    b"\x12\x00",                    # done with wire type 2
    b"\x1d\x00\x00\x00\x00",        # finish_reason with wire type 5
    b"\x10",                        # varint missing
], ids=bytes.hex)
def test_malformed_messages(body: bytes) -> None:
    assert_rejects(FrameDecoder, prefixed(body + b"\x10\x01"), MalformedFrame)


def test_frame_over_the_limit_is_rejected_from_its_prefix() -> None:
    dec = FrameDecoder(max_frame_bytes=64)
    with pytest.raises(FrameTooLarge):
        dec.feed((65).to_bytes(4, "big"))
    ok = prefixed(b"\x10\x01" + b"\x42\x3c" + b"x" * 60)  # exactly 64 bytes
    assert_decodes(lambda: FrameDecoder(max_frame_bytes=64), ok, [Frame(ids=(), done=True)])


def test_truncated_stream() -> None:
    body = FrameEncoder().encode(Frame(ids=(1, 2, 3), done=True, finish_reason="stop"))
    for cut in range(1, len(body)):
        assert_rejects(FrameDecoder, body[:cut], TruncatedStream)
    assert_rejects(FrameDecoder, FrameEncoder().encode(Frame(ids=(1,), done=False)),
                   TruncatedStream)


def test_data_after_done() -> None:
    done = FrameEncoder().encode(Frame(ids=(1,), done=True))
    assert_rejects(FrameDecoder, done + done, DataAfterDone)
    assert_rejects(FrameDecoder, done + b"\x00", DataAfterDone)


# ---------------------------------------------------------------- properties


@settings(max_examples=120, suppress_health_check=[HealthCheck.too_slow])
@given(frames=frames_strategy(), legacy=st.booleans(), data=st.data())
def test_round_trip_in_any_chunking(frames: list[Frame], legacy: bool, data) -> None:
    body = b"".join(map(FrameEncoder(legacy_done_false=legacy).encode, frames))
    cuts = data.draw(st.lists(st.integers(0, len(body)), max_size=10).map(sorted))
    bounds = [0, *cuts, len(body)]
    chunks = [body[a:b] for a, b in itertools.pairwise(bounds)]
    assert decode_chunks(FrameDecoder, chunks) == frames


def test_round_trip_of_a_70000_id_frame() -> None:
    ids = tuple(random.Random(2).randrange(2**32) for _ in range(70_000))
    frames = [Frame(ids=ids, done=False), Frame(ids=ids[-5:], done=True, finish_reason="stop")]
    body = b"".join(map(FrameEncoder().encode, frames))
    assert decode_chunks(FrameDecoder, [body]) == frames
    assert decode_chunks(FrameDecoder, [body[i : i + 999] for i in range(0, len(body), 999)]) \
        == frames


@settings(max_examples=300)
@given(raw=st.binary(max_size=64))
@example(raw=b"\x00\x00\x00\x02\x10\x01")
def test_fuzz_yields_frames_or_remote_errors(raw: bytes) -> None:
    whole = outcome(FrameDecoder, [raw])
    assert whole == outcome(FrameDecoder, [raw[i : i + 1] for i in range(len(raw))])


@settings(max_examples=300)
@given(fields=st.lists(st.tuples(st.integers(1, 12), st.sampled_from([0, 1, 2, 5]),
                                 st.binary(max_size=12)), max_size=6))
def test_fuzz_field_soup(fields: list[tuple[int, int, bytes]]) -> None:
    body = b"".join(encode_uvarint(n << 3 | wt) + (encode_uvarint(len(v)) if wt == 2 else b"")
                    + v for n, wt, v in fields)
    data = prefixed(body)
    whole = outcome(FrameDecoder, [data])
    assert whole == outcome(FrameDecoder, [data[i : i + 1] for i in range(len(data))])


def test_bytewise_feed_of_many_frames_keeps_only_the_partial_frame() -> None:
    frames = [Frame(ids=(i * 31 % 200_000,), done=False) for i in range(20_000)]
    frames.append(Frame(ids=(), done=True, finish_reason="length"))
    body = b"".join(map(FrameEncoder().encode, frames))
    dec = FrameDecoder()
    out: list[Frame] = []
    retained = 0
    for i in range(len(body)):
        out.extend(dec.feed(body[i : i + 1]))
        retained = max(retained, dec._buffered())
    dec.feed_eof()
    assert out == frames
    assert retained < 16


@settings(max_examples=200)
@given(frames=frames_strategy(max_ids=5), flip=st.integers(0, 10_000), value=st.integers(0, 255))
def test_fuzz_corrupted_streams(frames: list[Frame], flip: int, value: int) -> None:
    body = bytearray(b"".join(map(FrameEncoder().encode, frames)))
    body[flip % len(body)] = value
    assert outcome(FrameDecoder, [bytes(body)]) == outcome(
        FrameDecoder, [bytes(body[i : i + 1]) for i in range(len(body))])
