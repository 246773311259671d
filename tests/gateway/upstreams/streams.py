"""Reading an upstream's event stream in tests: every event up to and including the terminal."""

from __future__ import annotations

import asyncio

from tokenwire.gateway.ir import Event, EventStream, is_terminal

#: A generation that never ends is a bug under test, not something to wait out.
EVENT_TIMEOUT_S = 10.0


async def collect(stream: EventStream) -> list[Event]:
    out: list[Event] = []
    while not out or not is_terminal(out[-1]):
        out.append(await asyncio.wait_for(stream.next_event(), EVENT_TIMEOUT_S))
    return out
