"""The seed's request hygiene, one test per rule, named after it (issue 5 item 3).

Rules that decide what an upstream receives are checked at the wire: a Responses upstream
adapter sends to a scripted Responses server on a loopback socket, which records the exact
bytes and headers it got.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.requests import Request

from tokenwire.errors import CompactionRefused, RemoteProtocolError
from tokenwire.gateway.affinity import (
    MAX_AFFINITY_CHARS,
    MAX_TURN_STATE_CHARS,
    TURN_STATE_HEADER,
    affinity_body,
    affinity_headers,
    affinity_hints,
    unwrap_turn_state,
    wrap_turn_state,
)
from tokenwire.gateway.apis.responses_hygiene import (
    COMPACTION_MESSAGE,
    ENCRYPTED_SCHEMA_MARKER,
    collaboration_call_fields,
    remove_control_items,
    strip_collaboration_marker,
    strip_internal_fields,
)
from tokenwire.gateway.apis.responses_request import ResponsesCall, parse_responses_request
from tokenwire.gateway.ir import ChatMessage, ChatPrompt, Event, GenerationRequest, is_terminal
from tokenwire.gateway.upstreams.base import ModelRoute, UpstreamConfig
from tokenwire.gateway.upstreams.responses_upstream import ResponsesUpstream

from .upstreams.fakes_responses import ResponsesStream, Script, ScriptedServer


def parse(body: Any, raw: bytes | None = None, **kw: Any) -> ResponsesCall:
    return parse_responses_request(body, headers=kw.pop("headers", {}), raw=raw, **kw)


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


# -- internal fields -----------------------------------------------------------------------


def test_internal_chat_message_metadata_passthrough_is_removed_from_every_input_item() -> None:
    meta = {"internal_chat_message_metadata_passthrough": {"turn": 1}}
    body = {"input": [{**user("hi"), **meta},
                      {"type": "function_call", "call_id": "c", "name": "f",
                       "arguments": "{}", **meta},
                      {"type": "function_call_output", "call_id": "c", "output": "o", **meta}]}
    out, removed = strip_internal_fields(body)
    assert removed
    assert all("internal_chat_message_metadata_passthrough" not in i for i in out["input"])
    assert "internal_chat_message_metadata_passthrough" in body["input"][0]  # copy-on-write


def test_encrypted_function_args_is_removed_from_function_call_items_only() -> None:
    call = {"type": "function_call", "call_id": "c", "name": "spawn_agent",
            "arguments": "{\"message\":\"plain\"}", "encrypted_function_args": ["x"]}
    other = {**user("hi"), "encrypted_function_args": ["y"]}
    out, removed = strip_internal_fields({"input": [call, other]})
    assert removed
    assert out["input"][0] == {k: v for k, v in call.items() if k != "encrypted_function_args"}
    assert out["input"][0]["arguments"] == "{\"message\":\"plain\"}"  # plaintext stays
    assert out["input"][1] is other


def test_client_metadata_mcp_attribution_is_removed_and_other_keys_untouched() -> None:
    body = {"input": "x", "client_metadata": {"mcp_attribution": {"s": 1}, "app": "codex"}}
    out, removed = strip_internal_fields(body)
    assert removed and out["client_metadata"] == {"app": "codex"}
    assert body["client_metadata"]["mcp_attribution"] == {"s": 1}


@pytest.mark.parametrize("body", [
    {"input": "x", "client_metadata": None}, {"input": "x", "client_metadata": []},
    {"input": "x", "client_metadata": "mcp_attribution"},
    {"input": [None, 3, ["internal_chat_message_metadata_passthrough"]]},
    {"input": [user("hi")], "client_metadata": {"app": "codex"}}])
def test_shapes_that_are_not_objects_are_left_alone_and_nothing_removed_is_the_same_object(
        body: dict) -> None:
    out, removed = strip_internal_fields(body)
    assert out is body and not removed


@settings(max_examples=150, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(
    ["type", "role", "content", "internal_chat_message_metadata_passthrough",
     "encrypted_function_args", "arguments"]), st.sampled_from(
    ["function_call", "message", "x", 1, None])), max_size=5))
def test_stripping_removes_exactly_the_internal_fields(items: list[dict]) -> None:
    out, removed = strip_internal_fields({"input": items})
    for before, after in zip(items, out["input"], strict=True):
        expect = {k: v for k, v in before.items()
                  if k != "internal_chat_message_metadata_passthrough"
                  and not (k == "encrypted_function_args"
                           and before.get("type") == "function_call")}
        assert after == expect
    assert removed == (out["input"] != items)


# -- control items -------------------------------------------------------------------------


def test_configuration_update_items_are_dropped_and_counted() -> None:
    items = [{"type": "configuration_update", "model": "secret"}, user("hi"),
             {"type": "configuration_update"}]
    assert remove_control_items(items) == ([user("hi")], 2)
    call = parse({"input": items})
    assert call.dropped["control_items"] == 2
    assert call.request.prompt == ChatPrompt(messages=(ChatMessage(role="user", content="hi"),))
    assert call.input_items == [user("hi")]


def test_compaction_trigger_is_refused_as_final_with_the_seed_message() -> None:
    with pytest.raises(CompactionRefused) as err:
        parse({"input": [user("hi"), {"type": "compaction_trigger"}], "stream": True})
    exc = err.value
    assert str(exc) == COMPACTION_MESSAGE == (
        "This gateway serves compaction inside the gateway executor; this Codex build sent "
        "remote compaction, which the gateway does not support yet.")
    assert (exc.status_hint, exc.code, exc.stream_code) == (400, "invalid_request",
                                                            "invalid_prompt")


# -- agent_message -------------------------------------------------------------------------


def test_agent_message_is_flattened_into_one_user_message_in_part_order() -> None:
    item = {"type": "agent_message", "author": "/root/worker", "recipient": "/root",
            "content": [{"type": "input_text", "text": "Found "},
                        {"type": "encrypted_content", "encrypted_content": "gAAA"},
                        {"type": "output_text", "text": "3 bugs."}]}
    call = parse({"input": [user("go"), item]})
    assert call.request.prompt == ChatPrompt(messages=(
        ChatMessage(role="user", content="go"), ChatMessage(role="user", content="Found 3 bugs.")))
    assert "worker" not in repr(call.request.prompt)  # author/recipient are never rendered
    assert call.raw_body is None


def test_agent_message_with_no_text_adds_no_message() -> None:
    item = {"type": "agent_message", "content": [
        {"type": "encrypted_content", "encrypted_content": "gAAA"}]}
    call = parse({"input": [user("go"), item]})
    assert call.request.prompt == ChatPrompt(messages=(ChatMessage(role="user", content="go"),))


def test_agent_message_with_any_other_part_is_a_client_error_before_any_upstream(
        responses_server: ScriptedServer) -> None:
    item = {"type": "agent_message", "content": [
        {"type": "input_text", "text": "see"},
        {"type": "input_image", "image_url": "https://x/y.png"}]}
    with pytest.raises(RemoteProtocolError) as err:
        parse({"input": [item]})
    assert err.value.status_hint == 400
    assert responses_server.requests == []


# -- cache affinity and turn state ---------------------------------------------------------


def test_cache_affinity_keys_are_forwarded_only_when_well_formed() -> None:
    good = "019a-thread_1:x.y"
    hints = affinity_hints(
        {"prompt_cache_key": good},
        {"session-id": "s" * MAX_AFFINITY_CHARS, "thread-id": "t" * (MAX_AFFINITY_CHARS + 1),
         "x-session-id": "bad value\r\nx: y"})
    assert hints == (("prompt_cache_key", good), ("session-id", "s" * MAX_AFFINITY_CHARS))
    assert affinity_hints({"prompt_cache_key": 7}, {"session-id": ""}) == ()


@pytest.mark.parametrize(("kind", "headers", "body"), [
    ("responses", {"session-id": "s1", "thread-id": "t1"}, {"prompt_cache_key": "k1"}),
    ("openai", {"x-session-id": "s1"}, {}),
    ("anthropic", {}, {}), ("embedded", {}, {}), ("codec", {}, {})])
def test_cache_affinity_keys_reach_only_upstream_kinds_that_use_them(
        kind: str, headers: dict, body: dict) -> None:
    hints = affinity_hints({"prompt_cache_key": "k1"}, {"session-id": "s1", "thread-id": "t1"})
    assert affinity_headers(kind, "up", hints) == headers
    assert affinity_body(kind, hints) == body


def test_turn_state_is_wrapped_with_the_issuing_upstream_and_unwrapped_only_for_it() -> None:
    value = "eyJ0dXJuIjoxfQ" * 55  # ~780 characters, as the seed measured
    wrapped = wrap_turn_state("codex-sub", value)
    assert wrapped is not None and wrapped != value
    assert unwrap_turn_state("codex-sub", wrapped) == value
    assert unwrap_turn_state("other", wrapped) is None


@pytest.mark.parametrize("value", ["x" * (MAX_TURN_STATE_CHARS + 1), "", "a b", "a\r\nb"])
def test_malformed_or_oversized_upstream_turn_state_is_dropped(value: str) -> None:
    assert wrap_turn_state("up", value) is None


@pytest.mark.parametrize("client_value", ["raw-unwrapped-value", "tw2.", "tw2.!!!.v",
                                          "tw2.dXA.", "tw2.dXA.a b",
                                          # the old unsigned form, and a forged signature
                                          "tw1.dXA.state-123",
                                          "tw2.dXA.AAAAAAAAAAAAAAAAAAAAAA.state-123"])
def test_malformed_client_turn_state_is_never_forwarded(client_value: str) -> None:
    hints = affinity_hints({}, {TURN_STATE_HEADER: client_value})
    assert TURN_STATE_HEADER not in affinity_headers("responses", "up", hints)


def test_turn_state_is_forwarded_only_to_the_responses_upstream_that_issued_it() -> None:
    wrapped = wrap_turn_state("up", "state-123")
    assert wrapped is not None
    hints = affinity_hints({}, {TURN_STATE_HEADER: wrapped})
    assert affinity_headers("responses", "up", hints) == {TURN_STATE_HEADER: "state-123"}
    assert affinity_headers("responses", "other", hints) == {}
    assert affinity_headers("openai", "up", hints) == {}


# -- collaboration tools -------------------------------------------------------------------


def _collab_tool(name: str) -> dict[str, Any]:
    return {"type": "function", "name": name, "parameters": {"type": "object", "properties": {
        "message": {"type": "string", ENCRYPTED_SCHEMA_MARKER: True},
        "agent_type": {"type": "string", ENCRYPTED_SCHEMA_MARKER: True}}}}


@pytest.mark.parametrize("name", ["spawn_agent", "send_message", "followup_task"])
def test_collaboration_marker_is_stripped_only_from_the_message_parameter(name: str) -> None:
    tool = _collab_tool(name)
    out = strip_collaboration_marker(tool, "collaboration")
    props = out["parameters"]["properties"]
    assert props["message"] == {"type": "string"}
    assert props["agent_type"][ENCRYPTED_SCHEMA_MARKER] is True  # other schemas untouched
    assert tool["parameters"]["properties"]["message"][ENCRYPTED_SCHEMA_MARKER]  # caller's copy
    call = parse({"input": "x", "tools": [{"type": "namespace", "name": "collaboration",
                                           "tools": [tool]}]})
    assert call.request.tools[0].parameters["properties"]["message"] == {"type": "string"}
    assert call.collaboration_tools == {name}


@pytest.mark.parametrize(("name", "namespace"), [("spawn_agent", None),
                                                 ("spawn_agent", "other"),
                                                 ("exec_command", "collaboration")])
def test_collaboration_marker_stays_on_other_tools(name: str, namespace: str | None) -> None:
    tool = _collab_tool(name)
    assert strip_collaboration_marker(tool, namespace) is tool


def test_collaboration_calls_are_emitted_with_empty_encrypted_function_args() -> None:
    call = parse({"input": "x", "tools": [{**_collab_tool("send_message"),
                                           "namespace": "collaboration"},
                                          {"type": "function", "name": "exec_command"}]})
    assert collaboration_call_fields("send_message", call.collaboration_tools) == {
        "namespace": "collaboration", "encrypted_function_args": []}
    assert collaboration_call_fields("exec_command", call.collaboration_tools) == {}


# -- untouched bodies reach a Responses upstream byte-identical ----------------------------


class RawServer(ScriptedServer):
    """The scripted Responses server, also keeping each request's exact bytes."""

    def __init__(self, **kw: Any) -> None:
        self.raw: list[bytes] = []
        super().__init__(**kw)

    async def _stream(self, request: Request) -> Any:
        self.raw.append(await request.body())
        return await super()._stream(request)


