"""The OpenAI-compatible adapter against scripted vLLM / Ollama / llama.cpp servers."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.gateway.upstreams.fakes import (
    Reply,
    ToolScript,
    chat_stream,
    completion_stream,
    error_reply,
    sse,
    start_fake,
)
from tests.gateway.upstreams.streams import collect
from tokenwire.codec.maps import load_map_file
from tokenwire.codec.tokenizer import Tokenizer
from tokenwire.gateway.context_window import (
    INLINE_COUNT_CHARS,
    TEXT_SLACK,
    certain_request_tokens,
)
from tokenwire.gateway.ir import (
    ChatMessage,
    ChatPrompt,
    Failure,
    FailureClass,
    Finish,
    FinishKind,
    GenerationRequest,
    IdsSource,
    ImagePart,
    MessageToolCall,
    PromptIds,
    PromptText,
    ReasoningDelta,
    TextPart,
    TokenDelta,
    ToolCallDelta,
    ToolSpec,
    Usage,
)
from tokenwire.gateway.upstreams.base import ModelRoute, UpstreamConfig, UpstreamState
from tokenwire.gateway.upstreams.failures import MALFORMED
from tokenwire.gateway.upstreams.openai_compat import ChunkParser, OpenAICompatUpstream

SMOL = load_map_file(Path(__file__).resolve().parents[2] / "fixtures" / "maps" /
                     "huggingfacetb" / "smollm2.json")
CHAT = ChatPrompt(messages=(ChatMessage(role="user", content="hi"),))


@pytest.fixture(scope="module")
def fake():
    server = start_fake(lambda path, body: Reply())
    yield server
    server.stop()


def upstream(url: str, *, map_id: str | None = None, transport=None, **options):
    cfg = UpstreamConfig(name="up", kind="openai", base_url=url, options=options,
                         models=(ModelRoute(name="m", map_id=map_id),))
    return OpenAICompatUpstream.from_config(cfg, transport=transport,
                                            maps={SMOL.id: SMOL})


def run(fake, reply: Reply | None, request: GenerationRequest, **kw) -> list:
    if reply is not None:
        fake.respond = lambda path, body: reply

    async def go():
        up = upstream(fake.url, **kw)
        try:
            return await collect(up.submit(request))
        finally:
            await up.aclose()
    return asyncio.run(go())


def req(prompt=CHAT, **kw) -> GenerationRequest:
    return GenerationRequest(prompt=prompt, model="m", **kw)


def text_of(events) -> str:
    return "".join(e.text for e in events if isinstance(e, TokenDelta))


def ids_of(events) -> list[int]:
    return [i for e in events if isinstance(e, TokenDelta) for i in e.ids]


# -- request bodies ----------------------------------------------------------------------


def test_chat_body_has_messages_tools_sampling_and_asks_for_usage(fake):
    prompt = ChatPrompt(messages=(
        ChatMessage(role="developer", content="be brief"),
        ChatMessage(role="user", content=(TextPart(text="see"),
                                          ImagePart(url="data:image/png;base64,AA"))),
        ChatMessage(role="assistant", tool_calls=(
            MessageToolCall(id="c1", name="get", arguments='{"a":1}'),)),
        ChatMessage(role="tool", tool_call_id="c1", content="42"),
    ))
    tool = ToolSpec(name="get", description="d", parameters={"type": "object"})
    run(fake, Reply(chunks=chat_stream("vllm", ["x"])),
        req(prompt, tools=(tool,), tool_choice={"name": "get"}, parallel_tool_calls=True,
            reasoning_effort="low", stop=("END",), seed=7, temperature=0.0, top_p=0.5,
            max_tokens=9))
    path, body = fake.requests[-1]
    assert path == "/v1/chat/completions"
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "tool"]
    assert body["messages"][1]["content"][1] == {
        "type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}
    assert body["messages"][2] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get", "arguments": '{"a":1}'}}]}
    assert body["messages"][3]["tool_call_id"] == "c1"
    assert body["tools"][0]["function"]["name"] == "get"
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get"}}
    assert (body["parallel_tool_calls"], body["reasoning_effort"], body["stop"],
            body["seed"], body["temperature"], body["top_p"], body["max_tokens"]) == (
        True, "low", ["END"], 7, 0.0, 0.5, 9)
    assert "return_token_ids" not in body  # ids were not asked for


def test_text_prompt_goes_to_completions_and_ids_prompt_as_a_list(fake):
    out = run(fake, Reply(chunks=completion_stream("vllm", ["a", "b"])),
              req(PromptText(text="Once")))
    assert fake.requests[-1][0] == "/v1/completions"
    assert fake.requests[-1][1]["prompt"] == "Once" and text_of(out) == "ab"
    run(fake, None, req(PromptIds(ids=(1, 2, 3))))
    assert fake.requests[-1][1]["prompt"] == [1, 2, 3]


def test_api_option_refuses_the_other_prompt_kind(fake):
    out = run(fake, None, req(PromptText(text="x")), api="chat")
    assert out[-1].failure_class is FailureClass.INVALID_REQUEST


# -- vLLM ----------------------------------------------------------------------------------


def test_vllm_token_ids_become_delta_ids_when_ids_are_wanted(fake):
    chunks = chat_stream("vllm", ["Hel", "lo"], ids=[[10, 11], [12]], prompt_ids=[1, 2])
    out = run(fake, Reply(chunks=chunks), req(want_ids=True), ids="vllm")
    assert fake.requests[-1][1]["return_token_ids"] is True
    assert ids_of(out) == [10, 11, 12] and text_of(out) == "Hello"
    assert out[-2:] == [Usage(prompt_tokens=5, completion_tokens=3),
                        Finish(reason=FinishKind.EOS)]


def test_vllm_stop_reason_string_is_a_stop_sequence_finish(fake):
    out = run(fake, Reply(chunks=chat_stream("vllm", ["a"], stop_reason="END")), req())
    assert out[-1] == Finish(reason=FinishKind.STOP_SEQUENCE, matched_stop="END")


@pytest.mark.parametrize(("reason", "kind"), [
    ("length", FinishKind.LENGTH), ("content_filter", FinishKind.CONTENT_FILTER),
    ("tool_calls", FinishKind.TOOL_CALLS),
    # the words of servers that speak OpenAI's API in their own: TGI's, and Anthropic's
    ("eos_token", FinishKind.EOS), ("stop_sequence", FinishKind.STOP_SEQUENCE),
    ("max_tokens", FinishKind.LENGTH)])
def test_finish_reason_maps_to_the_ir_vocabulary(fake, reason, kind):
    assert run(fake, Reply(chunks=chat_stream("vllm", ["a"], finish=reason)),
               req())[-1] == Finish(reason=kind)


@pytest.mark.parametrize("reason", ["abort", "error", "cancelled", "weird"])
def test_a_finish_reason_of_a_cut_answer_is_a_failure_after_the_text_so_far(fake, reason):
    """vLLM's and SGLang's ``abort`` (and any word that is not one of a complete answer)
    used to reach the client as ``stop``: a cut answer shown as a finished one."""
    out = run(fake, Reply(chunks=chat_stream("vllm", ["par", "tial"], finish=reason)), req())
    assert text_of(out) == "partial"
    assert isinstance(out[-1], Failure) and out[-1].status == 502
    assert out[-1].failure_class is FailureClass.UPSTREAM and reason in out[-1].message
    assert not any(isinstance(e, Finish) for e in out)


_CHUNK_HEAD = {"id": "c", "object": "chat.completion.chunk", "model": "m"}


def _chat_chunk(delta: object = None, finish: object = None) -> dict:
    return {**_CHUNK_HEAD, "choices": [{"index": 0, "delta": delta or {},
                                        "finish_reason": finish}]}


@pytest.mark.parametrize("chunk", [
    _chat_chunk({"content": 5}), _chat_chunk({"content": {"text": "a"}}),
    _chat_chunk({"content": [{"type": "image_url"}]}), _chat_chunk({"reasoning_content": 1}),
    _chat_chunk(finish={"why": "stop"}), _chat_chunk(finish=7),
    _chat_chunk({"tool_calls": {"index": 0}}), _chat_chunk({"tool_calls": ["call"]}),
    _chat_chunk({"tool_calls": [{"index": "zz", "function": {"name": "f"}}]}),
    _chat_chunk({"tool_calls": [{"index": -1, "function": {"name": "f"}}]}),
    _chat_chunk({"tool_calls": [{"index": 0, "function": {"name": 3}}]}),
    _chat_chunk({"tool_calls": [{"index": 0, "id": ["x"], "function": {"name": "f"}}]}),
    _chat_chunk({"tool_calls": [{"index": 0, "function": "f"}]}),
    _chat_chunk({"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": 5}}]}),
    {**_CHUNK_HEAD, "choices": [{"index": 0, "text": 5, "finish_reason": None}]},
], ids=lambda c: json.dumps(c["choices"][0])[:60])
def test_a_chunk_field_of_the_wrong_type_is_a_malformed_stream(fake, chunk):
    """Each used to reach the client as it came (``"content": 5``) or as the gateway's own
    500 (``int("zz")``, an unhashable finish_reason): it is the upstream's broken stream,
    502, final (README "When things go wrong")."""
    out = run(fake, Reply(chunks=(*chat_stream("vllm", ["ok"], finish=None, usage=None,
                                                done=False), *sse(chunk))), req())
    assert text_of(out) == "ok"
    assert isinstance(out[-1], Failure) and out[-1].status == 502
    assert out[-1].code == MALFORMED and "wrong shape" in out[-1].message


def test_content_as_a_list_of_text_parts_is_its_text(fake):
    """Some OpenAI-compatible servers send a delta's ``content`` as parts."""
    parts = [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]
    out = run(fake, Reply(chunks=sse(_chat_chunk({"content": parts}),
                                     _chat_chunk(finish="stop"), "[DONE]")), req())
    assert text_of(out) == "Hello" and out[-1] == Finish(reason=FinishKind.EOS)


