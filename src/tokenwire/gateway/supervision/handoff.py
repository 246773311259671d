"""A bounded hand-off of events from one producing task to one consuming task.

Why not ``asyncio.Queue`` (BENCHMARKS.md, "Session of 2026-12-04 (3)"): every token of every
supervised stream goes through one, and a ``Queue`` spends a dozen Python calls on each
(``put`` -> ``full`` -> ``qsize``, ``put_nowait`` -> ``_put``, the unfinished-task count and
its ``Event.clear()``, ``_wakeup_next`` over its getters' deque; ``get_nowait`` and
``empty`` on the reader's side): 12 % of the gateway's profiled CPU at 64 streams. A stream
has exactly one producer (its supervising task) and one reader (the response writer), and
needs no ``join``; this is that case: a deque, and a future only while a side waits.

The guarantees a ``Queue`` gives that the supervisor relies on are kept: a waiting ``get``
or ``put`` that is cancelled loses nothing and leaves nothing behind (the item stays queued,
or was never added); ``put`` waits while the buffer is full, so a stalled client pushes back
on the upstream; :meth:`force` always gets its item in (a terminal must reach the reader).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

from tokenwire.gateway.wakeups import wake

__all__ = ["Handoff"]

T = TypeVar("T")


class Handoff(Generic[T]):
    """FIFO of at most ``maxsize`` items between one producer and one consumer task."""

    __slots__ = ("_getter", "_items", "_maxsize", "_putter")

    def __init__(self, maxsize: int) -> None:
        self._items: deque[T] = deque()
        self._maxsize = maxsize
        self._getter: asyncio.Future[None] | None = None  # the reader, while it waits
        self._putter: asyncio.Future[None] | None = None  # the producer, while it waits

    def __len__(self) -> int:
        return len(self._items)

    async def get(self) -> T:
        """The oldest item, waiting for one if there is none."""
        items = self._items
        while not items:
            waiter = self._getter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._getter = None
        item = items.popleft()
        wake(self._putter)
        return item

    def take_all(self) -> list[T]:
        """Every queued item, oldest first, without waiting."""
        out = list(self._items)
        self._items.clear()
        wake(self._putter)
        return out

    async def put(self, item: T) -> None:
        """Add ``item``, waiting while the buffer is full."""
        while len(self._items) >= self._maxsize:
            waiter = self._putter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._putter = None
        self._items.append(item)
        wake(self._getter)

    def room(self) -> int:
        """How many items :meth:`offer` would take now."""
        return self._maxsize - len(self._items)

    def offer(self, item: T) -> bool:
        """Add ``item`` if there is room now; False (nothing added) when the buffer is full."""
        if len(self._items) >= self._maxsize:
            return False
        self._items.append(item)
        wake(self._getter)
        return True

    def force(self, item: T) -> None:
        """Add ``item`` now; when the buffer is full the oldest item makes room (a stalled
        reader still gets the stream's terminal)."""
        if len(self._items) >= self._maxsize:
            self._items.popleft()
        self._items.append(item)
        wake(self._getter)
