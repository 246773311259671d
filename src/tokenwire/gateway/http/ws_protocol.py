"""uvicorn's wsproto WebSocket protocol, with its reads paused while its writes are.

uvicorn answers every Ping at once with a write and never looks at the write buffer for
it, and Pings do not pause reading (only a complete message does, until the app takes
it). A peer that sends Pings and never reads the Pongs grew the server's memory without
bound: 300 MB of Pings from one socket, +450 MB in 25 s (and 64 sockets are allowed per
address). Here the transport's own flow control decides: past its high-water mark
(``pause_writing``) the socket is not read until the peer has read enough of what it was
sent (``resume_writing``), so the peer's sends block in its own kernel buffers instead.
The keep-alive still runs: a peer that reads nothing answers no Ping and is closed after
``ws_ping_timeout`` (``gateway/server.py``).
"""

from __future__ import annotations

from uvicorn.protocols.websockets.wsproto_impl import WSProtocol

__all__ = ["BackpressuredWSProtocol"]


class BackpressuredWSProtocol(WSProtocol):
    """:class:`WSProtocol` that stops reading while the transport stops writing."""

    _writes_paused = False

    def pause_writing(self) -> None:
        super().pause_writing()
        self._writes_paused = True
        if not self.transport.is_closing():
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._writes_paused = False
        # uvicorn pauses reading too while a message waits for the app (``read_paused``).
        if not self.read_paused and not self.transport.is_closing():
            self.transport.resume_reading()

    async def receive(self):  # type: ignore[no-untyped-def]
        message = await super().receive()
        # uvicorn resumed reading when its queue ran empty: not while our writes are paused.
        if self._writes_paused and not self.transport.is_closing():
            self.transport.pause_reading()
        return message
