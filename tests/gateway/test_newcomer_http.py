"""Issue 10, the HTTP side: defaults that surprise nobody, errors a person can act on, and
what clients call that was missing. Real peers where they exist (the ``openai`` and
``anthropic`` SDKs, the embedded SmolLM2 engine); scripted upstreams only for the gateway's
own error paths.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import socket

import anthropic
import httpx
import openai
import pytest

from tokenwire.codec.frames import StreamFormat
from tokenwire.gateway.apis.chat import ChatRenderer, parse_chat_request
from tokenwire.gateway.apis.codec_stream import CodecStreamRenderer
from tokenwire.gateway.apis.completions import CompletionsRenderer, parse_completions_request
from tokenwire.gateway.apis.messages import MessagesRenderer
from tokenwire.gateway.apis.responses_render import ResponsesRenderer
from tokenwire.gateway.defaults import (
    COMPLETIONS_MAX_TOKENS,
    LLAMA_CPP_SAMPLING,
    sampling_from_gguf,
)
from tokenwire.gateway.http import generation
from tokenwire.gateway.http.shutdown import shutdown_failure
from tokenwire.gateway.ir import (
    ChatMessage,
    ChatPrompt,
    Finish,
    FinishKind,
    GenerationRequest,
    ImagePart,
    TextPart,
    TokenDelta,
    Usage,
)
from tokenwire.gateway.upstreams._openai_body import chat_body
from tokenwire.gateway.upstreams.anthropic_upstream import AnthropicUpstream
from tokenwire.gateway.upstreams.base import ModelRoute, UpstreamConfig
from tokenwire.gateway.upstreams.responses_upstream import build_responses_body

from .conftest import ScriptedUpstream
from .test_hardening import KEY, stacks  # noqa: F401  (the hardened serve_gateway stack)

SIMPLE = [(0.0, TokenDelta(ids=(10,), text="a")), (0.0, Usage(prompt_tokens=1,
                                                                completion_tokens=1)),
          (0.0, Finish(reason=FinishKind.EOS))]
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}


@pytest.fixture(scope="module")
def scripted(serve):
    return serve(ScriptedUpstream(SIMPLE))


@pytest.fixture(scope="module")
def live(engine, serve):
    return serve(engine)


def _err(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == err["code"].lower(), "a class name reached the wire"
    return err


# -- errors a person can act on ------------------------------------------------------------


@pytest.mark.parametrize(("path", "body", "status", "code", "param"), [
    ("/v1/chat/completions", b"{not json", 400, "invalid_json", None),
    ("/v1/chat/completions", {"messages": []}, 400, "empty_array", "messages"),
    ("/v1/chat/completions", {}, 400, "missing_required_parameter", "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "bot", "content": "x"}]}, 400,
     "invalid_value", "messages[0].role"),
    ("/v1/completions", {"prompt": "x", "n": 2}, 400, "unsupported_value", "n"),
    ("/v1/completions", {"prompt": "x", "stream_format": "cbor"}, 400, "invalid_value",
     "stream_format"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "integer_below_min_value",
     "max_tokens"),
    ("/v1/completions", {"prompt": "x", "temperature": "hot"}, 400, "invalid_type",
     "temperature"),
    ("/v1/completions", {"prompt": "x", "model": "gpt-9"}, 404, "model_not_found", "model"),
    ("/v1/responses", {"input": []}, 400, "empty_array", "input"),
    ("/v1/nope", {}, 404, "unknown_url", None),
])
def test_errors_carry_openai_codes_and_the_field(scripted, path, body, status, code,
                                                 param) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    resp = httpx.post(scripted.url + path, content=content,
                      headers={"content-type": "application/json"}, timeout=10)
    err = _err(resp, status)
    assert (err["code"], err["param"]) == (code, param)
    assert err["type"] == "invalid_request_error"


@pytest.mark.parametrize(("body", "ctype", "status", "code"), [
    (b"\xff", "application/x-protobuf", 400, "codec_malformed_frame"),
    (b"{}", "application/json", 415, "unsupported_media_type"),
])
def test_path_c_errors_have_documented_codes(scripted, body, ctype, status, code) -> None:
    resp = httpx.post(scripted.url + "/v1/completions/codec", content=body,
                      headers={"content-type": ctype}, timeout=10)
    assert _err(resp, status)["code"] == code


@pytest.mark.parametrize(("method", "path", "status", "type_"), [
    ("GET", "/v1/messages", 405, "invalid_request_error"),
    ("POST", "/v1/messages/batches", 404, "not_found_error"),
    ("POST", "/v1/messages", 404, "not_found_error"),  # an unknown model
])
def test_every_messages_error_is_anthropic_shaped(scripted, method, path, status,
                                                  type_) -> None:
    resp = httpx.request(method, scripted.url + path, timeout=10,
                         json={"model": "nope", "max_tokens": 5,
                               "messages": [{"role": "user", "content": "hi"}]})
    assert resp.status_code == status
    body = resp.json()
    assert body["type"] == "error" and body["error"]["type"] == type_
    assert body["error"]["message"]


def _stream_text(chunks: list[bytes]) -> str:
    return b"".join(chunks).decode()


def test_a_shutdown_says_server_shutting_down_in_every_api() -> None:
    failure = shutdown_failure()
    started = [TokenDelta(ids=(1,), text="a")]
    chat = ChatRenderer(completion_id="c", model="m", created=0, stream=True)
    comp = CompletionsRenderer(completion_id="c", model="m", created=0, stream=True)
    resp = ResponsesRenderer(response_id="resp_" + "0" * 32, model="m", created_at=0,
                             stream=True)
    msgs = MessagesRenderer(message_id="msg_1", model="m", stream=True)
    for renderer in (chat, comp, resp, msgs):
        out = [c for ev in [*started, failure] for c in renderer.on_event(ev)]
        assert '"server_shutting_down"' in _stream_text(out), type(renderer).__name__
    assert '"capacity"' not in _stream_text(chat.on_event(failure) or [b""])
    # Before any byte (a Codec client, or any JSON body): the same code with its 503.
    status, _, body = generation._failure_response(failure)
    assert status == 503 and json.loads(body)["error"]["code"] == "server_shutting_down"
    codec = CodecStreamRenderer(StreamFormat.MSGPACK)
    assert codec.on_event(failure)  # mid-stream: the terminal frame, finish_reason "error"


# -- images to the text-only embedded model -------------------------------------------------


@pytest.mark.slow
def test_an_image_to_the_text_only_engine_is_a_400_naming_the_field(live) -> None:
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "What?"},
                                                      IMAGE]}], "max_tokens": 4}
    err = _err(httpx.post(live.url + "/v1/chat/completions", json=body, timeout=30), 400)
    assert "does not accept images" in err["message"]
    assert (err["param"], err["code"]) == ("messages[0].content[1]", "unsupported_value")
    anth = httpx.post(live.url + "/v1/messages", timeout=30, json={
        "max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "iVBORw0KGgo="}}]}]})
    assert anth.status_code == 400
    assert "does not accept images" in anth.json()["error"]["message"]


@pytest.mark.slow
def test_the_engine_itself_refuses_an_image_with_its_field(engine) -> None:
    prompt = ChatPrompt(messages=(ChatMessage(role="user", content=(
        TextPart(text="x"), ImagePart(url="data:,", param="messages[0].content[1]"))),))

    async def run() -> object:
        stream = engine.submit(GenerationRequest(prompt=prompt, max_tokens=2))
        return await stream.next_event()

    failure = asyncio.run(run())
    assert failure.param == "messages[0].content[1]" and failure.status == 400
    assert "does not accept images" in failure.message and "tuple" not in failure.message


# -- defaults -------------------------------------------------------------------------------


def test_llama_cpp_defaults_are_the_installed_library_s() -> None:
    from llama_cpp import Llama

    params = inspect.signature(Llama.generate).parameters
    got = {name: params[key].default for name, key in (
        ("temperature", "temp"), ("top_p", "top_p"), ("top_k", "top_k"), ("min_p", "min_p"),
        ("repeat_penalty", "repeat_penalty"))}
    assert got == {k: getattr(LLAMA_CPP_SAMPLING, k) for k in got}


def test_gguf_sampling_keys_win_and_bad_values_fall_back() -> None:
    d = sampling_from_gguf({"general.sampling.temp": "0.2", "general.sampling.top_k": "20",
                            "general.sampling.top_p": "nan", "general.sampling.min_p": "7"})
    assert (d.values.temperature, d.values.top_k) == (0.2, 20)
    assert (d.values.top_p, d.values.min_p) == (LLAMA_CPP_SAMPLING.top_p,
                                                LLAMA_CPP_SAMPLING.min_p)
    assert dict(d.sources)["temperature"] == "general.sampling.temp"
    assert "general.sampling.temp" in d.describe()


@pytest.mark.slow
def test_the_engine_samples_with_the_model_s_defaults_and_the_request_s_fields(engine) -> None:
    # SmolLM2's GGUF carries no general.sampling.* keys: llama.cpp's defaults, not top_k=0.
    assert engine.sampling.values == LLAMA_CPP_SAMPLING
    prompt = ChatPrompt(messages=(ChatMessage(role="user", content="hi"),))
    args = engine._sampler_args(GenerationRequest(prompt=prompt))
    assert args == {"temp": 0.8, "top_p": 0.95, "top_k": 40, "min_p": 0.05,
                    "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
    args = engine._sampler_args(GenerationRequest(prompt=prompt, temperature=0.1, top_k=3,
                                                  frequency_penalty=0.5, repeat_penalty=1.2))
    assert (args["temp"], args["top_k"], args["top_p"]) == (0.1, 3, 0.95)
    assert (args["frequency_penalty"], args["repeat_penalty"]) == (0.5, 1.2)


def test_upstreams_get_no_sampling_or_length_the_client_did_not_send() -> None:
    chat = parse_chat_request({"messages": [{"role": "user", "content": "hi"}]}).request
    body = chat_body(chat, "m", {})
    assert not {"temperature", "top_p", "top_k", "min_p", "max_tokens"} & set(body)
    assert "max_output_tokens" not in build_responses_body(chat, model="m", upstream_name="u")
    sent = chat_body(parse_chat_request({"messages": [{"role": "user", "content": "hi"}],
                                         "temperature": 0.3, "top_k": 5}).request, "m", {})
    assert (sent["temperature"], sent["top_k"]) == (0.3, 5)
    assert parse_completions_request({"prompt": "x"}).request.max_tokens == \
        COMPLETIONS_MAX_TOKENS == 16


# -- what clients call ----------------------------------------------------------------------


def test_the_openai_sdk_retrieves_a_model_and_gets_model_not_found(scripted,
                                                                   closing) -> None:
    client = closing(openai.OpenAI(base_url=scripted.url + "/v1", api_key="x", max_retries=0))
    assert client.models.retrieve("scripted").id == "scripted"
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("gpt-9")
    assert info.value.code == "model_not_found"


@pytest.mark.slow
def test_count_tokens_equals_what_the_engine_evaluates(live, closing) -> None:
    client = closing(anthropic.Anthropic(base_url=live.url, api_key="x", max_retries=0))
    kw = {"system": "You are terse.", "messages": [{"role": "user", "content": "Say hi"}]}
    counted = client.messages.count_tokens(model="SmolLM2-135M-Instruct", **kw).input_tokens
    made = client.messages.create(model="SmolLM2-135M-Instruct", max_tokens=1, **kw)
    assert counted == made.usage.input_tokens > 5


def test_count_tokens_is_forwarded_to_an_anthropic_upstream() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"input_tokens": 42})

    cfg = UpstreamConfig(name="claude", kind="anthropic", base_url="https://a.example",
                         models=(ModelRoute(name="c", upstream_model="claude-x"),))
    up = AnthropicUpstream(cfg, httpx.AsyncClient(transport=httpx.MockTransport(handler)))
    req = GenerationRequest(prompt=ChatPrompt(messages=(
        ChatMessage(role="system", content="s"), ChatMessage(role="user", content="u"))),
        model="c")
    assert asyncio.run(up.count_tokens(req)) == 42
    sent = json.loads(seen[0].content)
    assert seen[0].url.path == "/v1/messages/count_tokens"
    assert sent["model"] == "claude-x" and sent["system"] and "max_tokens" not in sent


@pytest.mark.slow
def test_tokenize_takes_vllm_s_messages_form(live, engine) -> None:
    messages = [{"role": "user", "content": "Say hi"}]
    got = httpx.post(live.url + "/tokenize", json={"messages": messages}, timeout=30).json()
    want = engine.prompt_ids(ChatPrompt(messages=(ChatMessage(role="user", content="Say hi"),)))
    assert got["tokens"] == want and got["count"] == len(want)
    bare = httpx.post(live.url + "/tokenize", timeout=30, json={
        "messages": messages, "add_generation_prompt": False}).json()["tokens"]
    assert want[:len(bare)] == bare and len(bare) < len(want)
    both = httpx.post(live.url + "/tokenize", timeout=30, json={
        "messages": messages, "add_generation_prompt": True, "continue_final_message": True})
    assert _err(both, 400)["param"] == "continue_final_message"


def test_discovery_is_served_to_any_origin_with_a_preflight(stacks) -> None:  # noqa: F811
    keyed = stacks(api_keys=(KEY,), auth="keys")
    origin = {"origin": "https://anywhere.example"}
    path = keyed.url + "/.well-known/codec/index.json"
    pre = httpx.options(path, headers={**origin, "access-control-request-method": "GET",
                                       "access-control-request-headers": "if-none-match"})
    assert pre.status_code == 204
    assert pre.headers["access-control-allow-origin"] == "*"
    assert "GET" in pre.headers["access-control-allow-methods"]
    assert "if-none-match" in pre.headers["access-control-allow-headers"].lower()
    got = httpx.get(path, headers=origin)  # no key: public data
    assert got.status_code == 200 and got.headers["access-control-allow-origin"] == "*"
    missing = httpx.get(keyed.url + "/.well-known/codec/maps/no/such.json", headers=origin)
    assert missing.headers["access-control-allow-origin"] == "*"
    assert _err(missing, 404)["code"] == "not_found"
    # Inference routes keep the Origin refusal.
    refused = httpx.post(keyed.url + "/v1/completions", json={"prompt": "x"},
                         headers={**origin, "authorization": f"Bearer {KEY}"})
    assert refused.status_code == 403


def test_a_refused_websocket_upgrade_logs_no_library_advice(stacks) -> None:  # noqa: F811
    # Refused: the Responses WebSocket turned off (it is served by default).
    keyed = stacks(api_keys=(KEY,), auth="keys", responses_websocket=False)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("uvicorn.error")
    logger.addHandler(handler)
    try:
        head = (f"GET /v1/responses HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n").encode()
        with socket.create_connection(("127.0.0.1", keyed.port), timeout=60) as conn:
            conn.sendall(head)
            data = b""
            while chunk := conn.recv(4096):
                data += chunk
    finally:
        logger.removeHandler(handler)
    assert data.startswith(b"HTTP/1.1 426 ") and data.endswith(b"\r\n\r\n")
    assert b"connection: close" in data.lower()
    assert [r.getMessage() for r in records if r.levelno >= logging.WARNING] == []
