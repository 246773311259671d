"""Bad input gets a typed 4xx in its API's shape, never a 500 (issue 11 items 5 and 6).

Each case is the input that showed the defect; the served stack is ``serve_gateway``'s
(``guarded`` from ``test_connection_limits``) over a scripted upstream.
"""

from __future__ import annotations

import json
import logging
import socket
import time

import anthropic
import httpx
import msgspec
import openai
import pytest

from tokenwire.codec.requests import CodecRequest, encode_request

from .raw_sockets import connect_from, read_until_closed
from .test_connection_limits import guarded  # noqa: F401
from .test_hardening import KEY

AUTH = {"authorization": f"Bearer {KEY}"}
USER = [{"role": "user", "content": "Hi"}]
DEEP = 5000


@pytest.fixture(scope="module")
def stack(guarded):  # noqa: F811
    return guarded()


def _post(stack, path: str, body: object, **kw) -> httpx.Response:
    return httpx.post(stack.url + path, json=body, headers=AUTH, timeout=30, **kw)


def _openai_error(resp: httpx.Response, status: int = 400) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert isinstance(err["message"], str) and isinstance(err["type"], str)
    return err


def _nested(depth: int) -> object:
    value: object = "x"
    for _ in range(depth):
        value = [value]
    return value


def _deep_json(depth: int) -> bytes:
    return b'{"model": "scripted", "x": ' + b"[" * depth + b"]" * depth + b"}"


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/v1/responses",
                                  "/tokenize", "/detokenize"])
def test_json_nested_thousands_deep_is_a_400(stack, path) -> None:
    resp = httpx.post(stack.url + path, content=_deep_json(DEEP), headers={
        **AUTH, "content-type": "application/json"}, timeout=30)
    assert "nests" in _openai_error(resp)["message"] or resp.status_code == 400


def test_deep_json_on_messages_is_a_400_in_anthropics_shape(stack) -> None:
    resp = httpx.post(stack.url + "/v1/messages", content=_deep_json(DEEP), headers={
        **AUTH, "content-type": "application/json"}, timeout=30)
    assert resp.status_code == 400
    assert resp.json()["type"] == "error" and resp.json()["error"]["type"]


def test_moderately_deep_json_that_python_could_decode_is_refused_too(stack) -> None:
    body = {"model": "scripted", "messages": USER, "metadata": _nested(200)}
    assert "nests" in _openai_error(_post(stack, "/v1/chat/completions", body))["message"]


def test_path_c_msgpack_nested_in_an_unknown_key_is_a_400(stack) -> None:
    head = msgspec.msgpack.encode({"prompt_ids": [1], "max_tokens": 1,
                                   "stream_format": "msgpack"})
    assert head[0] == 0x83  # a fixmap of 3: add a 4th key, an array nested DEEP times
    raw = b"\x84" + head[1:] + msgspec.msgpack.encode("junk") + b"\x91" * DEEP + b"\xc0"
    resp = httpx.post(stack.url + "/v1/completions/codec", content=raw, timeout=30,
                      headers={**AUTH, "content-type": "application/x-msgpack"})
    _openai_error(resp)


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"messages": [{"role": ["user"], "content": "x"}]}),
    ("/v1/chat/completions", {"messages": [{"role": {"a": 1}, "content": "x"}]}),
    ("/v1/chat/completions", {"messages": USER, "tools": ["not an object"]}),
    ("/v1/chat/completions", {"messages": USER, "tool_choice": ["auto"]}),
    ("/v1/chat/completions", {"messages": USER, "reasoning_effort": {"x": 1}}),
    ("/v1/completions", {"prompt": [True, 1]}),
])
def test_wrong_types_are_400s_naming_the_field(stack, path, body) -> None:
    err = _openai_error(_post(stack, path, {"model": "scripted", **body}))
    assert err["type"] == "invalid_request_error"


