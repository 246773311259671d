"""An SSE upstream stream pushes what it parses to a sink (``SSEUpstreamStream.push_to``),
in the upstream connection's callback, and keeps for ``next_event`` what the sink leaves.

The upstream is a raw asyncio server writing exact bytes, each part only when the test says
(so which bytes arrive while the stream's reader waits is the test's own precondition); the
adapter is the real OpenAI-compatible one on the real lean transport.
"""

from __future__ import annotations

import asyncio

from tests.gateway.upstreams.fakes import chat_stream
from tests.gateway.upstreams.test_http_transport import (
    CHUNKED_HEAD,
    Server,
    _chunk,
    _read_request,
    _run,
)
from tests.gateway.upstreams.test_stream_reuse import REQUEST, _upstream
from tokenwire.gateway.ir import Event, Finish, TokenDelta, is_terminal

#: role chunk, "Hello", " wide", " world", "!", the finish chunk, usage, [DONE]
BODY = chat_stream("vllm", ["Hello", " wide", " world", "!"])


def _serve_in_two_parts(first: int) -> tuple[Server, asyncio.Event, list[int]]:
    """The head and ``BODY[:first]`` at once; the rest of the body and its end when the
    event is set. The list counts the requests each connection served."""
    go = asyncio.Event()
    served: list[int] = []

    async def handler(reader, writer):
        served.append(0)
        while True:
            try:
                await _read_request(reader)
            except asyncio.IncompleteReadError:
                return
            served[-1] += 1
            writer.write(CHUNKED_HEAD + b"".join(_chunk(c) for c in BODY[:first]))
            await writer.drain()
            await go.wait()
            writer.write(b"".join(_chunk(c) for c in BODY[first:]) + b"0\r\n\r\n")
            await writer.drain()

    return Server(handler), go, served


async def _read_all(stream, pulled: list[Event]) -> None:
    while not pulled or not is_terminal(pulled[-1]):
        pulled.append(await stream.next_event())


async def _waiting_pushed(stream) -> None:
    """Until the stream's reader waits with its body pushed (bounded: a safety net)."""
    for _ in range(1000):
        if stream._pushing is not None:
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the stream never waited with its body pushed")


def _texts(events: list[Event]) -> list[str]:
    return [e.text for e in events if isinstance(e, TokenDelta) and e.text]


def test_what_arrives_while_the_reader_waits_goes_to_the_sink_in_order() -> None:
    async def main():
        server, go, served = _serve_in_two_parts(first=2)  # the role chunk and "Hello"
        url = await server.start()
        up = _upstream(url)
        stream = up.submit(REQUEST)
        sunk: list[Event] = []
        stream.push_to(lambda event: isinstance(event, TokenDelta) and not sunk.append(event))
        pulled: list[Event] = []
        reading = asyncio.ensure_future(_read_all(stream, pulled))
        await _waiting_pushed(stream)
        go.set()
        await asyncio.wait_for(reading, 10)
        # A second request on the same connection: the body's end was read while pushed.
        second = up.submit(REQUEST)
        await asyncio.wait_for(_read_all(second, []), 10)
        await up.aclose()
        await server.stop()
        return pulled, sunk, served

    pulled, sunk, served = _run_value(main)
    # "Hello" came with the head or just after it (pulled or pushed, as TCP delivered it);
    # everything after the pause came while the reader waited.
    assert _texts(sunk)[-3:] == [" wide", " world", "!"]
    assert _texts(pulled) + _texts(sunk) == ["Hello", " wide", " world", "!"]
    assert isinstance(pulled[-1], Finish)
    assert served == [2]  # one connection carried both requests


def test_after_the_sink_refuses_one_event_every_later_one_is_kept_in_order() -> None:
    async def main():
        server, go, _ = _serve_in_two_parts(first=2)
        url = await server.start()
        up = _upstream(url)
        stream = up.submit(REQUEST)
        offered: list[str] = []

        def sink(event: Event) -> bool:  # takes " wide", refuses " world"
            if isinstance(event, TokenDelta) and event.text:
                offered.append(event.text)
                return event.text == " wide"
            return False
        stream.push_to(sink)
        pulled: list[Event] = []
        reading = asyncio.ensure_future(_read_all(stream, pulled))
        await _waiting_pushed(stream)
        go.set()
        await asyncio.wait_for(reading, 10)
        await up.aclose()
        await server.stop()
        return pulled, offered

    pulled, offered = _run_value(main)
    assert offered[-2:] == [" wide", " world"]  # "!" came after a refusal: never offered
    assert _texts(pulled) == ["Hello", " world", "!"]
    assert isinstance(pulled[-1], Finish)


def _run_value(main):
    out = []

    async def wrapper():
        out.append(await main())
    _run(wrapper)
    return out[0]
