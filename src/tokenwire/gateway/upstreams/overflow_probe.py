"""An empty 200 stream, confirmed: ``python -m llama_cpp.server``'s way of failing.

llama_cpp.server validates a request inside its SSE publisher, after the ``200`` head went
out: a prompt over its ``--n_ctx`` (``ValueError: Requested tokens (P) exceed context window
of N``), like any other error it raises there, ends the body at once: no event, no
``[DONE]``, nothing on the wire that says why (checked with 0.3.36 against its source,
``server/app.py`` ``get_event_publisher``). The same request *non-streamed* is answered by
its error handler with the real status and body: ``400`` ``context_length_exceeded`` with
"This model's maximum context length is N tokens ... (P in the messages, C in the
completion)". Nor does it report its context length anywhere (its ``/v1/models`` has
``owned_by: "me"`` and no metadata), so the overflow cannot always be decided before sending.

So when a stream ends before its first event (the parser says ``EMPTY_STREAM``), the adapter
asks once more, non-streamed and with ``max_tokens: 1`` (:func:`confirmation_body`). What
that answer means is decided here without I/O (:func:`confirmed_failure`): a 4xx is the real
failure (an overflow is ``context_length_exceeded``, final, with the counts; nothing is
retried, so no client reconnects); a 200 or a 5xx confirms nothing and the empty stream
stays what it was, a broken stream retried once. Cost: one extra request per empty stream,
which for an overflow stops at tokenization. Done for llama-cpp-python (``owned_by: "me"``)
by default; the ``empty_stream`` option of an ``openai`` upstream says ``confirm`` /
``retry`` for any other server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from tokenwire.gateway.ir import Event, EventStream, Failure, FailureClass
from tokenwire.gateway.upstreams.failures import failure_from_response

__all__ = ["EMPTY_STREAM", "EMPTY_STREAM_MODES", "ConfirmingStream", "confirmation_body",
           "confirmed_failure"]

#: ``Failure.code`` of a 200 stream that ended before its first event.
EMPTY_STREAM = "empty_stream"
#: The ``empty_stream`` option: ``auto`` confirms behind llama-cpp-python only.
EMPTY_STREAM_MODES = ("auto", "confirm", "retry")
#: Keys of a streamed body that a non-streamed one must not carry.
_STREAM_ONLY = ("stream_options",)


def confirmation_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """The streamed request's body, non-streamed and asking for one token: an overflow is
    refused before any work, and a prompt that fits costs its evaluation and one token."""
    out = {k: v for k, v in body.items() if k not in _STREAM_ONLY}
    out["stream"] = False
    out.pop("max_completion_tokens", None)
    out["max_tokens"] = 1
    return out


def confirmed_failure(status: int, headers: Mapping[str, str], body: bytes) -> Failure | None:
    """The failure a confirmation's answer reveals, or None when it reveals none (a 200: the
    request can be served; a 5xx: the server is failing, which the empty stream says too)."""
    if not 400 <= status < 500:
        return None
    failure = failure_from_response(status, headers, body)
    if failure.failure_class is FailureClass.RATE_LIMITED:
        return None  # a throttle says nothing about the request itself
    return failure


class ConfirmingStream:
    """An upstream stream whose ``EMPTY_STREAM`` failure is replaced by what ``confirm()``
    finds (an :class:`~tokenwire.gateway.ir.EventStream`). The confirmation runs in its own
    task: a caller that stops waiting (the supervisor's heartbeat timer) and asks again
    gets the same answer, and :meth:`cancel` stops it."""

    def __init__(self, inner: EventStream,
                 confirm: Callable[[], Awaitable[Failure | None]]) -> None:
        self._inner = inner
        self._confirm = confirm
        self._task: asyncio.Task[Failure | None] | None = None
        self._empty: Failure | None = None

    async def next_event(self) -> Event:
        if self._empty is None:
            event = await self._inner.next_event()
            if not (isinstance(event, Failure) and event.code == EMPTY_STREAM):
                return event
            self._empty = event
            self._task = asyncio.get_running_loop().create_task(self._confirm())
        assert self._task is not None
        found = await asyncio.shield(self._task)
        return found if found is not None else self._empty

    def cancel(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._inner.cancel()