def test_tool_call_arguments_sent_as_an_object_are_its_json_text(fake):
    """They used to be Python's repr of the dict (``{'a': 1}``), not JSON."""
    call = {"index": 0, "id": "call_1", "type": "function",
            "function": {"name": "f", "arguments": {"a": 1, "b": "x é"}}}
    out = run(fake, Reply(chunks=sse(_chat_chunk({"tool_calls": [call]}),
                                     _chat_chunk(finish="tool_calls"), "[DONE]")), req())
    calls = [e for e in out if isinstance(e, ToolCallDelta)]
    assert [(c.id, c.name) for c in calls] == [("call_1", "f")]
    assert json.loads(calls[0].arguments) == {"a": 1, "b": "x é"}
    assert out[-1] == Finish(reason=FinishKind.TOOL_CALLS)


@pytest.mark.parametrize("flavor", ["vllm", "ollama", "llamacpp"])
def test_reasoning_deltas_come_before_the_answer(fake, flavor):
    out = run(fake, Reply(chunks=chat_stream(flavor, ["42"], reasoning=["think", "ing"])),
              req())
    assert [e.text for e in out if isinstance(e, ReasoningDelta)] == ["think", "ing"]
    assert text_of(out) == "42"


@pytest.mark.parametrize("flavor", ["vllm", "ollama", "llamacpp"])
def test_parallel_tool_calls_keep_their_index_id_name_and_arguments(fake, flavor):
    calls = [ToolScript(0, "call_a", "weather", ('{"city"', ': "Oslo"}')),
             ToolScript(1, "call_b", "time", ('{"tz": ', '"UTC"}'))]
    out = run(fake, Reply(chunks=chat_stream(flavor, tools=calls, finish="tool_calls")),
              req())
    got: dict[int, list] = {}
    for e in out:
        if isinstance(e, ToolCallDelta):
            entry = got.setdefault(e.index, [None, None, ""])
            entry[0] = entry[0] or e.id
            entry[1] = entry[1] or e.name
            entry[2] += e.arguments
    assert got == {0: ["call_a", "weather", '{"city": "Oslo"}'],
                   1: ["call_b", "time", '{"tz": "UTC"}']}
    assert out[-1] == Finish(reason=FinishKind.TOOL_CALLS)


