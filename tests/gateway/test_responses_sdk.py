"""``POST /v1/responses`` through the ``openai`` SDK, in front of every upstream kind.

``client.responses.stream()`` is a strict lifecycle validator (gateway-research §5.7: it raises
on a missing ``output_item.added`` / ``content_part.added``, on changed identities and on
unfinished items at ``response.completed``); ``client.responses.create()`` checks the stream
events and the non-streamed object. The upstreams are the real adapters pointed at scripted
servers on loopback sockets (Chat Completions, Responses, Anthropic Messages), and the real
embedded engine.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest

from tokenwire.gateway.apis.responses_render import unwrap_encrypted
from tokenwire.gateway.http.state import GatewayState
from tokenwire.gateway.ir import IdsSource
from tokenwire.gateway.routing.router import Router, ServedModel
from tokenwire.gateway.settings import ServerSettings
from tokenwire.gateway.upstreams.anthropic_upstream import AnthropicUpstream
from tokenwire.gateway.upstreams.base import ModelRoute, UpstreamConfig
from tokenwire.gateway.upstreams.openai_compat import OpenAICompatUpstream
from tokenwire.gateway.upstreams.responses_upstream import ResponsesUpstream

from .conftest import Served, start_server
from .upstreams.fakes import FakeServer, Reply, ToolScript, chat_stream, error_reply, start_fake
from .upstreams.fakes_anthropic import MessagesStream, anthropic_server
from .upstreams.fakes_responses import ResponsesStream, Script, ScriptedServer

KEY_ENV = "TW_TEST_RESPONSES_SDK_KEY"
WEATHER = {"type": "function", "name": "get_weather", "description": "weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


def gateway(upstream: Any, name: str) -> Served:
    router = Router([ServedModel(name=name, upstream=upstream, ids_source=IdsSource.NONE,
                                 upstream_name=upstream.name)])
    return start_server(GatewayState(settings=ServerSettings(), router=router))


def stop(served: Served, upstream: Any) -> None:
    """Close the adapter's HTTP client on the gateway's own loop, then stop the gateway."""
    loop = served.server.servers[0].get_loop()
    asyncio.run_coroutine_threadsafe(upstream.aclose(), loop).result(10)
    served.stop()


@pytest.fixture
def clients() -> Iterator[Callable[[Served], openai.OpenAI]]:
    made: list[openai.OpenAI] = []

    def make(served: Served) -> openai.OpenAI:
        made.append(openai.OpenAI(base_url=served.url + "/v1", api_key="sk-none",
                                  max_retries=0))
        return made[-1]

    yield make
    for c in made:
        c.close()


def stream_final(c: openai.OpenAI, **kw: Any) -> tuple[list[str], Any]:
    """Run ``responses.stream()`` (the strict validator); event types and final response."""
    with c.responses.stream(**kw) as s:
        seen = [ev.type for ev in s]
        final = s.get_final_response()
    return seen, final


def create_events(c: openai.OpenAI, **kw: Any) -> list[Any]:
    events = list(c.responses.create(stream=True, **kw))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created"
    return events


# -- the Chat Completions fake (vLLM shape) -------------------------------------------------


@pytest.fixture(scope="module")
def chat_fake() -> Iterator[tuple[FakeServer, list[Reply], Served]]:
    replies: list[Reply] = []
    fake = start_fake(lambda path, body: replies.pop(0))
    up = OpenAICompatUpstream.from_config(UpstreamConfig(
        name="vllm", kind="openai", base_url=fake.url, models=(ModelRoute(name="m"),)))
    served = gateway(up, "m")
    yield fake, replies, served
    stop(served, up)
    fake.stop()


def test_chat_upstream_text_passes_the_stream_validator(chat_fake, clients) -> None:
    _fake, replies, served = chat_fake
    replies.append(Reply(chunks=chat_stream("vllm", ["Hel", "lo"])))
    seen, final = stream_final(clients(served), model="m", input="Hi")
    assert final.output_text == "Hello" and final.status == "completed"
    assert seen[:2] == ["response.created", "response.in_progress"]
    assert seen[-1] == "response.completed"
    assert re.fullmatch(r"resp_[0-9a-f]{32}", final.id)
    assert final.usage.input_tokens == 5 and final.usage.total_tokens == 8


def test_chat_upstream_text_non_streaming_is_one_response_object(chat_fake, clients) -> None:
    _fake, replies, served = chat_fake
    replies.append(Reply(chunks=chat_stream("vllm", ["Hel", "lo"])))
    raw = clients(served).responses.with_raw_response.create(model="m", input="Hi")
    resp = raw.parse()
    assert resp.output_text == "Hello" and resp.status == "completed"
    assert raw.headers["x-request-id"] == resp.id
    assert json.loads(raw.text)["end_turn"] is True  # a translated upstream, no calls


def test_chat_upstream_function_call_round_trip_keeps_call_ids_exactly(chat_fake, clients) -> None:
    fake, replies, served = chat_fake
    c = clients(served)
    replies.append(Reply(chunks=chat_stream("vllm", tools=[ToolScript(
        0, "chatcmpl-tool-9f3.x", "get_weather", ('{"city":', ' "Paris"}'))],
        finish="tool_calls")))
    seen, first = stream_final(c, model="m", input="Weather?", tools=[WEATHER])
    [call] = first.output
    assert call.type == "function_call" and call.call_id == "chatcmpl-tool-9f3.x"
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert "response.function_call_arguments.done" in seen
    replies.append(Reply(chunks=chat_stream("vllm", ["Sunny."])))
    second = c.responses.create(model="m", tools=[WEATHER], input=[
        {"role": "user", "content": "Weather?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name,
         "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert second.output_text == "Sunny."
    messages = fake.requests[-1][1]["messages"]
    assert messages[-2]["tool_calls"][0]["id"] == "chatcmpl-tool-9f3.x"
    assert messages[-1]["role"] == "tool" and messages[-1]["content"] == "sunny"
    assert messages[-1]["tool_call_id"] == "chatcmpl-tool-9f3.x"


def test_chat_upstream_parallel_calls_are_separate_items(chat_fake, clients) -> None:
    _fake, replies, served = chat_fake
    replies.append(Reply(chunks=chat_stream("vllm", tools=[
        ToolScript(0, "call_a", "get_weather", ('{"city":', '"Oslo"}')),
        ToolScript(1, "call_b", "get_weather", ('{"city":', '"Rome"}'))], finish="tool_calls")))
    events = create_events(clients(served), model="m", input="Both?", tools=[WEATHER])
    done = [e for e in events if e.type == "response.output_item.done"]
    assert [(e.output_index, e.item.call_id) for e in done] == [(0, "call_a"), (1, "call_b")]
    assert [json.loads(e.item.arguments)["city"] for e in done] == ["Oslo", "Rome"]
    assert events[-1].type == "response.completed"


def test_chat_upstream_reasoning_content_becomes_a_summary(chat_fake, clients) -> None:
    _fake, replies, served = chat_fake
    replies.append(Reply(chunks=chat_stream("vllm", ["42"], reasoning=["Let me ", "think."])))
    seen, final = stream_final(clients(served), model="m", input="?",
                               reasoning={"summary": "auto"})
    reasoning, message = final.output
    assert reasoning.type == "reasoning"
    assert reasoning.summary[0].text == "Let me think."
    assert not reasoning.encrypted_content  # nothing invented
    assert message.content[0].text == "42"
    assert "response.reasoning_summary_text.delta" in seen


def test_chat_upstream_summary_none_hides_reasoning(chat_fake, clients) -> None:
    _fake, replies, served = chat_fake
    replies.append(Reply(chunks=chat_stream("vllm", ["42"], reasoning=["hidden"])))
    events = create_events(clients(served), model="m", input="?", reasoning={"summary": "none"})
    assert not any("reasoning" in e.type for e in events)


def test_created_is_sent_before_the_upstream_answers(chat_fake, clients) -> None:
    fake, replies, served = chat_fake
    replies.append(Reply(chunks=(), hold_open=True))  # an upstream that never answers
    asked = len(fake.requests)
    with httpx.Client(timeout=10) as h, h.stream(
            "POST", served.url + "/v1/responses",
            json={"model": "m", "input": "Hi", "stream": True}) as r:
        assert r.status_code == 200 and r.headers["x-request-id"].startswith("resp_")
        lines = r.iter_lines()
        assert next(lines) == "event: response.created"
        assert json.loads(next(lines).removeprefix("data: "))["sequence_number"] == 0
        while len(fake.requests) == asked:  # the upstream was asked and has said nothing
            time.sleep(0.01)
    assert not replies  # its (never sent) answer was taken: nothing left for other tests


CONTEXT_400 = {"error": {"object": "error", "type": "BadRequestError", "code": 400, "message":
               "This model's maximum context length is 2048 tokens. However, you requested "
               "3000 tokens (2900 in the messages, 100 in the completion)."}}


def test_context_overflow_streams_response_failed_with_its_code(chat_fake, clients) -> None:
    _fake, replies, served = chat_fake
    replies.append(error_reply(400, CONTEXT_400))
    events = create_events(clients(served), model="m", input="long")
    assert [e.type for e in events] == ["response.created", "response.in_progress",
                                        "response.failed"]
    assert events[-1].response.error.code == "context_length_exceeded"


def test_context_overflow_non_streaming_is_an_http_400_with_its_code(chat_fake, clients) -> None:
    _fake, replies, served = chat_fake
    replies.append(error_reply(400, CONTEXT_400))
    with pytest.raises(openai.BadRequestError) as info:
        clients(served).responses.create(model="m", input="long")
    assert info.value.code == "context_length_exceeded"


# -- the Responses fake ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def responses_fake() -> Iterator[tuple[ScriptedServer, Served]]:
    srv = ScriptedServer(stream_path="/v1/responses", models_path="/v1/models")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(KEY_ENV, "sk-upstream")
        up = ResponsesUpstream.from_config(UpstreamConfig(
            name="oa", kind="responses", base_url=srv.url + "/v1", api_key_env=KEY_ENV,
            models=(ModelRoute(name="smart", upstream_model="gpt-test"),)))
    served = gateway(up, "smart")
    yield srv, served
    stop(served, up)
    srv.stop()


def test_responses_upstream_text(responses_fake, clients) -> None:
    srv, served = responses_fake
    srv.push(Script(chunks=ResponsesStream().message(["Hel", "lo"]).completed().chunks()))
    _seen, final = stream_final(clients(served), model="smart", input="Hi")
    assert final.output_text == "Hello"
    assert final.id != "resp_1" and final.output[0].id != "msg_0"  # ids are ours
    srv.push(Script(chunks=ResponsesStream().message(["Hi"]).completed().chunks()))
    assert clients(served).responses.create(model="smart", input="Hi").output_text == "Hi"


def test_responses_upstream_function_call_keeps_call_id(responses_fake, clients) -> None:
    srv, served = responses_fake
    srv.push(Script(chunks=ResponsesStream().function_call(
        "call_UP_1", "get_weather", ['{"city":', '"Paris"}']).completed().chunks()))
    _seen, final = stream_final(clients(served), model="smart", input="?", tools=[WEATHER])
    [call] = final.output
    assert call.call_id == "call_UP_1" and call.arguments == '{"city":"Paris"}'


def test_responses_upstream_reasoning_summary_and_encrypted_state(responses_fake, clients) -> None:
    srv, served = responses_fake
    srv.push(Script(chunks=ResponsesStream().reasoning(["Hmm, ", "yes."], encrypted="gAAAenc")
                    .message(["Yes"]).completed().chunks()))
    _seen, final = stream_final(clients(served), model="smart", input="?",
                               include=["reasoning.encrypted_content"])
    reasoning = final.output[0]
    assert reasoning.summary[0].text == "Hmm, yes."
    assert unwrap_encrypted(reasoning.encrypted_content) == ("oa", "gAAAenc")
    assert final.output_text == "Yes"


def test_responses_upstream_round_trip_returns_call_and_reasoning_state(
        responses_fake, clients) -> None:
    srv, served = responses_fake
    c = clients(served)
    srv.push(Script(chunks=ResponsesStream().reasoning(["Need weather."], encrypted="gAAAx")
                    .function_call("call_UP_2", "get_weather", ['{"city":"Oslo"}'])
                    .completed().chunks()))
    first = c.responses.create(model="smart", input="Weather?", tools=[WEATHER], store=False,
                               include=["reasoning.encrypted_content"])
    reasoning, call = first.output
    srv.push(Script(chunks=ResponsesStream().message(["Cold."]).completed().chunks()))
    replay = [{"role": "user", "content": "Weather?"},
              reasoning.model_dump(exclude_none=True), call.model_dump(exclude_none=True),
              {"type": "function_call_output", "call_id": call.call_id, "output": "-5C"}]
    second = c.responses.create(model="smart", input=replay, tools=[WEATHER], store=False)
    assert second.output_text == "Cold."
    sent = srv.requests[-1].body["input"]
    by_type = {item.get("type"): item for item in sent}
    assert by_type["reasoning"]["encrypted_content"] == "gAAAx"  # restored to its upstream
    assert by_type["function_call"]["call_id"] == "call_UP_2"
    assert by_type["function_call_output"]["call_id"] == "call_UP_2"


def test_responses_upstream_parallel_and_custom_tool_calls(responses_fake, clients) -> None:
    srv, served = responses_fake
    patch = "*** Begin Patch\n*** End Patch\n"
    srv.push(Script(chunks=ResponsesStream()
                    .function_call("call_a", "get_weather", ['{"city":"Oslo"}'])
                    .custom_call("call_p", "apply_patch", [patch[:10], patch[10:]])
                    .completed().chunks()))
    seen, final = stream_final(clients(served), model="smart", input="Go", tools=[
        WEATHER, {"type": "custom", "name": "apply_patch", "description": "patch"}])
    fn, custom = final.output
    assert (fn.type, fn.call_id) == ("function_call", "call_a")
    assert (custom.type, custom.call_id, custom.input) == ("custom_tool_call", "call_p", patch)
    assert "response.custom_tool_call_input.delta" in seen


# -- the Anthropic fake ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def anthropic_fake() -> Iterator[tuple[ScriptedServer, Served]]:
    srv = anthropic_server()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(KEY_ENV, "sk-ant")
        up = AnthropicUpstream.from_config(UpstreamConfig(
            name="claude", kind="anthropic", base_url=srv.url, api_key_env=KEY_ENV,
            models=(ModelRoute(name="sonnet", upstream_model="claude-test"),)))
    served = gateway(up, "sonnet")
    yield srv, served
    stop(served, up)
    srv.stop()


def test_anthropic_upstream_text(anthropic_fake, clients) -> None:
    srv, served = anthropic_fake
    srv.push(Script(chunks=MessagesStream().ping().text(["Hel", "lo"]).end().chunks()))
    _seen, final = stream_final(clients(served), model="sonnet", input="Hi")
    assert final.output_text == "Hello" and final.usage.input_tokens == 12
    srv.push(Script(chunks=MessagesStream().text(["Hi"]).end().chunks()))
    assert clients(served).responses.create(model="sonnet", input="Hi").output_text == "Hi"


def test_anthropic_upstream_tool_use_keeps_its_id(anthropic_fake, clients) -> None:
    srv, served = anthropic_fake
    srv.push(Script(chunks=MessagesStream().text(["Let me check."]).tool_use(
        "toolu_01Abc", "get_weather", ['{"city":', '"Paris"}']).end("tool_use").chunks()))
    _seen, final = stream_final(clients(served), model="sonnet", input="?", tools=[WEATHER])
    message, call = final.output
    assert message.content[0].text == "Let me check."  # text and call both kept
    assert call.call_id == "toolu_01Abc" and json.loads(call.arguments) == {"city": "Paris"}


def test_anthropic_upstream_thinking_becomes_a_summary_without_its_signature(
        anthropic_fake, clients) -> None:
    srv, served = anthropic_fake
    srv.push(Script(chunks=MessagesStream().thinking(["Consider", " it."], "sig-123")
                    .text(["Done"]).end().chunks()))
    _seen, final = stream_final(clients(served), model="sonnet", input="?")
    reasoning = final.output[0]
    assert reasoning.summary[0].text == "Consider it."
    assert not reasoning.encrypted_content  # a signed thinking block is not handed out
    assert final.output_text == "Done"


def test_anthropic_upstream_parallel_tool_use_round_trip(anthropic_fake, clients) -> None:
    srv, served = anthropic_fake
    c = clients(served)
    srv.push(Script(chunks=MessagesStream().tool_use("toolu_A", "get_weather", ['{"city":"Oslo"}'])
                    .tool_use("toolu_B", "get_weather", ['{"city":"Rome"}'])
                    .end("tool_use").chunks()))
    events = create_events(c, model="sonnet", input="Both?", tools=[WEATHER])
    calls = [e.item for e in events if e.type == "response.output_item.done"]
    assert [(x.call_id, json.loads(x.arguments)["city"]) for x in calls] == [
        ("toolu_A", "Oslo"), ("toolu_B", "Rome")]
    srv.push(Script(chunks=MessagesStream().text(["Mild."]).end().chunks()))
    replay = [{"role": "user", "content": "Both?"},
              *[x.model_dump(exclude_none=True) for x in calls],
              *[{"type": "function_call_output", "call_id": x.call_id, "output": "ok"}
                for x in calls]]
    assert c.responses.create(model="sonnet", input=replay, tools=[WEATHER]).output_text \
        == "Mild."
    blocks = [b for m in srv.requests[-1].body["messages"] if isinstance(m["content"], list)
              for b in m["content"]]
    assert [b["id"] for b in blocks if b["type"] == "tool_use"] == ["toolu_A", "toolu_B"]
    assert [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"] == [
        "toolu_A", "toolu_B"]


# -- the embedded engine ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def embedded(engine, smollm2_map) -> Iterator[Served]:
    router = Router([ServedModel(name=engine.model_id, upstream=engine, tmap=smollm2_map,
                                 max_model_len=1024, ids_source=IdsSource.ENGINE,
                                 upstream_name="embedded")])
    served = start_server(GatewayState(settings=ServerSettings(), router=router))
    yield served
    served.stop()


ARITHMETIC = "What is 2+2? Answer with a number only."


def test_embedded_engine_text_stream_and_create(embedded, clients) -> None:
    c = clients(embedded)
    _seen, final = stream_final(c, model="", input=ARITHMETIC, max_output_tokens=64,
                                temperature=0)
    [message] = final.output
    assert message.type == "message" and "4" in final.output_text
    assert final.usage.output_tokens >= 1 and final.usage.input_tokens > 10
    resp = c.responses.create(model="", input=ARITHMETIC, max_output_tokens=64, temperature=0)
    assert resp.output_text == final.output_text  # greedy: the same answer both ways


def test_embedded_engine_length_ends_response_incomplete(embedded, clients) -> None:
    events = create_events(clients(embedded), model="", input="Tell me a long story.",
                           max_output_tokens=3, temperature=0)
    last = events[-1]
    assert last.type == "response.incomplete"
    assert last.response.incomplete_details.reason == "max_output_tokens"
    assert last.response.usage.output_tokens == 3


# -- the route around the renderer -----------------------------------------------------------


def test_stored_response_continues_by_previous_response_id_and_reads_back(
        chat_fake, clients) -> None:
    fake, replies, served = chat_fake
    c = clients(served)
    replies.append(Reply(chunks=chat_stream("vllm", ["Paris."])))
    first = c.responses.create(model="m", input="Capital of France?")
    assert c.responses.retrieve(first.id).output_text == "Paris."
    replies.append(Reply(chunks=chat_stream("vllm", ["Lyon."])))
    second = c.responses.create(model="m", input="And the second city?",
                                previous_response_id=first.id, stream=True)
    assert [e.type for e in second][-1] == "response.completed"
    sent = [(m["role"], m["content"]) for m in fake.requests[-1][1]["messages"]]
    assert sent == [("user", "Capital of France?"), ("assistant", "Paris."),
                    ("user", "And the second city?")]


def test_unknown_previous_response_id_is_openai_s_400(chat_fake, clients) -> None:
    _fake, _replies, served = chat_fake
    with pytest.raises(openai.BadRequestError) as info:
        clients(served).responses.create(model="m", input="x",
                                         previous_response_id="resp_" + "0" * 32)
    assert info.value.code == "previous_response_not_found"


def test_compaction_trigger_streams_a_final_invalid_prompt_without_calling_upstream(
        chat_fake, clients) -> None:
    fake, _replies, served = chat_fake
    asked = len(fake.requests)
    events = create_events(clients(served), model="m",
                           input=[{"role": "user", "content": "hi"},
                                  {"type": "compaction_trigger"}])
    assert [e.type for e in events] == ["response.created", "response.in_progress",
                                        "response.failed"]
    assert events[-1].response.error.code == "invalid_prompt"
    assert "remote compaction" in events[-1].response.error.message
    assert len(fake.requests) == asked


def test_a_quiet_upstream_gets_in_progress_heartbeats_in_sequence() -> None:
    """The supervisor's heartbeat is rendered as a data event that keeps the sequence (when
    heartbeats are sent is the supervisor's business: tests/gateway/test_supervisor.py)."""
    from tokenwire.gateway.apis.responses_render import ResponsesRenderer
    from tokenwire.gateway.http.responses_routes import _SSEResponse
    from tokenwire.gateway.ir import Finish, FinishKind, Heartbeat

    class Quiet:
        calls = 0

        async def next_event(self):
            self.calls += 1
            return Heartbeat() if self.calls == 1 else Finish(reason=FinishKind.EOS)

        def cancel(self) -> None:
            pass

    sent: list[bytes] = []

    async def receive():
        await asyncio.Event().wait()

    async def send(message):
        sent.append(message.get("body", b""))

    renderer = ResponsesRenderer(response_id="resp_" + "1" * 32, model="m", created_at=0,
                                 stream=True)
    app = _SSEResponse(Quiet(), renderer, headers=[], save=None)
    asyncio.run(app({"type": "http"}, receive, send))
    events = [json.loads(line[6:]) for line in b"".join(sent).decode().splitlines()
              if line.startswith("data: ")]
    assert [(e["type"], e["sequence_number"]) for e in events] == [
        ("response.created", 0), ("response.in_progress", 1), ("response.in_progress", 2),
        ("response.completed", 3)]
