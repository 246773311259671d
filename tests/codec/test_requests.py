"""Path C ``CodecRequest`` bodies (codec-spec.md §1.3, §2.7b): both encodings, both ways."""

from __future__ import annotations

import struct

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.codec.test_frames_msgpack import UINT32, VECTORS
from tokenwire.codec.frames import StreamFormat
from tokenwire.codec.requests import (
    CodecRequest,
    decode_request,
    encode_request,
    request_format_for_content_type,
)
from tokenwire.errors import FrameTooLarge, MalformedFrame, RemoteProtocolError, VarintOverflow

PB_VECTOR, MSGPACK_VECTOR = VECTORS["requests"]


def test_protobuf_vector_both_ways() -> None:
    f = PB_VECTOR["fields"]
    req = CodecRequest(prompt_ids=tuple(f["prompt_ids"]), max_tokens=f["max_tokens"],
                       temperature=f["temperature"], stop=tuple(f["stop"]),
                       stream_format=f["stream_format"])
    assert encode_request(req, "protobuf").hex() == PB_VECTOR["hex"]
    got = decode_request(bytes.fromhex(PB_VECTOR["hex"]), StreamFormat.PROTOBUF)
    # temperature travels as float32 (field 3, fixed32 little-endian)
    f32 = struct.unpack("<f", struct.pack("<f", 0.7))[0]
    assert got == CodecRequest(prompt_ids=(1, 2, 3, 4567), max_tokens=256, temperature=f32,
                               stop=("\n",), stream_format="msgpack")


def test_msgpack_vector_both_ways() -> None:
    got = decode_request(bytes.fromhex(MSGPACK_VECTOR["hex"]), "msgpack")
    assert got == CodecRequest(prompt_ids=(1, 2, 3, 4567), max_tokens=256)
    assert encode_request(got, "msgpack").hex() == MSGPACK_VECTOR["hex"]


def test_defaults_follow_the_forks() -> None:
    for fmt, empty in (("protobuf", b""), ("msgpack", b"\x80")):
        req = decode_request(empty, fmt)
        assert req == CodecRequest(prompt_ids=(), max_tokens=256, temperature=None, stop=(),
                                   stream_format="msgpack")


def test_msgpack_key_order_is_free_and_stop_may_be_a_string() -> None:
    body = msgspec.msgpack.encode({"stop": "END", "stream_format": "protobuf",
                                   "prompt_ids": [7], "extra": {"ignored": True}})
    assert decode_request(body, "msgpack") == CodecRequest(prompt_ids=(7,), stop=("END",),
                                                           stream_format="protobuf")


def test_protobuf_unpacked_ids_and_unknown_fields() -> None:
    body = b"\x08\x05\x08\x06" + b"\x30\x01" + b"\x3a\x01x" + b"\x10\x0a"
    assert decode_request(body, "protobuf") == CodecRequest(prompt_ids=(5, 6), max_tokens=10)


def test_content_type_routing() -> None:
    assert request_format_for_content_type("application/x-protobuf") is StreamFormat.PROTOBUF
    assert request_format_for_content_type("application/x-msgpack") is StreamFormat.MSGPACK
    assert request_format_for_content_type("text/plain") is StreamFormat.MSGPACK
    with pytest.raises(ValueError):
        encode_request(CodecRequest(), "msgpack-delta")


@pytest.mark.parametrize("body", [
    b"\x0a\x05\x01",                          # packed ids past the end
    b"\x1d\x00\x00",                          # float truncated
    b"\x22\x02\xff\xfe",                      # stop not UTF-8
    b"\x2a\x05ab",                            # stream_format truncated
    b"\x12\x00",                              # max_tokens with wire type 2
    b"\x0b",                                  # group start
    b"\x1d\x00\x00\xc0\x7f",                  # temperature NaN
    b"\x00\x00",                              # field 0
], ids=bytes.hex)
def test_malformed_protobuf_is_a_400(body: bytes) -> None:
    with pytest.raises(MalformedFrame) as info:
        decode_request(body, "protobuf")
    assert info.value.status_hint == 400


@pytest.mark.parametrize("body", [
    b"\x10" + b"\x80" * 5 + b"\x01",          # max_tokens: 6-byte varint
    b"\x0a\x05\xff\xff\xff\xff\x7f",          # prompt id over uint32
], ids=bytes.hex)
def test_varint_overflow_is_a_400(body: bytes) -> None:
    with pytest.raises(VarintOverflow) as info:
        decode_request(body, "protobuf")
    assert info.value.status_hint == 400


@pytest.mark.parametrize("obj", [
    [1, 2], {"prompt_ids": [-1]}, {"prompt_ids": "x"}, {"max_tokens": 2**32},
    {"temperature": "hot"}, {"stop": [1]}, {"temperature": float("inf")},
], ids=str)
def test_malformed_msgpack_is_a_400(obj: object) -> None:
    with pytest.raises(MalformedFrame) as info:
        decode_request(msgspec.msgpack.encode(obj), "msgpack")
    assert info.value.status_hint == 400


def test_trailing_bytes_and_oversized_bodies() -> None:
    with pytest.raises(MalformedFrame):
        decode_request(b"\x80\x80", "msgpack")
    with pytest.raises(FrameTooLarge) as info:
        decode_request(b"\x80" + b"\x00" * 100, "msgpack", max_bytes=100)
    assert info.value.status_hint == 413


requests = st.builds(
    CodecRequest,
    prompt_ids=st.lists(UINT32, max_size=50).map(tuple),
    max_tokens=UINT32,
    temperature=st.none() | st.floats(-2, 2, width=32),
    stop=st.lists(st.text(max_size=8), max_size=3).map(tuple),
    stream_format=st.sampled_from(["msgpack", "protobuf", "msgpack-delta", "json", ""]),
)


@settings(max_examples=200)
@given(req=requests, fmt=st.sampled_from(["msgpack", "protobuf"]))
def test_round_trip(req: CodecRequest, fmt: str) -> None:
    assert decode_request(encode_request(req, fmt), fmt) == req


@settings(max_examples=300)
@given(raw=st.binary(max_size=48), fmt=st.sampled_from(["msgpack", "protobuf"]))
def test_fuzz_yields_requests_or_remote_errors(raw: bytes, fmt: str) -> None:
    try:
        assert isinstance(decode_request(raw, fmt), CodecRequest)
    except RemoteProtocolError as exc:
        assert exc.status_hint in (400, 413)