@pytest.fixture(scope="module")
def _server() -> Iterator[RawServer]:
    srv = RawServer(stream_path="/v1/responses", models_path="/v1/models")
    yield srv
    srv.stop()


@pytest.fixture
def responses_server(_server: RawServer) -> RawServer:
    _server.scripts.clear()
    _server.requests.clear()
    _server.raw.clear()
    return _server


def run_upstream(server: RawServer, request: GenerationRequest, model: str = "gpt-test",
                 sent_as: str = "") -> list[Event]:
    server.push(Script(chunks=ResponsesStream().message(["ok"]).completed().chunks()))

    async def main() -> list[Event]:
        up = ResponsesUpstream.from_config(UpstreamConfig(
            name="up", kind="responses", base_url=server.url + "/v1",
            models=(ModelRoute(name=model, upstream_model=sent_as),)))
        try:
            stream = up.submit(request)
            events = [await stream.next_event()]
            while not is_terminal(events[-1]):
                events.append(await stream.next_event())
            return events
        finally:
            await up.aclose()

    return asyncio.run(main())


def _codex_like_body() -> bytes:
    # Key order, spacing and unicode escapes a re-encoder would not reproduce.
    return (b'{ "model":"gpt-test", "stream":true, "store":false, "include":[],\n'
            b' "input":[{"type":"message","role":"user","content":[{"type":"input_text",'
            b'"text":"caf\\u00e9 \xe2\x98\x95"}]}], "tools":[{"type":"web_search"}],'
            b' "prompt_cache_key":"th-1", "text":{"verbosity":"low"} }')