def test_vllm_mid_stream_error_is_a_failure_after_the_text_so_far(fake):
    err = {"message": "CUDA out of memory", "type": "InternalServerError", "code": 500}
    out = run(fake, Reply(chunks=chat_stream("vllm", ["par", "tial"], error=err)), req())
    assert text_of(out) == "partial"
    assert isinstance(out[-1], Failure) and out[-1].failure_class is FailureClass.UPSTREAM
    assert "out of memory" in out[-1].message


@pytest.mark.parametrize(("message", "prompt", "ctx"), [
    ("This model's maximum context length is 2048 tokens. However, you requested 3000 tokens "
     "(2900 in the messages, 100 in the completion). Please reduce the length of the "
     "messages or completion.", 2900, 2048),
    ("'max_tokens' or 'max_completion_tokens' is too large: 100. This model's maximum context "
     "length is 2048 tokens and your request has 2000 input tokens (100 > 2048 - 2000).",
     2000, 2048),
    ("You passed 3000 input tokens and requested 16 output tokens. However, the model's "
     "context length is only 2048 tokens, resulting in a maximum input length of 2032 "
     "tokens. Please reduce the length of the input prompt. (parameter=input_tokens, "
     "value=3000)", 3000, 2048),
])
def test_vllm_context_overflow_wordings_are_context_length_with_counts(fake, message,
                                                                       prompt, ctx):
    body = {"error": {"message": message, "type": "BadRequestError", "param": None,
                      "code": 400}}
    out = run(fake, error_reply(400, body), req())
    f = out[-1]
    assert (f.failure_class, f.status, f.prompt_tokens, f.context_tokens) == (
        FailureClass.CONTEXT_LENGTH, 400, prompt, ctx)


