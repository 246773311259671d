"""``upstreams/overflow_probe.py`` and the ``openai`` adapter's context windows, sans-IO and
over ``httpx.MockTransport`` (the shapes are llama_cpp.server's, vLLM's, llama.cpp's and
Ollama's own; ``test_llama_cpp_overflow.py`` runs the real llama_cpp.server)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from tests.gateway.upstreams.streams import collect
from tokenwire.gateway.ir import (
    ChatMessage,
    ChatPrompt,
    Event,
    Failure,
    FailureClass,
    Finish,
    FinishKind,
    GenerationRequest,
)
from tokenwire.gateway.upstreams.base import ModelRoute, UpstreamConfig
from tokenwire.gateway.upstreams.openai_compat import ChunkParser, OpenAICompatUpstream
from tokenwire.gateway.upstreams.overflow_probe import (
    EMPTY_STREAM,
    ConfirmingStream,
    confirmation_body,
    confirmed_failure,
)

#: llama_cpp.server 0.3.36's non-streamed overflow answer (server/errors.py builds it).
LLAMA_CPP_PY_400 = json.dumps({"error": {
    "message": "This model's maximum context length is 512 tokens. However, you requested "
               "839 tokens (831 in the messages, 8 in the completion). Please reduce the "
               "length of the messages or completion.",
    "type": "invalid_request_error", "param": "messages",
    "code": "context_length_exceeded"}}).encode()
CHAT = ChatPrompt(messages=(ChatMessage(role="user", content="word " * 800),))
REQ = GenerationRequest(prompt=CHAT, model="m", max_tokens=8)


# -- the decision, without I/O ------------------------------------------------------------------


def test_the_confirmation_is_the_same_body_non_streamed_for_one_token() -> None:
    body = {"model": "x", "messages": [], "stream": True, "max_tokens": 8,
            "stream_options": {"include_usage": True}, "temperature": 0}
    assert confirmation_body(body) == {"model": "x", "messages": [], "stream": False,
                                       "max_tokens": 1, "temperature": 0}
    assert "max_completion_tokens" not in confirmation_body({"max_completion_tokens": 9})


def test_llama_cpp_pythons_400_confirms_an_overflow_with_its_counts() -> None:
    failure = confirmed_failure(400, {"content-type": "application/json"}, LLAMA_CPP_PY_400)
    assert failure is not None and failure.failure_class is FailureClass.CONTEXT_LENGTH
    assert (failure.prompt_tokens, failure.context_tokens) == (831, 512)


@pytest.mark.parametrize(("status", "body"), [
    (200, b'{"choices": []}'), (500, b'{"error": {"message": "boom"}}'),
    (429, b'{"error": {"code": "rate_limit_exceeded", "message": "slow"}}')])
def test_an_answer_that_says_nothing_about_the_request_confirms_nothing(status, body) -> None:
    assert confirmed_failure(status, {}, body) is None


def test_another_4xx_is_the_real_failure() -> None:
    body = b'{"error": {"message": "bad grammar", "type": "invalid_request_error"}}'
    failure = confirmed_failure(400, {}, body)
    assert failure is not None and failure.failure_class is FailureClass.INVALID_REQUEST


def test_the_parser_names_an_empty_stream_and_only_an_empty_one() -> None:
    up = _upstream(lambda r: httpx.Response(404))
    assert ChunkParser(REQ, up).on_eof()[0].code == EMPTY_STREAM
    parser = ChunkParser(REQ, up)
    parser.on_data('{"choices": [{"index": 0, "delta": {"content": "Hi"}}]}')
    [broken] = parser.on_eof()
    assert isinstance(broken, Failure) and broken.code is None


# -- the confirming stream ----------------------------------------------------------------------


class _Events:
    def __init__(self, *events: Event) -> None:
        self.events, self.cancelled = list(events), False

    async def next_event(self) -> Event:
        return self.events.pop(0)

    def cancel(self) -> None:
        self.cancelled = True


def test_an_empty_stream_becomes_what_the_confirmation_found_once() -> None:
    empty = Failure(failure_class=FailureClass.UPSTREAM, message="e", status=502,
                    code=EMPTY_STREAM)
    overflow = Failure(failure_class=FailureClass.CONTEXT_LENGTH, message="o", status=400)
    calls: list[int] = []
    release = asyncio.Event()

    async def confirm() -> Failure | None:
        calls.append(1)
        await release.wait()
        return overflow

    async def go() -> Event:
        stream = ConfirmingStream(_Events(empty), confirm)
        with pytest.raises(TimeoutError):  # a heartbeat timer stops waiting...
            await asyncio.wait_for(stream.next_event(), 0.01)
        release.set()
        return await stream.next_event()  # ...and the next wait gets the same answer

    assert asyncio.run(go()) is overflow and calls == [1]


def test_an_unconfirmed_empty_stream_stays_a_retryable_broken_stream() -> None:
    empty = Failure(failure_class=FailureClass.UPSTREAM, message="e", status=502,
                    code=EMPTY_STREAM)

    async def nothing() -> Failure | None:
        return None

    async def go() -> Event:
        return await ConfirmingStream(_Events(empty), nothing).next_event()

    assert asyncio.run(go()) is empty


def test_other_events_pass_through_untouched() -> None:
    done = Finish(reason=FinishKind.EOS)

    async def never() -> Failure | None:
        raise AssertionError("confirmed a stream that was not empty")

    async def go() -> Event:
        return await ConfirmingStream(_Events(done), never).next_event()

    assert asyncio.run(go()) is done


# -- the adapter: which server, which window ----------------------------------------------------


def _upstream(handler: Any, **options: Any) -> OpenAICompatUpstream:
    cfg = UpstreamConfig(name="up", kind="openai", base_url="http://up/v1", options=options,
                         models=(ModelRoute(name="m", upstream_model="u"),))
    return OpenAICompatUpstream.from_config(cfg, transport=httpx.MockTransport(handler))


def _probe(up: OpenAICompatUpstream, times: int = 1) -> None:
    async def go() -> None:
        try:
            for _ in range(times):
                await up.probe()
        finally:
            await up.aclose()
    asyncio.run(go())


def _listing(owner: str, **extra: Any) -> httpx.Response:
    return httpx.Response(200, json={"object": "list", "data": [
        {"id": "u", "object": "model", "owned_by": owner, **extra}]})


def test_vllms_listing_gives_the_window_and_binds_max_tokens() -> None:
    seen: list[str] = []

    def handler(r: httpx.Request) -> httpx.Response:
        seen.append(r.url.path)
        return _listing("vllm", max_model_len=4096)

    up = _upstream(handler)
    _probe(up)
    assert up.context_length_for("m") == 4096 and up.binds_max_tokens
    assert not up.confirms_empty_streams and seen == ["/v1/models"]  # no props probe


def test_llama_server_props_give_the_window_once() -> None:
    seen: list[str] = []

    def handler(r: httpx.Request) -> httpx.Response:
        seen.append(r.url.path)
        if r.url.path == "/props":
            return httpx.Response(200, json={"default_generation_settings": {"n_ctx": 8192}})
        return _listing("llamacpp")

    up = _upstream(handler)
    _probe(up, times=2)  # the health monitor's next probe does not ask again
    assert up.context_length_for("m") == 8192 and not up.binds_max_tokens
    assert seen == ["/v1/models", "/props", "/v1/models"]


def test_ollama_show_gives_the_window() -> None:
    seen: list[str] = []

    def handler(r: httpx.Request) -> httpx.Response:
        seen.append(r.url.path)
        if r.url.path == "/api/show":
            assert json.loads(r.content) == {"model": "u"}
            return httpx.Response(200, json={"model_info": {
                "general.architecture": "llama", "llama.context_length": 131072}})
        return _listing("library")

    up = _upstream(handler)
    _probe(up)
    assert up.context_length_for("m") == 131072 and seen == ["/v1/models", "/api/show"]


def test_llama_cpp_python_reports_no_window_and_its_empty_streams_are_confirmed() -> None:
    seen: list[str] = []

    def handler(r: httpx.Request) -> httpx.Response:
        seen.append(r.url.path)
        return _listing("me")

    up = _upstream(handler)
    _probe(up)
    assert up.context_length_for("m") is None and up.confirms_empty_streams
    assert seen == ["/v1/models"]  # it has no props endpoint to ask
    assert not _upstream(lambda r: httpx.Response(404), empty_stream="retry") \
        .confirms_empty_streams


def _sse_then(confirm: httpx.Response) -> Any:
    """Chat streams answer 200 with no event; non-streamed requests answer ``confirm``."""
    sent: list[dict[str, Any]] = []

    def handler(r: httpx.Request) -> httpx.Response:
        body = json.loads(r.content)
        sent.append(body)
        if body["stream"]:
            return httpx.Response(200, headers={"content-type": "text/event-stream"},
                                  content=b"")
        return confirm
    return handler, sent


def test_an_empty_stream_confirmed_as_an_overflow_is_final_context_length_exceeded() -> None:
    handler, sent = _sse_then(httpx.Response(400, content=LLAMA_CPP_PY_400))
    up = _upstream(handler, empty_stream="confirm")
    [failure] = asyncio.run(collect(up.submit(REQ)))
    assert isinstance(failure, Failure)
    assert failure.failure_class is FailureClass.CONTEXT_LENGTH
    assert (failure.prompt_tokens, failure.context_tokens) == (831, 512)
    assert [b["stream"] for b in sent] == [True, False] and sent[1]["max_tokens"] == 1


def test_an_empty_stream_that_the_confirmation_serves_stays_retryable() -> None:
    handler, sent = _sse_then(httpx.Response(200, json={"choices": [
        {"index": 0, "message": {"content": "x"}, "finish_reason": "length"}]}))
    up = _upstream(handler, empty_stream="confirm")
    [failure] = asyncio.run(collect(up.submit(REQ)))
    assert isinstance(failure, Failure) and failure.code == EMPTY_STREAM
    assert len(sent) == 2


def test_the_empty_stream_option_is_checked() -> None:
    from tokenwire.errors import ConfigError

    with pytest.raises(ConfigError, match="empty_stream must be one of"):
        _upstream(lambda r: httpx.Response(404), empty_stream="sometimes")
