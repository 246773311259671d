"""Waits bounded by a deadline, with one timer per deadline instead of one per wait.

Why (BENCHMARKS.md, "The hot path (issue 15)"): the response writer waits for every event
under its coalescing window's deadline, and the supervisor waits for every upstream event
under its next heartbeat / idle deadline. With ``asyncio.timeout`` or ``anyio.move_on_after``
around each wait, every token paid for a timer (a heap push and a cancel) and a cancel
scope: 13 % of the gateway's busy samples at 64 streams. The deadline of those waits moves
rarely (once per window; the supervisor's only later, with each event), so one
:class:`DeadlineWaits` keeps one timer armed for the earliest deadline asked and re-arms it
only when it fires early or a wait asks for an earlier one.

The guarantee kept from ``asyncio.timeout`` (whose bookkeeping this repeats): the timer
cancels a task only while that task is suspended inside :meth:`DeadlineWaits.wait`, so a
timer that outlives one wait can never interrupt the code after it (forwarding an event,
writing to the socket). A cancellation that did not come from the timer (a disconnect, a
cancel scope) is re-raised, counted with ``Task.uncancel()``. What is awaited must lose
nothing when its wait is cancelled (the ``EventStream.next_event`` contract, ``ir.py``).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

__all__ = ["EXPIRED", "DeadlineWaits", "wake"]

T = TypeVar("T")


class _Expired:
    __slots__ = ()

    def __repr__(self) -> str:
        return "EXPIRED"


#: What :meth:`DeadlineWaits.wait` returns when its deadline came first.
EXPIRED: Final = _Expired()


class DeadlineWaits:
    """Sequential waits of one task (the first wait's), each bounded by a deadline in the
    loop's time."""

    def __init__(self) -> None:
        self._timer: asyncio.TimerHandle | None = None
        self._armed_for = math.inf  # the deadline the armed timer was set for
        self._until = math.inf  # the deadline of the wait in progress
        self._task: asyncio.Task | None = None  # the task, while it waits (else None)
        self._fired = False  # the timer cancelled the wait in progress
        # The loop and the waiting task, found at the first wait: every wait is the same
        # task's (looking them up was a tenth of this method's cost, paid per token).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._owner: asyncio.Task | None = None

    async def wait(self, call: Callable[[], Awaitable[T]], until: float) -> T | _Expired:
        """``await call()``, or :data:`EXPIRED` once the loop's clock reaches ``until``
        (then ``call()``'s wait was cancelled, or it was never called: already past)."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
            self._owner = asyncio.current_task()
        if until <= loop.time():
            return EXPIRED
        if self._timer is None or until < self._armed_for:
            self._arm(loop, until)
        self._until = until
        task = self._task = self._owner
        assert task is not None
        try:
            result = await call()
        except asyncio.CancelledError:
            if not self._fired:
                raise
            self._fired = False
            if task.uncancel() > 0:  # cancelled by someone else as well: theirs wins
                raise
            return EXPIRED
        except BaseException:
            if self._fired:  # the call absorbed our cancellation, then failed: undo its count
                self._fired = False
                task.uncancel()
            raise
        finally:
            self._task = None
        if self._fired:  # the awaited call absorbed our cancellation: undo its count
            self._fired = False
            task.uncancel()
        return result

    def close(self) -> None:
        """No more waits: the timer goes (a live one would keep its owner for a deadline)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._armed_for = math.inf

    def _arm(self, loop: asyncio.AbstractEventLoop, until: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._armed_for = until
        self._timer = loop.call_at(until, self._on_timer, loop)

    def _on_timer(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        armed_for, self._armed_for = self._armed_for, math.inf
        task = self._task
        if task is None:  # nobody waits now: the next wait arms what it needs
            return
        if self._until > armed_for:  # this wait's deadline is later: keep waiting
            self._arm(loop, self._until)
            return
        # Only here, with the task suspended inside wait(): see the module docstring.
        self._fired = True
        task.cancel()


def wake(waiter: asyncio.Future[None] | None) -> None:
    """Resolve the future a side waits on, if one does and it is not done yet (cancelled
    with its waiter, or already woken): the one-line hand-off of the gateway's own
    producer/consumer pairs (``supervision/handoff.py``, ``upstreams/stream_post.py``,
    ``upstreams/http_transport.py``)."""
    if waiter is not None and not waiter.done():
        waiter.set_result(None)