_FN = {"type": "function", "function": {"name": "f"}}


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {"messages": USER, "tools": [
        {**_FN, "function": {"name": "f", "parameters": [1]}}]}, "tools[0].function.parameters"),
    ("/v1/chat/completions", {"messages": USER, "tools": [
        {**_FN, "function": {"name": "f", "parameters": "zzz"}}]},
     "tools[0].function.parameters"),
    ("/v1/chat/completions", {"messages": [*USER, {"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]},
     "messages[1].tool_calls[0].function.arguments"),
    ("/v1/responses", {"input": "Hi", "tools": [{"type": "function", "name": "f",
                                                 "parameters": "zzz"}]}, "tools[0].parameters"),
    ("/v1/responses", {"input": "Hi", "tools": [{"type": "custom", "name": "f",
                                                 "format": "regex"}]}, "tools[0].format"),
])
def test_tool_fields_of_the_wrong_type_are_400s_not_dropped(stack, path, body, param) -> None:
    """Each was accepted and dropped in silence: a schema the grammar never saw, a replayed
    call whose arguments never reached the prompt."""
    err = _openai_error(_post(stack, path, {"model": "scripted", **body}))
    assert (err["param"], err["code"]) == (param, "invalid_type"), err


_FLAG_BODIES = {"/v1/chat/completions": {"messages": USER},
                "/v1/completions": {"prompt": "Hi"},
                "/v1/messages": {"messages": USER, "max_tokens": 5},
                "/v1/responses": {"input": "Hi"}}


@pytest.mark.parametrize("path", sorted(_FLAG_BODIES))
@pytest.mark.parametrize("value", ["false", "true", 0, 1, [1], {}])
def test_a_stream_flag_that_is_not_a_boolean_is_a_400_naming_it(stack, path, value) -> None:
    """``"stream": "false"`` was read by truthiness: a stream came back (``{}``: a body)."""
    resp = _post(stack, path, {"model": "scripted", **_FLAG_BODIES[path], "stream": value})
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["type"] == "invalid_request_error" and "stream must be a boolean" in err[
        "message"]


@pytest.mark.parametrize("options", [{"include_usage": "no"}, {"include_usage": 1}, "yes", [1]])
def test_stream_options_of_the_wrong_type_are_a_400(stack, options) -> None:
    err = _openai_error(_post(stack, "/v1/chat/completions", {
        "model": "scripted", "messages": USER, "stream": True, "stream_options": options}))
    assert err["param"].startswith("stream_options") and err["code"] == "invalid_type"


def test_a_null_stream_flag_is_the_default(stack) -> None:
    resp = _post(stack, "/v1/chat/completions", {"model": "scripted", "messages": USER,
                                                 "stream": None, "stream_options": None})
    assert resp.status_code == 200 and resp.json()["object"] == "chat.completion"


def test_a_boolean_prompt_is_not_called_a_batch(stack) -> None:
    err = _openai_error(_post(stack, "/v1/completions", {"prompt": [True, 1]}))
    assert "prompt[0] is a boolean" in err["message"] and "batch" not in err["message"]


@pytest.mark.parametrize("thinking", [{"type": ["enabled"]}, {"type": {"a": 1}}])
def test_messages_thinking_type_of_the_wrong_type_is_anthropics_400(stack, thinking) -> None:
    resp = _post(stack, "/v1/messages", {"model": "scripted", "max_tokens": 5,
                                         "messages": USER, "thinking": thinking})
    assert resp.status_code == 400, resp.text
    body = resp.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"


def test_messages_roles_of_the_wrong_type_are_anthropics_400(stack) -> None:
    resp = _post(stack, "/v1/messages", {"model": "scripted", "max_tokens": 5,
                                         "messages": [{"role": ["user"], "content": "x"}]})
    assert resp.status_code == 400 and resp.json()["type"] == "error"


# -- ids and numbers the model cannot take -----------------------------------------------------


def test_out_of_vocabulary_prompt_ids_never_reach_the_upstream(stack, smollm2_map) -> None:
    before = len(stack.upstream.requests)
    err = _openai_error(_post(stack, "/v1/completions",
                              {"model": "scripted", "prompt": [1, smollm2_map.max_id + 1]}))
    assert "prompt[1]" in err["message"] and "vocabulary" in err["message"]
    raw = encode_request(CodecRequest(prompt_ids=(1, 10**9), max_tokens=4,
                                      stream_format="msgpack"), "msgpack")
    resp = httpx.post(stack.url + "/v1/completions/codec", content=raw, timeout=30,
                      headers={**AUTH, "content-type": "application/x-msgpack"})
    assert "prompt_ids[1]" in _openai_error(resp)["message"]
    assert len(stack.upstream.requests) == before


def test_path_c_max_tokens_of_2_to_the_32_is_refused_naming_the_field(stack) -> None:
    raw = encode_request(CodecRequest(prompt_ids=(1,), max_tokens=2**32 - 1,
                                      stream_format="msgpack"), "msgpack")
    resp = httpx.post(stack.url + "/v1/completions/codec", content=raw, timeout=30,
                      headers={**AUTH, "content-type": "application/x-msgpack"})
    assert "max_tokens" in _openai_error(resp)["message"]


@pytest.mark.parametrize(("temperature", "code"), [(5.0, "decimal_above_max_value"),
                                                    (-1.0, "decimal_below_min_value")])
def test_path_c_temperature_outside_0_to_2_is_refused_not_clamped(stack, temperature,
                                                                 code) -> None:
    # It was clamped to 0..2 without a word: 5.0 sampled at 2.0, -1.0 greedily, where the
    # JSON APIs refuse the same number naming the field.
    before = len(stack.upstream.requests)
    raw = encode_request(CodecRequest(prompt_ids=(1,), max_tokens=4, temperature=temperature,
                                      stream_format="msgpack"), "msgpack")
    resp = httpx.post(stack.url + "/v1/completions/codec", content=raw, timeout=30,
                      headers={**AUTH, "content-type": "application/x-msgpack"})
    err = _openai_error(resp)
    assert err["param"] == "temperature" and err["code"] == code
    assert len(stack.upstream.requests) == before


def test_path_c_temperature_in_range_reaches_the_upstream_as_sent(stack) -> None:
    raw = encode_request(CodecRequest(prompt_ids=(1,), max_tokens=4, temperature=1.5,
                                      stream_format="msgpack"), "msgpack")
    resp = httpx.post(stack.url + "/v1/completions/codec", content=raw, timeout=30,
                      headers={**AUTH, "content-type": "application/x-msgpack"})
    assert resp.status_code == 200, resp.text
    assert stack.upstream.requests[-1].temperature == 1.5


def test_max_tokens_is_capped_at_the_models_context_window(stack) -> None:
    resp = _post(stack, "/v1/chat/completions", {"model": "scripted", "messages": USER,
                                                 "max_tokens": 100_000})
    assert resp.status_code == 200
    assert stack.upstream.requests[-1].max_tokens == 1024  # the served model's window


# -- the upload deadline -----------------------------------------------------------------------


def _slow_upload(port: int, path: str) -> bytes:
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{").encode()
    with connect_from(port) as conn:
        conn.sendall(head)  # and never the rest
        return read_until_closed(conn)


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize", "/v1/chat/completions",
                                  "/v1/messages"])