def test_llama_cpp_exceed_context_size_error_counts_are_read_from_fields(fake):
    body = {"error": {"code": 400, "type": "exceed_context_size_error",
                      "message": "request (3000 tokens) exceeds the available context size "
                                 "(2048 tokens), try increasing it",
                      "n_prompt_tokens": 3000, "n_ctx": 2048}}
    f = run(fake, error_reply(400, body), req())[-1]
    assert (f.failure_class, f.prompt_tokens, f.context_tokens, f.code) == (
        FailureClass.CONTEXT_LENGTH, 3000, 2048, "exceed_context_size_error")


@pytest.mark.parametrize(("status", "error", "headers", "cls", "retry"), [
    (429, {"message": "slow down", "type": "rate_limit_error"}, [("retry-after", "7")],
     FailureClass.RATE_LIMITED, 7.0),
    (429, {"message": "no money", "code": "insufficient_quota"}, [], FailureClass.QUOTA, None),
    (503, {"message": "busy"}, [("retry-after", "2")], FailureClass.CAPACITY, 2.0),
    (401, {"message": "bad key", "type": "invalid_request_error"}, [],
     FailureClass.AUTHENTICATION, None),
    (500, {"message": "boom"}, [], FailureClass.UPSTREAM, None),
    (404, {"message": "model not found"}, [], FailureClass.INVALID_REQUEST, None),
])
def test_http_errors_before_the_stream_are_classified_from_status_and_code(
        fake, status, error, headers, cls, retry):
    f = run(fake, error_reply(status, {"error": error}, headers), req())[-1]
    assert (f.failure_class, f.retry_after) == (cls, retry)
    assert f.status != 401  # our upstream credentials are not the client's problem