def test_a_body_with_nothing_to_strip_reaches_a_responses_upstream_byte_identical(
        responses_server: RawServer) -> None:
    raw = _codex_like_body()
    call = parse(json.loads(raw), raw=raw, headers={"session-id": "s-1"})
    assert call.raw_body == raw
    run_upstream(responses_server, call.request)
    assert responses_server.raw == [raw]
    assert responses_server.requests[0].headers["session-id"] == "s-1"


def test_a_body_with_something_stripped_is_translated_not_passed_through(
        responses_server: RawServer) -> None:
    body = json.loads(_codex_like_body())
    body["client_metadata"] = {"mcp_attribution": "x", "app": "codex"}
    raw = json.dumps(body).encode()
    call = parse(body, raw=raw)
    assert call.raw_body is None
    run_upstream(responses_server, call.request)
    sent = responses_server.requests[0].body
    assert responses_server.raw[0] != raw and "client_metadata" not in sent
    assert sent["prompt_cache_key"] == "th-1"  # the translated body keeps the affinity key


def test_an_untouched_body_is_not_passed_through_when_the_upstream_renames_the_model(
        responses_server: RawServer) -> None:
    raw = _codex_like_body()
    call = parse(json.loads(raw), raw=raw)
    run_upstream(responses_server, call.request, sent_as="gpt-renamed")
    assert responses_server.requests[0].body["model"] == "gpt-renamed"


