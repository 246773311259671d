"""Capacity: a bounded number of upstream requests, a FIFO queue, and 429 before the body.

Seed, "Capacity": at most ``max_concurrent`` upstream requests run at once (four by
default), and each upstream may have its own, smaller limit (the embedded engine runs one
generation at a time). Up to ``queue_size`` (32) more requests wait in arrival order instead
of failing. A request counts from the moment it arrives, *before its body is read*: "the
admission bound includes body uploads", so an overload never buffers bodies. When every
running and waiting place is taken, the request is answered with a retryable 429 and
``Retry-After: 1`` before a byte of its body is read (:class:`AdmissionMiddleware`).

Two steps, two objects:

* :meth:`Admission.reserve` when the request arrives: a :class:`Ticket`, or ``None`` when
  full. The ticket is the request's place in flight; it ends when the HTTP exchange ends.
* :meth:`Admission.enqueue` once the request is parsed and routed: a future that resolves
  when an upstream slot is granted. Waiters are granted in arrival order; a waiter for an
  upstream at its own limit does not hold back a later waiter for another upstream (each
  upstream's queue is FIFO, and a free slot is never left idle while someone could use it).
  Cancelling the wait (the client went away) removes the waiter without touching an upstream.
A pool of replicas (``routing/pool.py``) is one upstream here, with the sum of its replicas'
limits, and also says whether a replica its breakers admit has a free slot.

``running`` and ``queued`` are read by ``/health`` and the metrics: ``queued`` is every
request in flight that does not hold a slot (uploading, validating or waiting).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from tokenwire.errors import ConfigError
from tokenwire.gateway.ir import free_slot

__all__ = [
    "DEFAULT_MAX_CONCURRENT",
    "DEFAULT_QUEUE_SIZE",
    "RETRY_AFTER_S",
    "Admission",
    "Ticket",
]

#: Seed: "The daemon runs at most maxConcurrent providers (four by default)."
DEFAULT_MAX_CONCURRENT = 4
#: Seed: "Up to 32 additional requests wait in a FIFO queue".
DEFAULT_QUEUE_SIZE = 32
#: Seed: "A full queue returns busy with HTTP 429 and Retry-After: 1."
RETRY_AFTER_S = 1


@dataclass(eq=False, slots=True)
class Ticket:
    """One request in flight. ``arrived_at`` is the event loop's clock at arrival: the
    request's deadlines (idle timeout, one-hour cap) count from it, queue wait included."""

    admission: Admission
    arrived_at: float
    upstream: object | None = None  # the upstream whose slot it holds, when running
    released: bool = False
    #: No longer counted in flight (:meth:`end_place`); ``released`` comes after.
    place_ended: bool = False
    #: Set when the route handed the request to the supervisor (which records it); a
    #: request answered before that was refused (400, 413, ...) and is counted as such.
    supervised: bool = False
    #: Runs once when the exchange ends (the request's record writes its log line then,
    #: after the last byte was sent).
    on_release: Callable[[], None] | None = None

    @property
    def running(self) -> bool:
        return self.upstream is not None

    def release_slot(self) -> None:
        """Give the upstream slot back (idempotent): the next waiter may start."""
        self.admission._release_slot(self)

    def end_place(self) -> None:
        """Stop counting the request in flight and give its slot back (idempotent), when
        its response is complete but the exchange has not unwound yet: the last body
        message is about to reach the server, and the client may send its next request
        the moment it reads it. The server can run that request before this one's task
        reaches :meth:`release`, and it must find the place free (a client at exactly
        the capacity got 429s otherwise, with every slot held by answered requests)."""
        self.admission._end_place(self)

    def release(self) -> None:
        """End the request's place in flight, and its slot if it still holds one; then
        ``on_release`` (once the exchange is over)."""
        self.admission._release(self)


@dataclass(slots=True)
class _Waiter:
    ticket: Ticket
    upstream: object
    future: asyncio.Future[None]
    #: Replicas of a pool this request already failed on: it waits for a slot elsewhere.
    avoid: frozenset[str] = frozenset()