# -- stream endings --------------------------------------------------------------------------


def test_eof_without_finish_reason_is_an_upstream_failure(fake):
    out = run(fake, Reply(chunks=chat_stream("vllm", ["a"], finish=None, usage=None,
                                             done=False)), req())
    assert isinstance(out[-1], Failure) and out[-1].failure_class is FailureClass.UPSTREAM


def test_done_without_finish_reason_is_an_upstream_failure(fake):
    out = run(fake, Reply(chunks=chat_stream("vllm", ["a"], finish=None)), req())
    assert isinstance(out[-1], Failure)


def test_line_cut_off_at_eof_is_an_upstream_failure(fake):
    out = run(fake, Reply(chunks=(*chat_stream("vllm", ["a"], finish=None, done=False),
                                  b'data: {"choi')), req())
    assert isinstance(out[-1], Failure) and out[-1].failure_class is FailureClass.UPSTREAM


def test_keepalive_comments_and_crlf_are_tolerated(fake):
    body = b"".join(chat_stream("vllm", ["a", "b"])).replace(b"\n", b"\r\n")
    out = run(fake, Reply(chunks=(b": ping\r\n\r\n", body)), req())
    assert text_of(out) == "ab" and out[-1] == Finish(reason=FinishKind.EOS)


def test_not_json_chunk_is_an_upstream_failure(fake):
    out = run(fake, Reply(chunks=sse("not json")), req())
    assert out[-1].failure_class is FailureClass.UPSTREAM


def test_cancel_closes_the_upstream_connection(fake):
    reply = Reply(chunks=chat_stream("vllm", ["a", "b"], finish=None, usage=None,
                                     done=False), hold_open=True)
    fake.respond = lambda path, body: reply
    before = fake.disconnects

    async def go():
        up = upstream(fake.url)
        stream = up.submit(req())
        assert isinstance(await stream.next_event(), TokenDelta)
        stream.cancel()
        last = await collect(stream)
        # Checked before aclose(): closing the client would close the socket anyway.
        deadline = time.monotonic() + 10
        while fake.disconnects == before and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        closed = fake.disconnects - before
        await up.aclose()
        return last, closed
    last, closed = asyncio.run(go())
    assert last[-1] == Finish(reason=FinishKind.ABORT)
    assert closed == 1


def test_unreachable_upstream_is_a_connection_failure():
    async def go():
        up = upstream("http://127.0.0.1:9/v1")
        try:
            return await collect(up.submit(req()))
        finally:
            await up.aclose()
    assert asyncio.run(go())[-1].failure_class is FailureClass.CONNECTION


# -- llama.cpp and Ollama --------------------------------------------------------------------


def test_llama_cpp_tokens_become_ids_and_usage_on_the_finish_chunk_counts(fake):
    chunks = chat_stream("llamacpp", ["Hi", "!"], ids=[[7], [8]], usage=(4, 2))
    out = run(fake, Reply(chunks=chunks), req(want_ids=True), ids="llama.cpp")
    assert fake.requests[-1][1]["return_tokens"] is True
    assert ids_of(out) == [7, 8]
    assert out[-2:] == [Usage(prompt_tokens=4, completion_tokens=2),
                        Finish(reason=FinishKind.EOS)]


def test_ollama_silent_prompt_truncation_is_a_context_length_failure(fake):
    prompt = PromptText(text="word " * 300)
    # the bound is the preflight's: what any upstream certainly counts (its slack off)
    sent = len(Tokenizer.from_map(SMOL).encode(prompt.text)) - TEXT_SLACK
    chunks = completion_stream("ollama", ["ok"], usage=(128, 1))
    out = run(fake, Reply(chunks=chunks), req(prompt), map_id=SMOL.id)
    f = out[-1]
    assert text_of(out) == "ok"
    assert (f.failure_class, f.prompt_tokens, f.context_tokens) == (
        FailureClass.CONTEXT_LENGTH, sent, 128)
    ignored = run(fake, None, req(prompt), map_id=SMOL.id, truncation="ignore")
    assert ignored[-1] == Finish(reason=FinishKind.EOS)


