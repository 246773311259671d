"""A misbehaving OpenAI-compatible upstream, seen by each client API: what the upstream said
validly reaches the client unchanged; what it said wrongly ends as the documented failure
(docs/failure-semantics.md), never the gateway's own 500 or a silently altered answer."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.gateway.conftest import start_server
from tests.gateway.upstreams.fakes import Reply, sse, start_fake
from tests.gateway.upstreams.test_openai_compat import (  # noqa: F401
    fake,
    ids_of,
    req,
    run,
    text_of,
)
from tokenwire.gateway.http.state import GatewayState
from tokenwire.gateway.ir import (
    Failure,
    FailureClass,
    Finish,
    FinishKind,
    IdsSource,
    PromptText,
    TokenDelta,
    ToolCallDelta,
)
from tokenwire.gateway.routing.router import Router, ServedModel
from tokenwire.gateway.settings import ServerSettings
from tokenwire.gateway.upstreams.base import ModelRoute, UpstreamConfig
from tokenwire.gateway.upstreams.failures import MALFORMED
from tokenwire.gateway.upstreams.openai_compat import OpenAICompatUpstream

HEAD = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
USER = [{"role": "user", "content": "hi"}]


def chunk(delta: dict | None = None, finish: str | None = None, **choice) -> dict:
    return {**HEAD, "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish,
                                 **choice}]}


def call(index: int | None, args: str, call_id: str | None = None,
         name: str | None = None) -> dict:
    out: dict = {"function": {"arguments": args}}
    if index is not None:
        out["index"] = index
    if call_id is not None:
        out["id"], out["type"] = call_id, "function"
    if name is not None:
        out["function"]["name"] = name
    return chunk({"tool_calls": [out]})


@pytest.fixture(scope="module")
def gateway() -> Iterator[tuple[str, dict]]:
    """A gateway over a scripted upstream; ``script["reply"]`` is what the upstream answers
    (``script["server"]``: the upstream, with the requests it got)."""
    script: dict = {"reply": Reply()}
    upstream = script["server"] = start_fake(lambda path, body: script["reply"], owned_by="x")
    cfg = UpstreamConfig(name="up", kind="openai", base_url=upstream.url,
                         models=(ModelRoute(name="m"),))
    served = ServedModel(name="m", upstream=OpenAICompatUpstream.from_config(cfg), tmap=None,
                         ids_source=IdsSource.NONE, upstream_name="up")
    live = start_server(GatewayState(settings=ServerSettings(), router=Router([served])))
    yield live.url, script
    live.stop()
    upstream.stop()


def post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(url + path, json={"model": "m", **body}, timeout=60)


def calls_by_api(url: str) -> dict[str, list[tuple[str, str, str]]]:
    """(id, name, arguments text) of each call, as each API's whole answer gives them."""
    chat = post(url, "/v1/chat/completions", {"messages": USER}).json()
    responses = post(url, "/v1/responses", {"input": "hi"}).json()
    messages = post(url, "/v1/messages", {"messages": USER, "max_tokens": 9}).json()
    return {
        "chat": [(c["id"], c["function"]["name"], c["function"]["arguments"])
                 for c in chat["choices"][0]["message"]["tool_calls"]],
        "responses": [(o["call_id"], o["name"], o["arguments"]) for o in responses["output"]
                      if o["type"] == "function_call"],
        "messages": [(b["id"], b["name"], json.dumps(b["input"], separators=(",", ":")))
                     for b in messages["content"] if b["type"] == "tool_use"],
    }


# -- tool calls --------------------------------------------------------------------------------


def test_a_new_call_at_a_taken_index_is_a_call_of_its_own(fake):  # noqa: F811
    """Reproduced: two calls at index 0 (the second with its own id and name) came out as
    one call, ``f`` with arguments ``{}{"y":1}``; the second call was lost."""
    out = run(fake, Reply(chunks=sse(call(0, "{}", "call_a", "f"),
                                     call(0, '{"y":', "call_b", "g"), call(0, "1}"),
                                     chunk(finish="tool_calls"), "[DONE]")), req())
    deltas = [e for e in out if isinstance(e, ToolCallDelta)]
    assert [(d.index, d.id, d.name, d.arguments) for d in deltas] == [
        (0, "call_a", "f", "{}"), (1, "call_b", "g", '{"y":'), (1, None, None, "1}")]
    assert out[-1] == Finish(reason=FinishKind.TOOL_CALLS)