def test_a_non_streaming_untouched_body_is_translated_to_a_stream(
        responses_server: RawServer) -> None:
    raw = _codex_like_body().replace(b'"stream":true', b'"stream":false')
    call = parse(json.loads(raw), raw=raw)
    assert call.raw_body == raw
    run_upstream(responses_server, call.request)
    assert responses_server.requests[0].body["stream"] is True


# -- refusals through the app: no provider is invoked ----------------------------------------


@pytest.fixture(scope="module")
def gateway_url(_server: RawServer) -> Iterator[str]:
    from tokenwire.gateway.http.state import GatewayState
    from tokenwire.gateway.settings import ServerSettings

    from .conftest import start_server

    upstream = ResponsesUpstream.from_config(UpstreamConfig(
        name="up", kind="responses", base_url=_server.url + "/v1",
        models=(ModelRoute(name="gpt-test"),)))
    served = start_server(GatewayState(settings=ServerSettings(), upstream=upstream))
    yield served.url
    served.stop()


def _post(url: str, body: dict[str, Any]) -> Any:
    import httpx

    return httpx.post(url + "/v1/responses", json=body, timeout=30)


def test_compaction_trigger_without_stream_is_http_400_invalid_request(
        gateway_url: str, responses_server: RawServer) -> None:
    resp = _post(gateway_url, {"model": "gpt-test", "input": [
        user("hi"), {"type": "compaction_trigger"}]})
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert (error["message"], error["code"]) == (COMPACTION_MESSAGE, "invalid_request")
    assert responses_server.requests == []


def test_compaction_trigger_in_a_stream_is_response_failed_invalid_prompt(
        gateway_url: str, responses_server: RawServer) -> None:
    resp = _post(gateway_url, {"model": "gpt-test", "stream": True, "input": [
        {"type": "compaction_trigger"}]})
    events = [json.loads(line[6:]) for line in resp.text.splitlines()
              if line.startswith("data: ") and line[6:].startswith("{")]
    failed = [e for e in events if e["type"] == "response.failed"]
    assert len(failed) == 1 and events[-1] is failed[0]
    assert failed[0]["response"]["error"] == {"code": "invalid_prompt",
                                              "message": COMPACTION_MESSAGE}
    assert responses_server.requests == []


def test_agent_message_with_an_image_part_is_http_400_before_any_upstream(
        gateway_url: str, responses_server: RawServer) -> None:
    resp = _post(gateway_url, {"model": "gpt-test", "input": [{
        "type": "agent_message", "content": [{"type": "input_image",
                                              "image_url": "https://x/y.png"}]}]})
    assert resp.status_code == 400
    assert responses_server.requests == []


def test_an_untouched_body_reaches_the_responses_upstream_through_the_app_byte_identical(
        gateway_url: str, responses_server: RawServer) -> None:
    import httpx

    raw = _codex_like_body()
    responses_server.push(Script(chunks=ResponsesStream().message(["ok"]).completed().chunks()))
    resp = httpx.post(gateway_url + "/v1/responses", content=raw, timeout=30,
                      headers={"content-type": "application/json", "thread-id": "t-9"})
    assert resp.status_code == 200 and "response.completed" in resp.text
    assert responses_server.raw == [raw]
    assert responses_server.requests[0].headers["thread-id"] == "t-9"
