"""``msgpack-delta`` frames (codec-spec.md §1.4): the reference byte shape, chained zigzag
deltas, self-anchoring frames."""

from __future__ import annotations

import itertools

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.codec.test_frames_msgpack import (
    UINT32,
    VECTORS,
    assert_decodes,
    assert_rejects,
    decode_chunks,
    outcome,
)
from tokenwire.codec.frames import Frame, ToolCall
from tokenwire.codec.frames_delta import (
    FrameDecoder,
    FrameEncoder,
    encode_delta_frame,
    zigzag_decode,
    zigzag_encode,
)
from tokenwire.errors import DataAfterDone, LocalProtocolError, MalformedFrame, TruncatedStream


def _frame(v: dict) -> Frame:
    return Frame(ids=tuple(v["ids"]), done=v["done"], finish_reason=v["finish_reason"])


@pytest.mark.parametrize("vector", VECTORS["delta_msgpack_frames"], ids=lambda v: v["hex"][:24])
def test_golden_vector_encodes_byte_exact(vector: dict) -> None:
    assert encode_delta_frame(_frame(vector), vector["base_id"]).hex() == vector["hex"]
    assert msgspec.msgpack.decode(bytes.fromhex(vector["hex"]))["ids_delta"] == \
        vector["ids_delta"]


@pytest.mark.parametrize("vector", VECTORS["delta_msgpack_frames"], ids=lambda v: v["hex"][:24])
def test_golden_vector_decodes_in_any_chunking(vector: dict) -> None:
    frame = _frame(vector)
    assert_decodes(FrameDecoder, bytes.fromhex(vector["hex"]), [frame], eof=frame.done)


def test_finish_reason_is_nil_not_omitted() -> None:
    data = encode_delta_frame(Frame(ids=[10, 20, 30, 15, 100], done=False))
    assert data == (b"\x84\xa7base_id\x00\xa9ids_delta\x95\x14\x14\x14\x1d\xcc\xaa"
                    b"\xa4done\xc2\xadfinish_reason\xc0")


def test_encoder_chains_base_id_and_keeps_it_across_empty_frames() -> None:
    enc = FrameEncoder()
    frames = [Frame(ids=(5, 7), done=False), Frame(ids=(), done=False),
              Frame(ids=(6,), done=True, finish_reason="stop")]
    bases = [msgspec.msgpack.decode(enc.encode(f))["base_id"] for f in frames]
    assert bases == [0, 7, 7]


def test_each_frame_is_self_anchoring() -> None:
    enc = FrameEncoder()
    frames = [Frame(ids=(100, 90), done=False), Frame(ids=(80, 81), done=False),
              Frame(ids=(7,), done=True)]
    wire = [enc.encode(f) for f in frames]
    # Dropping the middle frame does not change how the last one decodes.
    assert decode_chunks(FrameDecoder, [wire[0], wire[2]]) == [frames[0], frames[2]]


def test_zigzag_is_protobufs_sint_mapping() -> None:
    assert [zigzag_encode(n) for n in (0, -1, 1, -2, 2)] == [0, 1, 2, 3, 4]
    for n in (0, 1, -1, 2**32 - 1, -(2**32 - 1)):
        assert zigzag_decode(zigzag_encode(n)) == n


def test_absent_finish_reason_key_is_accepted() -> None:
    raw = msgspec.msgpack.encode({"base_id": 3, "ids_delta": [2], "done": True})
    assert_decodes(FrameDecoder, raw, [Frame(ids=(4,), done=True)])


@pytest.mark.parametrize("obj", [
    {"base_id": 0, "ids_delta": [1], "done": True},              # rebuilds id -1
    {"base_id": 2**32 - 1, "ids_delta": [2], "done": True},       # rebuilds id 2**32
    {"base_id": -1, "ids_delta": [], "done": True},               # signed base
    {"base_id": 0, "ids_delta": [2**33], "done": True},           # delta beyond any uint32 pair
    {"ids_delta": [], "done": True},                              # no base_id
    {"base_id": 0, "done": True},                                 # no ids_delta
    {"base_id": 0, "ids_delta": [], "done": None},                # done not a bool
], ids=str)
def test_invalid_delta_frames_are_malformed(obj: dict) -> None:
    assert_rejects(FrameDecoder, msgspec.msgpack.encode(obj), MalformedFrame)


def test_tool_calls_cannot_be_carried() -> None:
    with pytest.raises(LocalProtocolError):
        FrameEncoder().encode(Frame(ids=[1], done=False, tool_calls=(ToolCall(),)))


def test_stream_rules() -> None:
    enc = FrameEncoder()
    body = enc.encode(Frame(ids=(1,), done=False))
    assert_rejects(FrameDecoder, body, TruncatedStream)
    done = enc.encode(Frame(ids=(2,), done=True))
    assert_rejects(FrameDecoder, body + done + body, DataAfterDone)


stream = st.lists(st.lists(UINT32, max_size=30).map(tuple), max_size=8)


@settings(max_examples=120, suppress_health_check=[HealthCheck.too_slow])
@given(ids_per_frame=stream, data=st.data())
@example(ids_per_frame=[(0, 2**32 - 1, 0)], data=None)
def test_round_trip_in_any_chunking(ids_per_frame: list[tuple[int, ...]], data) -> None:
    frames = [Frame(ids=ids, done=False) for ids in ids_per_frame]
    frames.append(Frame(ids=(), done=True, finish_reason="stop"))
    enc = FrameEncoder()
    body = b"".join(map(enc.encode, frames))
    if data is None:
        chunks = [body]
    else:
        cuts = data.draw(st.lists(st.integers(0, len(body)), max_size=10).map(sorted))
        bounds = [0, *cuts, len(body)]
        chunks = [body[a:b] for a, b in itertools.pairwise(bounds)]
    assert decode_chunks(FrameDecoder, chunks) == frames


def test_round_trip_of_a_70000_id_frame() -> None:
    ids = tuple((i * 2654435761) % 2**32 for i in range(70_000))
    frames = [Frame(ids=ids, done=True, finish_reason="length")]
    body = FrameEncoder().encode(frames[0])
    assert decode_chunks(FrameDecoder, [body]) == frames


@settings(max_examples=300)
@given(raw=st.binary(max_size=64))
def test_fuzz_yields_frames_or_remote_errors(raw: bytes) -> None:
    whole = outcome(FrameDecoder, [raw])
    assert whole == outcome(FrameDecoder, [raw[i : i + 1] for i in range(len(raw))])


def test_done_rule_outranks_a_bad_frame_after_it() -> None:
    done = encode_delta_frame(Frame(ids=(1,), done=True))
    bad = msgspec.msgpack.encode({"base_id": 0, "ids_delta": [1], "done": False})
    assert_rejects(FrameDecoder, done + bad, DataAfterDone)


@settings(max_examples=200)
@given(ids_per_frame=stream, flip=st.integers(0, 10_000), value=st.integers(0, 255))
def test_fuzz_corrupted_streams(ids_per_frame, flip: int, value: int) -> None:
    enc = FrameEncoder()
    frames = [Frame(ids=ids, done=False) for ids in ids_per_frame] + [Frame(ids=(), done=True)]
    body = bytearray(b"".join(map(enc.encode, frames)))
    body[flip % len(body)] = value
    assert outcome(FrameDecoder, [bytes(body)]) == outcome(
        FrameDecoder, [bytes(body[i : i + 1]) for i in range(len(body))])
