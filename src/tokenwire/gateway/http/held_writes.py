"""The HTTP/1.1 response cork (``asgi.CORK_EXTENSION``): a request cycle's writes held in
Python and sent as one write when the cork comes off, as ``http2.py`` holds a stream's
HEADERS frame. :mod:`.connections` offers it in every HTTP/1.1 request's scope."""

from __future__ import annotations

from typing import Any

__all__ = ["HeldWrites", "cork_cycle"]


class HeldWrites:
    """A request cycle's transport while its response is corked (``asgi.CORK_EXTENSION``):
    what uvicorn writes is kept and goes to the socket as one write when the cork comes off
    (:func:`cork_cycle`), or before the cycle closes the connection. It was the socket's
    ``TCP_CORK`` until 2026-12-05: three more system calls per streamed answer (cork,
    uncork, a second write), the cork alone ~26 µs of the first token's way out with the
    caches cold (BENCHMARKS.md, "Session of 2026-12-05 (8)"). Everything else is the
    transport's own."""

    __slots__ = ("_chunks", "transport")

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self._chunks: list[bytes] = []

    def write(self, data: bytes) -> None:
        self._chunks.append(data)

    def release(self) -> None:
        """Send what was kept, in one write (nothing to a closing transport)."""
        chunks = self._chunks
        if chunks and not self.transport.is_closing():
            self.transport.write(b"".join(chunks))
        chunks.clear()

    def close(self) -> None:
        self.release()
        self.transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


def cork_cycle(cycle: Any, on: bool) -> None:
    """The cork of one request's response (``asgi.CORK_EXTENSION``): its cycle's writes
    held while on. Bound to the cycle, not the connection: a pipelined request's cycle is
    made while the one before it still answers."""
    transport = cycle.transport
    if on:
        if not isinstance(transport, HeldWrites):
            cycle.transport = HeldWrites(transport)
    elif isinstance(transport, HeldWrites):
        cycle.transport = transport.transport
        transport.release()