@pytest.mark.parametrize("long", [False, True])
def test_a_long_prompt_is_counted_for_the_truncation_check_on_a_worker_thread(
        fake, monkeypatch, long: bool):
    """Counted on the event loop at the end of the stream, a 1 MB prompt held every other
    client ~0.9 s (an 8 MB one ~4.7 s); past INLINE_COUNT_CHARS the count runs on a worker
    thread while the upstream works, and the stream's end waits for it. A short prompt
    stays inline. Either way the truncation is found."""
    import threading

    threads: list[threading.Thread] = []
    encode = Tokenizer.encode
    words = INLINE_COUNT_CHARS // 5 + 1 if long else 300

    def recorded(self, text, *a, **kw):
        if text == "word " * words:  # the prompt's count (not a chunk's text)
            threads.append(threading.current_thread())
        return encode(self, text, *a, **kw)

    monkeypatch.setattr(Tokenizer, "encode", recorded)
    chunks = completion_stream("ollama", ["ok"], usage=(128, 1))
    out = run(fake, Reply(chunks=chunks), req(PromptText(text="word " * words)),
              map_id=SMOL.id)
    assert (out[-1].failure_class, out[-1].context_tokens) == (FailureClass.CONTEXT_LENGTH, 128)
    assert len(threads) == 1 and (threads[0] is threading.main_thread()) is not long
    threads.clear()  # a long prompt read whole: the count's wait ends in the Finish
    chunks = completion_stream("ollama", ["ok"], usage=(words + 10, 1))
    out = run(fake, Reply(chunks=chunks), req(PromptText(text="word " * words)),
              map_id=SMOL.id)
    assert out[-1] == Finish(reason=FinishKind.EOS) and len(threads) == 1


@pytest.mark.parametrize("long", [False, True])
def test_the_preflight_and_the_truncation_check_encode_the_prompt_once(
        fake, monkeypatch, long: bool):
    """Before, the preflight (window known: vLLM, llama-server, Ollama) and the truncation
    check at the stream's end each encoded the prompt with the same map: ~7 ms each for an
    agent's 60,000 characters. The request carries the count (``GenerationRequest.counts``),
    and a fallback's copy of it too."""
    from tokenwire.gateway.routing.fallbacks import _for_target
    from tokenwire.gateway.routing.router import ServedModel

    counted: list[str] = []
    encode = Tokenizer.encode
    words = INLINE_COUNT_CHARS // 5 + 1 if long else 300
    text = "word " * words

    def recorded(self, t, *a, **kw):
        if t == text:
            counted.append(t)
        return encode(self, t, *a, **kw)

    monkeypatch.setattr(Tokenizer, "encode", recorded)
    fake.respond = lambda path, body: Reply(
        chunks=completion_stream("ollama", ["ok"], usage=(128, 1)))
    request = req(PromptText(text=text))

    async def go():
        up = upstream(fake.url, map_id=SMOL.id)
        served = ServedModel(name="m", upstream=up, tmap=SMOL, max_model_len=1 << 20)
        other = ServedModel(name="m", upstream=up, tmap=SMOL, max_model_len=1 << 20)
        try:
            assert served.preflight(request) is None
            first = await collect(served.submit(request))
            again = _for_target(other, request)  # a fallback's copy: same prompt, same map
            assert other.preflight(again) is None
            return first, await collect(other.submit(again))
        finally:
            await up.aclose()

    first, second = asyncio.run(go())
    for out in (first, second):
        assert (out[-1].failure_class, out[-1].context_tokens) == (
            FailureClass.CONTEXT_LENGTH, 128)
    assert len(counted) == 1
    # The memo is no part of the request's value: it still encodes (as {}) and compares.
    assert msgspec.json.decode(msgspec.json.encode(request), type=GenerationRequest) == request
    # Another prompt in a copy of the request is counted afresh, never given the old count.
    other_text = req(PromptText(text="word " * 7))
    shared = msgspec.structs.replace(request, prompt=other_text.prompt)
    assert shared.counts is request.counts
    assert certain_request_tokens(shared, SMOL) == len(encode(Tokenizer.from_map(SMOL),
                                                              "word " * 7)) - TEXT_SLACK