def test_a_body_that_never_ends_gets_a_408_in_the_apis_shape(guarded, path) -> None:  # noqa: F811
    stack = guarded(body_timeout_s=0.3)
    data = _slow_upload(stack.port, path)
    assert data.startswith(b"HTTP/1.1 408 "), data[:200]
    body = json.loads(data.partition(b"\r\n\r\n")[2])
    assert ("error" in body) if path != "/v1/messages" else body["type"] == "error"


def test_slow_uploads_free_their_slots_at_the_body_deadline(guarded) -> None:  # noqa: F811
    stack = guarded(body_timeout_s=0.5, max_concurrent=1, queue_size=1)
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}"
            "\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{").encode()
    slow = [connect_from(stack.port) for _ in range(2)]  # every admission slot
    try:
        for conn in slow:
            conn.sendall(head)
        for conn in slow:
            assert read_until_closed(conn).startswith(b"HTTP/1.1 408 ")
        resp = _post(stack, "/v1/chat/completions", {"model": "scripted", "messages": USER})
        assert resp.status_code == 200
    finally:
        for conn in slow:
            conn.close()


# -- logs --------------------------------------------------------------------------------------


def test_a_client_that_disconnects_mid_upload_is_not_an_internal_error(guarded,  # noqa: F811
                                                                      caplog) -> None:
    stack = guarded()
    caplog.set_level(logging.INFO)
    head = (f"POST /tokenize HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{").encode()
    conn = connect_from(stack.port)
    conn.sendall(head)
    time.sleep(0.3)  # lets the route start reading (a margin, not a measurement)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    conn.close()
    deadline = time.monotonic() + 10
    while "disconnected" not in caplog.text and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "internal error" not in caplog.text
    assert "Traceback" not in caplog.text


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_queries_are_never_logged(guarded) -> None:  # noqa: F811
    stack = guarded()
    collect = _Collect()
    # uvicorn's loggers do not propagate to the root: listen on each server-side logger.
    loggers = [logging.getLogger(n) for n in ("uvicorn", "uvicorn.access", "uvicorn.error",
                                              "tokenwire")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(collect)
        lg.setLevel(logging.DEBUG)
    try:
        resp = httpx.get(stack.url + "/health?api_key=sekrit-in-query&prompt=private",
                         headers=AUTH)
        assert resp.status_code == 200
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.removeHandler(collect)
            lg.setLevel(level)
    text = "\n".join(collect.lines)
    assert "sekrit-in-query" not in text and "private" not in text


@pytest.mark.parametrize(("headers", "status", "kind"), [
    ({}, 401, "authentication_error"),
    ({**AUTH, "origin": "https://evil.example"}, 403, "permission_error"),
])
def test_messages_refusals_use_anthropics_shape(stack, headers, status, kind) -> None:
    resp = httpx.post(stack.url + "/v1/messages", json={"model": "scripted", "max_tokens": 5,
                                                        "messages": USER},
                      headers=headers, timeout=30)
    assert resp.status_code == status
    assert resp.json() == {"type": "error", "error": {"type": kind,
                                                      "message": resp.json()["error"]["message"]}}


# -- sizes and counts a caller controls (gateway/apis/limits.py) ------------------------------

_META_17 = {f"k{i}": "v" for i in range(17)}
_FN = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
_RTOOL = {"type": "function", "name": "f", "parameters": {"type": "object"}}
_MTOOL = {"name": "f", "input_schema": {"type": "object"}}
MESSAGES = {"model": "scripted", "max_tokens": 5, "messages": USER}
OPENAI_LIMITS = [
    ("/v1/chat/completions", {"metadata": _META_17}, "metadata"),
    ("/v1/chat/completions", {"metadata": {"k" * 65: "v"}}, "metadata"),
    ("/v1/chat/completions", {"metadata": {"k": "v" * 513}}, "metadata.k"),
    ("/v1/chat/completions", {"metadata": {"k": 1}}, "metadata.k"),
    ("/v1/chat/completions", {"user": 42}, "user"),
    ("/v1/chat/completions", {"user": "u" * 129}, "user"),
    ("/v1/chat/completions", {"safety_identifier": "u" * 129}, "safety_identifier"),
    ("/v1/chat/completions", {"tools": [_FN] * 129}, "tools"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f" * 65}}]},
     "tools[0].function.name"),
    ("/v1/chat/completions", {"logit_bias": {str(i): 1 for i in range(1025)}}, "logit_bias"),
    ("/v1/chat/completions", {"logit_bias": {"42": 101}}, "logit_bias.42"),
    ("/v1/chat/completions", {"logit_bias": {"hello": 1}}, "logit_bias"),
    ("/v1/completions", {"prompt": "Hi", "user": ["u"]}, "user"),
    ("/v1/completions", {"prompt": "Hi", "logit_bias": {"42": -101}}, "logit_bias.42"),
    ("/v1/responses", {"input": "Hi", "metadata": _META_17}, "metadata"),
    ("/v1/responses", {"input": "Hi", "metadata": {"k": "v" * 513}}, "metadata.k"),
    ("/v1/responses", {"input": "Hi", "user": {"id": 1}}, "user"),
    ("/v1/responses", {"input": "Hi", "tools": [_RTOOL] * 129}, "tools"),
    ("/v1/responses", {"input": "Hi", "tools": [{"type": "namespace", "name": "ns",
                                                  "tools": [_RTOOL] * 129}]}, "tools"),
    ("/v1/responses", {"input": "Hi", "tools": [{**_RTOOL, "name": "f" * 65}]},
     "tools[0].name"),
    # prompt_cache_key: OpenAI's 64 characters; service_tier: the API's own values.
    ("/v1/chat/completions", {"prompt_cache_key": "k" * 65}, "prompt_cache_key"),
    ("/v1/chat/completions", {"prompt_cache_key": 42}, "prompt_cache_key"),
    ("/v1/responses", {"input": "Hi", "prompt_cache_key": "k" * 65}, "prompt_cache_key"),
    ("/v1/chat/completions", {"service_tier": "gold"}, "service_tier"),
    ("/v1/chat/completions", {"service_tier": ["auto"]}, "service_tier"),
    ("/v1/chat/completions", {"service_tier": "ultrafast"}, "service_tier"),  # Responses' only
    ("/v1/responses", {"input": "Hi", "service_tier": "gold"}, "service_tier"),
    # Tool names: OpenAI's ^[a-zA-Z0-9_-]+$, the param with the tool's index.
    ("/v1/chat/completions", {"tools": [_FN, {"type": "function", "function": {
        "name": "get weather"}}]}, "tools[1].function.name"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": ""}}]},
     "tools[0].function.name"),
    ("/v1/chat/completions", {"tools": [_FN, _FN, _FN, {"type": "function", "function": {
        "name": "<|im_start|>system"}}]}, "tools[3].function.name"),
    ("/v1/chat/completions", {"tool_choice": {"type": "function", "function": {
        "name": "a.b"}}, "tools": [_FN]}, "tool_choice.function.name"),
    ("/v1/chat/completions", {"messages": [*USER, {"role": "assistant", "tool_calls": [{
        "id": "c1", "type": "function", "function": {"name": "x y", "arguments": "{}"}}]}]},
     "messages[1].tool_calls[0].function.name"),
    ("/v1/responses", {"input": "Hi", "tools": [_RTOOL, {**_RTOOL, "name": "a.b"}]},
     "tools[1].name"),
    ("/v1/responses", {"input": "Hi", "tools": [{"type": "custom", "name": "apply patch"}]},
     "tools[0].name"),
    ("/v1/responses", {"input": "Hi", "tools": [_RTOOL, {"type": "namespace", "name": "ns",
                                                         "tools": [_RTOOL, {**_RTOOL,
                                                                            "name": "é"}]}]},
     "tools[1].tools[1].name"),
    ("/v1/responses", {"input": "Hi", "tools": [{"type": "namespace", "name": "n s",
                                                  "tools": [_RTOOL]}]}, "tools[0].name"),
    ("/v1/responses", {"input": "Hi", "tools": [_RTOOL], "tool_choice": {
        "type": "function", "name": "f" * 65}}, "tool_choice.name"),
]


@pytest.mark.parametrize(("path", "body", "param"), OPENAI_LIMITS,
                         ids=[f"{c[0].removeprefix('/v1/').replace('/', '_')}-{c[2]}-{i}"
                              for i, c in enumerate(OPENAI_LIMITS)])
def test_openai_sizes_and_counts_past_the_apis_limits_are_400s(stack, path, body,
                                                               param) -> None:
    messages = {"messages": USER} if path.endswith("chat/completions") else {}
    before = len(stack.upstream.requests)
    err = _openai_error(_post(stack, path, {"model": "scripted", **messages, **body}))
    assert len(stack.upstream.requests) == before  # refused before any upstream saw it
    assert err["type"] == "invalid_request_error" and err["param"] == param, err
    # The limit answered, not the refusal of a field this upstream cannot take (logit_bias).
    assert "passed only to an upstream" not in err["message"], err


def test_openai_sizes_at_the_limits_are_served(stack) -> None:
    body = {"model": "scripted", "messages": USER, "max_tokens": 2,
            "metadata": {f"{i:0>64}": "v" * 512 for i in range(16)}, "user": "u" * 128,
            "tools": [{"type": "function", "function": {"name": f"{i:f>64}"}}
                      for i in range(128)]}
    resp = _post(stack, "/v1/chat/completions", body)
    assert resp.status_code == 200, resp.text
    every = {"prompt_cache_key": "k" * 64, "service_tier": "flex",
             "tools": [{"type": "function", "function": {"name": "aZ09_-"}}]}
    resp = _post(stack, "/v1/chat/completions", {**body, **every})
    assert resp.status_code == 200, resp.text
    # logit_bias is the upstream's own (its token ids): a scripted upstream refuses any, so
    # the largest one allowed gets that refusal, not the limit's.
    bias = {str(i): (-100, 100)[i % 2] for i in range(1024)}
    err = _openai_error(_post(stack, "/v1/chat/completions", {**body, "logit_bias": bias}))
    assert err["param"] == "logit_bias" and "limit" not in err["message"], err


@pytest.mark.parametrize(("body", "param"), [
    ({"metadata": {"user_id": "u" * 257}}, "metadata.user_id"),
    ({"metadata": {"user_id": 7}}, "metadata.user_id"),
    ({"metadata": {"user_id": "u", "other": "x"}}, "metadata.other"),
    ({"tools": [{**_MTOOL, "name": "f" * 129}]}, "tools.0.name"),
    ({"tools": [_MTOOL] * 513}, "tools"),
    ({"tools": [_MTOOL, {**_MTOOL, "name": "get weather"}]}, "tools.1.name"),
    ({"tools": [{**_MTOOL, "name": ""}]}, "tools.0.name"),
    ({"tools": [_MTOOL], "tool_choice": {"type": "tool", "name": "<|im_end|>"}},
     "tool_choice.name"),
    ({"service_tier": "priority"}, "service_tier"),  # OpenAI's word, not Anthropic's
    ({"service_tier": 1}, "service_tier"),
])
def test_messages_sizes_past_anthropics_limits_are_anthropics_400(stack, body, param) -> None:
    resp = _post(stack, "/v1/messages", {**MESSAGES, **body})
    assert resp.status_code == 400, resp.text
    out = resp.json()
    assert out["type"] == "error" and out["error"]["type"] == "invalid_request_error"
    assert out["error"]["message"].startswith(param + ":"), out


def test_messages_metadata_at_the_limit_is_served(stack) -> None:
    resp = _post(stack, "/v1/messages", {**MESSAGES, "metadata": {"user_id": "u" * 256},
                                         "service_tier": "standard_only",
                                         "tools": [{**_MTOOL, "name": "aZ09_-" + "f" * 122}]})
    assert resp.status_code == 200, resp.text


def test_responses_values_at_the_limits_are_served(stack) -> None:
    resp = _post(stack, "/v1/responses", {
        "model": "scripted", "input": "Hi", "prompt_cache_key": "k" * 64,
        "service_tier": "ultrafast",
        "tools": [{**_RTOOL, "name": "f" * 64}, {"type": "namespace", "name": "n-s_1",
                                                  "tools": [{**_RTOOL, "name": "g"}]}]})
    assert resp.status_code == 200, resp.text
    assert stack.upstream.requests[-1].service_tier == "ultrafast"


# -- the real SDKs read each refusal as their typed 400 ------------------------------------


@pytest.mark.parametrize(("kwargs", "param", "code"), [
    ({"prompt_cache_key": "k" * 65}, "prompt_cache_key", "string_above_max_length"),
    ({"service_tier": "gold"}, "service_tier", "invalid_value"),
    ({"tools": [{"type": "function", "function": {"name": "a/b"}}]},
     "tools[0].function.name", "invalid_value"),
])
def test_the_openai_sdk_reads_the_chat_limits_as_bad_request_errors(stack, kwargs, param,
                                                                     code) -> None:
    with (openai.OpenAI(base_url=stack.url + "/v1", api_key=KEY, max_retries=0) as client,
          pytest.raises(openai.BadRequestError) as info):
        client.chat.completions.create(model="scripted", messages=USER, **kwargs)
    assert (info.value.param, info.value.code) == (param, code)


def test_the_openai_sdk_reads_a_responses_tool_name_refusal_with_its_index(stack) -> None:
    with (openai.OpenAI(base_url=stack.url + "/v1", api_key=KEY, max_retries=0) as client,
          pytest.raises(openai.BadRequestError) as info):
        client.responses.create(model="scripted", input="Hi", tools=[
            {**_RTOOL, "strict": False}, {**_RTOOL, "name": "x:y", "strict": False}])
    assert (info.value.param, info.value.code) == ("tools[1].name", "invalid_value")


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"tools": [{**_MTOOL, "name": "a b"}]}, "tools.0.name"),
    ({"service_tier": "flex"}, "service_tier"),
])
def test_the_anthropic_sdk_reads_the_messages_limits_as_bad_request_errors(
        stack, kwargs, param) -> None:
    with (anthropic.Anthropic(base_url=stack.url, api_key=KEY, max_retries=0) as client,
          pytest.raises(anthropic.BadRequestError) as info):
        client.messages.create(model="scripted", max_tokens=5, messages=USER, **kwargs)
    assert info.value.body["error"]["type"] == "invalid_request_error"
    assert info.value.body["error"]["message"].startswith(param + ":")


def test_a_response_id_too_long_to_be_one_is_a_404_that_does_not_repeat_it(stack) -> None:
    long_id = "resp_" + "x" * 10_000
    resp = httpx.get(f"{stack.url}/v1/responses/{long_id}", headers=AUTH, timeout=30)
    err = _openai_error(resp, 404)
    assert err["code"] == "not_found" and "x" * 300 not in resp.text
    short = httpx.get(f"{stack.url}/v1/responses/resp_nope", headers=AUTH, timeout=30)
    assert _openai_error(short, 404)["message"] == "Response with id 'resp_nope' not found."
