"""The ``anthropic`` SDK, unchanged, against ``POST /v1/messages`` in front of every upstream kind.

``client.messages.stream()`` (``text_stream``, ``get_final_message()``: the SDK's accumulator,
which fails on a malformed event order) and ``client.messages.create()`` run against tokenwire
on a real loopback socket, in front of the embedded engine and of the scripted Chat
Completions, Responses and Anthropic fakes driven through the real upstream adapters.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from tokenwire.gateway.http.state import GatewayState
from tokenwire.gateway.ir import IdsSource
from tokenwire.gateway.routing.router import Router, ServedModel
from tokenwire.gateway.settings import ServerSettings
from tokenwire.gateway.upstreams.anthropic_upstream import AnthropicUpstream
from tokenwire.gateway.upstreams.base import ModelRoute, UpstreamConfig
from tokenwire.gateway.upstreams.openai_compat import OpenAICompatUpstream
from tokenwire.gateway.upstreams.responses_upstream import ResponsesUpstream

from .conftest import Served, start_server
from .upstreams.fakes import FakeServer, Reply, ToolScript, chat_stream, start_fake
from .upstreams.fakes_anthropic import MessagesStream, anthropic_server
from .upstreams.fakes_responses import ResponsesStream, Script, ScriptedServer

KEY_ENV = "TW_TEST_MESSAGES_SDK_KEY"
USER = [{"role": "user", "content": "Weather in Oslo?"}]
WEATHER = {"name": "get_weather", "description": "Weather for a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


def client(served: Served) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=served.url, api_key="unused", max_retries=0,
                               timeout=60)


def gateway(name: str, upstream: Any, upstream_name: str) -> Served:
    return start_server(GatewayState(settings=ServerSettings(), router=Router([ServedModel(
        name=name, upstream=upstream, ids_source=IdsSource.NONE,
        upstream_name=upstream_name)])))


@pytest.fixture
def sdk() -> Iterator[Any]:
    """``sdk(served)`` -> a client, closed after the test (its sockets with it)."""
    made: list[anthropic.Anthropic] = []

    def make(served: Served) -> anthropic.Anthropic:
        made.append(client(served))
        return made[-1]

    yield make
    for c in made:
        c.close()


@pytest.fixture(scope="module", autouse=True)
def _key() -> Iterator[None]:
    mp = pytest.MonkeyPatch()
    mp.setenv(KEY_ENV, "sk-test")
    yield
    mp.undo()


# -- the embedded engine -----------------------------------------------------------------------


def test_embedded_engine_text_stream_and_create_agree(engine, serve) -> None:
    kw = {"model": engine.model_id, "max_tokens": 12, "extra_body": {"temperature": 0.0},
          "messages": [{"role": "user", "content": "Name a fruit."}]}
    with client(serve(engine)) as c, c.messages.stream(**kw) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].text == text
    assert final.id.startswith("msg_") and final.role == "assistant"
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert final.usage.input_tokens > 0 and final.usage.output_tokens > 0
    with client(serve(engine)) as c:
        whole = c.messages.create(**kw)
    assert whole.content[0].text == text and whole.stop_reason == final.stop_reason


# -- a Chat Completions upstream ---------------------------------------------------------------


@pytest.fixture(scope="module")
def chat_up() -> Iterator[tuple[FakeServer, Served]]:
    fake = start_fake(lambda path, body: Reply())
    up = OpenAICompatUpstream.from_config(UpstreamConfig(
        name="vllm", kind="openai", base_url=fake.url, models=(ModelRoute(name="m"),)))
    served = gateway("m", up, "vllm")
    yield fake, served
    served.stop()
    fake.stop()


def _reply(fake: FakeServer, body: tuple[bytes, ...]) -> None:
    fake.respond = lambda path, req: Reply(chunks=body, delay=0.002)


def test_chat_upstream_text_stream_and_create(chat_up) -> None:
    fake, served = chat_up
    _reply(fake, chat_stream("vllm", ["Sunny ", "and mild."], usage=(9, 4)))
    with client(served) as c, c.messages.stream(model="m", max_tokens=50,
                                                messages=USER) as stream:
        assert "".join(stream.text_stream) == "Sunny and mild."
        final = stream.get_final_message()
    assert (final.stop_reason, final.usage.input_tokens, final.usage.output_tokens) == (
        "end_turn", 9, 4)
    with client(served) as c:
        whole = c.messages.create(model="m", max_tokens=50, messages=USER)
    assert whole.content[0].text == "Sunny and mild." and whole.model == "m"


def test_chat_upstream_tool_use_round_trip_keeps_ids(chat_up, sdk) -> None:
    fake, served = chat_up
    _reply(fake, chat_stream("vllm", ["Let me check."], finish="tool_calls", tools=[
        ToolScript(0, "call_W1", "get_weather", ('{"city":', ' "Oslo"}'))]))
    c = sdk(served)
    with c.messages.stream(model="m", max_tokens=50, messages=USER, tools=[WEATHER],
                           tool_choice={"type": "auto"}) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    text, call = final.content
    assert text.text == "Let me check."
    assert (call.type, call.id, call.name, call.input) == (
        "tool_use", "call_W1", "get_weather", {"city": "Oslo"})
    sent = fake.requests[-1][1]
    assert sent["tools"][0]["function"]["name"] == "get_weather"
    assert sent["tools"][0]["function"]["parameters"] == WEATHER["input_schema"]
    # The client answers the call; the upstream sees the same id on both sides.
    _reply(fake, chat_stream("vllm", ["It is sunny."]))
    follow = c.messages.create(model="m", max_tokens=50, tools=[WEATHER], messages=[
        *USER, {"role": "assistant", "content": [b.model_dump() for b in final.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                      "content": "sunny, 18C"}]}])
    assert follow.content[0].text == "It is sunny."
    msgs = fake.requests[-1][1]["messages"]
    assert msgs[1]["tool_calls"][0]["id"] == "call_W1"
    assert json.loads(msgs[1]["tool_calls"][0]["function"]["arguments"]) == {"city": "Oslo"}
    assert (msgs[2]["role"], msgs[2]["tool_call_id"], msgs[2]["content"]) == (
        "tool", "call_W1", "sunny, 18C")


def test_chat_upstream_parallel_tool_calls_become_two_blocks(chat_up) -> None:
    fake, served = chat_up
    _reply(fake, chat_stream("vllm", finish="tool_calls", tools=[
        ToolScript(0, "call_A", "get_weather", ('{"city":', '"Oslo"}')),
        ToolScript(1, "call_B", "get_weather", ('{"city":', '"Rome"}'))]))
    with client(served) as c, c.messages.stream(model="m", max_tokens=50, messages=USER,
                                                tools=[WEATHER]) as stream:
        final = stream.get_final_message()
    assert [(b.id, b.input) for b in final.content] == [
        ("call_A", {"city": "Oslo"}), ("call_B", {"city": "Rome"})]


def test_chat_upstream_reasoning_content_becomes_a_thinking_block(chat_up, sdk) -> None:
    fake, served = chat_up
    _reply(fake, chat_stream("vllm", ["42."], reasoning=["Let me ", "think."]))
    c = sdk(served)
    with c.messages.stream(model="m", max_tokens=50, messages=USER,
                           thinking={"type": "enabled", "budget_tokens": 2000}) as stream:
        final = stream.get_final_message()
    thinking, text = final.content
    assert (thinking.type, thinking.thinking, text.text) == ("thinking", "Let me think.", "42.")
    assert fake.requests[-1][1].get("reasoning_effort") == "low"


# -- a Responses upstream ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def responses_up() -> Iterator[tuple[ScriptedServer, Served]]:
    fake = ScriptedServer(stream_path="/v1/responses", models_path="/v1/models",
                          models=("gpt-test",))
    up = ResponsesUpstream.from_config(UpstreamConfig(
        name="oai", kind="responses", base_url=fake.url + "/v1", api_key_env=KEY_ENV,
        models=(ModelRoute(name="smart", upstream_model="gpt-test"),)))
    served = gateway("smart", up, "oai")
    yield fake, served
    served.stop()
    fake.stop()


def test_responses_upstream_text_and_function_call(responses_up) -> None:
    fake, served = responses_up
    s = (ResponsesStream().reasoning(["Checking."], encrypted="ENC").message(["Sure."])
         .function_call("call_R1", "get_weather", ['{"city":', '"Oslo"}']).completed(9, 12))
    fake.push(Script(s.chunks(), delay=0.002))
    with client(served) as c, c.messages.stream(model="smart", max_tokens=50,
                                                messages=USER, tools=[WEATHER]) as stream:
        final = stream.get_final_message()
    kinds = [b.type for b in final.content]
    assert kinds == ["thinking", "text", "tool_use"]
    assert final.content[0].signature == ""  # a Responses blob never reaches the client
    assert (final.content[2].id, final.content[2].input) == ("call_R1", {"city": "Oslo"})
    assert final.stop_reason == "tool_use" and final.usage.output_tokens == 12
    fake.push(Script(ResponsesStream().message(["Plain."]).completed().chunks()))
    with client(served) as c:
        whole = c.messages.create(model="smart", max_tokens=50, messages=USER)
    assert whole.content[0].text == "Plain."


# -- an Anthropic upstream (Messages through the IR) -------------------------------------------


@pytest.fixture(scope="module")
def anthropic_up() -> Iterator[tuple[ScriptedServer, Served]]:
    fake = anthropic_server()
    up = AnthropicUpstream.from_config(UpstreamConfig(
        name="claude", kind="anthropic", base_url=fake.url, api_key_env=KEY_ENV,
        models=(ModelRoute(name="sonnet", upstream_model="claude-test"),)))
    served = gateway("sonnet", up, "claude")
    yield fake, served
    served.stop()
    fake.stop()


def test_anthropic_upstream_signed_thinking_round_trips_exactly(anthropic_up, sdk) -> None:
    fake, served = anthropic_up
    s = (MessagesStream(input_tokens=21).thinking(["Hmm, ", "Oslo."], "SIG==").redacted("RED")
         .text(["Checking."]).tool_use("toolu_01X", "get_weather", ['{"city":', '"Oslo"}'])
         .end("tool_use", 17))
    fake.push(Script(s.chunks(), delay=0.002))
    c = sdk(served)
    with c.messages.stream(model="sonnet", max_tokens=100, messages=USER, tools=[WEATHER],
                           thinking={"type": "enabled", "budget_tokens": 1024}) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "redacted_thinking", "text",
                                               "tool_use"]
    assert (final.content[0].thinking, final.content[0].signature) == ("Hmm, Oslo.", "SIG==")
    assert final.content[1].data == "RED" and final.content[3].id == "toolu_01X"
    assert (final.usage.input_tokens, final.usage.output_tokens) == (21, 17)
    # The next turn sends the blocks back; the upstream receives them unchanged.
    fake.push(Script(MessagesStream().text(["Sunny."]).end().chunks()))
    follow = c.messages.create(model="sonnet", max_tokens=100, tools=[WEATHER], messages=[
        *USER, {"role": "assistant", "content": [b.model_dump() for b in final.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01X",
                                      "content": "sunny"}]}])
    assert follow.content[0].text == "Sunny."
    sent = fake.requests[-1].body["messages"]
    assert sent[1]["content"][:2] == [
        {"type": "thinking", "thinking": "Hmm, Oslo.", "signature": "SIG=="},
        {"type": "redacted_thinking", "data": "RED"}]
    assert sent[1]["content"][-1]["id"] == "toolu_01X"
    assert sent[2]["content"][0]["tool_use_id"] == "toolu_01X"


def test_anthropic_upstream_gets_the_clients_own_body_cache_control_and_thinking_kept(
        anthropic_up, sdk) -> None:
    """Claude Code's shape: system blocks and a message block with ``cache_control``, a
    thinking budget of 31,999 in 32,000 tokens, a tool result with ``is_error``. Built from
    the IR, the upstream got no ``cache_control`` (the prompt cache lost: every turn billed
    whole), ``max_tokens`` 48,384 with a budget of 16,384, and ``"Error: "`` text."""
    fake, served = anthropic_up
    system = [{"type": "text", "text": "You are Claude Code.",
               "cache_control": {"type": "ephemeral"}}]
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Run it.",
                                      "cache_control": {"type": "ephemeral", "ttl": "1h"}}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Run.", "signature": "SIG=="},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
             "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "is_error": True, "content": "exit 1"}]}]
    thinking = {"type": "enabled", "budget_tokens": 31999}
    fake.push(Script(MessagesStream().text(["Fixed."]).end().chunks()))
    answer = sdk(served).messages.create(model="sonnet", max_tokens=32000, system=system,
                                         messages=messages, tools=[WEATHER],
                                         thinking=thinking, metadata={"user_id": "u1"})
    assert answer.content[0].text == "Fixed."
    sent = fake.requests[-1].body
    assert sent["model"] == "claude-test" and sent["stream"] is True
    assert (sent["max_tokens"], sent["thinking"]) == (32000, thinking)
    assert (sent["system"], sent["messages"]) == (system, messages)
    assert sent["metadata"] == {"user_id": "u1"} and sent["tools"][0]["name"] == "get_weather"
    # A thinking block with no signature (another model's turn) cannot go as the client
    # wrote it: the IR's body, which keeps its text only.
    fake.push(Script(MessagesStream().text(["Ok."]).end().chunks()))
    unsigned = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "Hmm."}, {"type": "text", "text": "Hello."}]},
        {"role": "user", "content": "Again"}]
    sdk(served).messages.create(model="sonnet", max_tokens=50, messages=unsigned)
    sent = fake.requests[-1].body
    assert all(b.get("type") != "thinking" for m in sent["messages"]
               for b in (m["content"] if isinstance(m["content"], list) else ()))


def test_anthropic_upstream_mid_stream_overload_is_an_sdk_error(anthropic_up) -> None:
    fake, served = anthropic_up
    s = MessagesStream().text(["Part"]).error("overloaded_error", "Overloaded")
    fake.push(Script(s.chunks()))
    with pytest.raises(anthropic.APIStatusError) as err, client(served) as c, \
            c.messages.stream(model="sonnet", max_tokens=10, messages=USER) as stream:
        stream.get_final_message()
    assert err.value.body["error"]["type"] == "overloaded_error"


def test_unknown_model_is_an_sdk_not_found_error(anthropic_up) -> None:
    _, served = anthropic_up
    with pytest.raises(anthropic.NotFoundError) as err, client(served) as c:
        c.messages.create(model="nope", max_tokens=5, messages=USER)
    assert err.value.body["error"]["type"] == "not_found_error"