def test_calls_without_an_index_each_keep_their_arguments_on_every_api(gateway):
    """Ollama's whole calls without ``index``: each was read as index 0 and merged into the
    first (Chat without streaming, Responses and Messages all showed one call)."""
    url, script = gateway
    script["reply"] = Reply(chunks=sse(call(None, '{"city":"Oslo"}', "call_a", "weather"),
                                       call(None, '{"tz":"UTC"}', "call_b", "time"),
                                       chunk(finish="tool_calls"), "[DONE]"))
    want = [("call_a", "weather", '{"city":"Oslo"}'), ("call_b", "time", '{"tz":"UTC"}')]
    assert calls_by_api(url) == {"chat": want, "responses": want, "messages": want}


def test_a_new_id_without_a_name_continues_the_call(fake):  # noqa: F811
    """A server that puts an id on every fragment (even a different one) still streams one
    call: only a delta that names the call starts another."""
    out = run(fake, Reply(chunks=sse(call(0, '{"a":', "call_a", "f"), call(0, "1}", "call_x"),
                                     chunk(finish="tool_calls"), "[DONE]")), req())
    assert {d.index for d in out if isinstance(d, ToolCallDelta)} == {0}


def test_a_call_the_upstream_gave_no_id_gets_one_on_chat(gateway):
    """Reproduced: a call streamed without ``id`` (nor ``type``) reached a Chat client as
    ``"id": null`` (and a first stream delta with no id), which it cannot answer: a tool
    message needs a ``tool_call_id``. Responses and Messages made up ids; now the adapter
    gives the call one, as the Codec and embedded adapters do."""
    url, script = gateway
    script["reply"] = Reply(chunks=sse(call(0, '{"a":1}', name="f"),
                                       chunk(finish="tool_calls"), "[DONE]"))
    made = post(url, "/v1/chat/completions", {"messages": USER}).json()
    (only,) = made["choices"][0]["message"]["tool_calls"]
    assert only["id"].startswith("call_") and only["type"] == "function"
    assert only["function"] == {"name": "f", "arguments": '{"a":1}'}
    streamed = post(url, "/v1/chat/completions", {"messages": USER, "stream": True}).text
    first = next(json.loads(line[6:])["choices"][0]["delta"]["tool_calls"][0]
                 for line in streamed.splitlines() if "tool_calls" in line)
    assert first["id"].startswith("call_") and first["type"] == "function"


def test_a_legacy_function_call_is_call_0(fake):  # noqa: F811
    """The functions API streams ``delta.function_call`` and ends with finish_reason
    ``function_call``. Reproduced: the call was never read; the answer ended as one with
    tool calls, and had none."""
    out = run(fake, Reply(chunks=sse(chunk({"function_call": {"name": "f", "arguments": ""}}),
                                     chunk({"function_call": {"arguments": '{"a":'}}),
                                     chunk({"function_call": {"arguments": "1}"}}),
                                     chunk(finish="function_call"), "[DONE]")), req())
    deltas = [e for e in out if isinstance(e, ToolCallDelta)]
    assert {d.index for d in deltas} == {0} and deltas[0].name == "f"
    assert deltas[0].id.startswith("call_")
    assert "".join(d.arguments for d in deltas) == '{"a":1}'
    assert out[-1] == Finish(reason=FinishKind.TOOL_CALLS)


def test_a_call_sent_both_as_tool_calls_and_function_call_is_read_once(fake):  # noqa: F811
    """llama_cpp.server sends each call both ways in one delta (``tool_calls`` and the
    legacy ``function_call``); read as two, its arguments ran together (``{..}{..}``)."""
    def both(name, args, first):
        call = {"index": 0, "function": {"name": name, "arguments": args}}
        if first:
            call |= {"id": "call_1", "type": "function"}
        return chunk({"tool_calls": [call], "function_call": {"name": name, "arguments": args}})

    out = run(fake, Reply(chunks=sse(both("f", '{"a":', True), both("f", "1}", False),
                                     chunk({"function_call": {"arguments": ""}}),
                                     chunk(finish="tool_calls"), "[DONE]")), req())
    deltas = [e for e in out if isinstance(e, ToolCallDelta)]
    assert {d.index for d in deltas} == {0} and deltas[0].id == "call_1"
    assert "".join(d.arguments for d in deltas) == '{"a":1}'



