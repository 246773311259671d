"""The response writer (gateway/http/streaming.py ``EventResponse``) when the client goes away.

A disconnect cancels the stream (``EventStream.cancel``: it ends with ``ABORT`` after what it
had queued) and the writer stops there: nothing more is rendered, stored or sent, and the
call returns. The disconnect is the test's own precondition (``receive`` answers it once the
test says so); the waits are safety nets, never measured. With anyio's task group (before
issue 15's request-path work) the writer could take the ``ABORT`` before the scope's
cancellation reached it, and rendered and sent it (and, for a whole body, stored it) to a
client that had gone: both tests fail there.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tokenwire.codec.compression import IdentityCompressor
from tokenwire.gateway.http.streaming import EventResponse
from tokenwire.gateway.ir import Event, Finish, FinishKind, TokenDelta


class Stream:
    """One token, then nothing until :meth:`cancel`, then ``ABORT`` (the contract)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.queue.put_nowait(TokenDelta(ids=(1,), text="a"))
        self.cancelled = 0

    async def next_event(self) -> Event:
        return await self.queue.get()

    def cancel(self) -> None:
        self.cancelled += 1
        self.queue.put_nowait(Finish(reason=FinishKind.ABORT))


class Renderer:
    content_type = "text/plain"

    def __init__(self) -> None:
        self.rendered: list[Event] = []

    def on_event(self, event: Event) -> list[bytes]:
        self.rendered.append(event)
        return [b"x"]

    def on_error(self, exc: BaseException) -> list[bytes]:
        raise AssertionError(exc)


async def _serve(*, streaming: bool) -> tuple[Stream, Renderer, list[dict], list[str]]:
    stream, renderer, sent, stored = Stream(), Renderer(), [], []
    gone = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message.get("body") == b"x":  # the first token reached the client: it leaves
            gone.set()

    async def store() -> None:
        stored.append("stored")

    app = EventResponse(stream, renderer, headers=[("content-type", "text/plain")],
                        compressor=IdentityCompressor, on_failure=lambda f: (500, [], b""),
                        window=0.0, streaming=streaming, before_send=store)
    call = asyncio.ensure_future(app({"type": "http"}, receive, send))
    if not streaming:  # a whole body waits for the terminal: the client leaves before it
        await asyncio.sleep(0)
        gone.set()
    await asyncio.wait_for(call, 10)  # a safety net: the call returns on its own
    assert app.disconnected
    return stream, renderer, sent, stored


def test_a_stream_stops_at_the_disconnect_and_sends_nothing_after_it() -> None:
    stream, renderer, sent, _ = asyncio.run(_serve(streaming=True))
    assert stream.cancelled == 1
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert [type(e) for e in renderer.rendered] == [TokenDelta]  # the ABORT is not rendered


def test_a_whole_body_is_neither_rendered_nor_stored_nor_sent_after_the_disconnect() -> None:
    stream, renderer, sent, stored = asyncio.run(_serve(streaming=False))
    assert stream.cancelled == 1
    assert sent == [] and stored == [] and renderer.rendered == []


# -- a window's events taken at once ------------------------------------------------------------


class TextRenderer(Renderer):
    def on_event(self, event: Event) -> list[bytes]:
        self.rendered.append(event)
        return [event.text.encode()] if isinstance(event, TokenDelta) else [b"|end"]


def _supervised(texts: list[str], *, streaming: bool) -> tuple[list, dict[str, int]]:
    """A real supervised stream of ``texts`` (0.1 s apart, then the end) through the
    writer, with gzip and a 1 s window, on a looptime loop: the messages sent, each with
    the loop time it went at, and how often the writer called each read of the stream."""
    import random

    import looptime

    from tests.gateway.test_supervisor import EOS, REQUEST, Script, tokens
    from tokenwire.codec.compression import new_compressor
    from tokenwire.gateway.supervision.admission import Admission
    from tokenwire.gateway.supervision.supervisor import SupervisedStream

    sent: list[tuple[float, dict]] = []
    calls = {"next_event": 0, "settled": 0}

    async def go() -> None:
        loop = asyncio.get_running_loop()
        ticket = Admission().reserve(loop.time())
        stream = SupervisedStream(Script([[*tokens(*texts, gap=0.1), (0.1, EOS)]]), REQUEST,
                                  ticket, rng=random.Random(1))
        for name in calls:  # count the writer's wake-ups, as instance attributes
            method = getattr(stream, name)

            def counted(method=method, name=name):
                calls[name] += 1
                return method()
            setattr(stream, name, counted)

        async def receive() -> dict[str, Any]:
            await asyncio.Event().wait()
            return {}

        async def send(message: dict[str, Any]) -> None:
            sent.append((round(loop.time(), 6), message))

        app = EventResponse(stream, TextRenderer(), headers=[], streaming=streaming,
                            on_failure=lambda f: (500, [], b""), window=1.0, clock=loop.time,
                            compressor=lambda: new_compressor("gzip"))
        await app({"type": "http"}, receive, send)

    with asyncio.Runner(loop_factory=lambda: looptime.new_event_loop(start=0)) as runner:
        runner.run(go())
    return [(t, m["body"]) for t, m in sent if m["type"] == "http.response.body"], calls


def test_a_window_wakes_the_writer_once_and_the_terminal_ends_it_early() -> None:
    """With a supervised stream (``settled``/``ready``) the writer does not wake for each
    event of an open window: it sleeps to the deadline, woken early by the terminal, and the
    bytes are those of the event-by-event writer, each sent within its window."""
    import zlib

    texts = [f"w{i}" for i in range(10)]
    bodies, calls = _supervised(texts, streaming=True)
    # The first token at once (0.1 s); the rest of the window ends with the terminal at 1.1 s,
    # before the window's deadline (1.2 s).
    assert [t for t, _ in bodies] == [0.1, 1.1]
    assert zlib.decompress(b"".join(b for _, b in bodies), wbits=31) == \
        ("".join(texts) + "|end").encode()
    assert calls == {"next_event": 2, "settled": 1}  # not one wake-up per token


def test_a_whole_body_waits_once_for_the_terminal() -> None:
    import zlib

    texts = [f"w{i}" for i in range(10)]
    bodies, calls = _supervised(texts, streaming=False)
    assert [t for t, _ in bodies] == [1.1]
    assert zlib.decompress(bodies[0][1], wbits=31) == ("".join(texts) + "|end").encode()
    assert calls == {"next_event": 1, "settled": 1}  # the first read, then the terminal