@dataclass
class Admission:
    """The capacity bound of one gateway (see the module docstring).

    ``limits`` maps ``id(upstream)`` to that upstream's own concurrency limit (upstream
    objects need not be hashable; :func:`limits_of` builds it); upstreams not listed are
    bounded by ``max_concurrent`` alone.
    """

    max_concurrent: int = DEFAULT_MAX_CONCURRENT
    queue_size: int = DEFAULT_QUEUE_SIZE
    limits: Mapping[int, int] = field(default_factory=dict)
    #: True when ``limits`` covers every upstream served: then at most their sum can run,
    #: and the capacity counts that, not ``max_concurrent`` (:attr:`runnable`).
    all_limited: bool = False
    _in_flight: int = 0
    _running: int = 0
    _per_upstream: dict[int, int] = field(default_factory=dict)
    _waiters: list[_Waiter] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.max_concurrent < 1:
            raise ConfigError("max_concurrent must be at least 1")
        if self.queue_size < 0:
            raise ConfigError("the admission queue size must be >= 0")
        if any(n < 1 for n in self.limits.values()):
            raise ConfigError("an upstream's concurrency limit must be at least 1")

    @property
    def runnable(self) -> int:
        """Upstream requests that can really run at once: ``max_concurrent``, or the sum of
        the upstreams' own limits when every upstream has one and they add up to less (the
        embedded engine alone: 1)."""
        if self.all_limited and self.limits:
            return min(self.max_concurrent, sum(self.limits.values()))
        return self.max_concurrent

    @property
    def capacity(self) -> int:
        """Requests in flight before a 429: what can run plus ``queue_size`` waiting.

        The seed says "the larger of top-level maxConcurrent and the sum of effective
        provider limits, plus 32"; with the effective limits summing to less than
        maxConcurrent, "the larger" would let more than ``queue_size`` wait (the embedded
        engine, ``--queue-size 1``: five admitted, one running). Its other rule, "up to 32
        additional requests wait", is the promise kept here."""
        return self.runnable + self.queue_size

    @property
    def running(self) -> int:
        return self._running

    @property
    def queued(self) -> int:
        return self._in_flight - self._running

    def counts(self) -> tuple[int, int]:
        """``(running, queued)`` for /health and the metrics."""
        return self._running, self.queued

    def reserve(self, now: float) -> Ticket | None:
        """A place in flight for a request arriving at ``now``, or None when full."""
        if self._in_flight >= self.capacity:
            return None
        self._in_flight += 1
        return Ticket(admission=self, arrived_at=now)

    def enqueue(self, ticket: Ticket, upstream: object) -> asyncio.Future[None]:
        """Wait in line for a slot on ``upstream``; the future resolves when it is granted.

        Cancel the future to leave the line (nothing else is needed)."""
        if ticket.released or ticket.running:
            raise RuntimeError("a released or running ticket cannot queue again")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(_Waiter(ticket, upstream, future))
        self._grant()
        return future

    # -- internals -------------------------------------------------------------------------

    def requeue(self, ticket: Ticket, avoid: frozenset[str]) -> asyncio.Future[None]:
        """Give a running ticket's slot back and wait, first in line, for a slot of the same
        pool on a replica not in ``avoid`` (a failover before output, ``routing/pool.py``):
        the request already waited its turn once."""
        upstream = ticket.upstream
        if upstream is None or ticket.released:
            raise RuntimeError("only a running ticket can be requeued")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.insert(0, _Waiter(ticket, upstream, future, avoid))
        self._release_slot(ticket)  # grants: this waiter first
        return future

    def regrant(self) -> None:
        """Capacity may have grown outside a release (a pool's replica came back): start
        every waiter that now fits."""
        self._grant()

    def _fits(self, upstream: object, avoid: frozenset[str] = frozenset()) -> bool:
        if self._running >= self.max_concurrent:
            return False
        limit = self.limits.get(id(upstream))
        if limit is not None and self._per_upstream.get(id(upstream), 0) >= limit:
            return False
        # A pool of replicas (routing/pool.py) has a slot only where a healthy replica has
        # one: a pool at its limits waits here, the one queue, never inside the pool.
        return free_slot(upstream, avoid, self._per_upstream.get(id(upstream), 0))

    def _grant(self) -> None:
        """Start every waiter that fits, oldest first."""
        if self._running >= self.max_concurrent:  # full: nobody fits (O(1) for a long line)
            return
        kept: list[_Waiter] = []
        for i, w in enumerate(self._waiters):
            if self._running >= self.max_concurrent:  # just filled: the rest keep waiting
                kept += self._waiters[i:]
                break
            if w.future.done():  # cancelled while waiting: it just leaves the line
                continue
            if self._fits(w.upstream, w.avoid):
                w.ticket.upstream = w.upstream
                self._running += 1
                self._per_upstream[id(w.upstream)] = self._per_upstream.get(id(w.upstream), 0) + 1
                w.future.set_result(None)
            else:
                kept.append(w)
        self._waiters = kept

    def _release_slot(self, ticket: Ticket) -> None:
        if ticket.upstream is None:
            return
        key = id(ticket.upstream)
        ticket.upstream = None
        self._running -= 1
        self._per_upstream[key] -= 1
        self._grant()

    def _end_place(self, ticket: Ticket) -> None:
        if ticket.place_ended:
            return
        ticket.place_ended = True
        for w in self._waiters:  # still in line: leave it
            if w.ticket is ticket and not w.future.done():
                w.future.cancel()
        self._release_slot(ticket)
        self._in_flight -= 1
        self._grant()

    def _release(self, ticket: Ticket) -> None:
        if ticket.released:
            return
        ticket.released = True
        self._end_place(ticket)
        if ticket.on_release is not None:
            ticket.on_release()


def limits_of(upstreams: Iterable[object]) -> dict[int, int]:
    """Each upstream's own concurrency limit, read from its ``max_concurrent`` attribute or
    its config's (the embedded engine: 1, one generation at a time)."""
    out: dict[int, int] = {}
    for up in upstreams:
        limit = getattr(up, "max_concurrent", None)
        if limit is None:
            limit = getattr(getattr(up, "config", None), "max_concurrent", None)
        if isinstance(limit, int) and limit >= 1:
            out[id(up)] = limit
    return out
