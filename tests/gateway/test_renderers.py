"""API renderers without a server (STYLE §6 item 10): IR events in, wire bytes out."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenwire.codec import frames_delta, frames_msgpack, frames_protobuf
from tokenwire.codec.frames import StreamFormat
from tokenwire.gateway.apis.chat import ChatRenderer, parse_chat_request
from tokenwire.gateway.apis.codec_stream import CodecStreamRenderer
from tokenwire.gateway.apis.completions import CompletionsRenderer, parse_completions_request
from tokenwire.gateway.apis.params import SUPPORTED_STREAM_FORMATS
from tokenwire.gateway.ir import (
    ChatPrompt,
    Failure,
    FailureClass,
    Finish,
    FinishKind,
    PromptIds,
    PromptText,
    ResponseMeta,
    TokenDelta,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
    Usage,
)
from tokenwire.gateway.stops import StopMatcher

DECODERS = {
    StreamFormat.MSGPACK: frames_msgpack.FrameDecoder,
    StreamFormat.PROTOBUF: frames_protobuf.FrameDecoder,
    StreamFormat.MSGPACK_DELTA: frames_delta.FrameDecoder,
}


def _decode(fmt: StreamFormat, chunks: list[bytes]):
    dec = DECODERS[fmt]()
    frames = dec.feed(b"".join(chunks))
    dec.feed_eof()
    return frames


def _sse(chunks: list[bytes]) -> list[object]:
    text = b"".join(chunks).decode()
    assert text.endswith("\n\n")
    out = []
    for block in text.split("\n\n")[:-1]:
        assert block.startswith("data: ")
        data = block[len("data: "):]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


# -- Codec frames ----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", list(StreamFormat))
@settings(max_examples=50, deadline=None)
@given(deltas=st.lists(st.lists(st.integers(0, 2**32 - 1), max_size=5), max_size=20))
def test_codec_frames_carry_exactly_the_ids_of_the_deltas(fmt, deltas) -> None:
    r = CodecStreamRenderer(fmt)
    chunks = [c for d in deltas for c in r.on_event(TokenDelta(ids=tuple(d), text="x"))]
    chunks += r.on_event(Finish(reason=FinishKind.LENGTH))
    frames = _decode(fmt, chunks)
    assert [i for f in frames for i in f.ids] == [i for d in deltas for i in d]
    assert all(f.ids for f in frames[:-1]), "only the terminal frame may have empty ids"
    assert frames[-1].done and frames[-1].finish_reason == "length"


@pytest.mark.parametrize(("kind", "wire"), [
    (FinishKind.EOS, "eos_token"), (FinishKind.STOP_SEQUENCE, "stop_sequence"),
    (FinishKind.LENGTH, "length"), (FinishKind.POLICY_VIOLATION, "policy_violation"),
    (FinishKind.TOOL_CALLS, "eos_token"), (FinishKind.ABORT, "error"),
])
def test_finish_reason_is_mapped_to_the_spec_vocabulary(kind, wire) -> None:
    r = CodecStreamRenderer(StreamFormat.MSGPACK)
    frames = _decode(StreamFormat.MSGPACK, r.on_event(Finish(reason=kind, matched_stop="x")))
    assert frames[-1].finish_reason == wire


def test_policy_violation_is_error_for_clients_below_v0_4() -> None:
    r = CodecStreamRenderer(StreamFormat.MSGPACK, client_version=(0, 3))
    fin = r.on_event(Finish(reason=FinishKind.POLICY_VIOLATION))
    assert _decode(StreamFormat.MSGPACK, fin)[-1].finish_reason == "error"


def test_legacy_mode_writes_stop_like_the_engine_forks() -> None:
    r = CodecStreamRenderer(StreamFormat.PROTOBUF, legacy_finish_reason=True)
    fin = r.on_event(Finish(reason=FinishKind.EOS))
    assert _decode(StreamFormat.PROTOBUF, fin)[-1].finish_reason == "stop"


@pytest.mark.parametrize("fmt", list(StreamFormat))
def test_mid_stream_failure_is_a_terminal_error_frame(fmt) -> None:
    r = CodecStreamRenderer(fmt)
    chunks = r.on_event(TokenDelta(ids=(5, 6)))
    chunks += r.on_event(Failure(failure_class=FailureClass.UPSTREAM, message="boom"))
    frames = _decode(fmt, chunks)
    assert frames[-1].done and frames[-1].finish_reason == "error"
    assert r.on_error(RuntimeError("late")) == [], "nothing may follow the terminal frame"


@pytest.mark.parametrize("fmt", list(StreamFormat))
def test_exception_after_headers_ends_the_stream_with_error(fmt) -> None:
    r = CodecStreamRenderer(fmt)
    chunks = r.on_event(TokenDelta(ids=(1,))) + r.on_error(RuntimeError("x"))
    assert _decode(fmt, chunks)[-1].finish_reason == "error"


def test_tool_call_fragments_are_assembled_on_the_terminal_frame() -> None:
    r = CodecStreamRenderer(StreamFormat.MSGPACK)
    r.on_event(ToolCallDelta(index=0, id="tc_1", name="get", arguments='{"a"'))
    r.on_event(ToolCallDelta(index=0, arguments=": 1}"))
    frame = _decode(StreamFormat.MSGPACK, r.on_event(Finish(reason=FinishKind.TOOL_CALLS)))[-1]
    assert [(t.id, t.name, t.arguments_json) for t in frame.tool_calls] == [
        ("tc_1", "get", '{"a": 1}')]


# -- OpenAI Completions ----------------------------------------------------------------------


def _completions(stream: bool, **kw) -> CompletionsRenderer:
    return CompletionsRenderer(completion_id="cmpl-1", model="m", created=1, stream=stream, **kw)


@settings(max_examples=200, deadline=None)
@given(tokens=st.lists(st.text("ab", min_size=0, max_size=2), max_size=12),
       stop=st.text("ab", min_size=1, max_size=3))
def test_stop_matcher_sends_the_logprobs_of_the_tokens_the_text_shows(tokens, stop) -> None:
    """A token's logprob goes out once its text begins in the shown text; the tokens that
    begin inside the matched stop string are not sent (their text never is)."""
    m = StopMatcher([stop])
    shown, sent = "", []
    for i, piece in enumerate(tokens):
        text, lps = m.feed_delta(piece, [i])
        shown, sent = shown + text, sent + lps
        if m.matched is not None:
            break
    text, lps = m.flush_delta()
    shown, sent = shown + text, sent + lps
    starts = list(itertools.accumulate((len(t) for t in tokens), initial=0))
    fed = len(tokens) if m.matched is None else i + 1
    want = [k for k in range(fed) if starts[k] < len(shown) or m.matched is None]
    assert sent == want


def test_completions_top_logprobs_hold_the_sampled_token() -> None:
    """OpenAI: "the API will always return the logprob of the sampled token, so there may
    be up to logprobs+1 elements"; a hot sample outside the top ones was missing."""
    r = _completions(False)
    r.on_event(TokenDelta(ids=(1,), text="b", logprobs=(TokenLogprob(
        token="b", bytes=(98,), logprob=-2.5, top=(TopLogprob(token="a", bytes=(97,),
                                                             logprob=-0.1),)),)))
    r.on_event(TokenDelta(ids=(2,), text="c", logprobs=(TokenLogprob(
        token="c", bytes=(99,), logprob=-0.2),)))
    (body,) = r.on_event(Finish(reason=FinishKind.LENGTH))
    assert json.loads(body)["choices"][0]["logprobs"]["top_logprobs"] == [
        {"a": -0.1, "b": -2.5}, {"c": -0.2}]


