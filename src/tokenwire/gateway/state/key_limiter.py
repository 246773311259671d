"""The per-key limiter a gateway uses: Redis when ``[state]`` names one, else this process.

:meth:`KeyLimiter.acquire` decides before any upstream work and returns a :class:`Lease`;
:meth:`KeyLimiter.release` ends it however the request ended (completed, failed, client gone)
and charges the tokens its usage reported. Release is synchronous for the caller: the local
counts move at once and the Redis round trip runs as its own task, so a cancelled request
(a client that disconnected) still gives its slot back.

**Degraded mode**: when Redis cannot be used (:class:`StateUnavailable`: down, over its
deadline, or known degraded), each decision falls back to :class:`LocalLimiter`: every
instance then enforces each key's whole limit on its own, so N instances admit up to N x the
limit until Redis answers again; requests are never refused or delayed because Redis is
gone. The switch is logged once each way and shown by ``tokenwire_key_limits_local_only``.
Counts made locally are not copied to Redis on recovery, and leases taken on Redis whose
release failed expire there within ``LEASE_TTL_S`` (slots come back, never leak).

**One key's counters unreadable** (:class:`StateDataError`: a value that is not ours under
one of its Redis keys, from another application or version): that key's requests are
decided locally, as in degraded mode, while every other key stays shared; logged once each
way per key, counted as ``tokenwire_state_calls_total{outcome="data_error"}``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tokenwire.gateway.state.api_keys import ApiKey
from tokenwire.gateway.state.limits import LocalLimiter, Verdict
from tokenwire.gateway.state.limits_redis import RedisLimiter
from tokenwire.gateway.state.redis_conn import RedisConn, StateDataError, StateUnavailable

__all__ = ["KeyLimiter", "Lease"]

log = logging.getLogger("tokenwire.state")
_ADMITTED = Verdict(refused=None)


@dataclass(eq=False)
class Lease:
    """One admitted request of ``key``. ``usage`` is set by whoever learns the request's
    usage (``http/state.py`` points it at the request's record, whose ``charged_tokens()``
    is read at release); ``shared`` says which backend counted it."""

    key: ApiKey
    shared: bool = False
    lease_id: str | None = None
    usage: Any = None
    released: bool = field(default=False, repr=False)

    def tokens(self) -> int:
        usage = self.usage
        if usage is None:
            return 0
        try:
            return max(0, int(usage.charged_tokens()))
        except Exception:  # the record never raises; a foreign object must not fail a release
            return 0


class KeyLimiter:
    """Decisions for every key of one gateway process. ``conn``: the process's Redis
    connection (``None``: limits are this process's alone). ``clock``: wall-clock seconds,
    the same on every instance (tests pin it)."""

    def __init__(self, conn: RedisConn | None = None, *,
                 clock: Callable[[], float] = time.time,
                 on_mode: Callable[[bool], None] | None = None) -> None:
        self.local = LocalLimiter()
        self.shared = RedisLimiter(conn) if conn is not None else None
        self.clock = clock
        #: True while decisions fall back to local counts (Redis unreachable).
        self.local_only = False
        #: Told of each switch (True: local only); the per-key metrics' gauge.
        self.on_mode = on_mode
        self._tasks: set[asyncio.Task[None]] = set()
        #: Names of the keys whose Redis counters are unreadable (decided locally).
        self.unreadable: set[str] = set()

    async def acquire(self, key: ApiKey) -> tuple[Verdict, Lease | None]:
        """The decision for one request of ``key`` and, when admitted, its lease."""
        limits = key.limits
        if not limits.any:
            return _ADMITTED, Lease(key)
        now = self.clock()
        if self.shared is not None:
            try:
                verdict, lease_id = await self.shared.acquire(key.name, limits, now,
                                                              clock=self.clock)
            except StateDataError as exc:
                # Redis answers: only this key's counters are not ours. Flipping the whole
                # limiter to local-only here flapped it on every other key's next success.
                self._set_unreadable(key.name, True, exc)
            except StateUnavailable:
                self._set_local_only(True)
            else:
                self._set_local_only(False)
                self._set_unreadable(key.name, False)
                return verdict, (Lease(key, shared=True, lease_id=lease_id)
                                 if verdict.admitted else None)
        verdict = self.local.acquire(key.name, limits, now)
        return verdict, Lease(key) if verdict.admitted else None

    def release(self, lease: Lease, tokens: int) -> None:
        """The request of ``lease`` ended, having used ``tokens`` (:meth:`Lease.tokens`);
        idempotent."""
        if lease.released:
            return
        lease.released = True
        limits = lease.key.limits
        if not limits.any:
            return
        tokens = tokens if limits.tpm is not None else 0
        now = self.clock()
        if not lease.shared:
            self.local.release(lease.key.name, tokens, now)
            return
        assert self.shared is not None
        if tokens <= 0 and lease.lease_id is None:
            return  # rpm only: nothing to give back
        task = asyncio.get_running_loop().create_task(
            self._release_shared(lease.key.name, tokens, now, lease.lease_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _release_shared(self, name: str, tokens: int, now: float,
                              lease_id: str | None) -> None:
        assert self.shared is not None
        try:
            await self.shared.release(name, tokens, now, lease_id)
        except StateUnavailable:
            # The lease expires in Redis by itself; the tokens of this one request are not
            # counted there (logged once per degraded period by the connection).
            pass

    def _set_local_only(self, value: bool) -> None:
        if value == self.local_only:
            return
        self.local_only = value
        if value:
            log.warning("per-key limits: Redis is unreachable; each instance now enforces "
                        "every key's limits on its own (N instances admit up to N x the "
                        "limit) until it answers again")
        else:
            log.info("per-key limits: Redis answers again; limits are shared again")
        if self.on_mode is not None:
            self.on_mode(value)

    def _set_unreadable(self, name: str, value: bool, exc: Exception | None = None) -> None:
        if value == (name in self.unreadable):
            return
        if value:
            self.unreadable.add(name)
            log.warning("per-key limits of key %r: its counters in Redis are not values of "
                        "ours (%s); this instance enforces its limits on its own (N instances "
                        "admit up to N x the limit) until they read again; delete the keys "
                        "under the prefix's limits:%s: to reset them", name, exc, name)
        else:
            self.unreadable.discard(name)
            log.info("per-key limits of key %r: its counters in Redis read again; its limits "
                     "are shared again", name)

    async def drain(self) -> None:
        """Wait for the Redis releases still under way (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def aclose(self) -> None:
        await self.drain()
        if self.shared is not None:
            await self.shared.aclose()