def test_ollama_full_prompt_usage_is_not_truncation(fake):
    out = run(fake, Reply(chunks=chat_stream("ollama", ["ok"], usage=(40, 1))), req(),
              map_id=SMOL.id)
    assert out[-1] == Finish(reason=FinishKind.EOS)


def test_missing_upstream_ids_fall_back_to_retokenizing_with_the_map(fake):
    out = run(fake, Reply(chunks=chat_stream("vllm", ["Hello", " world"])),
              req(want_ids=True), ids="vllm", map_id=SMOL.id)
    assert ids_of(out) == Tokenizer.from_map(SMOL).encode("Hello world")
    assert out[-1] == Finish(reason=FinishKind.EOS)


def test_missing_upstream_ids_without_a_map_is_a_failure(fake):
    out = run(fake, Reply(chunks=chat_stream("vllm", ["Hello"])), req(want_ids=True),
              ids="vllm")
    assert isinstance(out[-1], Failure)


# -- probe, ids source, credentials ------------------------------------------------------------


@pytest.mark.parametrize(("owned_by", "source"), [("vllm", IdsSource.UPSTREAM),
                                                  ("llamacpp", IdsSource.UPSTREAM),
                                                  ("library", IdsSource.RETOKENIZED)])
def test_probe_reads_models_and_auto_ids_follow_the_server(fake, owned_by, source):
    fake.owned_by = owned_by

    async def go():
        up = upstream(fake.url, map_id=SMOL.id)
        assert up.ids_source is IdsSource.RETOKENIZED  # before any probe
        health = await up.probe()
        await up.aclose()
        return up, health
    up, health = asyncio.run(go())
    fake.owned_by = "vllm"
    assert health.state is UpstreamState.UP and health.models == ("m",)
    assert up.ids_source is source


def test_probe_reports_down_and_degraded(fake):
    async def go(url, name):
        cfg = UpstreamConfig(name="up", kind="openai", base_url=url,
                             models=(ModelRoute(name=name),))
        up = OpenAICompatUpstream.from_config(cfg)
        try:
            return await up.probe()
        finally:
            await up.aclose()
    assert asyncio.run(go("http://127.0.0.1:9/v1", "m")).state is UpstreamState.DOWN
    degraded = asyncio.run(go(fake.url, "other"))
    assert degraded.state is UpstreamState.DEGRADED and "other" in degraded.detail


def test_a_model_listing_is_read_no_further_than_its_limit(fake):
    """Reproduced: the probe read ``/models`` whole, however large (and decoded it with
    httpx's unbounded decoders). Past ``MAX_LISTING_BYTES`` it is not a model list."""
    fake.models = ("m", *(f"model-{i:06d}-{'x' * 40}" for i in range(20_000)))
    try:
        async def go():
            up = upstream(fake.url)
            try:
                return await up.probe()
            finally:
                await up.aclose()
        health = asyncio.run(go())
    finally:
        fake.models = ("m",)
    assert health.state is UpstreamState.DEGRADED
    assert health.detail == "the model listing is not the expected JSON"