# -- what a delta says -------------------------------------------------------------------------


def test_a_refusal_is_the_answers_text_on_every_api(gateway):
    """OpenAI streams a structured-output refusal in ``delta.refusal``. Reproduced: it was
    dropped, and every API answered an empty, successful message."""
    url, script = gateway
    script["reply"] = Reply(chunks=sse(chunk({"role": "assistant", "refusal": None}),
                                       chunk({"refusal": "I can't "}),
                                       chunk({"refusal": "help with that."}),
                                       chunk(finish="stop"), "[DONE]"))
    said = "I can't help with that."
    chat = post(url, "/v1/chat/completions", {"messages": USER}).json()
    assert chat["choices"][0]["message"]["content"] == said
    responses = post(url, "/v1/responses", {"input": "hi"}).json()
    assert responses["output"][0]["content"][0]["text"] == said
    messages = post(url, "/v1/messages", {"messages": USER, "max_tokens": 9}).json()
    assert messages["content"] == [{"type": "text", "text": said}]


_TEXT_HEAD = {"id": "t", "object": "text_completion", "created": 1, "model": "m"}


@pytest.mark.parametrize(("api", "logprobs"), [
    ("chat", [{"token": "ok", "logprob": -1.0}]),  # a list where the object goes
    ("chat", {"content": [{"token": "ok", "logprob": -1.0, "top_logprobs": 5}]}),
    ("completions", {"tokens": 7, "token_logprobs": [-1.0]}),
    ("completions", {"tokens": ["ok"], "token_logprobs": [-1.0], "top_logprobs": 3}),
])
def test_logprobs_of_an_odd_shape_are_skipped_not_the_gateways_500(fake, api, logprobs):  # noqa: F811
    """Reproduced: each raised in the parser (``AttributeError: 'list' object has no
    attribute 'get'``, ``TypeError: 'int' object is not iterable``) and the client got the
    gateway's own 500 ``internal``. Malformed logprobs are skipped (``logprobs_wire``); the
    answer is the upstream's."""
    if api == "chat":
        chunks = sse(chunk({"content": "ok"}, logprobs=logprobs), chunk(finish="stop"),
                     "[DONE]")
        request = req()
    else:
        chunks = sse({**_TEXT_HEAD, "choices": [{"index": 0, "text": "ok",
                                                  "logprobs": logprobs}]},
                     {**_TEXT_HEAD, "choices": [{"index": 0, "text": "",
                                                  "finish_reason": "stop"}]}, "[DONE]")
        request = req(PromptText(text="hi"))
    out = run(fake, Reply(chunks=chunks), request)
    assert text_of(out) == "ok" and out[-1] == Finish(reason=FinishKind.EOS)
    assert all(not e.logprobs for e in out if isinstance(e, TokenDelta))


# -- errors in the stream ----------------------------------------------------------------------

_OVERFLOW = (b'error: {"code":400,"message":"the request exceeds the available context size, '
             b'try increasing it","type":"exceed_context_size_error","n_prompt_tokens":5000,'
             b'"n_ctx":4096}\n\n')


def test_llama_servers_error_line_is_the_failure_it_names(fake):  # noqa: F811
    """llama-server streams an error as an ``error: {...}`` line, then ``data: [DONE]``.
    Reproduced: the line was ignored and the stream failed as 'ended ([DONE]) without a
    finish_reason' (502, retried), for an overflow that is final and names its counts."""
    out = run(fake, Reply(chunks=(_OVERFLOW, b"data: [DONE]\n\n")), req())
    assert len(out) == 1 and isinstance(out[0], Failure)
    assert out[0].failure_class is FailureClass.CONTEXT_LENGTH and out[0].status == 400
    assert (out[0].prompt_tokens, out[0].context_tokens) == (5000, 4096)


