"""Per-key limits shared by every instance on one Redis: the decisions of ``limits.py`` in Lua.

Each decision is **one round trip**: one script reads both windows of requests and tokens and
the key's concurrency leases, decides with the same expression as
:func:`~tokenwire.gateway.state.limits.decide`, and counts the request when admitted, all
atomically (Redis runs a script alone), so instances never both take the last slot. The end
of a request is a second round trip, only for keys that need it (``tpm``: charge the real
usage; ``max_concurrent``: give the lease back). A key with only ``rpm`` costs one.

Keys (under the ``[state]`` prefix), each with a TTL so nothing outlives its use:

* ``limits:<name>:r:<window>`` / ``limits:<name>:t:<window>``: requests / tokens counted in one
  60 s window (the index is ``floor(now / 60)``), expiring two windows later;
* ``limits:<name>:c``: a sorted set of concurrency leases, ``<instance>:<n>`` scored by the
  time the lease expires. A running request's lease is renewed by its instance every
  :data:`LEASE_RENEW_S` (one pipeline for all its leases); an instance that dies stops
  renewing, and its leases are dropped by the next decision once they expire
  (:data:`LEASE_TTL_S`), so a dead instance's requests never hold slots for longer.

Time is the instances' wall clocks (``now`` is passed in, as everywhere in ``limits.py``):
instances must be NTP-synchronised; a skew of ``d`` seconds moves a window boundary by ``d``
for one instance, which the sliding estimate turns into at most ``limit * d / 60`` extra
requests per minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from tokenwire.gateway.state.limits import (
    WINDOW_S,
    KeyLimits,
    Limit,
    Verdict,
    WindowCounts,
    decide,
    window_of,
)
from tokenwire.gateway.state.redis_conn import RedisConn, StateUnavailable

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["LEASE_RENEW_S", "LEASE_TTL_S", "RedisLimiter"]

log = logging.getLogger("tokenwire.state")

#: How long a concurrency lease lives without renewal: how long the slots of an instance
#: that died mid-request stay taken. Long enough that a few missed renewals (a Redis restart
#: takes about a second) do not free running requests' slots; short enough that a crashed
#: instance's slots come back within half a minute.
LEASE_TTL_S: Final = 30.0
#: Renewal period: three renewals per TTL, so two may fail before a lease lapses.
LEASE_RENEW_S: Final = LEASE_TTL_S / 3
#: Window counters live for the window they count and the next (where they are the
#: "previous" count), plus a margin for clock skew between instances.
_WINDOW_TTL_S: Final = int(2 * WINDOW_S + 10)
_REFUSALS: Final = {1: Limit.CONCURRENT, 2: Limit.REQUESTS, 3: Limit.TOKENS}

# KEYS: requests current, requests previous, tokens current, tokens previous, leases.
# ARGV: fraction, rpm, tpm, max_concurrent (-1: none), now, lease id, lease expiry, ttl.
# The comparisons are limits.py's, with its EPSILON.
# Returns {verdict (0 admitted, 1 concurrent, 2 requests, 3 tokens), the counts seen:
# requests current, previous, tokens current, previous, leases in flight}.
_ACQUIRE: Final = """
local f = tonumber(ARGV[1])
local rpm, tpm, maxc = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local rc = tonumber(redis.call('GET', KEYS[1]) or '0')
local rp = tonumber(redis.call('GET', KEYS[2]) or '0')
local tc = tonumber(redis.call('GET', KEYS[3]) or '0')
local tp = tonumber(redis.call('GET', KEYS[4]) or '0')
local inflight = 0
if maxc >= 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', ARGV[5])
  inflight = redis.call('ZCARD', KEYS[5])
end
local verdict = 0
if maxc >= 0 and inflight + 1 > maxc then verdict = 1
elseif rpm >= 0 and rp * (1.0 - f) + rc + 1 > rpm + 1e-9 then verdict = 2
elseif tpm >= 0 and tp * (1.0 - f) + tc + 1 > tpm + 1e-9 then verdict = 3
end
if verdict == 0 then
  if rpm >= 0 then
    redis.call('INCR', KEYS[1])
    redis.call('EXPIRE', KEYS[1], ARGV[8])
  end
  if maxc >= 0 then
    redis.call('ZADD', KEYS[5], ARGV[7], ARGV[6])
    redis.call('EXPIRE', KEYS[5], ARGV[8])
  end
end
return {verdict, rc, rp, tc, tp, inflight}
"""

# KEYS: tokens current, leases. ARGV: tokens, lease id ('' : none), ttl.
_RELEASE: Final = """
local n = tonumber(ARGV[1])
if n > 0 then
  redis.call('INCRBY', KEYS[1], n)
  redis.call('EXPIRE', KEYS[1], ARGV[3])
