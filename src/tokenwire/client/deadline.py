"""A whole request's deadline, for a server that never stops sending slowly.

httpx's timeouts bound each wait (a connect, one read), so a server that sends a byte just
inside the read timeout, for ever, keeps the client for ever (a ``max_decompressed`` body at
one byte a minute is decades). A :class:`Deadline` bounds one ``stream()`` / ``complete()``
call as a whole: the discovery GETs, the POST and the whole body.

* before each HTTP request it is checked, and the request's httpx timeouts (connect, read,
  write, pool) are cut to the time left, so no single wait outlasts it;
* every chunk read (discovery bodies, error bodies, the stream) checks it;
* an httpx error after it passed (a read cut short by the timeout above) is reported as
  the deadline, :class:`~tokenwire.errors.CodecDeadlineExceeded`, not as a transport fault.

A read already waiting when the deadline passes ends at its own timeout, which was cut to
what was left when its request started: the sync client ends at most one read timeout (60 s
by default) after the deadline, however the server paces its bytes, and not at all while a
server sends endless ``100 Continue`` heads (httpx reads them inside one call). The async
client also runs each await under :meth:`Deadline.cancelling`, so it ends at the deadline
itself, whatever the server does.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager

import anyio
import httpx

from tokenwire.errors import CodecDeadlineExceeded

__all__ = ["DEFAULT_DEADLINE_S", "NO_DEADLINE", "Deadline"]

#: A whole request's default bound: a tokenwire gateway ends any request after an hour
#: (its ``request_cap_s``), so a server still sending after that is not one of ours.
DEFAULT_DEADLINE_S = 3600.0


class Deadline:
    """``seconds`` from now (``None``: no deadline, every method is a no-op)."""

    __slots__ = ("_at", "seconds")

    def __init__(self, seconds: float | None) -> None:
        if seconds is not None and not seconds > 0:
            raise ValueError(f"a deadline must be a positive number of seconds, got {seconds!r}")
        self.seconds = seconds
        self._at = None if seconds is None else time.monotonic() + seconds

    def left(self) -> float | None:
        return None if self._at is None else self._at - time.monotonic()

    def check(self) -> None:
        """Raise :class:`CodecDeadlineExceeded` once the deadline has passed."""
        left = self.left()
        if left is not None and left <= 0:
            raise CodecDeadlineExceeded(
                f"the request took longer than its deadline of {self.seconds:g} s "
                "(the client's deadline)")

    def timeout(self, base: httpx.Timeout) -> httpx.Timeout:
        """``base`` with each wait cut to the time left (checked first)."""
        self.check()
        left = self.left()
        if left is None or left == math.inf:  # (an infinite wait is no socket timeout)
            return base

        def cut(wait: float | None) -> float:
            return left if wait is None else min(wait, left)

        return httpx.Timeout(connect=cut(base.connect), read=cut(base.read),
                             write=cut(base.write), pool=cut(base.pool))

    @contextmanager
    def cancelling(self) -> Iterator[None]:
        """(In async code, around awaits that yield nothing to a caller.) Cancel what runs
        inside when the deadline passes, and raise :class:`CodecDeadlineExceeded`."""
        left = self.left()
        if left is None or left == math.inf:
            yield
            return
        try:
            with anyio.fail_after(max(left, 0.0)):
                yield
        except TimeoutError:
            self.check()
            raise


#: The deadline of a call made without one (the module functions' default).
NO_DEADLINE = Deadline(None)