@pytest.mark.parametrize("error", [
    b'error: {"code":500,"message":"slot crashed","type":"server_error"}\n\n',
    b'event: error\ndata: {"message":"slot crashed","type":"server_error"}\n\n',
    b'event: error\ndata: {"error":{"message":"slot crashed","type":"server_error"}}\n\n',
])
def test_an_error_event_after_output_ends_the_answer_with_its_message(fake, error):  # noqa: F811
    out = run(fake, Reply(chunks=(*sse(chunk({"content": "par"})), error,
                                  b"data: [DONE]\n\n")), req())
    assert text_of(out) == "par"
    assert isinstance(out[-1], Failure) and out[-1].failure_class is FailureClass.UPSTREAM
    assert out[-1].message == "slot crashed"


def test_a_chat_client_gets_llama_servers_overflow_as_context_length_exceeded(gateway):
    url, script = gateway
    script["reply"] = Reply(chunks=(_OVERFLOW, b"data: [DONE]\n\n"))
    r = post(url, "/v1/chat/completions", {"messages": USER, "stream": True})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"


def test_a_null_error_field_is_no_error(fake):  # noqa: F811
    """Reproduced: ``"error": null`` on an ordinary chunk failed the stream (502, message
    "None") before any text."""
    out = run(fake, Reply(chunks=sse({**chunk({"content": "ok"}), "error": None},
                                     {**chunk(finish="stop"), "error": None}, "[DONE]")), req())
    assert text_of(out) == "ok" and out[-1] == Finish(reason=FinishKind.EOS)


_JSON = (("content-type", "application/json"),)


def test_a_200_with_an_error_object_instead_of_a_stream_is_that_error(fake):  # noqa: F811
    """Reproduced: a 200 ``application/json`` ``{"error": {"code":
    "context_length_exceeded", ...}}`` became "expected text/event-stream, got
    'application/json'", a 502 that is retried, and the reason was lost."""
    body = json.dumps({"error": {"message": "This model's maximum context length is 4096 "
                                            "tokens. However, you requested 5000 tokens",
                                 "type": "invalid_request_error",
                                 "code": "context_length_exceeded"}}).encode()
    out = run(fake, Reply(chunks=(body,), headers=_JSON), req())
    assert len(out) == 1 and out[0].failure_class is FailureClass.CONTEXT_LENGTH
    assert out[0].status == 400


def test_a_200_with_other_json_instead_of_a_stream_is_a_broken_answer(fake):  # noqa: F811
    body = json.dumps({"object": "chat.completion", "choices": []}).encode()
    out = run(fake, Reply(chunks=(body,), headers=_JSON), req())
    assert len(out) == 1 and out[0].failure_class is FailureClass.UPSTREAM
    assert out[0].status == 502 and "expected text/event-stream" in out[0].message


# -- usage -------------------------------------------------------------------------------------


def test_a_usage_with_only_the_completion_count_reaches_the_client(gateway):
    """Reproduced: ``{"completion_tokens": 7}`` was not read as a usage at all; the client
    got ``usage: null`` though the upstream had reported the completion's count."""
    url, script = gateway
    script["reply"] = Reply(chunks=sse(chunk({"content": "ok"}), chunk(finish="stop"),
                                       {**HEAD, "choices": [], "usage": {"completion_tokens": 7}},
                                       "[DONE]"))
    usage = post(url, "/v1/chat/completions", {"messages": USER}).json()["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (None, 7)
    assert usage["tokenwire_source"] == "upstream"


def test_an_answer_whose_usage_came_ends_though_the_upstream_holds_the_stream_open(gateway):
    """OpenAI's usage chunk (no choices, after the finish) is the last before ``[DONE]``.
    Reproduced: an upstream that sent it and then held the response open without
    ``[DONE]`` kept every client waiting for the upstream's read timeout (300 s), the
    streaming one after its last token, and then failed the answer it already had whole."""
    url, script = gateway
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    script["reply"] = Reply(chunks=sse(chunk({"content": "o"}), chunk({"content": "k"}),
                                       chunk(finish="stop"),
                                       {**HEAD, "choices": [], "usage": usage}),
                            hold_open=True)
    answer = post(url, "/v1/chat/completions", {"messages": USER}).json()
    assert answer["choices"][0]["message"]["content"] == "ok"
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert {k: answer["usage"][k] for k in usage} == usage
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=60,
                      json={"model": "m", "messages": USER, "stream": True,
                            "stream_options": {"include_usage": True}}) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    last = json.loads(lines[-2][6:])
    assert {k: last["usage"][k] for k in usage} == usage
    assert [json.loads(x[6:])["choices"][0]["finish_reason"] for x in lines[:-2]][-1] == "stop"