def test_completions_stream_is_sse_chunks_then_done() -> None:
    r = _completions(True, include_usage=True, return_token_ids=True)
    out = r.on_event(TokenDelta(ids=(1,), text="Hel"))
    out += r.on_event(TokenDelta(ids=(2,), text="lo"))
    out += r.on_event(Usage(prompt_tokens=3, completion_tokens=2))
    out += r.on_event(Finish(reason=FinishKind.STOP_SEQUENCE, matched_stop="\n"))
    events = _sse(out)
    assert events[-1] == "[DONE]"
    texts = [e["choices"][0]["text"] for e in events[:-1] if e["choices"]]
    assert "".join(texts) == "Hello"
    assert events[2]["choices"][0]["finish_reason"] == "stop"
    assert events[0]["choices"][0]["token_ids"] == [1]
    assert events[0]["object"] == "text_completion"
    assert events[3]["choices"] == [] and events[3]["usage"]["total_tokens"] == 5


def test_completions_body_is_one_json_object() -> None:
    r = _completions(False)
    assert r.on_event(TokenDelta(ids=(1,), text="a")) == []
    r.on_event(Usage(prompt_tokens=1, completion_tokens=1))
    (body,) = r.on_event(Finish(reason=FinishKind.LENGTH))
    doc = json.loads(body)
    assert doc["choices"][0] == {"index": 0, "text": "a", "logprobs": None,
                                 "finish_reason": "length"}
    assert doc["usage"] == {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2,
                            "prompt_tokens_details": None, "completion_tokens_details": None,
                            "tokenwire_source": "upstream"}


