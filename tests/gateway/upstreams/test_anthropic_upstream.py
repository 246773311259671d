"""The Anthropic Messages upstream adapter against a scripted Messages server on a real socket.

Each test drives ``AnthropicUpstream.submit`` and checks the exact IR event sequence (or
the exact request the upstream received), named after the rule it checks.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.gateway.upstreams.streams import collect
from tokenwire.gateway.apis.messages_request import parse_messages_request
from tokenwire.gateway.ir import (
    ChatMessage,
    ChatPrompt,
    Event,
    Failure,
    FailureClass,
    Finish,
    FinishKind,
    GenerationRequest,
    ImagePart,
    MessageToolCall,
    ReasoningDelta,
    TextPart,
    TokenDelta,
    ToolCallDelta,
    ToolSpec,
    Usage,
    is_terminal,
)
from tokenwire.gateway.server import _check_probe
from tokenwire.gateway.upstreams.anthropic_upstream import (
    _HANDLERS,
    AnthropicUpstream,
    MessagesStreamParser,
    build_messages_body,
)
from tokenwire.gateway.upstreams.base import ModelRoute, UpstreamConfig, UpstreamState
from tokenwire.gateway.upstreams.sse import SSEEvent
from tokenwire.gateway.upstreams.sse_http import UNKNOWN_NAME_CHARS, UNKNOWN_NAMES

from .fakes_anthropic import MessagesStream, Script, ScriptedServer, anthropic_server, dumps
from .fakes_anthropic import error_body as err

KEY_ENV = "TW_TEST_ANTHROPIC_KEY"
SECRET = "sk-ant-test-secret"


@pytest.fixture(scope="module")
def server() -> Iterator[ScriptedServer]:
    srv = anthropic_server()
    yield srv
    srv.stop()


@pytest.fixture
def fake(server: ScriptedServer, monkeypatch: pytest.MonkeyPatch) -> ScriptedServer:
    monkeypatch.setenv(KEY_ENV, SECRET)
    server.scripts.clear()
    server.requests.clear()
    server.disconnected.clear()
    server.models_status = 200
    return server


def config(url: str) -> UpstreamConfig:
    return UpstreamConfig(name="claude", kind="anthropic", base_url=url, api_key_env=KEY_ENV,
                          models=(ModelRoute(name="sonnet", upstream_model="claude-test"),))


def run(url: str, body: Callable[[AnthropicUpstream], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        up = AnthropicUpstream.from_config(config(url))
        try:
            return await body(up)
        finally:
            await up.aclose()
    return asyncio.run(main())


def generate(fake: ScriptedServer, request: GenerationRequest, *scripts: Script) -> list[Event]:
    fake.push(*scripts)
    return run(fake.url, lambda up: collect(up.submit(request)))


def chat(*messages: ChatMessage, **kw: Any) -> GenerationRequest:
    return GenerationRequest(prompt=ChatPrompt(messages=messages), model="sonnet", **kw)


HELLO = chat(ChatMessage(role="user", content="Hi"))
#: message_start's prompt count (the fake's 12 input tokens, its caches 0), sent at once.
EARLY = Usage(prompt_tokens=12, completion_tokens=None, cached_tokens=0,
              cache_creation_tokens=0)


def final_usage(output_tokens: int) -> Usage:
    return Usage(prompt_tokens=12, completion_tokens=output_tokens, cached_tokens=0,
                 cache_creation_tokens=0)


# -- streams ---------------------------------------------------------------------------------


def test_text_deltas_then_usage_then_eos_with_pings_ignored(fake: ScriptedServer) -> None:
    s = MessagesStream(input_tokens=12).ping().text(["Hel", "lo"]).ping().end("end_turn", 4)
    assert generate(fake, HELLO, Script(s.chunks())) == [
        EARLY, TokenDelta(text="Hel"), TokenDelta(text="lo"),
        final_usage(4), Finish(reason=FinishKind.EOS)]


def test_parallel_tool_use_blocks_keep_ids_and_get_own_indexes(fake: ScriptedServer) -> None:
    s = (MessagesStream().text(["Let me check."])
         .tool_use("toolu_01A", "get_weather", ['{"city": ', '"Oslo"}'])
         .tool_use("toolu_01B", "get_time", ['{"tz": "CET"}']).end("tool_use", 30))
    assert generate(fake, HELLO, Script(s.chunks())) == [
        EARLY, TokenDelta(text="Let me check."),
        ToolCallDelta(index=0, id="toolu_01A", name="get_weather"),
        ToolCallDelta(index=0, arguments='{"city": '),
        ToolCallDelta(index=0, arguments='"Oslo"}'),
        ToolCallDelta(index=1, id="toolu_01B", name="get_time"),
        ToolCallDelta(index=1, arguments='{"tz": "CET"}'),
        final_usage(30), Finish(reason=FinishKind.TOOL_CALLS)]


def test_thinking_is_reasoning_and_signed_block_is_kept_for_this_upstream(
        fake: ScriptedServer) -> None:
    s = MessagesStream().thinking(["Let me ", "think."], "sig==").redacted("opaque").text(["4"])
    events = generate(fake, HELLO, Script(s.end().chunks()))
    signed = dumps({"type": "thinking", "thinking": "Let me think.", "signature": "sig=="})
    redacted = dumps({"type": "redacted_thinking", "data": "opaque"})
    assert events[:6] == [EARLY, ReasoningDelta(text="Let me "), ReasoningDelta(text="think."),
                          ReasoningDelta(text="", encrypted=(("claude", signed),)),
                          ReasoningDelta(text="", encrypted=(("claude", redacted),)),
                          TokenDelta(text="4")]


def test_custom_tool_input_is_unwrapped_to_raw_text(fake: ScriptedServer) -> None:
    s = MessagesStream().tool_use("toolu_P", "apply_patch", ['{"input": "*** Begin', '\\n"}'])
    req = chat(ChatMessage(role="user", content="x"),
               tools=(ToolSpec(name="apply_patch", kind="custom"),))
    assert generate(fake, req, Script(s.end("tool_use").chunks()))[:3] == [
        EARLY, ToolCallDelta(index=0, id="toolu_P", name="apply_patch", kind="custom"),
        ToolCallDelta(index=0, arguments="*** Begin\n", kind="custom")]


@pytest.mark.parametrize(("stop_reason", "finish"), [
    ("max_tokens", Finish(reason=FinishKind.LENGTH)),
    ("stop_sequence", Finish(reason=FinishKind.STOP_SEQUENCE, matched_stop="###")),
    ("refusal", Finish(reason=FinishKind.CONTENT_FILTER)),
    ("end_turn", Finish(reason=FinishKind.EOS)),
])
def test_stop_reason_maps_to_finish_kind(fake: ScriptedServer, stop_reason: str,
                                         finish: Finish) -> None:
    seq = "###" if stop_reason == "stop_sequence" else None
    s = MessagesStream().text(["a"]).end(stop_reason, 2, stop_sequence=seq)
    assert generate(fake, HELLO, Script(s.chunks()))[-1] == finish


@pytest.mark.parametrize(("type_", "cls"), [
    ("overloaded_error", FailureClass.CAPACITY),
    ("rate_limit_error", FailureClass.RATE_LIMITED),
    ("api_error", FailureClass.UPSTREAM),
])
def test_mid_stream_error_event_is_classified_by_type(fake: ScriptedServer, type_: str,
                                                     cls: FailureClass) -> None:
    s = MessagesStream().text(["partial"]).error(type_, "Overloaded")
    events = generate(fake, HELLO, Script(s.chunks()))
    assert events[:2] == [EARLY, TokenDelta(text="partial")] and len(events) == 3
    assert isinstance(events[2], Failure)
    assert (events[2].failure_class, events[2].code) == (cls, type_)


def test_stream_ending_without_message_stop_is_upstream_failure(fake: ScriptedServer) -> None:
    s = MessagesStream().text(["half"])
    events = generate(fake, HELLO, Script(s.chunks()))
    assert events[:2] == [EARLY, TokenDelta(text="half")]
    assert isinstance(events[-1], Failure)
    assert events[-1].failure_class is FailureClass.UPSTREAM


@pytest.mark.parametrize("stream", [
    MessagesStream().tool_use("toolu_1", "f", ['{"a":', "nope}"]).end("tool_use"),
    MessagesStream().tool_use("toolu_1", "f", ["[1, ", "2]"]).end("tool_use"),
    MessagesStream().emit("content_block_delta", index=3,
                          delta={"type": "text_delta", "text": "ghost"}).text(["x"]).end(),
], ids=["input-not-json", "input-not-an-object", "delta-for-a-block-never-started"])
def test_a_malformed_stream_is_an_upstream_failure_never_dropped_content(
        fake: ScriptedServer, stream: MessagesStream) -> None:
    # Before: the block-less delta was dropped in silence, and a tool_use input that is not
    # a JSON object went on (a Messages client's non-streamed answer showed input {}).
    events = generate(fake, HELLO, Script(stream.chunks()))
    assert not any(isinstance(ev, Finish) for ev in events)
    assert isinstance(events[-1], Failure)
    assert (events[-1].failure_class, events[-1].status, events[-1].code) == (
        FailureClass.UPSTREAM, 502, "protocol_error")


def test_unknown_event_names_are_counted_within_bounds(fake: ScriptedServer) -> None:
    """The names of events, blocks and deltas this adapter does not read are the upstream's
    own strings, and the adapter kept every one for as long as it ran: 300 events with
    names of 2,000 characters held 600 KB after one request, and each request added more.
    Now each is cut to UNKNOWN_NAME_CHARS and at most UNKNOWN_NAMES are kept; the rest are
    counted under one name."""
    long = "x" * 2000
    s = MessagesStream()
    for n in range(300):
        s.emit(f"future_{n}_{long}")
    s.emit("content_block_start", index=0, content_block={"type": "server_" + long})
    s.emit("content_block_delta", index=0, delta={"type": "odd_delta_" + long})
    s.emit("content_block_stop", index=0).text(["ok"]).end()

    async def body(up: AnthropicUpstream) -> tuple[list[Event], dict[str, int]]:
        events = await collect(up.submit(HELLO))
        return events, dict(up.unknown_events)

    fake.push(Script(s.chunks()))
    events, unknown = run(fake.url, body)
    assert [e for e in events if isinstance(e, TokenDelta)] == [TokenDelta(text="ok")]
    assert events[-1] == Finish(reason=FinishKind.EOS)
    assert sum(unknown.values()) == 302 and len(unknown) <= UNKNOWN_NAMES + 1
    assert max(len(name) for name in unknown) <= UNKNOWN_NAME_CHARS
    assert unknown[f"future_0_{long}"[:UNKNOWN_NAME_CHARS]] == 1


# -- HTTP errors -----------------------------------------------------------------------------


@pytest.mark.parametrize(("script", "expected"), [
    (Script(status=429, body=err("rate_limit_error", "Number of request tokens has exceeded"),
            headers={"retry-after": "12"}),
     dict(failure_class=FailureClass.RATE_LIMITED, status=429, retry_after=12.0)),
    (Script(status=529, body=err("overloaded_error", "Overloaded")),
     dict(failure_class=FailureClass.CAPACITY, status=503, code="overloaded_error")),
    (Script(status=400, body=err("invalid_request_error",
                                 "prompt is too long: 208310 tokens > 200000 maximum")),
     dict(failure_class=FailureClass.CONTEXT_LENGTH, status=400, prompt_tokens=208310,
          context_tokens=200000)),
    (Script(status=400, body=err("invalid_request_error", "messages: field required")),
     dict(failure_class=FailureClass.INVALID_REQUEST, status=400)),
    (Script(status=401, body=err("authentication_error", "invalid x-api-key")),
     dict(failure_class=FailureClass.AUTHENTICATION, status=502)),
], ids=["429-retry-after", "529-overloaded", "400-prompt-too-long", "400", "401"])
def test_http_errors_are_classified_from_status_type_and_headers(
        fake: ScriptedServer, script: Script, expected: dict) -> None:
    [failure] = generate(fake, HELLO, script)
    assert isinstance(failure, Failure)
    assert {k: getattr(failure, k) for k in expected} == expected
    assert SECRET not in failure.message


def test_cancel_closes_the_upstream_response_and_ends_with_abort(fake: ScriptedServer) -> None:
    async def body(up: AnthropicUpstream) -> list[Event]:
        stream = up.submit(HELLO)
        got = [await asyncio.wait_for(stream.next_event(), 10) for _ in range(2)]
        stream.cancel()
        got.append(await asyncio.wait_for(stream.next_event(), 10))
        return got

    fake.push(Script(MessagesStream().text(["first"]).chunks(), hold=True))
    assert run(fake.url, body) == [EARLY, TokenDelta(text="first"),
                                   Finish(reason=FinishKind.ABORT)]
    assert fake.disconnected.wait(10), "the upstream never saw the disconnect"


# -- the request -----------------------------------------------------------------------------


def test_request_has_system_alternating_turns_exact_tool_ids_and_headers(
        fake: ScriptedServer) -> None:
    signed = dumps({"type": "thinking", "thinking": "hm", "signature": "sig"})
    history = (
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(role="developer", content="Use tools."),
        ChatMessage(role="user", content=(
            TextPart(text="Look:"), ImagePart(url="data:image/png;base64,iVBORw0KGgo="),
            ImagePart(url="https://x.test/b.jpg"))),
        ChatMessage(role="assistant", content="Checking.",
                    reasoning_encrypted=(("claude", signed), ("elsewhere", '{"x":1}')),
                    tool_calls=(MessageToolCall(id="toolu_01", name="look",
                                                arguments='{"q": 1}'),
                                MessageToolCall(id="toolu_02", name="look", arguments=""))),
        ChatMessage(role="tool", tool_call_id="toolu_01", content="a cat"),
        ChatMessage(role="tool", tool_call_id="toolu_02", content="a dog"),
        ChatMessage(role="user", content="So?"),
    )
    tools = (ToolSpec(name="look", description="Look at things",
                      parameters={"type": "object", "properties": {"q": {"type": "integer"}}}),)
    req = chat(*history, tools=tools, tool_choice="required", parallel_tool_calls=False,
               max_tokens=300, stop=("###",))
    generate(fake, req, Script(MessagesStream().text(["ok"]).end().chunks()))
    sent = fake.requests[-1]
    assert sent.path == "/v1/messages"
    assert (sent.headers["x-api-key"], sent.headers["anthropic-version"]) == (SECRET,
                                                                              "2023-06-01")
    assert sent.body == {
        "model": "claude-test", "max_tokens": 300, "stream": True,
        "system": "Be brief.\n\nUse tools.", "stop_sequences": ["###"],
        "tools": [{"name": "look", "description": "Look at things", "input_schema": {
            "type": "object", "properties": {"q": {"type": "integer"}}}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "Look:"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": "iVBORw0KGgo="}},
                {"type": "image", "source": {"type": "url", "url": "https://x.test/b.jpg"}}]},
            {"role": "assistant", "content": [
                json.loads(signed),
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_01", "name": "look", "input": {"q": 1}},
                {"type": "tool_use", "id": "toolu_02", "name": "look", "input": {}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": "a cat"},
                {"type": "tool_result", "tool_use_id": "toolu_02", "content": "a dog"},
                {"type": "text", "text": "So?"}]},
        ]}


def test_a_tool_results_images_reach_the_upstream_beside_its_text() -> None:
    # A Messages client's tool_result with an image (a screenshot a tool read): before,
    # only the text was sent and the image was dropped in silence.
    png = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
    call = parse_messages_request({"model": "m", "max_tokens": 8, "messages": [
        {"role": "user", "content": "Look"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "shot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": [{"type": "text", "text": "here"},
                                                  {"type": "image", "source": png}]}]}]})
    body = build_messages_body(call.request, model="m", upstream_name="claude")
    assert body["messages"][2]["content"] == [{"type": "tool_result", "tool_use_id": "toolu_1",
                                               "content": [{"type": "text", "text": "here"},
                                                           {"type": "image", "source": png}]}]


def test_reasoning_effort_enables_thinking_on_top_of_max_tokens() -> None:
    body = build_messages_body(chat(ChatMessage(role="user", content="x"),
                                    reasoning_effort="medium", max_tokens=500),
                               model="m", upstream_name="claude")
    # budget_tokens must stay below max_tokens.
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 4096}
    assert body["max_tokens"] == 4596 and "temperature" not in body


@pytest.mark.parametrize("field", ["temperature", "top_p"])
def test_sampling_beside_thinking_is_refused_naming_the_field(field: str) -> None:
    # Thinking forbids a changed temperature / top_p: refused, never dropped in silence.
    with pytest.raises(ValueError, match=field) as info:
        build_messages_body(chat(ChatMessage(role="user", content="x"),
                                 reasoning_effort="medium", **{field: 0.2}),
                            model="m", upstream_name="claude")
    assert info.value.param == field  # type: ignore[attr-defined]


def test_top_p_beside_temperature_is_refused_naming_top_p() -> None:
    with pytest.raises(ValueError) as info:
        build_messages_body(chat(ChatMessage(role="user", content="x"), temperature=0.5,
                                 top_p=0.9), model="m", upstream_name="claude")
    assert info.value.param == "top_p"  # type: ignore[attr-defined]


def test_temperature_is_clamped_to_anthropic_range() -> None:
    body = build_messages_body(chat(ChatMessage(role="user", content="x"), temperature=1.7),
                               model="m", upstream_name="claude")
    assert body["temperature"] == 1.0


def test_probe_lists_models_under_v1(fake: ScriptedServer) -> None:
    health = run(fake.url, lambda up: up.probe())
    # What the upstream lists (``sent_as``), which start-up checks each route against: a
    # model served under another name than the upstream's passes that check.
    assert health.state is UpstreamState.UP and health.models == ("claude-test",)
    _check_probe(config(fake.url), health)
    assert fake.requests[-1].path == "/v1/models"
    assert fake.requests[-1].headers["x-api-key"] == SECRET
    fake.models_status = 401
    assert run(fake.url, lambda up: up.probe()).state is UpstreamState.DOWN


# -- through the gateway ---------------------------------------------------------------------


def test_openai_sdk_chat_stream_through_tokenwire_gets_text_and_tool_calls(
        fake: ScriptedServer) -> None:
    import openai

    from tokenwire.gateway.http.state import GatewayState
    from tokenwire.gateway.ir import IdsSource
    from tokenwire.gateway.routing.router import Router, ServedModel
    from tokenwire.gateway.settings import ServerSettings

    from ..conftest import start_server

    up = AnthropicUpstream.from_config(config(fake.url))
    state = GatewayState(settings=ServerSettings(), router=Router([ServedModel(
        name="sonnet", upstream=up, ids_source=IdsSource.NONE, upstream_name="claude")]))
    served = start_server(state)
    s = (MessagesStream().thinking(["hmm"], "sig").text(["Sure, ", "checking."])
         .tool_use("toolu_W1", "get_weather", ['{"city":', '"Oslo"}'])
         .tool_use("toolu_T2", "get_time", ["{}"]).end("tool_use", 12))
    fake.push(Script(s.chunks(), delay=0.005))
    try:
        with openai.OpenAI(base_url=served.url + "/v1", api_key="unused",
                           max_retries=0) as client:
            chunks = list(client.chat.completions.create(
                model="sonnet", messages=[{"role": "user", "content": "Weather?"}],
                stream=True))
    finally:
        served.stop()  # the adapter's client lives on the server's loop; it goes with it
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls: dict[int, dict[str, str]] = {}
    for c in chunks:
        for tc in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
            slot["id"] += tc.id or ""
            slot["name"] += (tc.function.name or "") if tc.function else ""
            slot["arguments"] += (tc.function.arguments or "") if tc.function else ""
    assert text == "Sure, checking."
    assert calls == {0: {"id": "toolu_W1", "name": "get_weather",
                         "arguments": '{"city":"Oslo"}'},
                     1: {"id": "toolu_T2", "name": "get_time", "arguments": "{}"}}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert fake.requests[-1].body["model"] == "claude-test"


# -- the parser alone (sans-IO) --------------------------------------------------------------

_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                     lambda kids: st.lists(kids, max_size=3)
                     | st.dictionaries(st.text(max_size=8), kids, max_size=3), max_leaves=8)
_field_names = st.sampled_from(["index", "content_block", "delta", "message", "usage",
                                "error"])
_events = st.builds(
    lambda t, fields: {"type": t, **fields},
    st.sampled_from(sorted(_HANDLERS)) | st.text(max_size=10),
    st.dictionaries(_field_names, _json, max_size=4))


@settings(max_examples=200, deadline=None)
@given(st.lists(_events, max_size=12))
def test_any_event_sequence_yields_events_and_exactly_one_terminal(
        events: list[dict[str, Any]]) -> None:
    parser = MessagesStreamParser("claude", frozenset({"t"}))
    out: list[Event] = []
    for e in events:
        out += parser.on_sse(SSEEvent(str(e["type"]), json.dumps(e)))
    out += parser.on_eof()
    assert [i for i, ev in enumerate(out) if is_terminal(ev)] == [len(out) - 1]


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40), st.integers(1, 10))
def test_custom_tool_input_survives_any_split_of_its_json(raw: str, parts: int) -> None:
    encoded = json.dumps({"input": raw})
    step = max(1, len(encoded) // parts)
    pieces = [encoded[i:i + step] for i in range(0, len(encoded), step)]
    parser = MessagesStreamParser("claude", frozenset({"apply_patch"}))
    out: list[Event] = []
    for name, data in MessagesStream().tool_use("toolu_1", "apply_patch", pieces).end().events:
        out += parser.on_sse(SSEEvent(name, json.dumps(data)))
    args = "".join(ev.arguments for ev in out if isinstance(ev, ToolCallDelta))
    assert args == raw and out[-1] == Finish(reason=FinishKind.EOS)
