"""Responses request parsing: input items -> IR, tools, fields, ``previous_response_id``.

Each test names the translation rule it checks (issue 5 items 2, 4 and 6); the end-to-end
ones go through the real app to a scripted Responses upstream on a loopback socket, driven by
the ``openai`` SDK.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenwire.errors import PreviousResponseNotFound, RemoteProtocolError
from tokenwire.gateway.apis.responses_render import wrap_encrypted
from tokenwire.gateway.apis.responses_request import (
    ResponsesCall,
    load_previous,
    parse_responses_request,
)
from tokenwire.gateway.ir import (
    ChatMessage,
    ChatPrompt,
    ImagePart,
    MessageToolCall,
    TextPart,
    ToolSpec,
)
from tokenwire.gateway.state.response_store import SQLiteResponseStore
from tokenwire.gateway.upstreams.responses_upstream import build_responses_body


def parse(body: dict[str, Any], **kw: Any) -> ResponsesCall:
    store = kw.pop("store", None)
    previous = asyncio.run(load_previous(body, store))
    return parse_responses_request(body, headers=kw.pop("headers", {}), previous=previous,
                                   **kw)


def messages(call: ResponsesCall) -> tuple[ChatMessage, ...]:
    assert isinstance(call.request.prompt, ChatPrompt)
    return call.request.prompt.messages


# -- input items ---------------------------------------------------------------------------


def test_string_input_is_one_user_message() -> None:
    assert messages(parse({"model": "m", "input": "hello"})) == (
        ChatMessage(role="user", content="hello"),)


def test_instructions_become_a_leading_system_message_and_are_not_stored() -> None:
    call = parse({"model": "m", "instructions": "be brief", "input": "hi"})
    assert messages(call)[0] == ChatMessage(role="system", content="be brief")
    assert call.input_items == [{"type": "message", "role": "user", "content": "hi"}]


@pytest.mark.parametrize("role", ["user", "system", "developer", "assistant"])
def test_message_roles_are_kept(role: str) -> None:
    call = parse({"input": [{"type": "message", "role": role, "content": "x"}]})
    assert messages(call) == (ChatMessage(role=role, content="x"),)


def test_an_item_without_type_but_with_a_role_is_a_message() -> None:
    assert messages(parse({"input": [{"role": "user", "content": "x"}]})) == (
        ChatMessage(role="user", content="x"),)


def test_an_unknown_role_is_a_400() -> None:
    with pytest.raises(RemoteProtocolError) as err:
        parse({"input": [{"type": "message", "role": "tool", "content": "x"}]})
    assert err.value.status_hint == 400


def test_text_parts_collapse_to_text_and_images_stay_parts() -> None:
    data_url = "data:image/png;base64,iVBORw0KGgo="
    call = parse({"input": [
        {"role": "user", "content": [{"type": "input_text", "text": "a"},
                                     {"type": "input_text", "text": "b"}]},
        {"role": "user", "content": [
            {"type": "input_text", "text": "look"},
            {"type": "input_image", "image_url": "https://x/y.png", "detail": "low"},
            {"type": "input_image", "file_data": data_url}]},
    ]})
    assert messages(call) == (
        ChatMessage(role="user", content="ab"),
        ChatMessage(role="user", content=(
            TextPart(text="look"),
            ImagePart(url="https://x/y.png", detail="low", param="input[1].content[1]"),
            ImagePart(url=data_url, param="input[1].content[2]"))))


def test_an_image_by_file_id_is_a_400() -> None:
    with pytest.raises(RemoteProtocolError):
        parse({"input": [{"role": "user", "content": [{"type": "input_image",
                                                       "file_id": "file_1"}]}]})


def test_assistant_output_text_is_the_assistant_turn_text() -> None:
    call = parse({"input": [{"type": "message", "role": "assistant", "content": [
        {"type": "output_text", "text": "Hel", "annotations": []},
        {"type": "output_text", "text": "lo"}]}]})
    assert messages(call) == (ChatMessage(role="assistant", content="Hello"),)


def test_function_call_round_trip_keeps_call_ids_exactly() -> None:
    call = parse({"input": [
        {"role": "user", "content": "weather?"},
        {"type": "function_call", "call_id": "call_Ab9+/=", "name": "get", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_Ab9+/=", "output": "sunny"},
    ]})
    assert messages(call)[1:] == (
        ChatMessage(role="assistant", tool_calls=(
            MessageToolCall(id="call_Ab9+/=", name="get", arguments="{}"),)),
        ChatMessage(role="tool", tool_call_id="call_Ab9+/=", content="sunny"))


def test_parallel_calls_and_text_join_one_assistant_turn() -> None:
    call = parse({"input": [
        {"role": "user", "content": "go"},
        {"type": "message", "role": "assistant", "content": "Calling."},
        {"type": "function_call", "call_id": "c1", "name": "a", "arguments": "{\"x\":1}"},
        {"type": "function_call", "call_id": "c2", "name": "b", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "1"},
        {"type": "function_call_output", "call_id": "c2", "output": [
            {"type": "input_text", "text": "two"}]},
    ]})
    assert messages(call)[1:] == (
        ChatMessage(role="assistant", content="Calling.", tool_calls=(
            MessageToolCall(id="c1", name="a", arguments="{\"x\":1}"),
            MessageToolCall(id="c2", name="b", arguments="{}"))),
        ChatMessage(role="tool", tool_call_id="c1", content="1"),
        ChatMessage(role="tool", tool_call_id="c2", content="two"))


def test_a_tool_output_content_array_may_hold_images() -> None:
    call = parse({"input": [
        {"type": "function_call", "call_id": "c1", "name": "shot", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": [
            {"type": "input_image", "image_url": "data:image/png;base64,AA=="}]}]})
    assert messages(call)[1].content == (ImagePart(url="data:image/png;base64,AA==",
                                                   param="input[1].output[0]"),)


def test_custom_tool_calls_and_outputs_keep_their_kind() -> None:
    call = parse({"input": [
        {"type": "custom_tool_call", "call_id": "p1", "name": "apply_patch",
         "input": "*** Begin Patch"},
        {"type": "custom_tool_call_output", "call_id": "p1", "output": "Done"}]})
    assert messages(call) == (
        ChatMessage(role="assistant", tool_calls=(MessageToolCall(
            id="p1", name="apply_patch", arguments="*** Begin Patch", kind="custom"),)),
        ChatMessage(role="tool", tool_call_id="p1", content="Done"))


def test_a_call_without_call_id_is_a_400() -> None:
    with pytest.raises(RemoteProtocolError):
        parse({"input": [{"type": "function_call", "name": "a", "arguments": "{}"}]})


def test_reasoning_summary_becomes_the_assistant_turn_reasoning() -> None:
    call = parse({"input": [
        {"type": "reasoning", "id": "rs_1", "summary": [
            {"type": "summary_text", "text": "think"}, {"type": "summary_text", "text": "more"}]},
        {"type": "message", "role": "assistant", "content": "answer"}]})
    assert messages(call) == (ChatMessage(role="assistant", content="answer",
                                          reasoning="think\n\nmore"),)


def test_tagged_encrypted_reasoning_returns_only_to_the_upstream_that_produced_it() -> None:
    summary = [{"type": "summary_text", "text": "s"}]
    call = parse({"input": [
        {"type": "reasoning", "summary": summary,
         "encrypted_content": wrap_encrypted("oai", "gAAAblob")},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}]})
    (msg,) = messages(call)
    assert [name for name, _ in msg.reasoning_encrypted] == ["oai"]
    same = build_responses_body(call.request, model="m", upstream_name="oai")["input"]
    other = build_responses_body(call.request, model="m", upstream_name="elsewhere")["input"]
    assert same[0] == {"type": "reasoning", "summary": summary,
                       "encrypted_content": "gAAAblob"}
    assert all(i.get("type") != "reasoning" for i in other)
    assert call.raw_body is None  # the client's bytes hold our tag: never forwarded as is


def test_untagged_encrypted_reasoning_is_dropped_and_counted_keeping_its_summary() -> None:
    call = parse({"input": [
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}],
         "encrypted_content": "gAAA-from-another-server"},
        {"type": "message", "role": "assistant", "content": "ok"}]})
    assert messages(call) == (ChatMessage(role="assistant", content="ok", reasoning="s"),)
    assert call.dropped["reasoning_state"] == 1


def test_hosted_call_items_are_dropped_and_counted() -> None:
    call = parse({"input": [{"role": "user", "content": "q"},
                            {"type": "web_search_call", "id": "ws_1", "status": "completed"}]})
    assert messages(call) == (ChatMessage(role="user", content="q"),)
    assert call.dropped["hosted_items"] == 1


@pytest.mark.parametrize("item", [{"type": "item_reference", "id": "msg_1"},
                                  {"type": "audio_thing"}, 7, None,
                                  {"type": "reasoning", "summary": 5},
                                  {"type": "reasoning", "content": "raw"},
                                  {"type": "function_call_output", "call_id": "c", "output": 5},
                                  {"role": "user", "content": [{"type": "input_audio"}]}])
def test_unsupported_items_are_a_400(item: Any) -> None:
    with pytest.raises(RemoteProtocolError) as err:
        parse({"input": [item]})
    assert err.value.status_hint == 400


def test_empty_input_is_a_400() -> None:
    with pytest.raises(RemoteProtocolError):
        parse({"input": []})


# -- tools and fields ----------------------------------------------------------------------


def test_function_and_custom_tools_translate_with_format() -> None:
    fmt = {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}
    call = parse({"input": "x", "tools": [
        {"type": "function", "name": "f", "description": "d",
         "parameters": {"type": "object", "properties": {}}, "strict": True},
        {"type": "custom", "name": "apply_patch", "description": "p", "format": fmt}]})
    assert call.request.tools == (
        ToolSpec(name="f", description="d", parameters={"type": "object", "properties": {}},
                 strict=True),
        ToolSpec(name="apply_patch", description="p", kind="custom", format=fmt))


def test_hosted_tools_are_dropped_and_counted_not_refused() -> None:
    call = parse({"input": "x", "tools": [{"type": "web_search"},
                                          {"type": "function", "name": "f"}]})
    assert [t.name for t in call.request.tools] == ["f"]
    assert call.dropped["hosted_tools"] == 1


def test_an_unknown_tool_type_is_a_400() -> None:
    with pytest.raises(RemoteProtocolError):
        parse({"input": "x", "tools": [{"type": "teleport"}]})


def test_namespace_tools_are_flattened() -> None:
    call = parse({"input": "x", "tools": [{"type": "namespace", "name": "ns", "tools": [
        {"type": "function", "name": "a"}, {"type": "function", "name": "b"}]}]})
    assert [t.name for t in call.request.tools] == ["a", "b"]


@pytest.mark.parametrize(("choice", "ir"), [
    ("auto", "auto"), ("none", "none"), ("required", "required"), (None, None),
    ({"type": "function", "name": "f"}, {"name": "f"}),
    ({"type": "custom", "name": "apply_patch"}, {"name": "apply_patch"}),
    ({"type": "allowed_tools", "mode": "required", "tools": []}, "required")])
def test_tool_choice_translates(choice: Any, ir: Any) -> None:
    assert parse({"input": "x", "tool_choice": choice}).request.tool_choice == ir


_TWO_TOOLS = [{"type": "function", "name": "read_file"},
              {"type": "custom", "name": "delete_file"}, {"type": "web_search"}]


@pytest.mark.parametrize(("allowed", "offered"), [
    ([{"type": "function", "name": "read_file"}], ["read_file"]),
    ([{"type": "custom", "name": "delete_file"}, {"type": "web_search"}], ["delete_file"]),
    ([{"type": "function", "name": "read_file"}, {"type": "custom", "name": "delete_file"}],
     ["read_file", "delete_file"])])
def test_allowed_tools_offers_only_the_tools_it_names(allowed: list, offered: list) -> None:
    # Only the mode reached the IR before: every declared tool stayed callable, so a client
    # that allowed read_file alone could get a delete_file call.
    call = parse({"input": "x", "tools": _TWO_TOOLS, "tool_choice": {
        "type": "allowed_tools", "mode": "required", "tools": allowed}})
    assert [t.name for t in call.request.tools] == offered
    assert call.request.tool_choice == "required"


@pytest.mark.parametrize(("tools", "param"), [
    ([{"type": "function", "name": "rm"}], "tool_choice.tools[0]"),
    ([{"type": "function", "name": "read_file"}, "read_file"], "tool_choice.tools[1]"),
    ("read_file", "tool_choice.tools")])
def test_allowed_tools_naming_no_declared_tool_is_a_400(tools: Any, param: str) -> None:
    with pytest.raises(RemoteProtocolError) as exc:
        parse({"input": "x", "tools": _TWO_TOOLS, "tool_choice": {
            "type": "allowed_tools", "mode": "auto", "tools": tools}})
    assert exc.value.param == param


def test_request_fields_translate() -> None:
    call = parse({"model": "gpt-x", "input": "x", "max_output_tokens": 77, "temperature": 0.5,
                  "top_p": 0.9, "parallel_tool_calls": False, "stream": True, "store": False,
                  "reasoning": {"effort": "high", "summary": "none"}, "service_tier": "flex",
                  "prompt_cache_key": "thread-1"}, request_id="resp_1")
    req = call.request
    assert (req.model, req.max_tokens, req.temperature, req.top_p, req.parallel_tool_calls,
            req.reasoning_effort, req.request_id) == ("gpt-x", 77, 0.5, 0.9, False, "high",
                                                      "resp_1")
    assert (call.stream, call.store, call.reasoning_summary, call.service_tier,
            call.prompt_cache_key) == (True, False, "none", "flex", "thread-1")


def test_defaults_are_openai_s() -> None:
    """Left out, the output bound and the sampling are the generator's (gateway/defaults.py):
    an upstream applies its own, never a value the gateway made up."""
    call = parse({"input": "x"})
    assert (call.stream, call.store, call.request.max_tokens, call.request.temperature,
            call.request.top_p) == (False, True, None, None, None)


@pytest.mark.parametrize("body", [
    {"input": "x", "max_output_tokens": 0}, {"input": "x", "temperature": 3},
    {"input": "x", "stream": "yes"}, {"input": "x", "model": 5}, {"input": 5},
    {"input": "x", "reasoning": "high"}])
def test_bad_fields_are_a_400(body: dict) -> None:
    with pytest.raises(RemoteProtocolError):
        parse(body)


# -- previous_response_id ------------------------------------------------------------------


def test_previous_response_id_prepends_the_stored_conversation() -> None:
    store = SQLiteResponseStore()
    first_input = [{"type": "message", "role": "user", "content": "My name is Ada."}]
    asyncio.run(store.put("resp_a", input_items=first_input, response={
        "id": "resp_a", "output": [{"type": "message", "role": "assistant",
                                    "content": [{"type": "output_text", "text": "Hi Ada."}]}]}))
    call = parse({"input": "What is my name?", "previous_response_id": "resp_a"}, store=store)
    assert messages(call) == (ChatMessage(role="user", content="My name is Ada."),
                              ChatMessage(role="assistant", content="Hi Ada."),
                              ChatMessage(role="user", content="What is my name?"))
    assert len(call.input_items) == 3 and call.raw_body is None


@pytest.mark.parametrize("with_store", [True, False])
def test_an_unknown_previous_response_id_is_openai_s_400(with_store: bool) -> None:
    store = SQLiteResponseStore() if with_store else None
    with pytest.raises(PreviousResponseNotFound) as err:
        parse({"input": "x", "previous_response_id": "resp_gone"}, store=store)
    exc = err.value
    assert (str(exc), exc.status_hint, exc.code, exc.param) == (
        "Previous response with id 'resp_gone' not found.", 400,
        "previous_response_not_found", "previous_response_id")


def test_an_overlong_previous_response_id_is_refused_without_a_lookup_or_an_echo() -> None:
    class Store:
        async def get(self, response_id: str) -> None:
            raise AssertionError("looked up")

    with pytest.raises(RemoteProtocolError) as err:
        parse({"input": "x", "previous_response_id": "r" * 100_000}, store=Store())
    exc = err.value
    assert (exc.status_hint, exc.code, exc.param) == (
        400, "string_above_max_length", "previous_response_id")
    assert len(str(exc)) < 200


def test_an_expired_previous_response_id_is_not_found() -> None:
    now = [0.0]
    store = SQLiteResponseStore(ttl_s=10, clock=lambda: now[0])
    asyncio.run(store.put("resp_a", input_items=[{"role": "user", "content": "x"}],
                          response={"id": "resp_a", "output": []}))
    now[0] = 11
    with pytest.raises(PreviousResponseNotFound):
        parse({"input": "x", "previous_response_id": "resp_a"}, store=store)


# -- end to end: the openai SDK against the app and a scripted Responses upstream --------------


@pytest.fixture(scope="module")
def gateway() -> Iterator[Any]:
    from tokenwire.gateway.http.state import GatewayState
    from tokenwire.gateway.settings import ServerSettings
    from tokenwire.gateway.upstreams.base import ModelRoute, UpstreamConfig
    from tokenwire.gateway.upstreams.responses_upstream import ResponsesUpstream

    from .conftest import start_server
    from .upstreams.fakes_responses import ScriptedServer

    fake = ScriptedServer(stream_path="/v1/responses", models_path="/v1/models")
    upstream = ResponsesUpstream.from_config(UpstreamConfig(
        name="oai", kind="responses", base_url=fake.url + "/v1",
        models=(ModelRoute(name="gpt-test"),)))
    served = start_server(GatewayState(settings=ServerSettings(), upstream=upstream))
    yield fake, served
    served.stop()
    fake.stop()


def _answer(text: str) -> Any:
    from .upstreams.fakes_responses import ResponsesStream, Script
    return Script(chunks=ResponsesStream().message([text]).completed().chunks())


def test_sdk_retrieve_returns_a_stored_response_and_404s_an_unknown_one(gateway: Any,
                                                                        closing) -> None:
    import openai

    fake, served = gateway
    client = closing(openai.OpenAI(base_url=served.url + "/v1", api_key="x", max_retries=0))
    fake.push(_answer("Hello Ada."))
    created = client.responses.create(model="gpt-test", input="I am Ada.", store=True)
    got = client.responses.retrieve(created.id)
    assert got.id == created.id and got.output_text == "Hello Ada."
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.retrieve("resp_" + "0" * 32)
    assert err.value.body["message"] == f"Response with id 'resp_{'0' * 32}' not found."


def test_sdk_previous_response_id_continues_the_conversation(gateway: Any, closing) -> None:
    import openai

    fake, served = gateway
    client = closing(openai.OpenAI(base_url=served.url + "/v1", api_key="x", max_retries=0))
    fake.push(_answer("Hello Ada."), _answer("Your name is Ada."))
    first = client.responses.create(model="gpt-test", input="I am Ada.", store=True)
    second = client.responses.create(model="gpt-test", input="Who am I?",
                                     previous_response_id=first.id)
    assert second.output_text == "Your name is Ada."
    sent = fake.requests[-1].body["input"]
    assert [i["role"] for i in sent] == ["user", "assistant", "user"]
    assert sent[1]["content"] == "Hello Ada." or sent[1]["content"][0]["text"] == "Hello Ada."
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="gpt-test", input="x", previous_response_id="resp_nope")
    assert err.value.body == {"message": "Previous response with id 'resp_nope' not found.",
                              "type": "invalid_request_error",
                              "param": "previous_response_id",
                              "code": "previous_response_not_found"}


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False)
    | st.sampled_from(["message", "user", "assistant", "function_call", "reasoning",
                       "agent_message", "input_text", "function_call_output", "x"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(
        ["type", "role", "content", "text", "call_id", "name", "arguments", "output",
         "summary", "encrypted_content", "tools", "input", "model"]), inner, max_size=4),
    max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(body=st.dictionaries(st.sampled_from(
    ["input", "tools", "tool_choice", "model", "instructions", "reasoning", "stream", "store",
     "max_output_tokens", "temperature", "previous_response_id"]), _json, max_size=5))
def test_any_json_body_parses_or_is_a_client_error(body: dict) -> None:
    try:
        call = parse(body, store=SQLiteResponseStore())
    except RemoteProtocolError as exc:
        assert 400 <= exc.status_hint < 500
    else:
        assert isinstance(call.request.prompt, ChatPrompt) and messages(call)


def test_sdk_a_response_created_with_store_false_is_not_retrievable(gateway: Any,
                                                                     closing) -> None:
    import openai

    fake, served = gateway
    client = closing(openai.OpenAI(base_url=served.url + "/v1", api_key="x", max_retries=0))
    fake.push(_answer("ok"))
    created = client.responses.create(model="gpt-test", input="x", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)


@pytest.mark.parametrize("item", [
    {"type": ["message"], "role": "user", "content": "hi"},
    {"role": ["user"], "content": "hi"},
    {"role": "user", "content": [{"type": {"t": 1}, "text": "hi"}]},
])
def test_non_string_types_and_roles_are_client_errors(item: dict[str, Any]) -> None:
    """Found by the fuzz test: an unhashable ``type`` or ``role`` hit a set lookup (a 500)."""
    with pytest.raises(RemoteProtocolError) as info:
        parse_responses_request({"model": "m", "input": [item]}, headers={})
    assert info.value.status_hint == 400
