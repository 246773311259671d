"""A misbehaving Anthropic Messages upstream, seen by each client API: what the upstream said
validly reaches the client unchanged; what it said wrongly ends as the documented failure
(502 ``protocol_error``, docs/failure-semantics.md), never a success with altered content
and never the gateway's own 500."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import start_server
from tokenwire.gateway.http.state import GatewayState
from tokenwire.gateway.ir import IdsSource
from tokenwire.gateway.routing.router import Router, ServedModel
from tokenwire.gateway.settings import ServerSettings
from tokenwire.gateway.upstreams.anthropic_upstream import AnthropicUpstream
from tokenwire.gateway.upstreams.base import ModelRoute, UpstreamConfig

from .fakes_anthropic import MessagesStream, Script, ScriptedServer, anthropic_server

KEY_ENV = "TW_TEST_ANTHROPIC_MISBEHAVING_KEY"
USER = [{"role": "user", "content": "hi"}]
#: Each client API's whole (non-streamed) request.
APIS = {"chat": ("/v1/chat/completions", {"messages": USER}),
        "completions": ("/v1/completions", {"prompt": "hi"}),
        "responses": ("/v1/responses", {"input": "hi"}),
        "messages": ("/v1/messages", {"messages": USER, "max_tokens": 9})}


@pytest.fixture(scope="module")
def gateway() -> Iterator[tuple[str, ScriptedServer]]:
    """A gateway over a scripted Anthropic upstream (model ``sonnet``)."""
    mp = pytest.MonkeyPatch()
    mp.setenv(KEY_ENV, "sk-ant-test")
    upstream = anthropic_server()
    cfg = UpstreamConfig(name="claude", kind="anthropic", base_url=upstream.url,
                         api_key_env=KEY_ENV,
                         models=(ModelRoute(name="sonnet", upstream_model="claude-test"),))
    served = ServedModel(name="sonnet", upstream=AnthropicUpstream.from_config(cfg),
                         ids_source=IdsSource.NONE, upstream_name="claude")
    live = start_server(GatewayState(settings=ServerSettings(), router=Router([served])))
    yield live.url, upstream
    live.stop()
    upstream.stop()
    mp.undo()


def answer(gateway: tuple[str, ScriptedServer], api: str, stream: MessagesStream,
           **extra: Any) -> httpx.Response:
    """``api``'s answer when the upstream sends ``stream`` (once: a malformed stream is final,
    so a second attempt would be a defect the empty script list shows as a 502)."""
    url, upstream = gateway
    upstream.scripts.clear()
    upstream.push(Script(stream.chunks()))
    path, body = APIS[api]
    return httpx.post(url + path, json={"model": "sonnet", **body, **extra}, timeout=60)


def assert_malformed(resp: httpx.Response, api: str) -> None:
    """The documented failure of a malformed stream, in ``api``'s own error shape."""
    assert resp.status_code == 502, resp.text
    if api == "messages":
        assert resp.json()["type"] == "error" and resp.json()["error"]["type"] == "api_error"
    else:
        assert resp.json()["error"]["type"] == "server_error"


def open_block(s: MessagesStream, index: int, block: dict[str, Any]) -> MessagesStream:
    return s.emit("content_block_start", index=index, content_block=block)


def delta(s: MessagesStream, index: int, **fields: Any) -> MessagesStream:
    return s.emit("content_block_delta", index=index, delta=fields)


def tool(call_id: str = "toolu_1", name: str = "f") -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": {}}


# -- a block's life: start, deltas, stop -------------------------------------------------------


def _delta_after_stop() -> MessagesStream:
    s = MessagesStream().tool_use("toolu_1", "f", ['{"a":1}'])
    return delta(s, 0, type="input_json_delta", partial_json="}garbage").end("tool_use")


def _start_at_an_open_index() -> MessagesStream:
    s = delta(open_block(MessagesStream(), 0, tool()), 0, type="input_json_delta",
              partial_json='{"a":')
    s = delta(open_block(s, 0, {"type": "text", "text": ""}), 0, type="text_delta", text="x")
    return s.emit("content_block_stop", index=0).end("tool_use")


def _json_delta_in_a_text_block() -> MessagesStream:
    s = delta(open_block(MessagesStream(), 0, {"type": "text", "text": ""}), 0,
              type="input_json_delta", partial_json='{"a":1}')
    return s.emit("content_block_stop", index=0).end()


