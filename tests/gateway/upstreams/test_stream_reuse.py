"""A finished stream's upstream connection carries the next request (sse_http's drain).

The server is a raw asyncio server writing exact bytes, so what follows the terminal event
(the body's end at once, the end late, or more bytes than the drain reads) is the test's own
precondition. The adapter is the real OpenAI-compatible one on the real lean transport.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.gateway.upstreams.fakes import chat_stream
from tests.gateway.upstreams.streams import collect
from tests.gateway.upstreams.test_http_transport import (
    CHUNKED_HEAD,
    Server,
    _chunk,
    _read_request,
    _run,
    answer_every_request,
)
from tokenwire.gateway.ir import (
    ChatMessage,
    ChatPrompt,
    Failure,
    Finish,
    GenerationRequest,
    TokenDelta,
)
from tokenwire.gateway.upstreams import sse_http
from tokenwire.gateway.upstreams.base import ModelRoute, UpstreamConfig
from tokenwire.gateway.upstreams.openai_compat import OpenAICompatUpstream

REQUEST = GenerationRequest(prompt=ChatPrompt(messages=(ChatMessage(role="user",
                                                                    content="hi"),)),
                            model="m")
BODY = chat_stream("vllm", ["Hello", " world"])


def _upstream(url: str) -> OpenAICompatUpstream:
    cfg = UpstreamConfig(name="up", kind="openai", base_url=url + "/v1",
                         models=(ModelRoute(name="m"),))
    return OpenAICompatUpstream.from_config(cfg)


def _text(events) -> str:
    return "".join(e.text for e in events if isinstance(e, TokenDelta))


async def _streams(url: str, n: int) -> list[list]:
    up = _upstream(url)
    try:
        return [await collect(up.submit(REQUEST)) for _ in range(n)]
    finally:
        await up.aclose()


def test_streams_that_end_cleanly_share_one_upstream_connection() -> None:
    async def main():
        server = Server(answer_every_request(
            CHUNKED_HEAD + b"".join(_chunk(c) for c in BODY) + b"0\r\n\r\n"))
        url = await server.start()
        results = await _streams(url, 3)
        await server.stop()
        assert [_text(r) for r in results] == ["Hello world"] * 3
        assert all(isinstance(r[-1], Finish) for r in results)
        assert server.accepts == 1

    _run(main)


@pytest.mark.parametrize("tail", ["held_open", "too_long"])
def test_a_body_that_does_not_end_after_its_terminal_closes_its_connection(
        tail: str, monkeypatch) -> None:
    """The client gets its terminal at once either way; the connection is closed (never
    pooled) when the body's end does not come within the drain's time or bytes."""
    monkeypatch.setattr(sse_http, "DRAIN_MAX_S", 0.05)
    monkeypatch.setattr(sse_http, "DRAIN_MAX_BYTES", 1024)
    disconnects = 0

    async def handler(reader, writer):
        nonlocal disconnects
        await _read_request(reader)
        writer.write(CHUNKED_HEAD + b"".join(_chunk(c) for c in BODY))
        if tail == "too_long":
            writer.write(_chunk(b": padding\n\n" * 200))  # a comment past the bound
        await writer.drain()
        assert await reader.read(1) == b""  # the gateway hung up: never pooled
        disconnects += 1

    async def main():
        server = Server(handler)
        url = await server.start()
        results = await _streams(url, 2)
        while disconnects < 2:  # each handler sees its EOF (the safety net bounds this)
            await asyncio.sleep(0.01)
        await server.stop()
        assert [_text(r) for r in results] == ["Hello world"] * 2
        assert server.accepts == 2

    _run(main)


def test_a_wait_cancelled_while_the_request_opens_leaves_the_request_running() -> None:
    """The supervisor's heartbeat timer may cancel ``next_event`` while the request is still
    being answered: only that wait ends; the request goes on and the next wait reads it."""
    answered = CHUNKED_HEAD + b"".join(_chunk(c) for c in BODY) + b"0\r\n\r\n"

    async def late(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await release.wait()  # the head comes only after the first wait was cancelled
        writer.write(answered)
        await writer.drain()

    async def main():
        server = Server(late)
        url = await server.start()
        up = _upstream(url)
        stream = up.submit(REQUEST)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(stream.next_event(), 0.2)
        release.set()
        events = await collect(stream)
        await up.aclose()
        await server.stop()
        assert _text(events) == "Hello world" and isinstance(events[-1], Finish)
        assert server.accepts == 1  # the same request, not a new one

    release = asyncio.Event()
    _run(main)


#: Answers the stream refuses, each with a body it does not read to its end: another
#: content type, an error status whose body is past the 64 KiB read for its message.
_REFUSED = {
    "html": b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: 15\r\n\r\n"
            b"<html>hi</html>",
    "json": b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}",
    "big_500": b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain\r\n"
               b"content-length: 100000\r\n\r\n" + b"x" * 100_000,
}


@pytest.mark.parametrize("answer", sorted(_REFUSED))
def test_an_answer_without_an_event_stream_gives_its_connection_back(answer: str) -> None:
    """Each such answer is one failure, and its connection is closed or pooled, never kept:
    more requests than the upstream's connections all reach it (they used to wait for a
    connection that never came back, until the gateway restarted)."""
    requests = 0

    async def handler(reader, writer):
        nonlocal requests
        while True:
            try:
                await _read_request(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            requests += 1
            writer.write(_REFUSED[answer])
            await writer.drain()

    async def main():
        server = Server(handler)
        url = await server.start()
        up = _upstream(url)  # max_concurrent 1 (the default): one slot, few connections
        try:
            results = [await asyncio.wait_for(collect(up.submit(REQUEST)), 5)
                       for _ in range(8)]
        finally:
            await up.aclose()
            await server.stop()
        assert requests == 8
        assert all(len(r) == 1 and isinstance(r[0], Failure) for r in results), results
        assert {r[0].status for r in results} == {502}

    _run(main)