end
if ARGV[2] ~= '' then redis.call('ZREM', KEYS[2], ARGV[2]) end
return 1
"""


def _arg(limit: int | None) -> int:
    return -1 if limit is None else limit


class RedisLimiter:
    """The shared backend: ``acquire`` and ``release`` through the process's
    :class:`~tokenwire.gateway.state.redis_conn.RedisConn` (each raises
    :class:`~tokenwire.gateway.state.redis_conn.StateUnavailable` when Redis cannot be
    used; the caller then decides locally). Leases of running requests are renewed by a
    task started with the first one; :meth:`aclose` stops it."""

    def __init__(self, conn: RedisConn) -> None:
        self.conn = conn
        self.instance = secrets.token_hex(6)  # lease ids: which instance holds them
        self._seq = itertools.count(1)
        #: lease id -> leases key, for renewal.
        self.live: dict[str, str] = {}
        self._scripts: dict[str, Any] = {}
        self._renewer: asyncio.Task[None] | None = None
        self.renewals = 0

    def _keys(self, name: str, index: int) -> list[str]:
        k = self.conn.key
        return [k("limits", name, "r", str(index)), k("limits", name, "r", str(index - 1)),
                k("limits", name, "t", str(index)), k("limits", name, "t", str(index - 1)),
                k("limits", name, "c")]

    def _script(self, client: Redis, which: str) -> Any:
        script = self._scripts.get(which)
        if script is None:  # EVALSHA, with one EVAL the first time a server lacks it
            script = self._scripts[which] = client.register_script(
                _ACQUIRE if which == "acquire" else _RELEASE)
        return script

    async def acquire(self, name: str, limits: KeyLimits, now: float, *,
                      clock: Callable[[], float]) -> tuple[Verdict, str | None]:
        """``(verdict, lease id)``: one round trip. The lease id is set when the key has
        ``max_concurrent`` and the request was admitted."""
        index, fraction = window_of(now)
        keys = self._keys(name, index)
        lease = f"{self.instance}:{next(self._seq)}" if limits.max_concurrent else ""
        args = [repr(fraction), _arg(limits.rpm), _arg(limits.tpm),
                _arg(limits.max_concurrent), repr(now), lease, repr(now + LEASE_TTL_S),
                _WINDOW_TTL_S]

        async def op(client: Redis) -> list[int]:
            return await self._script(client, "acquire")(keys=keys, args=args, client=client)

        raw = await self.conn.call(op)
        code, rc, rp, tc, tp, inflight = (int(x) for x in raw)
        seen = WindowCounts(fraction=fraction, requests=(rp, rc), tokens=(tp, tc),
                            in_flight=inflight)
        verdict = decide(limits, seen)
        refused = _REFUSALS.get(code)
        if refused is not verdict.refused:  # Redis decided: its verdict stands
            log.warning("limits: the Lua and Python decisions differ (%s vs %s)",
                        refused, verdict.refused)
            verdict = Verdict(refused=refused, retry_after=max(verdict.retry_after, 1)
                              if refused else 0)
        if refused is None and lease:
            self.live[lease] = keys[4]
            self._start_renewer(clock)
            return verdict, lease
        return verdict, None

    async def release(self, name: str, tokens: int, now: float, lease: str | None) -> None:
        """Charge ``tokens`` to the window of ``now`` and give ``lease`` back; one round
        trip (none when there is nothing to do)."""
        if lease is not None:
            self.live.pop(lease, None)
        if tokens <= 0 and lease is None:
            return
        index, _ = window_of(now)
        keys = self._keys(name, index)
        args = [max(0, tokens), lease or "", _WINDOW_TTL_S]

        async def op(client: Redis) -> int:
            return await self._script(client, "release")(keys=[keys[2], keys[4]], args=args,
                                                         client=client)

        await self.conn.call(op)

    # -- lease renewal ---------------------------------------------------------------------

    def _start_renewer(self, clock: Callable[[], float]) -> None:
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._renew(clock))

    async def _renew(self, clock: Callable[[], float]) -> None:
        """Every :data:`LEASE_RENEW_S` while leases are live: one pipeline that pushes each
        one's expiry forward (``ZADD XX``: a lease already dropped is not brought back)."""
        while self.live:
            await asyncio.sleep(LEASE_RENEW_S)
            with contextlib.suppress(StateUnavailable):
                await self.renew_now(clock())

    async def renew_now(self, now: float) -> None:
        live = list(self.live.items())
        if not live:
            return
        until = now + LEASE_TTL_S

        async def op(client: Redis) -> list[Any]:
            pipe = client.pipeline(transaction=False)
            for lease, key in live:
                pipe.zadd(key, {lease: until}, xx=True)
            for key in {key for _, key in live}:  # the set itself outlives long requests
                pipe.expire(key, _WINDOW_TTL_S)
            return await pipe.execute()

        await self.conn.call(op, idempotent=True)  # ZADD XX / EXPIRE to fixed times
        self.renewals += 1

    async def aclose(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
            self._renewer = None
