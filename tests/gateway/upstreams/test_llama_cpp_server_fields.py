"""Request fields through tokenwire to the real ``python -m llama_cpp.server`` (issue 12).

Structured output, tools with a named ``tool_choice``, logprobs and the sampling extensions
reach llama-cpp-python's server in its own forms, and its answers come back as parsed
objects and real tool calls, checked against what the same server says when asked
directly. The server runs with its default chat handler (the GGUF's own template), which
constrains a named tool's arguments and a ``json_object`` schema with llama.cpp grammars.
Every compared generation starts from an unrelated cached prefix (``_evict``; see
``test_llama_cpp_server.py``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pydantic
import pytest

from tests.gateway.conftest import start_server
from tokenwire.codec.maps import bundled_map_path, load_map_file
from tokenwire.gateway.http.state import GatewayState
from tokenwire.gateway.routing.router import Router, ServedModel
from tokenwire.gateway.settings import ServerSettings
from tokenwire.gateway.upstreams.base import ModelRoute, UpstreamConfig
from tokenwire.gateway.upstreams.openai_compat import OpenAICompatUpstream

from .test_llama_cpp_server import N_CTX, _evict

pytestmark = pytest.mark.slow

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]


class City(pydantic.BaseModel):
    # A pattern the grammar enforces: SmolLM2-135M otherwise writes essays inside the
    # string, and llama-cpp-python's grammar for a plain string lets a raw newline through
    # (invalid JSON, seen with "Name a big city and its population."; the gateway returns
    # the upstream's text as it is).
    city: str = pydantic.Field(pattern=r"^[A-Za-z ]{1,40}$")
    population: int


@pytest.fixture(scope="module")
def gateway(llama_server):
    url, upstream_model = llama_server
    smollm2 = load_map_file(bundled_map_path("huggingfacetb/smollm2"))
    cfg = UpstreamConfig(name="llama-cpp-python", kind="openai", base_url=url,
                         models=(ModelRoute(name="smollm2", upstream_model=upstream_model,
                                            map_id=smollm2.id),))
    prober = OpenAICompatUpstream.from_config(cfg, maps={smollm2.id: smollm2})

    async def probe():
        try:
            return await prober.probe()
        finally:
            await prober.aclose()
    assert asyncio.run(probe()).state.value == "up"
    assert prober._json_object_schema  # found from the listing: owned_by "me"
    adapter = OpenAICompatUpstream.from_config(cfg, maps={smollm2.id: smollm2})
    adapter._server = prober._server
    served = ServedModel(name="smollm2", upstream=adapter, tmap=smollm2, max_model_len=N_CTX,
                         ids_source=adapter.ids_source_for("smollm2"),
                         upstream_name=adapter.name)
    live = start_server(GatewayState(settings=ServerSettings(), router=Router([served])))
    yield live.url, url, upstream_model
    live.stop(adapter)


@pytest.fixture(scope="module")
def client(gateway) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway[0] + "/v1", api_key="x", max_retries=0,
                       timeout=300) as sdk:
        yield sdk


def _direct(gateway, path: str, body: dict) -> dict:
    _, url, model = gateway
    _evict(url, model)
    return httpx.post(f"{url}/{path}", json={**body, "model": model}, timeout=300).json()


@pytest.mark.parametrize("prompt", ["Name a big city and its population.",
                                    "Tell me about Tokyo.", "Which city do you like?"])
def test_chat_parse_with_a_pydantic_model_returns_a_parsed_object(client, prompt) -> None:
    # json_schema reaches llama_cpp.server as its json_object + schema, a llama.cpp grammar.
    done = client.chat.completions.parse(
        model="smollm2", messages=[{"role": "user", "content": prompt}], max_tokens=120,
        temperature=0, response_format=City)
    parsed = done.choices[0].message.parsed
    assert isinstance(parsed, City), done.choices[0].message.content


def test_responses_parse_through_an_openai_upstream_returns_a_parsed_object(client) -> None:
    # Responses text.format -> the IR -> Chat response_format -> llama_cpp.server's form.
    resp = client.responses.parse(
        model="smollm2", input="Name a big city and its population.", max_output_tokens=120,
        temperature=0, text_format=City)
    assert isinstance(resp.output_parsed, City), resp.output_text


@pytest.mark.parametrize("stream", [False, True])
def test_named_tool_choice_returns_the_upstreams_real_call(gateway, client, stream) -> None:
    body = {"messages": ASK_WEATHER, "max_tokens": 60, "temperature": 0, "tools": [WEATHER],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    direct = _direct(gateway, "chat/completions", body)["choices"][0]["message"]
    want = direct["tool_calls"][0]["function"]
    _evict(gateway[1], gateway[2])
    if stream:
        name, args, reason = None, "", None
        for chunk in client.chat.completions.create(model="smollm2", stream=True, **body):
            choice = chunk.choices[0] if chunk.choices else None
            for call in (choice.delta.tool_calls or []) if choice else ():
                name = name or call.function.name
                args += call.function.arguments or ""
            reason = (choice.finish_reason if choice else None) or reason
    else:
        message = client.chat.completions.create(model="smollm2", **body).choices[0]
        call = message.message.tool_calls[0].function
        name, args, reason = call.name, call.arguments, message.finish_reason
    assert name == "get_weather" and reason == "tool_calls"
    assert json.loads(args) == json.loads(want["arguments"])  # what the server itself said
    assert isinstance(json.loads(args)["city"], str)


def test_messages_tool_choice_tool_reaches_it_as_a_named_function(gateway, closing) -> None:
    # Anthropic's {type: tool, name} -> the IR -> Chat's named tool_choice; the answer is a
    # tool_use block with the server's arguments.
    client = closing(anthropic.Anthropic(base_url=gateway[0], api_key="x", max_retries=0,
                                         timeout=300))
    _evict(gateway[1], gateway[2])
    msg = client.messages.create(
        model="smollm2", max_tokens=60, messages=ASK_WEATHER,
        extra_body={"temperature": 0},  # the SDK no longer names it; the API still takes it
        tools=[{"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}],
        tool_choice={"type": "tool", "name": "get_weather"})
    use = next(b for b in msg.content if b.type == "tool_use")
    assert use.name == "get_weather" and isinstance(use.input["city"], str)
    assert msg.stop_reason == "tool_use"


def test_chat_logprobs_are_the_upstreams(gateway, client) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
            "temperature": 0, "logprobs": True, "top_logprobs": 2}
    want = _direct(gateway, "chat/completions", body)["choices"][0]["logprobs"]["content"]
    _evict(gateway[1], gateway[2])
    got = client.chat.completions.create(model="smollm2", **body)
    content = got.choices[0].logprobs.content
    assert [c.token for c in content] == [w["token"] for w in want]
    assert [c.logprob for c in content] == pytest.approx([w["logprob"] for w in want])
    assert [[t.token for t in c.top_logprobs] for c in content] == [
        [t["token"] for t in w["top_logprobs"]] for w in want]


def test_completions_sampling_extensions_reach_it(gateway, client) -> None:
    fields = {"frequency_penalty": 1.5, "presence_penalty": 1.0, "top_k": 5, "min_p": 0.1,
              "repeat_penalty": 1.4}
    base = {"prompt": "one one one one one one", "max_tokens": 24, "temperature": 0}
    plain = _direct(gateway, "completions", base)["choices"][0]["text"]
    want = _direct(gateway, "completions", {**base, **fields})["choices"][0]["text"]
    assert want != plain  # the fields change this answer at the server itself
    _evict(gateway[1], gateway[2])
    got = client.completions.create(model="smollm2", **base, extra_body=fields)
    assert got.choices[0].text == want