def _text_delta_in_a_tool_block() -> MessagesStream:
    s = delta(open_block(MessagesStream(), 0, tool()), 0, type="text_delta", text="x")
    return s.emit("content_block_stop", index=0).end("tool_use")


@pytest.mark.parametrize("api", sorted(APIS))
@pytest.mark.parametrize("stream", [
    _delta_after_stop, _start_at_an_open_index, _json_delta_in_a_text_block,
    _text_delta_in_a_tool_block,
], ids=["delta-after-stop", "start-at-an-open-index", "json-delta-in-a-text-block",
        "text-delta-in-a-tool-block"])
def test_a_delta_without_its_own_open_block_is_a_malformed_stream(gateway, api, stream):
    """Reproduced (Chat): a tool call's input after its content_block_stop reached the client
    appended to the checked input (``{"a":1}}garbage``) with finish_reason tool_calls; a
    block started at an index still open left the first call's input cut (``{"a":``); an
    ``input_json_delta`` in a text block was dropped, and the answer was an empty success.
    Each is now the malformed stream it is, on every API."""
    assert_malformed(answer(gateway, api, stream()), api)


def test_blocks_left_open_at_message_stop_are_closed_and_checked(gateway):
    """A stream whose blocks never got their content_block_stop: the call's input is checked
    there as at a stop (a cut one is malformed; it reached the client as ``{"a":``), and a
    custom tool's input, unwrapped only at the stop, is no longer lost."""
    cut = delta(open_block(MessagesStream(), 0, tool()), 0, type="input_json_delta",
                partial_json='{"a":').end("tool_use")
    for api in APIS:
        assert_malformed(answer(gateway, api, cut), api)
    whole = delta(open_block(MessagesStream(), 0, tool("toolu_P", "apply_patch")), 0,
                  type="input_json_delta", partial_json='{"input": "*** Begin"}')
    custom = [{"type": "custom", "name": "apply_patch", "description": "patch"}]
    made = answer(gateway, "responses", whole.end("tool_use"), tools=custom).json()
    assert [(o["type"], o["call_id"], o["input"]) for o in made["output"]] == [
        ("custom_tool_call", "toolu_P", "*** Begin")]


# -- what a field holds ------------------------------------------------------------------------


def _in_text(**fields: Any) -> MessagesStream:
    s = delta(open_block(MessagesStream(), 0, {"type": "text", "text": ""}), 0, **fields)
    return s.emit("content_block_stop", index=0).end()


def _in_block(block: dict[str, Any], *deltas: dict[str, Any]) -> MessagesStream:
    s = open_block(MessagesStream(), 0, block)
    for fields in deltas:
        s = delta(s, 0, **fields)
    return s.emit("content_block_stop", index=0).end("tool_use")


@pytest.mark.parametrize("api", sorted(APIS))
@pytest.mark.parametrize("stream", [
    lambda: _in_text(type="text_delta", text={"a": 1}),
    lambda: _in_text(type="text_delta", text=7),
    lambda: _in_block({"type": "text", "text": ["x"]}),
    lambda: _in_block({"type": "thinking", "thinking": 1, "signature": ""}),
    lambda: _in_block({"type": "thinking", "thinking": "", "signature": ""},
                      {"type": "thinking_delta", "thinking": {"t": 1}}),
    lambda: _in_block(tool(), {"type": "input_json_delta", "partial_json": {"a": 1}}),
    lambda: _in_block({**tool(), "id": 5}),
    lambda: _in_block({**tool(), "name": ["f"]}),
    lambda: _in_block({**tool(), "input": [1, 2]}),
    lambda: _in_block({"type": "redacted_thinking", "data": {"a": 1}}),
    lambda: MessagesStream().text(["x"]).end("stop_sequence", stop_sequence=["###"]),
], ids=["text-object", "text-number", "start-text-list", "start-thinking-number",
        "thinking-object", "partial-json-object", "id-number", "name-list", "input-list",
        "redacted-data-object", "stop-sequence-list"])
def test_a_field_of_the_wrong_type_is_a_malformed_stream(gateway, api, stream):
    """Reproduced (Chat): a text_delta's ``{"a": 1}`` reached the client as the text
    ``{'a': 1}``, a call's id 5 as ``"id": 5``, its name ``["f"]`` as the name ``['f']``, an
    input ``[1, 2]`` as the arguments ``[1,2]`` (the API's input is an object); a Messages
    client's redacted_thinking held the data ``{'a': 1}``. A field of
    another JSON type is the upstream's error, never text made up from it."""
    assert_malformed(answer(gateway, api, stream()), api)


