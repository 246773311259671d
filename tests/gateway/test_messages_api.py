"""Anthropic Messages (``POST /v1/messages``): the request parser, the sans-IO renderer, and the
route's error shapes over a real loopback server. One test per rule, named after it."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenwire.errors import RemoteProtocolError
from tokenwire.gateway.apis.messages import MessagesRenderer
from tokenwire.gateway.apis.messages_request import parse_messages_request
from tokenwire.gateway.ir import (
    ChatMessage,
    Event,
    Failure,
    FailureClass,
    Finish,
    FinishKind,
    ImagePart,
    MessageToolCall,
    ReasoningDelta,
    TextPart,
    TokenDelta,
    ToolCallDelta,
    Usage,
)

from .conftest import ScriptedUpstream

USER = [{"role": "user", "content": "Hi"}]


def parse(**body: Any):
    return parse_messages_request({"model": "m", "max_tokens": 64, "messages": USER, **body})


def render(events: list[Event], *, stream: bool = True, signed_by: str | None = None
           ) -> list[tuple[str, dict[str, Any]]]:
    """Feed ``events``; return (event name, data) pairs (or [("body", json)] unstreamed)."""
    r = MessagesRenderer(message_id="msg_1", model="m", stream=stream, signed_by=signed_by)
    raw = b"".join(b for ev in events for b in r.on_event(ev))
    if not stream:
        return [("body", json.loads(raw))]
    return sse_events(raw)


def sse_events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for chunk in raw.decode().split("\n\n"):
        if not chunk:
            continue
        name, data = chunk.split("\n")
        assert name.startswith("event: ") and data.startswith("data: ")
        payload = json.loads(data[6:])
        assert payload["type"] == name[7:]  # every event names its own type
        out.append((name[7:], payload))
    return out


def names(events: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [n for n, _ in events]


END = [Usage(prompt_tokens=7, completion_tokens=3), Finish(reason=FinishKind.EOS)]


# -- request parsing ---------------------------------------------------------------------------


def test_max_tokens_is_required() -> None:
    with pytest.raises(RemoteProtocolError, match="max_tokens"):
        parse_messages_request({"model": "m", "messages": USER})


def test_system_string_or_text_blocks_becomes_one_system_message() -> None:
    for system in ("Be brief.", [{"type": "text", "text": "Be"}, {"type": "text",
                                                                  "text": "brief."}]):
        first = parse(system=system).request.prompt.messages[0]
        assert first.role == "system" and first.text in ("Be brief.", "Be\n\nbrief.")


def test_tool_use_and_tool_result_ids_are_kept_exactly() -> None:
    msgs = [*USER,
            {"role": "assistant", "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_01AbC", "name": "get", "input": {"q": 1}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01AbC", "content": "42"},
                {"type": "text", "text": "thanks"}]}]
    out = parse(messages=msgs).request.prompt.messages
    assert out[1] == ChatMessage(role="assistant", content="Checking.", tool_calls=(
        MessageToolCall(id="toolu_01AbC", name="get", arguments='{"q":1}'),))
    assert out[2] == ChatMessage(role="tool", tool_call_id="toolu_01AbC", content="42")
    assert out[3] == ChatMessage(role="user", content="thanks")


def test_tool_result_blocks_and_is_error_are_kept() -> None:
    msgs = [*USER, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "is_error": True,
                                      "content": [{"type": "text", "text": "boom"}]}]}]
    tool = parse(messages=msgs).request.prompt.messages[2]
    assert tool.tool_call_id == "t1" and tool.text == "Error: boom"


def test_image_sources_become_data_or_plain_urls() -> None:
    content = [{"type": "text", "text": "What is it?"},
               {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                            "data": "iVBOR"}},
               {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]
    msg = parse(messages=[{"role": "user", "content": content}]).request.prompt.messages[0]
    assert msg.content == (TextPart(text="What is it?"),
                           ImagePart(url="data:image/png;base64,iVBOR",
                                     param="messages.0.content.1"),
                           ImagePart(url="https://x/y.png", param="messages.0.content.2"))


def _thinking_turns() -> list[dict[str, Any]]:
    return [*USER, {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "ponder", "signature": "SIG"},
        {"type": "redacted_thinking", "data": "REDACTED"},
        {"type": "text", "text": "Done."}]}, {"role": "user", "content": "more"}]


def test_signed_thinking_is_kept_only_for_an_anthropic_upstream() -> None:
    body = {"model": "m", "max_tokens": 9, "messages": _thinking_turns()}
    kept = parse_messages_request(body, encrypted_for="claude").request.prompt.messages[1]
    assert kept.reasoning == "ponder"
    assert [(n, json.loads(b)) for n, b in kept.reasoning_encrypted] == [
        ("claude", {"type": "thinking", "thinking": "ponder", "signature": "SIG"}),
        ("claude", {"type": "redacted_thinking", "data": "REDACTED"})]
    plain = parse_messages_request(body).request.prompt.messages[1]
    assert plain.reasoning == "ponder" and plain.reasoning_encrypted == ()


@pytest.mark.parametrize(("choice", "ir", "parallel"), [
    ({"type": "auto"}, "auto", None), ({"type": "any"}, "required", None),
    ({"type": "none"}, "none", None),
    ({"type": "tool", "name": "f", "disable_parallel_tool_use": True}, {"name": "f"}, False)])
def test_tool_choice_maps_to_ir(choice: dict, ir: Any, parallel: bool | None) -> None:
    req = parse(tool_choice=choice, tools=[{"name": "f", "description": "d",
                                            "input_schema": {"type": "object"}}]).request
    assert (req.tool_choice, req.parallel_tool_calls) == (ir, parallel)
    assert req.tools[0].parameters == {"type": "object"} and req.tools[0].description == "d"


def test_sampling_stop_sequences_thinking_and_ignored_top_k() -> None:
    call = parse(temperature=0.5, top_p=0.9, top_k=5, stop_sequences=["END"],
                 thinking={"type": "enabled", "budget_tokens": 4096}, metadata={"user_id": "u"},
                 stream=True)
    req = call.request
    assert (req.temperature, req.top_p, req.stop, req.reasoning_effort) == (
        0.5, 0.9, ("END",), "medium")
    assert call.stream and req.top_k is not None  # forwarded now (Anthropic has top_k)


def test_adaptive_thinking_takes_its_effort_from_output_config() -> None:
    assert parse(thinking={"type": "adaptive"},
                 output_config={"effort": "high"}).request.reasoning_effort == "high"
    assert parse(thinking={"type": "adaptive"}).request.reasoning_effort == "medium"
    assert parse(thinking={"type": "disabled"}).request.reasoning_effort is None
    with pytest.raises(RemoteProtocolError, match="thinking"):
        parse(thinking={"type": "sometimes"})


# -- the renderer ------------------------------------------------------------------------------


def test_text_stream_is_the_documented_event_sequence() -> None:
    ev = render([TokenDelta(text="Hel"), TokenDelta(text="lo"), *END])
    assert names(ev) == ["message_start", "content_block_start", "content_block_delta",
                         "content_block_delta", "content_block_stop", "message_delta",
                         "message_stop"]
    msg = ev[0][1]["message"]
    assert msg["id"].startswith("msg_") and msg["role"] == "assistant" and msg["content"] == []
    assert "input_tokens" in msg["usage"]
    assert ev[1][1] == {"type": "content_block_start", "index": 0,
                        "content_block": {"type": "text", "text": ""}}
    assert ev[2][1]["delta"] == {"type": "text_delta", "text": "Hel"}
    assert ev[5][1]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert ev[5][1]["usage"]["output_tokens"] == 3


@pytest.mark.parametrize(("kind", "reason"), [
    (FinishKind.EOS, "end_turn"), (FinishKind.LENGTH, "max_tokens"),
    (FinishKind.TOOL_CALLS, "tool_use"), (FinishKind.POLICY_VIOLATION, "refusal"),
    (FinishKind.CONTENT_FILTER, "refusal")])
def test_finish_kind_maps_to_stop_reason(kind: FinishKind, reason: str) -> None:
    ev = render([TokenDelta(text="x"), Finish(reason=kind)])
    assert ev[-2][1]["delta"]["stop_reason"] == reason


def test_stop_sequence_names_the_matched_stop() -> None:
    ev = render([TokenDelta(text="x"), Finish(reason=FinishKind.STOP_SEQUENCE,
                                              matched_stop="END")])
    assert ev[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}


def test_tool_use_block_keeps_the_upstream_id_and_streams_partial_json() -> None:
    ev = render([ToolCallDelta(index=0, id="call_abc", name="get"),
                 ToolCallDelta(index=0, arguments='{"q":'), ToolCallDelta(index=0,
                                                                          arguments="1}"),
                 Finish(reason=FinishKind.TOOL_CALLS)])
    assert ev[1][1]["content_block"] == {"type": "tool_use", "id": "call_abc", "name": "get",
                                         "input": {}}
    assert [d["delta"] for n, d in ev if n == "content_block_delta"] == [
        {"type": "input_json_delta", "partial_json": '{"q":'},
        {"type": "input_json_delta", "partial_json": "1}"}]


def test_tool_call_without_id_gets_a_toolu_id() -> None:
    ev = render([ToolCallDelta(index=0, name="get", arguments="{}"),
                 Finish(reason=FinishKind.TOOL_CALLS)])
    assert ev[1][1]["content_block"]["id"].startswith("toolu_")


def test_parallel_calls_with_interleaved_fragments_become_sequential_blocks() -> None:
    ev = render([ToolCallDelta(index=0, id="a", name="f"), ToolCallDelta(index=1, id="b",
                                                                         name="g"),
                 ToolCallDelta(index=0, arguments='{"x":'), ToolCallDelta(index=1,
                                                                          arguments='{"y":'),
                 ToolCallDelta(index=0, arguments="1}"), ToolCallDelta(index=1, arguments="2}"),
                 Finish(reason=FinishKind.TOOL_CALLS)])
    blocks: dict[int, str] = {}
    order = []
    for n, d in ev:
        if n == "content_block_start":
            order.append(d["content_block"]["id"])
            blocks[d["index"]] = ""
        elif n == "content_block_delta":
            assert d["index"] == max(blocks)  # only the newest block is ever open
            blocks[d["index"]] += d["delta"]["partial_json"]
    assert order == ["a", "b"] and blocks == {0: '{"x":1}', 1: '{"y":2}'}


@pytest.mark.parametrize("between", [TokenDelta(text="Note."), ReasoningDelta(text="hm")])
def test_text_between_a_calls_fragments_waits_and_never_cuts_its_streamed_input(
        between: Event) -> None:
    # An upstream sent text (or reasoning) between two fragments of call "b", which waited
    # behind open call "a". Before, the text closed both blocks, and the fragments after it
    # never reached the stream: "b" streamed '{"y":' alone (the SDK fails to parse it)
    # while the non-streamed body had '{"y":2}'.
    events = [ToolCallDelta(index=0, id="a", name="f", arguments='{"x":'),
              ToolCallDelta(index=1, id="b", name="g", arguments='{"y":'), between,
              ToolCallDelta(index=0, arguments="1}"), ToolCallDelta(index=1, arguments="2}"),
              Finish(reason=FinishKind.TOOL_CALLS)]
    streamed: dict[int, list[Any]] = {}
    for n, d in render(events):
        if n == "content_block_start":
            streamed[d["index"]] = [d["content_block"]["type"], ""]
        elif n == "content_block_delta":
            delta = d["delta"]
            streamed[d["index"]][1] += delta.get("partial_json", delta.get("text",
                                                                            delta.get("thinking")))
    kind = "text" if isinstance(between, TokenDelta) else "thinking"
    shown = between.text  # type: ignore[attr-defined]
    assert list(streamed.values()) == [["tool_use", '{"x":1}'], ["tool_use", '{"y":2}'],
                                       [kind, shown]]
    body = render(events, stream=False)[0][1]["content"]
    assert [b.get("input") for b in body[:2]] == [{"x": 1}, {"y": 2}]


def test_reasoning_is_a_thinking_block_before_the_text() -> None:
    ev = render([ReasoningDelta(text="hmm"), TokenDelta(text="Yes"), *END])
    assert ev[1][1]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    assert ev[2][1]["delta"] == {"type": "thinking_delta", "thinking": "hmm"}
    assert ev[3][0] == "content_block_stop" and ev[4][1]["content_block"]["type"] == "text"


def test_signature_delta_only_for_blobs_of_the_anthropic_upstream() -> None:
    blob = json.dumps({"type": "thinking", "thinking": "hmm", "signature": "SIG"})
    events = [ReasoningDelta(text="hmm"), ReasoningDelta(text="", encrypted=(("claude", blob),)),
              TokenDelta(text="ok"), *END]
    signed = render(events, signed_by="claude")
    assert signed[3][1]["delta"] == {"type": "signature_delta", "signature": "SIG"}
    for other in (None, "someone-else"):
        assert all(d.get("delta", {}).get("type") != "signature_delta"
                   for _, d in render(events, signed_by=other))


def test_redacted_thinking_from_the_anthropic_upstream_is_its_own_block() -> None:
    blob = json.dumps({"type": "redacted_thinking", "data": "XYZ"})
    ev = render([ReasoningDelta(text="", encrypted=(("claude", blob),)), TokenDelta(text="ok"),
                 *END], signed_by="claude")
    assert ev[1][1]["content_block"] == {"type": "redacted_thinking", "data": "XYZ"}
    assert ev[2][0] == "content_block_stop"


def test_usage_reaches_message_delta_and_the_unstreamed_body() -> None:
    body = render([ReasoningDelta(text="r"), TokenDelta(text="Hi"),
                   ToolCallDelta(index=0, id="toolu_1", name="f", arguments='{"a":1}'),
                   Usage(prompt_tokens=7, completion_tokens=3),
                   Finish(reason=FinishKind.TOOL_CALLS)], stream=False)[0][1]
    assert body["type"] == "message" and body["id"] == "msg_1"
    assert body["content"] == [
        {"type": "thinking", "thinking": "r", "signature": ""}, {"type": "text", "text": "Hi"},
        {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}}]
    assert body["stop_reason"] == "tool_use"
    assert body["usage"] == {"input_tokens": 7, "output_tokens": 3,
                             "cache_creation_input_tokens": None,
                             "cache_read_input_tokens": None, "tokenwire_source": "upstream"}


@pytest.mark.parametrize(("failure", "type_", "message"), [
    (Failure(failure_class=FailureClass.CAPACITY, message="full", status=503),
     "overloaded_error", "full"),
    (Failure(failure_class=FailureClass.RATE_LIMITED, message="slow", status=429),
     "rate_limit_error", "slow"),
    (Failure(failure_class=FailureClass.UPSTREAM, message="broke", status=502),
     "api_error", "broke"),
    (Failure(failure_class=FailureClass.CONTEXT_LENGTH, message="long", status=400,
             prompt_tokens=5000, context_tokens=4096),
     "invalid_request_error", "prompt is too long: 5000 tokens > 4096 maximum"),
    # Reproduced: without the counts the upstream's words went as they were, and a Claude
    # client, which matches "prompt is too long", did not compact its conversation.
    (Failure(failure_class=FailureClass.CONTEXT_LENGTH, status=400,
             message="This model's maximum context length is 8192 tokens"),
     "invalid_request_error",
     "prompt is too long: This model's maximum context length is 8192 tokens"),
    (Failure(failure_class=FailureClass.CONTEXT_LENGTH, status=400,
             message="prompt is too long: 9000 > 8192"),
     "invalid_request_error", "prompt is too long: 9000 > 8192")])
def test_failure_after_start_is_one_error_event(failure: Failure, type_: str,
                                                message: str) -> None:
    ev = render([TokenDelta(text="x"), failure])
    assert names(ev)[-2:] == ["content_block_stop", "error"]
    assert ev[-1][1] == {"type": "error", "error": {"type": type_, "message": message}}


def test_on_error_after_start_is_an_api_error_event() -> None:
    r = MessagesRenderer(message_id="msg_1", model="m", stream=True)
    r.on_event(TokenDelta(text="x"))
    ev = sse_events(b"".join(r.on_error(RuntimeError("x"))))
    assert names(ev) == ["content_block_stop", "error"]
    assert ev[-1][1]["error"]["type"] == "api_error"
    assert r.on_error(RuntimeError("again")) == []


_ir = st.one_of(
    st.builds(TokenDelta, text=st.text(max_size=3)),
    st.builds(ReasoningDelta, text=st.text(max_size=3)),
    st.builds(ReasoningDelta, text=st.just(""), encrypted=st.sampled_from([
        (("claude", '{"type":"thinking","thinking":"t","signature":"S"}'),),
        (("claude", '{"type":"redacted_thinking","data":"D"}'),), (("other", "x"),),
        (("claude", "not json"),)])),
    st.builds(ToolCallDelta, index=st.integers(0, 3), id=st.none() | st.just("toolu_1"),
              name=st.none() | st.just("f"), arguments=st.sampled_from(["", "{", "}", "1"]),
              kind=st.sampled_from(["function", "custom"])),
    st.builds(Usage, prompt_tokens=st.integers(0, 9), completion_tokens=st.integers(0, 9)))
_terminal = st.builds(Finish, reason=st.sampled_from(list(FinishKind))) | st.builds(
    Failure, failure_class=st.sampled_from(list(FailureClass)), message=st.just("m"))


@settings(max_examples=200, deadline=None)
@given(st.lists(_ir, max_size=15), _terminal, st.booleans())
def test_every_ir_sequence_is_a_well_formed_messages_stream(events, terminal, crash) -> None:
    r = MessagesRenderer(message_id="msg_1", model="m", stream=True, signed_by="claude")
    raw = b"".join(b for ev in events for b in r.on_event(ev))
    raw += b"".join(r.on_error(RuntimeError("x")) if crash else r.on_event(terminal))
    ev = sse_events(raw)
    assert ev[0][0] == "message_start" and names(ev).count("message_start") == 1
    open_index = None
    for n, d in ev:
        if n == "content_block_start":
            assert open_index is None  # blocks never interleave
            open_index = d["index"]
        elif n in ("content_block_delta", "content_block_stop"):
            assert d["index"] == open_index
            open_index = None if n == "content_block_stop" else open_index
    assert open_index is None  # every block that started has stopped
    ends = [n for n in names(ev) if n in ("message_stop", "error")]
    assert len(ends) == 1 and names(ev)[-1] == ends[0]


# -- the route over HTTP -----------------------------------------------------------------------

TEXT = [(0.0, TokenDelta(text="Hello")), (0.0, Usage(prompt_tokens=4, completion_tokens=1)),
        (0.0, Finish(reason=FinishKind.EOS))]


@pytest.fixture(scope="module")
def text_server(serve):
    return serve(ScriptedUpstream(TEXT))


def post(url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + "/v1/messages", json=body, timeout=10)


def _is_anthropic_error(r: httpx.Response, status: int, type_: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == type_
    assert isinstance(body["error"]["message"], str)
    return body


def test_missing_max_tokens_is_400_in_anthropic_shape(text_server) -> None:
    r = post(text_server.url, {"model": "scripted", "messages": USER})
    assert "max_tokens" in _is_anthropic_error(r, 400, "invalid_request_error")["error"][
        "message"]


def test_unknown_model_is_404_not_found_error(text_server) -> None:
    _is_anthropic_error(post(text_server.url, {"model": "nope", "max_tokens": 5,
                                               "messages": USER}), 404, "not_found_error")


def test_invalid_json_and_too_large_bodies_are_anthropic_errors(serve) -> None:
    small = serve(ScriptedUpstream(TEXT), max_body_bytes=200)
    r = httpx.post(small.url + "/v1/messages", content=b"{nope", timeout=10)
    _is_anthropic_error(r, 400, "invalid_request_error")
    big = {"model": "scripted", "max_tokens": 5, "messages": [{"role": "user",
                                                              "content": "x" * 500}]}
    _is_anthropic_error(post(small.url, big), 413, "request_too_large")


@pytest.mark.parametrize(("failure", "status", "type_"), [
    (Failure(failure_class=FailureClass.CAPACITY, message="full", status=503), 529,
     "overloaded_error"),
    (Failure(failure_class=FailureClass.RATE_LIMITED, message="slow", status=429,
             retry_after=3), 429, "rate_limit_error"),
    (Failure(failure_class=FailureClass.CONTEXT_LENGTH, message="long", status=400,
             prompt_tokens=9000, context_tokens=4096), 400, "invalid_request_error")])
def test_failure_before_the_stream_is_an_http_error_with_anthropic_status(
        serve, failure: Failure, status: int, type_: str) -> None:
    srv = serve(ScriptedUpstream([(0.0, failure)]), retries=False)  # the mapping, not budgets
    r = post(srv.url, {"model": "scripted", "max_tokens": 5, "messages": USER,
                       "stream": True})
    body = _is_anthropic_error(r, status, type_)
    if failure.retry_after is not None:
        assert r.headers["retry-after"] == "3"
    if failure.prompt_tokens is not None:
        assert body["error"]["message"] == "prompt is too long: 9000 tokens > 4096 maximum"


def test_an_upstream_that_stays_busy_is_529_overloaded(serve) -> None:
    busy = serve(ScriptedUpstream(TEXT, capacity=0))
    r = post(busy.url, {"model": "scripted", "max_tokens": 5, "messages": USER})
    _is_anthropic_error(r, 529, "overloaded_error")


def test_stream_over_http_is_sse_with_named_events(text_server) -> None:
    r = post(text_server.url, {"model": "scripted", "max_tokens": 5, "messages": USER,
                               "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    ev = sse_events(r.content)
    assert names(ev)[0] == "message_start" and names(ev)[-1] == "message_stop"
    assert ev[0][1]["message"]["model"] == "scripted"
    assert "".join(d["delta"].get("text", "") for n, d in ev
                   if n == "content_block_delta") == "Hello"
    assert r.headers["x-request-id"] == ev[0][1]["message"]["id"]


def test_unstreamed_answer_is_one_message_body(text_server) -> None:
    r = post(text_server.url, {"model": "scripted", "max_tokens": 5, "messages": USER})
    body = r.json()
    assert body["content"] == [{"type": "text", "text": "Hello"}]
    assert body["usage"] == {"input_tokens": 4, "output_tokens": 1,
                             "cache_creation_input_tokens": None,
                             "cache_read_input_tokens": None, "tokenwire_source": "upstream"}
    assert body["id"].startswith("msg_") and body["stop_reason"] == "end_turn"


def test_a_heartbeat_is_anthropics_ping_event_and_nothing_when_not_streaming() -> None:
    from tokenwire.gateway.ir import Heartbeat

    events = render([Heartbeat(), TokenDelta(text="Hi"), Heartbeat(), *END])
    # before any output a ping does not open the message (message_start waits for output)
    assert names(events)[:3] == ["ping", "message_start", "content_block_start"]
    assert names(events).count("ping") == 2 and names(events)[-1] == "message_stop"
    assert render([Heartbeat(), TokenDelta(text="Hi"), *END], stream=False)[0][1]["content"] \
        == [{"type": "text", "text": "Hi"}]


def test_message_start_after_heartbeats_names_the_model_that_serves() -> None:
    """A fallback taken after heartbeats opened the stream (its ResponseMeta comes just
    before the first output): message_start, sent with the first output, names it."""
    from tokenwire.gateway.ir import Heartbeat, ResponseMeta

    events = render([Heartbeat(), Usage(prompt_tokens=9, completion_tokens=None), Heartbeat(),
                     ResponseMeta(model="backup"), TokenDelta(text="Hi"), *END])
    assert names(events)[:3] == ["ping", "ping", "message_start"]
    assert events[2][1]["message"]["model"] == "backup"
    assert names(events).count("message_start") == 1
    # a failure before any output still opens the message first, then the error
    failed = render([Heartbeat(), Failure(failure_class=FailureClass.UPSTREAM, status=502,
                                          message="down")])
    assert names(failed) == ["ping", "message_start", "error"]