def test_completions_failure_mid_stream_is_an_error_event() -> None:
    r = _completions(True)
    out = r.on_event(Failure(failure_class=FailureClass.UPSTREAM, message="engine died",
                             status=503))
    events = _sse(out)
    assert events[0]["error"]["message"] == "engine died" and events[-1] == "[DONE]"


def test_policy_violation_is_content_filter_for_openai_clients() -> None:
    events = _sse(_completions(True).on_event(Finish(reason=FinishKind.POLICY_VIOLATION)))
    assert events[0]["choices"][0]["finish_reason"] == "content_filter"


# -- Chat ------------------------------------------------------------------------------------


def test_chat_stream_opens_with_the_role_and_closes_with_finish_reason() -> None:
    r = ChatRenderer(completion_id="c", model="m", created=1, stream=True)
    out = r.on_event(TokenDelta(ids=(1,), text="Hi"))
    out += r.on_event(TokenDelta(ids=(2,), text=""))
    out += r.on_event(Finish(reason=FinishKind.EOS))
    events = _sse(out)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert events[1]["choices"][0]["delta"] == {"content": "Hi"}
    assert events[2]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None,
                                       "finish_reason": "stop"}
    assert all(e["object"] == "chat.completion.chunk" for e in events[:-1])


def test_chat_stream_without_content_still_sends_the_role_chunk() -> None:
    r = ChatRenderer(completion_id="c", model="m", created=1, stream=True)
    events = _sse(r.on_event(Finish(reason=FinishKind.LENGTH)))
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert events[1]["choices"][0]["finish_reason"] == "length"


def test_chat_body_assembles_message_and_tool_calls() -> None:
    r = ChatRenderer(completion_id="c", model="m", created=1, stream=False)
    r.on_event(TokenDelta(text="ok"))
    r.on_event(ToolCallDelta(index=0, id="t", name="f", arguments="{}"))
    (body,) = r.on_event(Finish(reason=FinishKind.TOOL_CALLS))
    choice = json.loads(body)["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "ok"
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "f", "arguments": "{}"}


# -- request parsing -------------------------------------------------------------------------


def test_unknown_stream_format_is_400_listing_the_supported_ones() -> None:
    with pytest.raises(Exception) as info:
        parse_completions_request({"prompt": "x", "stream_format": "cbor"})
    assert info.value.status_hint == 400
    for fmt in SUPPORTED_STREAM_FORMATS:
        assert fmt in str(info.value)


@pytest.mark.parametrize("fmt", [f.value for f in StreamFormat])
def test_n_above_one_with_a_binary_format_is_400(fmt) -> None:
    with pytest.raises(Exception) as info:
        parse_completions_request({"prompt": "x", "stream_format": fmt, "n": 2})
    assert info.value.status_hint == 400 and "n must be 1" in str(info.value)


def test_prompt_as_text_or_ids() -> None:
    assert parse_completions_request({"prompt": "hi"}).request.prompt == PromptText(text="hi")
    call = parse_completions_request({"prompt": [1, 2], "stream_format": "msgpack"})
    assert call.request.prompt == PromptIds(ids=(1, 2)) and call.stream


