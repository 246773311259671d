"""Request fields in each upstream's own form, and logprobs back from OpenAI-shaped upstreams.

``test_request_fields.py`` checks every field lands at its key; these check the values:
the translations where the APIs differ (Anthropic's ``output_config.format`` and
``tool_choice``, Responses' flat ``text.format``, Completions' integer ``logprobs``) and the
parsing of the logprobs an upstream returns.
"""

from __future__ import annotations

import json

from tokenwire.gateway.ir import (
    ChatMessage,
    ChatPrompt,
    GenerationRequest,
    PromptText,
    ResponseFormat,
    TokenDelta,
    ToolSpec,
)
from tokenwire.gateway.upstreams._openai_body import chat_body, completions_body
from tokenwire.gateway.upstreams.anthropic_upstream import build_messages_body
from tokenwire.gateway.upstreams.logprobs_wire import completions_logprobs, entry_logprobs
from tokenwire.gateway.upstreams.responses_upstream import (
    ResponsesStreamParser,
    build_responses_body,
)
from tokenwire.gateway.upstreams.sse import SSEEvent

SCHEMA = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
CHAT = ChatPrompt(messages=(ChatMessage(role="user", content="hi"),))
WEATHER = ToolSpec(name="get_weather", parameters=SCHEMA)


def _req(**kw) -> GenerationRequest:
    return GenerationRequest(prompt=kw.pop("prompt", CHAT), model="m", **kw)


def test_json_schema_in_each_upstreams_form() -> None:
    fmt = ResponseFormat(type="json_schema", schema=SCHEMA, name="o", strict=True)
    assert chat_body(_req(response_format=fmt), "m", {})["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "o", "schema": SCHEMA, "strict": True}}
    assert build_responses_body(_req(response_format=fmt), model="m",
                                upstream_name="r")["text"] == {
        "format": {"type": "json_schema", "name": "o", "schema": SCHEMA, "strict": True}}
    assert build_messages_body(_req(response_format=fmt), model="m",
                               upstream_name="a")["output_config"] == {
        "format": {"type": "json_schema", "schema": SCHEMA}}


def test_json_object_becomes_anthropics_schema_of_any_object() -> None:
    body = build_messages_body(_req(response_format=ResponseFormat(type="json_object")),
                               model="m", upstream_name="a")
    assert body["output_config"]["format"] == {"type": "json_schema",
                                               "schema": {"type": "object"}}


def test_tool_choice_in_anthropics_words() -> None:
    def choice(value, **kw):
        return build_messages_body(_req(tools=(WEATHER,), tool_choice=value, **kw),
                                   model="m", upstream_name="a")["tool_choice"]
    assert choice("required") == {"type": "any"}
    assert choice({"name": "get_weather"}) == {"type": "tool", "name": "get_weather"}
    assert choice("none") == {"type": "none"}
    assert choice("auto", parallel_tool_calls=False) == {"type": "auto",
                                                         "disable_parallel_tool_use": True}
    tools = build_messages_body(_req(tools=(WEATHER,)), model="m", upstream_name="a")["tools"]
    assert tools == [{"name": "get_weather", "input_schema": SCHEMA}]


def test_tools_in_responses_form() -> None:
    body = build_responses_body(_req(tools=(WEATHER,), tool_choice={"name": "get_weather"}),
                                model="m", upstream_name="r")
    assert body["tools"][0]["type"] == "function" and body["tools"][0]["name"] == "get_weather"
    assert body["tools"][0]["parameters"] == SCHEMA
    assert body["tool_choice"] == {"type": "function", "name": "get_weather"}


def test_logprobs_and_penalties_in_openai_and_responses_forms() -> None:
    sampling = {"presence_penalty": 0.5, "frequency_penalty": 0.7, "repeat_penalty": 1.2}
    chat = chat_body(_req(logprobs=True, top_logprobs=3, **sampling), "m", {})
    assert (chat["logprobs"], chat["top_logprobs"]) == (True, 3)
    assert {k: chat[k] for k in sampling} == sampling and chat["repetition_penalty"] == 1.2
    text = completions_body(_req(prompt=PromptText(text="x"), logprobs=True, top_logprobs=2),
                            "m", {})
    assert text["logprobs"] == 2  # Completions' integer
    resp = build_responses_body(_req(logprobs=True, top_logprobs=2), model="m",
                                upstream_name="r")
    assert "message.output_text.logprobs" in resp["include"] and resp["top_logprobs"] == 2


def test_chat_extensions_reach_an_openai_upstream_and_the_policy_bans_win() -> None:
    req = _req(api="chat", extensions=(("logit_bias", {"5": 3, "9": 1}), ("verbosity", "low")),
               banned_ids=frozenset({5}))
    body = chat_body(req, "m", {})
    assert body["logit_bias"] == {"5": -100, "9": 1} and body["verbosity"] == "low"
    # Another API's extensions never reach this wire.
    assert "verbosity" not in chat_body(_req(api="responses",
                                             extensions=(("verbosity", "low"),)), "m", {})


def test_logprobs_from_openai_shaped_upstreams() -> None:
    [lp] = entry_logprobs([{"token": "é", "logprob": -0.5, "bytes": None,
                            "top_logprobs": [{"token": "é", "logprob": -0.5},
                                             {"token": "e", "logprob": -1.5}]}])
    assert lp.bytes == tuple("é".encode()) and [t.token for t in lp.top] == ["é", "e"]
    legacy = completions_logprobs({"tokens": [" a", " b"], "token_logprobs": [-0.1, -0.2],
                                   "top_logprobs": [{" c": -3.0, " a": -0.1}, None]})
    assert [x.token for x in legacy] == [" a", " b"]
    assert [t.token for t in legacy[0].top] == [" a", " c"] and legacy[1].top == ()


def test_responses_deltas_carry_their_logprobs() -> None:
    parser = ResponsesStreamParser("r")
    entry = {"token": "hi", "logprob": -0.25, "bytes": [104, 105], "top_logprobs": []}
    events = parser.on_sse(SSEEvent(event="response.output_text.delta", data=(
        '{"type": "response.output_text.delta", "output_index": 0, "delta": "hi", '
        '"logprobs": [' + json.dumps(entry) + "]}")))
    [delta] = [e for e in events if isinstance(e, TokenDelta)]
    assert delta.text == "hi" and delta.logprobs[0].logprob == -0.25
