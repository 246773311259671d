"""When a Responses stream's head and ``response.created`` go out, and what they say.

The seed: a validated streaming request emits ``response.created`` before waiting for the
provider. Two things are known only once the provider's first event arrives, though: the
model that serves (a fallback taken before any output, README "Fallbacks") and the replica
of the turn (a pool's turn-state token, ``routing/pool.py``), which Codex reads from the
response head. So when the supervised stream says its ``head_waits`` (a fallback is
configured, or a pool serves), :func:`open_stream` reads ahead to the first event that is
not a fact (``ResponseMeta``, ``MessageStart``, ``Usage``: the supervisor sends them just
before the first output, or a heartbeat after 15 s of silence), names the serving model in
the renderer, and hands back a stream that replays what it read. The seed's own Codex
route holds its head for the provider's first event the same way, for its turn state.
"""

from __future__ import annotations

from tokenwire.gateway.apis.responses_render import ResponsesRenderer
from tokenwire.gateway.ir import Event, EventStream, MessageStart, ResponseMeta, Usage

__all__ = ["open_stream", "turn_state_of"]


async def open_stream(stream: EventStream, renderer: ResponsesRenderer
                      ) -> tuple[EventStream, list[Event]]:
    """``(stream to render, facts read ahead)``: unchanged with nothing read when the head
    need not wait (module docstring)."""
    if not getattr(stream, "head_waits", False):
        return stream, []
    read: list[Event] = []
    try:
        event = await stream.next_event()
        read.append(event)
        while isinstance(event, ResponseMeta | MessageStart | Usage):
            event = await stream.next_event()
            read.append(event)
    except Exception as exc:  # reported in-stream by the caller's loop, as any other
        return _Replay(stream, read, exc), read
    served = [e.model for e in read if isinstance(e, ResponseMeta) and e.model]
    if served:
        renderer.served_by(served[-1])
    return _Replay(stream, read), read[:-1]


def turn_state_of(facts: list[Event]) -> str | None:
    """The first turn state among a response's facts (Codex keeps the first it sees)."""
    return next((e.turn_state for e in facts
                 if isinstance(e, ResponseMeta) and e.turn_state is not None), None)


class _Replay:
    """The events read ahead (then a pending error, if reading failed), then the rest."""

    def __init__(self, inner: EventStream, read: list[Event],
                 error: Exception | None = None) -> None:
        self._inner, self._read, self._error = inner, list(read), error
        self.observer = getattr(inner, "observer", None)

    async def next_event(self) -> Event:
        if self._read:
            return self._read.pop(0)
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return await self._inner.next_event()

    def cancel(self) -> None:
        self._inner.cancel()

    def served_headers(self) -> list[tuple[str, str]]:
        served = getattr(self._inner, "served_headers", None)
        return served() if served is not None else []