def test_chat_request_parses_text_parts() -> None:
    call = parse_chat_request({"messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    ], "stop": "\n", "seed": 3})
    assert isinstance(call.request.prompt, ChatPrompt)
    assert call.request.prompt.messages[0].content == "ab"
    assert call.request.stop == ("\n",) and call.request.seed == 3


# -- stop sequences --------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(text=st.text("ab\n", max_size=30), stop=st.text("ab\n", min_size=1, max_size=3),
       cuts=st.lists(st.integers(0, 30), max_size=6))
def test_stop_matcher_output_is_the_text_before_the_first_stop(text, stop, cuts) -> None:
    m = StopMatcher([stop])
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    shown = "".join(m.feed(text[a:b]) for a, b in itertools.pairwise(bounds))
    if m.matched is None:
        shown += m.flush()
    pos = text.find(stop)
    assert shown == (text if pos < 0 else text[:pos])
    assert (m.matched is not None) == (pos >= 0)


def test_heartbeats_are_sse_comments_on_chat_and_completions_and_empty_frames_on_codec() -> None:
    """Keep-alives every parser skips: an SSE comment (a chunk without choices would break
    clients that read ``choices[0]``), a Codec frame with no ids (codecai skips it too)."""
    from tokenwire.codec import frames_msgpack
    from tokenwire.codec.frames import StreamFormat
    from tokenwire.gateway.apis.chat import ChatRenderer
    from tokenwire.gateway.apis.codec_stream import CodecStreamRenderer
    from tokenwire.gateway.apis.completions import CompletionsRenderer
    from tokenwire.gateway.ir import Heartbeat

    chat = ChatRenderer(completion_id="c", model="m", created=0, stream=True,
                        include_usage=False)
    assert chat.on_event(Heartbeat()) == [b": keep-alive\n\n"]
    assert ChatRenderer(completion_id="c", model="m", created=0, stream=False,
                        include_usage=False).on_event(Heartbeat()) == []
    comp = CompletionsRenderer(completion_id="c", model="m", created=0, stream=True,
                               include_usage=False, return_token_ids=False)
    assert comp.on_event(Heartbeat()) == [b": keep-alive\n\n"]
    codec = CodecStreamRenderer(StreamFormat.MSGPACK)
    (frame,) = frames_msgpack.FrameDecoder().feed(b"".join(codec.on_event(Heartbeat())))
    assert frame.ids == () and not frame.done


_DELTA_TEXT = st.lists(st.sampled_from(
    ['a', ' ', '"', '\\', '\n', '\x00', 'é', '😀', '\u2028', '\x00tokenwire content\x00']),
    max_size=6).map("".join)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(
    _DELTA_TEXT.map(lambda t: TokenDelta(ids=(1,), text=t)),
    st.just(TokenDelta(ids=(2,), text="", logprobs=(
        TokenLogprob(token="x", bytes=(120,), logprob=-0.5),))),
    st.just(TokenDelta(ids=(3,), text="y", logprobs=(
        TokenLogprob(token="y", bytes=(121,), logprob=-1.0),))),
    st.sampled_from(["other-model", "\x00tokenwire content\x00"]).map(
        lambda m: ResponseMeta(model=m))), max_size=12),
    st.sampled_from(["c", "\x00tokenwire content\x00"]))
def test_a_text_delta_chunk_is_the_envelope_s_bytes_whatever_the_text(events, cid) -> None:
    """The chat renderer's text-delta chunk (``_content_chunk``: the envelope encoded once
    around a marker) is byte for byte what encoding each chunk's envelope gives, through
    held-back logprobs, a model that changes mid-stream, and ids or text holding the
    marker."""
    fast = ChatRenderer(completion_id=cid, model="m", created=1, stream=True)
    slow = ChatRenderer(completion_id=cid, model="m", created=1, stream=True)
    for event in [*events, Finish(reason=FinishKind.EOS)]:
        slow._content_frame = False  # every chunk through the envelope's encoding
        assert fast.on_event(event) == slow.on_event(event)