def test_an_answer_past_its_size_is_answer_too_large_on_chat(gateway, monkeypatch):
    """The bound on one answer (supervisor.MAX_ANSWER_SIZE, made 10 here), as a client
    sees it: the gateway's own code, 502, whole or as the stream's error event."""
    from tokenwire.gateway.supervision import supervisor

    monkeypatch.setattr(supervisor, "MAX_ANSWER_SIZE", 10)
    url, script = gateway
    script["reply"] = Reply(chunks=sse(*(chunk({"content": "abcd"}) for _ in range(5)),
                                       chunk(finish="stop"), "[DONE]"))
    r = post(url, "/v1/chat/completions", {"messages": USER})
    assert r.status_code == 502 and r.json()["error"]["code"] == "answer_too_large"
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=60,
                      json={"model": "m", "messages": USER, "stream": True}) as resp:
        lines = [json.loads(line[6:]) for line in resp.iter_lines()
                 if line.startswith("data: {")]
    assert "".join(x["choices"][0]["delta"].get("content", "") for x in lines[:-1]
                   if x.get("choices")) == "abcdabcd"
    assert lines[-1]["error"]["code"] == "answer_too_large"


# -- token ids ---------------------------------------------------------------------------------


@pytest.mark.parametrize("ids", [[-1], [2**32], [5, True]])
def test_token_ids_that_are_not_uint32_are_a_malformed_stream(fake, ids):  # noqa: F811
    """Reproduced through a Codec (msgpack) client: vLLM ``token_ids`` [-1] or [2**40]
    raised in the frame encoder after the head (logged ``LocalProtocolError``, a final
    ``error`` frame from the gateway itself), and [True] went out as ``ids: [true]``. Now
    the upstream's chunk is malformed (a list that is not all ints is no ids: here, text
    without ids and no map to retokenize with)."""
    out = run(fake, Reply(chunks=sse(chunk({"content": "A"}, token_ids=[7]),
                                     chunk({"content": "B"}, token_ids=ids),
                                     chunk(finish="stop"), "[DONE]")),
              req(want_ids=True), ids="vllm")
    assert ids_of(out) == [7]
    assert isinstance(out[-1], Failure) and out[-1].status == 502
    assert out[-1].code == MALFORMED


# -- finish reasons ----------------------------------------------------------------------------


def test_mistrals_model_length_is_a_length_finish(fake):  # noqa: F811
    """Mistral's API ends an answer the context window cut with ``model_length``.
    Reproduced: an unknown word, so the whole answer became a 502 after its text."""
    out = run(fake, Reply(chunks=sse(chunk({"content": "long"}), chunk(finish="model_length"),
                                     "[DONE]")), req())
    assert text_of(out) == "long" and out[-1] == Finish(reason=FinishKind.LENGTH)


def test_a_200_html_page_instead_of_a_stream_is_final(gateway):
    """README: a 200 that is not an event stream is final. Reproduced: it had no code, so
    the retry policy read it as a 5xx and asked again after 1 s (2 upstream requests)."""
    url, script = gateway
    script["reply"] = Reply(chunks=(b"<html>maintenance</html>",),
                            headers=(("content-type", "text/html"),))
    before = len(script["server"].requests)
    r = post(url, "/v1/chat/completions", {"messages": USER})
    assert r.status_code == 502 and "expected text/event-stream" in r.json()["error"]["message"]
    assert len(script["server"].requests) - before == 1
