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