def test_api_key_is_sent_as_bearer_and_never_in_repr_or_failures(monkeypatch):
    monkeypatch.setenv("TW_TEST_KEY", "sk-secret-123")
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(401, json={"error": {"message": "invalid key"}})

    cfg = UpstreamConfig(name="up", kind="openai", base_url="http://x/v1",
                         api_key_env="TW_TEST_KEY", models=(ModelRoute(name="m"),))

    async def go():
        up = OpenAICompatUpstream.from_config(cfg, transport=httpx.MockTransport(handler))
        out = await collect(up.submit(req()))
        await up.aclose()
        return up, out
    up, out = asyncio.run(go())
    assert seen == ["Bearer sk-secret-123"]
    assert "sk-secret" not in repr(up) and "sk-secret" not in json.dumps(
        [str(e) for e in out])


# -- the plain-chunk read (ChunkParser._plain) against the general one -----------------------

_ANY = st.none() | st.booleans() | st.integers(-2, 2) | st.text(max_size=3) | \
    st.lists(st.integers(0, 5), max_size=2) | st.dictionaries(st.text(max_size=2),
                                                                st.integers(), max_size=1)


def _maybe(key: str, values: st.SearchStrategy) -> st.SearchStrategy:
    """``{key: value}`` or ``{}`` (the key absent)."""
    return st.one_of(st.just({}), values.map(lambda v: {key: v}))


def _merged(*parts: st.SearchStrategy) -> st.SearchStrategy:
    return st.tuples(*parts).map(lambda ds: {k: v for d in ds for k, v in d.items()})


_DELTA = _merged(_maybe("content", st.none() | st.text(max_size=4) | _ANY),
                 _maybe("role", st.just("assistant")),
                 _maybe("reasoning_content", st.none() | st.text(max_size=2)),
                 _maybe("tool_calls", st.none() | st.just([]) | st.just(
                     [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": "{"}}])))
_CHOICE = _merged(_maybe("index", st.sampled_from([0, 1, None, "0"])),
                  _maybe("delta", _DELTA | st.none() | _ANY),
                  _maybe("text", st.none() | st.text(max_size=3) | _ANY),
                  _maybe("finish_reason", st.sampled_from([None, "", "stop", "length",
                                                            "tool_calls", 3])),
                  _maybe("stop_reason", st.sampled_from([None, "</s>", 7])),
                  _maybe("logprobs", st.none() | st.just({"content": []})),
                  _maybe("token_ids", st.none() | st.just([5, 6])))
_CHUNK = _merged(_maybe("choices", st.lists(_CHOICE | _ANY, max_size=2) | st.none() | _ANY),
                 _maybe("usage", st.none() | st.just({"prompt_tokens": 3,
                                                       "completion_tokens": 1})),
                 _maybe("error", st.none() | st.just({"message": "boom"})),
                 _maybe("object", st.sampled_from(["chat.completion.chunk", "error"])),
                 _maybe("tokens", st.none() | st.just([1])),
                 _maybe("id", st.just("chatcmpl-1")))


def _general(parser: ChunkParser, data: str) -> list:
    parser._plain = lambda data: None  # type: ignore[method-assign]
    return parser.on_data(data)


@settings(max_examples=400, deadline=None)
@given(st.lists(_CHUNK, min_size=1, max_size=4))
def test_the_plain_chunk_read_gives_the_general_reads_events(chunks: list[dict]) -> None:
    """Whatever the chunks hold, reading them with the plain-chunk shortcut gives the
    events and the end (finish, usage) that the general read alone gives."""
    request = GenerationRequest(prompt=ChatPrompt(messages=(
        ChatMessage(role="user", content="hi"),)), model="m")
    config = UpstreamConfig(name="up", kind="openai", base_url="http://127.0.0.1:9/v1",
                            models=(ModelRoute(name="m"),))
    up = OpenAICompatUpstream.from_config(config)
    fast, general = ChunkParser(request, up), ChunkParser(request, up)
    for chunk in chunks:
        data = json.dumps(chunk)
        assert fast.on_data(data) == _general(general, data), data
    assert fast.on_data("[DONE]") == _general(general, "[DONE]")
    asyncio.run(up.aclose())
