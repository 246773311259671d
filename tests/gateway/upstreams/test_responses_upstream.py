"""The Responses API upstream adapter against a scripted Responses server on a real socket.

Each test drives ``ResponsesUpstream.submit`` and checks the exact IR event sequence (or
the exact request the upstream received), named after the rule it checks.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.gateway.upstreams.streams import collect
from tokenwire.errors import ConfigError
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
    MessageStart,
    MessageToolCall,
    PromptIds,
    ReasoningDelta,
    TextPart,
    TokenDelta,
    ToolCallDelta,
    ToolSpec,
    Usage,
    is_terminal,
)
from tokenwire.gateway.upstreams.base import ModelRoute, UpstreamConfig, UpstreamState
from tokenwire.gateway.upstreams.responses_upstream import (
    _HANDLERS,
    ResponsesStreamParser,
    ResponsesUpstream,
)
from tokenwire.gateway.upstreams.sse import SSEEvent

from .fakes_responses import ResponsesStream, Script, ScriptedServer, sse

KEY_ENV = "TW_TEST_RESPONSES_KEY"
SECRET = "sk-test-secret-value"


@pytest.fixture(scope="module")
def server() -> Iterator[ScriptedServer]:
    srv = ScriptedServer(stream_path="/v1/responses", models_path="/v1/models",
                         models=("gpt-test", "gpt-other"))
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


def config(url: str, **kw: Any) -> UpstreamConfig:
    return UpstreamConfig(name="oai", kind="responses", base_url=url + "/v1",
                          api_key_env=KEY_ENV,
                          models=(ModelRoute(name="smart", upstream_model="gpt-test"),), **kw)


def run(url: str, body: Callable[[ResponsesUpstream], Awaitable[Any]], **kw: Any) -> Any:
    async def main() -> Any:
        up = ResponsesUpstream.from_config(config(url, **kw))
        try:
            return await body(up)
        finally:
            await up.aclose()
    return asyncio.run(main())


def generate(fake: ScriptedServer, request: GenerationRequest, *scripts: Script) -> list[Event]:
    fake.push(*scripts)
    return run(fake.url, lambda up: collect(up.submit(request)))


def chat(*messages: ChatMessage, **kw: Any) -> GenerationRequest:
    return GenerationRequest(prompt=ChatPrompt(messages=messages), model="smart", **kw)


HELLO = chat(ChatMessage(role="user", content="Hi"))


# -- streams ---------------------------------------------------------------------------------


def test_text_deltas_then_usage_then_eos(fake: ScriptedServer) -> None:
    s = ResponsesStream().message(["Hel", "lo", "!"]).completed(11, 3)
    assert generate(fake, HELLO, Script(s.chunks())) == [
        MessageStart(), TokenDelta(text="Hel"), TokenDelta(text="lo"), TokenDelta(text="!"),
        Usage(prompt_tokens=11, completion_tokens=3, cached_tokens=0, reasoning_tokens=0),
        Finish(reason=FinishKind.EOS)]


def test_parallel_function_calls_keep_call_ids_and_get_own_indexes(fake: ScriptedServer) -> None:
    s = (ResponsesStream().function_call("call_AbC", "get_weather", ['{"city":', '"Oslo"}'])
         .function_call("call_XyZ", "get_time", ['{"tz":"CET"}']).completed(20, 9))
    assert generate(fake, HELLO, Script(s.chunks())) == [
        ToolCallDelta(index=0, id="call_AbC", name="get_weather"),
        ToolCallDelta(index=0, arguments='{"city":'),
        ToolCallDelta(index=0, arguments='"Oslo"}'),
        ToolCallDelta(index=1, id="call_XyZ", name="get_time"),
        ToolCallDelta(index=1, arguments='{"tz":"CET"}'),
        Usage(prompt_tokens=20, completion_tokens=9, cached_tokens=0, reasoning_tokens=0),
        Finish(reason=FinishKind.TOOL_CALLS)]


def test_arguments_only_in_done_event_are_sent_once(fake: ScriptedServer) -> None:
    s = ResponsesStream().function_call("call_1", "f", [])
    s.events[-2]["arguments"] = '{"a":1}'  # .done carries what no delta did (vllm#36073)
    s.events[-1]["item"]["arguments"] = '{"a":1}'  # and so does the finished item
    s.completed()
    events = generate(fake, HELLO, Script(s.chunks()))
    assert events[:2] == [ToolCallDelta(index=0, id="call_1", name="f"),
                          ToolCallDelta(index=0, arguments='{"a":1}')]
    assert events[-1] == Finish(reason=FinishKind.TOOL_CALLS)


def test_custom_tool_call_input_is_a_custom_tool_call_delta(fake: ScriptedServer) -> None:
    patch = ["*** Begin Patch\n", "*** End Patch"]
    s = ResponsesStream().custom_call("call_p", "apply_patch", patch).completed(5, 4)
    assert generate(fake, HELLO, Script(s.chunks()))[:3] == [
        ToolCallDelta(index=0, id="call_p", name="apply_patch", kind="custom"),
        ToolCallDelta(index=0, arguments=patch[0], kind="custom"),
        ToolCallDelta(index=0, arguments=patch[1], kind="custom")]


def test_reasoning_summary_is_reasoning_and_encrypted_content_is_scoped_to_upstream(
        fake: ScriptedServer) -> None:
    s = ResponsesStream().reasoning(["Think", "ing."], encrypted="gAAAA-blob").message(["Hi"])
    events = generate(fake, HELLO, Script(s.completed().chunks()))
    blob = json.dumps({"type": "reasoning", "summary": [{"type": "summary_text",
                                                          "text": "Thinking."}],
                       "encrypted_content": "gAAAA-blob"}, separators=(",", ":"))
    assert events[:5] == [ReasoningDelta(text="Think"), ReasoningDelta(text="ing."),
                          ReasoningDelta(text="", encrypted=(("oai", blob),)),
                          MessageStart(), TokenDelta(text="Hi")]


def test_unknown_events_are_ignored_and_counted(fake: ScriptedServer) -> None:
    s = ResponsesStream().emit("response.future_thing", x=1).message(["ok"]).completed()

    async def body(up: ResponsesUpstream) -> tuple[list[Event], dict[str, int]]:
        events = await collect(up.submit(HELLO))
        return events, dict(up.unknown_events)

    fake.push(Script(s.chunks()))
    events, unknown = run(fake.url, body)
    assert [e for e in events if isinstance(e, TokenDelta)] == [TokenDelta(text="ok")]
    assert unknown == {"response.future_thing": 1}


def test_stop_sequences_are_applied_locally_since_the_api_has_none(fake: ScriptedServer) -> None:
    s = ResponsesStream().message(["one EN", "D two"]).completed()
    events = generate(fake, chat(ChatMessage(role="user", content="x"), stop=("END",)),
                      Script(s.chunks()))
    assert events == [MessageStart(), TokenDelta(text="one "),
                      Finish(reason=FinishKind.STOP_SEQUENCE, matched_stop="END")]


@pytest.mark.parametrize(("reason", "kind"), [("max_output_tokens", FinishKind.LENGTH),
                                              ("content_filter", FinishKind.CONTENT_FILTER)])
def test_incomplete_response_finishes_with_its_reason(fake: ScriptedServer, reason: str,
                                                     kind: FinishKind) -> None:
    s = ResponsesStream().message(["cut"]).incomplete(reason)
    assert generate(fake, HELLO, Script(s.chunks()))[-2:] == [
        Usage(prompt_tokens=11, completion_tokens=16, cached_tokens=0, reasoning_tokens=0),
        Finish(reason=kind)]


@pytest.mark.parametrize(("code", "cls"), [
    ("context_length_exceeded", FailureClass.CONTEXT_LENGTH),
    ("rate_limit_exceeded", FailureClass.RATE_LIMITED),
    ("insufficient_quota", FailureClass.QUOTA),
    ("server_error", FailureClass.UPSTREAM),
    ("server_is_overloaded", FailureClass.CAPACITY),
    ("invalid_prompt", FailureClass.INVALID_REQUEST),
    ("cyber_policy", FailureClass.CONTENT_FILTER),
])
def test_mid_stream_failure_is_classified_by_error_code(fake: ScriptedServer, code: str,
                                                       cls: FailureClass) -> None:
    s = ResponsesStream().message(["partial"]).failed(code, "it broke")
    events = generate(fake, HELLO, Script(s.chunks()))
    assert events[:2] == [MessageStart(), TokenDelta(text="partial")]
    assert isinstance(events[-1], Failure) and len(events) == 3
    assert (events[-1].failure_class, events[-1].code) == (cls, code)


def test_response_failed_without_error_event_is_classified(fake: ScriptedServer) -> None:
    s = ResponsesStream().failed("context_length_exceeded", "too long")
    del s.events[-2]  # only response.failed
    [failure] = generate(fake, HELLO, Script(s.chunks()))
    assert isinstance(failure, Failure)
    assert failure.failure_class is FailureClass.CONTEXT_LENGTH and failure.status == 400


@pytest.mark.parametrize("done", [False, True], ids=["eof", "done-sentinel"])
def test_stream_ending_without_terminal_is_upstream_failure(fake: ScriptedServer,
                                                            done: bool) -> None:
    s = ResponsesStream().message(["half"])
    events = generate(fake, HELLO, Script(s.chunks(done=done)))
    assert events[:2] == [MessageStart(), TokenDelta(text="half")]
    assert isinstance(events[-1], Failure)
    assert events[-1].failure_class is FailureClass.UPSTREAM


def test_malformed_event_json_is_upstream_failure(fake: ScriptedServer) -> None:
    [failure] = generate(fake, HELLO, Script([sse("response.created", "{nope")]))
    assert isinstance(failure, Failure) and failure.failure_class is FailureClass.UPSTREAM


# -- HTTP errors -----------------------------------------------------------------------------


def _err(code: str | None, message: str, type_: str = "invalid_request_error") -> dict:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


@pytest.mark.parametrize(("script", "expected"), [
    (Script(status=429, body=_err("rate_limit_exceeded", "slow down", "requests"),
            headers={"retry-after": "7"}),
     dict(failure_class=FailureClass.RATE_LIMITED, status=429, retry_after=7.0)),
    (Script(status=429, body=_err("insufficient_quota", "pay up", "insufficient_quota")),
     dict(failure_class=FailureClass.QUOTA, status=429, retry_after=None)),
    (Script(status=400, body=_err("context_length_exceeded",
                                  "This model's maximum context length is 8192 tokens. However,"
                                  " your messages resulted in 9000 tokens.")),
     dict(failure_class=FailureClass.CONTEXT_LENGTH, status=400, prompt_tokens=9000,
          context_tokens=8192)),
    (Script(status=401, body=_err("invalid_api_key", "bad key")),
     dict(failure_class=FailureClass.AUTHENTICATION, status=502)),
    (Script(status=503, body=None), dict(failure_class=FailureClass.CAPACITY, status=503)),
    (Script(status=500, body=_err(None, "boom", "server_error")),
     dict(failure_class=FailureClass.UPSTREAM, status=502)),
], ids=["429-retry-after", "429-quota", "400-context", "401", "503", "500"])
def test_http_errors_are_classified_from_status_code_and_headers(
        fake: ScriptedServer, script: Script, expected: dict) -> None:
    [failure] = generate(fake, HELLO, script)
    assert isinstance(failure, Failure)
    assert {k: getattr(failure, k) for k in expected} == expected
    assert SECRET not in failure.message


def test_unreachable_upstream_is_connection_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, SECRET)
    # The discard port: nobody listens there.
    [failure] = run("http://127.0.0.1:9", lambda up: collect(up.submit(HELLO)))
    assert isinstance(failure, Failure) and failure.failure_class is FailureClass.CONNECTION


def test_final_arguments_contradicting_streamed_ones_is_a_failure(fake: ScriptedServer) -> None:
    s = ResponsesStream().function_call("call_1", "f", ['{"a":1}'])
    s.events[-2]["arguments"] = '{"b":2}'
    events = generate(fake, HELLO, Script(s.completed().chunks()))
    assert isinstance(events[-1], Failure)
    assert events[-1].failure_class is FailureClass.UPSTREAM


def test_a_snapshot_listing_an_unstreamed_item_first_repeats_no_call_or_text(
        fake: ScriptedServer) -> None:
    # The server streamed a call and a message (output_index 0 and 1), then listed a
    # reasoning item it never streamed first in response.completed's output, shifting both.
    # By position, the call came back as a second call with the same call_id (the client
    # would run the tool twice) and the message's text was shown twice.
    s = ResponsesStream().function_call("call_1", "f", ['{"a":', "1}"]).message(["Hi"])
    s.output.insert(0, {"type": "reasoning", "id": "rs_x", "summary": []})
    events = generate(fake, HELLO, Script(s.completed(7, 4).chunks()))
    assert events == [
        ToolCallDelta(index=0, id="call_1", name="f"), ToolCallDelta(index=0, arguments='{"a":'),
        ToolCallDelta(index=0, arguments="1}"), MessageStart(), TokenDelta(text="Hi"),
        Usage(prompt_tokens=7, completion_tokens=4, cached_tokens=0, reasoning_tokens=0),
        Finish(reason=FinishKind.TOOL_CALLS)]


def test_a_snapshot_item_with_an_id_the_stream_never_showed_is_shown_once_as_new(
        fake: ScriptedServer) -> None:
    s = ResponsesStream().message(["Hi"])
    s.output[0] = {**s.output[0], "id": "msg_other"}  # not the streamed item: a new one
    s.output.append({"type": "message", "id": "msg_0", "role": "assistant",
                     "content": [{"type": "output_text", "text": "Hi"}]})
    events = generate(fake, HELLO, Script(s.completed().chunks()))
    assert [e for e in events if isinstance(e, TokenDelta)] == [TokenDelta(text="Hi"),
                                                                 TokenDelta(text="Hi")]


@pytest.mark.parametrize(("reason", "finish"), [("max_output_tokens", FinishKind.LENGTH),
                                                ("content_filter", FinishKind.CONTENT_FILTER)])
def test_an_incomplete_snapshot_holding_unstreamed_output_is_shown(
        fake: ScriptedServer, reason: str, finish: FinishKind) -> None:
    # A server that streams no deltas has the partial answer only in the terminal snapshot:
    # response.completed's was shown, response.incomplete's was dropped (the client got an
    # incomplete response with no output at all).
    s = ResponsesStream().message(["Hello wor"]).function_call("call_1", "f", ['{"a":'])
    s.events = [e for e in s.events if e["type"].endswith(("created", "in_progress"))]
    s.emit("response.incomplete", response={"id": "resp_1", "status": "incomplete",
                                            "output": s.output,
                                            "incomplete_details": {"reason": reason},
                                            "usage": {"input_tokens": 6, "output_tokens": 9}})
    assert generate(fake, HELLO, Script(s.chunks())) == [
        MessageStart(), TokenDelta(text="Hello wor"),
        ToolCallDelta(index=0, id="call_1", name="f", arguments='{"a":'),
        Usage(prompt_tokens=6, completion_tokens=9), Finish(reason=finish)]


def test_a_failed_responses_usage_is_kept(fake: ScriptedServer) -> None:
    s = ResponsesStream().message(["partial"]).failed("server_error", "it broke")
    del s.events[-2]  # only response.failed, whose snapshot says what was used
    s.events[-1]["response"]["usage"] = {"input_tokens": 12, "output_tokens": 5}
    events = generate(fake, HELLO, Script(s.chunks()))
    assert events[:3] == [MessageStart(), TokenDelta(text="partial"),
                          Usage(prompt_tokens=12, completion_tokens=5)]
    assert isinstance(events[3], Failure) and len(events) == 4


# -- cancellation ----------------------------------------------------------------------------


def test_cancel_closes_the_upstream_response_and_ends_with_abort(fake: ScriptedServer) -> None:
    s = ResponsesStream().message(["first"])

    async def body(up: ResponsesUpstream) -> list[Event]:
        stream = up.submit(HELLO)
        got = [await asyncio.wait_for(stream.next_event(), 10) for _ in range(2)]
        stream.cancel()
        got.append(await asyncio.wait_for(stream.next_event(), 10))
        assert up.active == 0
        return got

    fake.push(Script(s.chunks(), hold=True))
    assert run(fake.url, body) == [MessageStart(), TokenDelta(text="first"),
                                   Finish(reason=FinishKind.ABORT)]
    assert fake.disconnected.wait(10), "the upstream never saw the disconnect"


# -- the request -----------------------------------------------------------------------------


def test_request_body_keeps_call_ids_and_replays_only_own_reasoning(fake: ScriptedServer) -> None:
    own = json.dumps({"type": "reasoning", "summary": [], "encrypted_content": "mine"})
    history = (
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(role="user", content=(TextPart(text="What is this?"),
                                          ImagePart(url="https://x.test/a.png"))),
        ChatMessage(role="assistant", content="Checking.",
                    reasoning_encrypted=(("oai", own), ("other", '{"type":"reasoning"}')),
                    tool_calls=(MessageToolCall(id="call_A1", name="look", arguments="{}"),
                                MessageToolCall(id="call_P2", name="apply_patch",
                                                arguments="*** Begin", kind="custom"))),
        ChatMessage(role="tool", tool_call_id="call_A1", content="a cat"),
        ChatMessage(role="tool", tool_call_id="call_P2", content="applied"),
    )
    tools = (ToolSpec(name="look", parameters={"type": "object", "properties": {}}),
             ToolSpec(name="apply_patch", kind="custom",
                      format={"type": "grammar", "syntax": "lark", "definition": "start: x"}))
    req = chat(*history, tools=tools, tool_choice="auto", parallel_tool_calls=True,
               reasoning_effort="high", max_tokens=99, temperature=0.5)
    generate(fake, req, Script(ResponsesStream().message(["ok"]).completed().chunks()))
    sent = fake.requests[-1]
    assert sent.headers["authorization"] == f"Bearer {SECRET}"
    assert sent.body == {
        "model": "gpt-test", "stream": True, "store": False, "max_output_tokens": 99,
        "temperature": 0.5, "tool_choice": "auto", "parallel_tool_calls": True,
        "reasoning": {"effort": "high", "summary": "auto"},
        "include": ["reasoning.encrypted_content"],
        "tools": [{"type": "function", "name": "look", "description": "",
                   "parameters": {"type": "object", "properties": {}}, "strict": False},
                  {"type": "custom", "name": "apply_patch", "description": "",
                   "format": {"type": "grammar", "syntax": "lark", "definition": "start: x"}}],
        "input": [
            {"type": "message", "role": "system", "content": "Be brief."},
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "What is this?"},
                {"type": "input_image", "image_url": "https://x.test/a.png", "detail": "auto"}]},
            {"type": "reasoning", "summary": [], "encrypted_content": "mine"},
            {"type": "message", "role": "assistant", "content": "Checking."},
            {"type": "function_call", "call_id": "call_A1", "name": "look", "arguments": "{}"},
            {"type": "custom_tool_call", "call_id": "call_P2", "name": "apply_patch",
             "input": "*** Begin"},
            {"type": "function_call_output", "call_id": "call_A1", "output": "a cat"},
            {"type": "custom_tool_call_output", "call_id": "call_P2", "output": "applied"},
        ]}


def test_named_tool_choice_uses_the_tool_kind(fake: ScriptedServer) -> None:
    req = chat(ChatMessage(role="user", content="x"), tool_choice={"name": "apply_patch"},
               tools=(ToolSpec(name="apply_patch", kind="custom"),))
    generate(fake, req, Script(ResponsesStream().message(["ok"]).completed().chunks()))
    assert fake.requests[-1].body["tool_choice"] == {"type": "custom", "name": "apply_patch"}


def test_token_id_prompts_are_refused_without_a_request(fake: ScriptedServer) -> None:
    [failure] = generate(fake, GenerationRequest(prompt=PromptIds(ids=(1, 2))))
    assert isinstance(failure, Failure)
    assert failure.failure_class is FailureClass.INVALID_REQUEST and not fake.requests


# -- configuration and probe -----------------------------------------------------------------


def test_missing_api_key_variable_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(ConfigError, match=KEY_ENV):
        ResponsesUpstream.from_config(config("http://127.0.0.1:9"))


def test_api_key_never_appears_in_repr(fake: ScriptedServer) -> None:
    up = ResponsesUpstream.from_config(config(fake.url))
    assert SECRET not in repr(up) and SECRET not in repr(up.__dict__.get("config"))


def test_probe_reports_up_degraded_and_down(fake: ScriptedServer) -> None:
    assert run(fake.url, lambda up: up.probe()).state is UpstreamState.UP
    assert fake.requests[-1].path == "/v1/models"
    fake.models.remove("gpt-test")
    try:
        health = run(fake.url, lambda up: up.probe())
        assert health.state is UpstreamState.DEGRADED and "smart" in health.detail
    finally:
        fake.models.insert(0, "gpt-test")
    fake.models_status = 401
    assert run(fake.url, lambda up: up.probe()).state is UpstreamState.DOWN


def test_mock_transport_is_used_when_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, SECRET)
    body = b"".join(ResponsesStream().message(["mock"]).completed().chunks())

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    async def main() -> list[Event]:
        up = ResponsesUpstream.from_config(config("http://upstream.invalid"),
                                           transport=httpx.MockTransport(handler))
        try:
            return await collect(up.submit(HELLO))
        finally:
            await up.aclose()

    assert asyncio.run(main())[:2] == [MessageStart(), TokenDelta(text="mock")]


# -- through the gateway ---------------------------------------------------------------------


def test_openai_sdk_chat_stream_through_tokenwire_gets_text_and_tool_calls(
        fake: ScriptedServer) -> None:
    import openai

    from tokenwire.gateway.http.state import GatewayState
    from tokenwire.gateway.ir import IdsSource
    from tokenwire.gateway.routing.router import Router, ServedModel
    from tokenwire.gateway.settings import ServerSettings

    from ..conftest import start_server

    up = ResponsesUpstream.from_config(config(fake.url))
    state = GatewayState(settings=ServerSettings(), router=Router([ServedModel(
        name="smart", upstream=up, ids_source=IdsSource.NONE, upstream_name="oai")]))
    served = start_server(state)
    s = (ResponsesStream().message(["Sure, ", "checking."])
         .function_call("call_W1", "get_weather", ['{"city":', '"Oslo"}'])
         .function_call("call_T2", "get_time", ["{}"]).completed(9, 12))
    fake.push(Script(s.chunks(), delay=0.005))
    try:
        with openai.OpenAI(base_url=served.url + "/v1", api_key="unused",
                           max_retries=0) as client:
            chunks = list(client.chat.completions.create(
                model="smart", messages=[{"role": "user", "content": "Weather?"}],
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
    assert calls == {0: {"id": "call_W1", "name": "get_weather", "arguments": '{"city":"Oslo"}'},
                     1: {"id": "call_T2", "name": "get_time", "arguments": "{}"}}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert fake.requests[-1].body["model"] == "gpt-test"


# -- the parser alone (sans-IO) --------------------------------------------------------------

_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                     lambda kids: st.lists(kids, max_size=3)
                     | st.dictionaries(st.text(max_size=8), kids, max_size=3), max_leaves=8)
_field_names = st.sampled_from(["output_index", "item", "delta", "arguments", "input",
                                "response", "error", "code", "message", "summary_index"])
_events = st.builds(
    lambda t, fields: {"type": t, **fields},
    st.sampled_from(sorted(_HANDLERS)) | st.text(max_size=10),
    st.dictionaries(_field_names, _json, max_size=4))


@settings(max_examples=200, deadline=None)
@given(st.lists(_events, max_size=12))
def test_any_event_sequence_yields_events_and_exactly_one_terminal(
        events: list[dict[str, Any]]) -> None:
    parser = ResponsesStreamParser("oai")
    out: list[Event] = []
    for e in events:
        out += parser.on_sse(SSEEvent(str(e["type"]), json.dumps(e)))
    out += parser.on_eof()
    assert [i for i, ev in enumerate(out) if is_terminal(ev)] == [len(out) - 1]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet="ab#", max_size=6), max_size=8),
       st.sampled_from(["#", "##", "ab#"]))
def test_local_stop_sequence_shows_exactly_the_text_before_the_first_stop(
        pieces: list[str], stop: str) -> None:
    parser = ResponsesStreamParser("oai", stop=(stop,))
    stream = ResponsesStream().message(pieces).completed()
    out: list[Event] = []
    for e in stream.events:
        out += parser.on_sse(SSEEvent(e["type"], json.dumps(e)))
    full = "".join(pieces)
    shown = "".join(ev.text for ev in out if isinstance(ev, TokenDelta))
    if stop in full:
        assert shown == full[:full.index(stop)]
        assert out[-1] == Finish(reason=FinishKind.STOP_SEQUENCE, matched_stop=stop)
    else:
        assert shown == full and out[-1] == Finish(reason=FinishKind.EOS)


def test_a_local_stop_strings_tokens_send_no_logprobs() -> None:
    """The stop matcher trimmed the text but every delta's logprobs went out whole: the
    tokens of the stop string, and those after it in the same delta, reached the client as
    logprobs of text it never saw."""
    def delta(text: str, tokens: list[str]) -> SSEEvent:
        lps = [{"token": t, "logprob": -0.5, "bytes": list(t.encode()), "top_logprobs": []}
               for t in tokens]
        return SSEEvent("response.output_text.delta", json.dumps({
            "type": "response.output_text.delta", "output_index": 0, "content_index": 0,
            "item_id": "msg_1", "delta": text, "logprobs": lps}))

    parser = ResponsesStreamParser("oai", stop=(" END",))
    out = parser.on_sse(delta("Hello wor", ["Hello", " wor"]))
    out += parser.on_sse(delta("ld END more", ["ld", " END", " more"]))
    shown = "".join(ev.text for ev in out if isinstance(ev, TokenDelta))
    tokens = [lp.token for ev in out if isinstance(ev, TokenDelta) for lp in ev.logprobs]
    assert shown == "Hello world" and tokens == ["Hello", " wor", "ld"]
    assert out[-1] == Finish(reason=FinishKind.STOP_SEQUENCE, matched_stop=" END")
    # With no stop fired, the logprobs held with a held tail go out at the end.
    parser = ResponsesStreamParser("oai", stop=(" END",))
    out = parser.on_sse(delta("Hi E", ["Hi", " E"]))
    out += parser.on_sse(SSEEvent("response.completed", json.dumps(
        {"type": "response.completed", "response": {"output": []}})))
    tokens = [lp.token for ev in out if isinstance(ev, TokenDelta) for lp in ev.logprobs]
    assert "".join(ev.text for ev in out if isinstance(ev, TokenDelta)) == "Hi E"
    assert tokens == ["Hi", " E"]
