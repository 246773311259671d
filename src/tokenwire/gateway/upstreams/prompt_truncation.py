"""A prompt the upstream silently cut, told by its own usage: the check, and where it runs.

Ollama answers an over-long prompt by dropping its start (gateway-research §3.4) and
reports, in the final usage, how many prompt tokens it read. When that is fewer than the
prompt certainly has (``context_window.certain_prompt_tokens``, the lower bound the
preflight uses), the answer was made from part of the prompt, and the stream ends with
:func:`truncation_failure` instead of its ``Finish``.

The count encodes the prompt with the model's map, once per request: when the preflight
has counted it with the same map, that count is used (``GenerationRequest.counts``).
Otherwise a short prompt is counted when the stream ends, in the adapter's parser (a few
hundred microseconds at most). A prompt over
``INLINE_COUNT_CHARS`` characters is counted on a worker thread from the moment the
request goes out, while the upstream reads it, and :class:`CountedStream` waits for that
count before it gives the ``Finish``: counted on the event loop, a 1 MB prompt held every
other client of the server ~0.9 s at the end of its stream, an 8 MB one ~4.7 s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from tokenwire.gateway.ir import (
    Event,
    EventStream,
    Failure,
    FailureClass,
    is_terminal,
    push_through,
    start_early,
)

__all__ = ["CountedStream", "LateCheck", "truncation_failure"]


def truncation_failure(bound: int | None, read: int | None) -> Failure | None:
    """The failure when the upstream read (``read``, its usage's prompt tokens) fewer
    tokens than the prompt certainly has (``bound``), else None."""
    if bound is None or read is None or read <= 0 or read >= bound:
        return None
    return Failure(failure_class=FailureClass.CONTEXT_LENGTH, status=400,
                   code="prompt_truncated", prompt_tokens=bound, context_tokens=read,
                   message=f"the upstream read only {read} of the prompt's at least "
                           f"{bound} tokens (it truncated the prompt to its context)")


class LateCheck(Protocol):
    """The parser's side: whether its stream ended with a usage to check, and the
    failure for a count (:func:`truncation_failure` on that usage)."""

    @property
    def check_due(self) -> bool: ...

    def truncation(self, bound: int | None) -> Failure | None: ...


class CountedStream:
    """An upstream stream (:class:`~tokenwire.gateway.ir.EventStream`) whose prompt is
    counted on a worker thread from its creation; its terminal, when the parser has a usage
    to check, waits for the count and becomes the truncation failure if the check says so.

    Every other event passes as it comes, pushed ones included (``push_to``), so only the
    end of the stream crosses this wrapper. The wait can be cancelled and resumed (the
    supervisor's heartbeat timer cancels each wait): the count is a future, shielded."""

    def __init__(self, inner: EventStream, count: Callable[[], int | None],
                 check: LateCheck) -> None:
        self._inner = inner
        self._check = check
        self._count = asyncio.get_running_loop().run_in_executor(None, count)
        self._held: Event | None = None
        self._given = False  # the terminal went out: what follows is the inner stream's

    def start(self) -> None:
        start_early(self._inner)

    def push_to(self, sink: Callable[[Event], bool]) -> bool:
        return push_through(self._inner, sink)

    async def next_event(self) -> Event:
        if self._held is None or self._given:
            event = await self._inner.next_event()
            if self._given or not (is_terminal(event) and self._check.check_due):
                return event
            self._held = event
        bound = await asyncio.shield(self._count)
        self._given = True
        return self._check.truncation(bound) or self._held

    def cancel(self) -> None:
        self._inner.cancel()
