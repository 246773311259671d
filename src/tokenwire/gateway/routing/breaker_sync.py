"""The Redis side of shared breaker ejections (``shared_breakers.py`` has the decisions).

One :class:`BreakerSync` per gateway process with ``[state]`` and at least one pool. It

* **publishes** this instance's ejections at once: one ``SET key record PX cool-down`` per
  ejection (the pool's ``on_transition`` hook schedules it); one that fails (Redis down or
  slow) is retried on each following sync while its cool-down lasts;
* **reads** every replica's key every ``interval_s``: one pipelined round trip of ``GET`` +
  ``PTTL`` per key, and adopts what other instances published.

No request waits on any of this: choosing a replica reads only the local breakers. When
Redis is unreachable (``StateUnavailable``) the breakers are local-only, exactly as without
``[state]``; the sync resumes by itself when the connection recovers (``redis_conn.py``
re-checks it). Keys: ``<prefix>breaker:<pool>:<replica>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from tokenwire.gateway.routing.breaker import BreakerState
from tokenwire.gateway.routing.pool import Replica, ReplicaPool
from tokenwire.gateway.routing.shared_breakers import (
    DEFAULT_SYNC_INTERVAL_S,
    Ejection,
    adopt,
    ejection_of,
)
from tokenwire.gateway.state.redis_conn import RedisConn, StateUnavailable

__all__ = ["BreakerSync"]

log = logging.getLogger(__name__)


class BreakerSync:
    """Publish this process's ejections, adopt the others' (module docstring)."""

    def __init__(self, conn: RedisConn, pools: Sequence[ReplicaPool], *,
                 interval_s: float = DEFAULT_SYNC_INTERVAL_S, instance_id: str | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.conn, self.pools = conn, tuple(pools)
        self.interval_s = interval_s
        self.instance_id = instance_id or uuid.uuid4().hex[:12]
        self._clock = clock
        #: Ejections not yet written (Redis was down): key -> (ejection, when it was made).
        self._pending: dict[str, tuple[Ejection, float]] = {}
        self._task: asyncio.Task[None] | None = None
        self._publishing: set[asyncio.Task[None]] = set()
        self.published = self.adopted = 0
        #: Round trips that succeeded: the per-request round trips of the other state are
        #: ``tokenwire_state_calls_total`` minus this (README "Deployment: several instances").
        self.round_trips = 0
        for pool in self.pools:
            pool.on_transition = self._hook(pool)

    def key(self, pool: ReplicaPool, replica: Replica) -> str:
        return self.conn.key("breaker", pool.name, replica.name)

    # -- publishing ------------------------------------------------------------------------

    def _hook(self, pool: ReplicaPool) -> Callable[[Replica, BreakerState], None]:
        def on_transition(replica: Replica, before: BreakerState) -> None:
            now = self._clock()
            ejection = ejection_of(replica.breaker, before, now, self.instance_id)
            if ejection is None:
                return
            self._pending[self.key(pool, replica)] = (ejection, now)
            self.start()
            with contextlib.suppress(RuntimeError):  # no running loop: the next sync sends it
                task = asyncio.get_running_loop().create_task(self._flush())
                self._publishing.add(task)
                task.add_done_callback(self._publishing.discard)
        return on_transition

    async def _flush(self) -> None:
        """Write every pending ejection (one pipelined round trip)."""
        now = self._clock()
        due = {k: Ejection(e.cooldown_s - (now - at), e.streak, e.origin)
               for k, (e, at) in self._pending.items()}
        due = {k: e for k, e in due.items() if e.cooldown_s > 0}
        if not due:
            self._pending.clear()
            return

        async def op(r: Any) -> Any:
            pipe = r.pipeline(transaction=False)
            for k, e in due.items():
                pipe.set(k, e.encode(), px=e.ttl_ms)
            return await pipe.execute()

        try:  # SET of the same values: running it twice is running it once
            await self.conn.call(op, idempotent=True)
        except StateUnavailable:
            return  # kept pending; the next sync retries
        self.round_trips += 1
        for k in due:
            self._pending.pop(k, None)
        self.published += len(due)

    # -- reading ---------------------------------------------------------------------------

    async def sync_once(self) -> int:
        """Publish what is pending, then read every replica's key and adopt; returns how
        many breakers changed here."""
        if self._pending:
            await self._flush()
        pairs = [(pool, r) for pool in self.pools for r in pool.replicas]

        async def op(r: Any) -> Any:
            pipe = r.pipeline(transaction=False)
            for pool, replica in pairs:
                k = self.key(pool, replica)
                pipe.get(k)
                pipe.pttl(k)
            # An error reply for one key (WRONGTYPE: a value not ours) is that key's answer,
            # read as no record; raised, it failed every replica's read, every sync.
            return await pipe.execute(raise_on_error=False)

        try:
            answers = await self.conn.call(op, idempotent=True)  # reads
        except StateUnavailable:
            return 0  # local-only until Redis answers again
        self.round_trips += 1
        now, changed = self._clock(), 0
        for i, (pool, replica) in enumerate(pairs):
            raw, pttl = answers[2 * i], answers[2 * i + 1]
            ejection = (None if isinstance(raw, Exception) or isinstance(pttl, Exception)
                        else Ejection.decode(raw, int(pttl)))
            if adopt(replica.breaker, ejection, now, self.instance_id):
                changed += 1
                assert ejection is not None
                log.warning("replica %s of %s: ejected by instance %s for %.1f s more "
                            "(shared breaker)", replica.name, pool.name, ejection.origin,
                            ejection.cooldown_s)
        self.adopted += changed
        return changed

    # -- the loop --------------------------------------------------------------------------

    def start(self) -> None:
        """Start the read loop (idempotent; needs a running event loop)."""
        if self._task is None or self._task.done():
            with contextlib.suppress(RuntimeError):
                self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            try:
                await self.sync_once()
            except Exception as exc:  # a bug here must not end the sharing
                log.error("breaker sync failed: %s", type(exc).__name__)
            await asyncio.sleep(self.interval_s)

    def collector(self) -> Collector:
        """``tokenwire_breaker_sync_round_trips_total`` and ``_adopted_total``."""
        sync = self

        class _Collector(Collector):
            def collect(self) -> Iterable[Metric]:
                trips = CounterMetricFamily(
                    "tokenwire_breaker_sync_round_trips", "Redis round trips of the breaker "
                    "sync that succeeded (publishing ejections, reading the others')")
                trips.add_metric([], sync.round_trips)
                adopted = CounterMetricFamily(
                    "tokenwire_breaker_sync_adopted", "Ejections taken over from other "
                    "gateway instances")
                adopted.add_metric([], sync.adopted)
                return [trips, adopted]

        return _Collector()

    async def aclose(self) -> None:
        tasks = [t for t in (self._task, *self._publishing) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