def test_a_null_text_is_no_text(gateway):
    """Reproduced: ``"text": null`` reached the client as the text ``None``."""
    s = _in_text(type="text_delta", text=None)
    s.events[-3:-3] = [("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                "delta": {"type": "text_delta", "text": "ok"}})]
    made = answer(gateway, "chat", s).json()
    assert made["choices"][0]["message"]["content"] == "ok"


def test_a_call_the_upstream_gave_no_id_gets_one_on_every_api(gateway):
    """Reproduced: a tool_use block without ``id`` reached a Chat client as ``"id": null``,
    which it cannot answer. The call gets one, the same on every API's answer."""
    s = _in_block({"type": "tool_use", "name": "f", "input": {}},
                  {"type": "input_json_delta", "partial_json": '{"a":1}'})
    chat = answer(gateway, "chat", s).json()["choices"][0]["message"]["tool_calls"]
    assert [(c["id"][:5], c["function"]["arguments"]) for c in chat] == [("call_", '{"a":1}')]
    made = answer(gateway, "messages", s).json()["content"]
    assert [(b["id"][:5], b["input"]) for b in made] == [("call_", {"a": 1})]


def test_a_call_with_no_input_is_the_empty_object_on_every_api(gateway):
    """Anthropic streams a call of a tool without parameters as ``input: {}`` and an empty
    (or no) ``input_json_delta``. Reproduced: Chat and Responses clients got the arguments
    ``""``, which is not JSON (the SDKs' ``json.loads``, Codex's parse of the arguments
    fail on it); what the upstream said is the object ``{}``."""
    for pieces in ([""], []):
        s = MessagesStream().tool_use("toolu_N", "now", pieces).end("tool_use")
        chat = answer(gateway, "chat", s).json()["choices"][0]["message"]["tool_calls"]
        assert [(c["id"], c["function"]["arguments"]) for c in chat] == [("toolu_N", "{}")]
        made = answer(gateway, "responses", s).json()["output"]
        assert [(o["call_id"], o["arguments"]) for o in made] == [("toolu_N", "{}")]
        made = answer(gateway, "messages", s).json()["content"]
        assert [(b["id"], b["input"]) for b in made] == [("toolu_N", {})]


# -- usage -------------------------------------------------------------------------------------


def _usage_stream(start: dict[str, Any], final: dict[str, Any]) -> MessagesStream:
    s = MessagesStream()
    s.events[0][1]["message"]["usage"] = start
    s.text(["ok"]).emit("message_delta", delta={"stop_reason": "end_turn"}, usage=final)
    return s.emit("message_stop")


def test_a_usage_with_only_the_output_count_reaches_the_client(gateway):
    """Reproduced: a stream whose usage never named ``input_tokens`` (an Anthropic-compatible
    server that counts only what it generated) gave every client ``usage: null`` / nulls,
    though the upstream had said ``output_tokens: 7``. The prompt's count stays unknown."""
    s = _usage_stream({}, {"output_tokens": 7})
    chat = answer(gateway, "chat", s).json()["usage"]
    assert (chat["prompt_tokens"], chat["completion_tokens"], chat["tokenwire_source"]) == (
        None, 7, "upstream")
    made = answer(gateway, "messages", s).json()["usage"]
    assert (made["input_tokens"], made["output_tokens"]) == (None, 7)
    made = answer(gateway, "responses", s).json()["usage"]
    assert (made["input_tokens"], made["output_tokens"]) == (None, 7)


@pytest.mark.parametrize("said", [-3, "12", 1.5, True, None, 2**53 + 1, 10**30])
def test_a_count_that_is_not_a_count_is_unknown_never_guessed(gateway, said):
    """Reproduced for the counts past 2**53 (no model's, and not exact in a JSON double):
    every client got them as said, which a JavaScript client rounds, and past 2**64 Codex
    (64-bit counts) cannot parse the response.completed that holds them at all."""
    s = _usage_stream({"input_tokens": 12}, {"output_tokens": said})
    chat = answer(gateway, "chat", s).json()["usage"]
    assert (chat["prompt_tokens"], chat["completion_tokens"]) == (12, None)


@pytest.mark.parametrize("given", [{"patch": "*** Begin"}, {"input": "a", "more": "b"}])
def test_a_custom_calls_input_beyond_its_one_field_is_a_malformed_stream(gateway, given):
    """A freeform tool is declared to Anthropic as an object with one string, ``input``, and
    its call is unwrapped back to that text. Reproduced: an input with other fields reached
    a Responses client as the text ``""`` (or ``"a"``), the rest dropped in silence."""
    s = MessagesStream().tool_use("toolu_P", "apply_patch", [json.dumps(given)])
    custom = [{"type": "custom", "name": "apply_patch"}]
    assert_malformed(answer(gateway, "responses", s.end("tool_use"), tools=custom),
                     "responses")


# -- error events ------------------------------------------------------------------------------


def test_an_error_event_whose_data_is_text_is_the_failure_it_names(gateway):
    """A proxy in front of the upstream may end a stream with ``event: error`` and plain
    text, or with that text as its ``error``. Reproduced: the first was a malformed stream
    ("malformed JSON in a 'error' event"), final, the second "the upstream reported an
    error": the upstream's words were lost. Each is the upstream failure it names (502,
    retried once before any output, as the OpenAI adapter reads an ``event: error``)."""
    url, upstream = gateway
    said = "upstream connect error or disconnect/reset before headers"
    as_text = f"event: error\ndata: {said}\n\n".encode()
    as_field = f'event: error\ndata: {{"type": "error", "error": "{said}"}}\n\n'.encode()
    for api, chunk in (("chat", as_text), ("messages", as_text), ("chat", as_field)):
        upstream.scripts.clear()
        upstream.requests.clear()
        upstream.push(*[Script([chunk])] * 2)
        path, body = APIS[api]
        resp = httpx.post(url + path, json={"model": "sonnet", **body}, timeout=60)
        assert_malformed(resp, api)
        assert resp.json()["error"]["message"] == said and len(upstream.requests) == 2


# -- an answer cut by max_tokens ---------------------------------------------------------------


def test_a_call_cut_by_max_tokens_is_a_length_finish_on_every_api(gateway):
    """When max_tokens ends the answer inside a tool call, Anthropic stops the block with its
    input cut short, and says ``stop_reason: max_tokens``. Reproduced: every client got a
    502 "a tool_use block's input is not a JSON object" (Codex retries a 502: the same cut
    each time) where the upstream had said why; now it is the length finish it is, the
    arguments as far as they came (as an OpenAI upstream's cut call reaches the client)."""
    s = (MessagesStream().text(["Checking."])
         .tool_use("toolu_1", "get_weather", ['{"city": ', '"Os']).end("max_tokens"))
    chat = answer(gateway, "chat", s).json()["choices"][0]
    assert chat["finish_reason"] == "length"
    assert [(c["id"], c["function"]["arguments"]) for c in chat["message"]["tool_calls"]] == [
        ("toolu_1", '{"city": "Os')]
    made = answer(gateway, "messages", s).json()
    assert made["stop_reason"] == "max_tokens"
    assert [b["type"] for b in made["content"]] == ["text", "tool_use"]
    made = answer(gateway, "responses", s).json()
    assert (made["status"], made["incomplete_details"]) == (
        "incomplete", {"reason": "max_output_tokens"})


def test_a_call_cut_by_a_refusal_is_a_content_filter_finish(gateway):
    """Anthropic's streaming classifiers can stop an answer anywhere, a call's input too,
    with ``stop_reason: refusal``. Reproduced: a 502 "input is not a JSON object" where the
    upstream had said why; it is the content-filter finish a refusal is."""
    s = MessagesStream().tool_use("toolu_1", "f", ['{"a": ']).end("refusal")
    assert answer(gateway, "chat", s).json()["choices"][0]["finish_reason"] == "content_filter"
    assert answer(gateway, "messages", s).json()["stop_reason"] == "refusal"


@pytest.mark.parametrize("api", sorted(APIS))
def test_a_cut_call_with_another_end_or_more_after_it_is_still_malformed(gateway, api):
    cut = MessagesStream().tool_use("toolu_1", "f", ['{"a": ']).end("end_turn")
    assert_malformed(answer(gateway, api, cut), api)
    more = MessagesStream().tool_use("toolu_1", "f", ['{"a": ']).text(["x"]).end("max_tokens")
    assert_malformed(answer(gateway, api, more), api)
