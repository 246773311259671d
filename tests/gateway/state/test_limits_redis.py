"""Per-key limits on a real ``redis-server`` (gateway/state/limits_redis.py, key_limiter.py):
the Lua decisions against the Python ones, leases of a dead instance, round trips, and the
fall back to local limits while Redis is gone."""

from __future__ import annotations

import asyncio
import logging
import random
import time

import pytest

from tests.redis_server import RedisServer
from tokenwire.gateway.state.api_keys import ApiKey, digest
from tokenwire.gateway.state.config import StateConfig
from tokenwire.gateway.state.key_limiter import KeyLimiter
from tokenwire.gateway.state.limits import WINDOW_S, KeyLimits, Limit, WindowCounts, decide
from tokenwire.gateway.state.limits_redis import LEASE_TTL_S, RedisLimiter
from tokenwire.gateway.state.redis_conn import INITIAL_BACKOFF_S, RedisConn

T0 = 1_000 * WINDOW_S


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def conn_for(server: RedisServer, clock: Clock | None = None) -> RedisConn:
    # A generous deadline: the machine is shared; the faults here are kills, not slowness.
    extra = {"clock": clock} if clock is not None else {}
    return RedisConn(StateConfig(url=server.url, timeout_s=5.0), **extra)


def key(name: str, **limits: int) -> ApiKey:
    return ApiKey(name=name, sha256=digest(name), limits=KeyLimits(**limits))


def test_the_lua_decision_is_the_python_decision(redis_server: RedisServer) -> None:
    """Random window counts written straight into Redis; each script verdict, and the
    counts it saw, must be what ``limits.decide`` says for them."""
    rng = random.Random(16)

    async def main() -> None:
        conn = conn_for(redis_server)
        lim = RedisLimiter(conn)
        for i in range(150):
            limits = KeyLimits(rpm=rng.randint(1, 40), tpm=rng.choice([None, 50, 500]))
            rp, rc, tp, tc = (rng.randint(0, 60) for _ in range(4))
            now = T0 + i * WINDOW_S + rng.uniform(0, WINDOW_S - 0.001)
            index = int(now // WINDOW_S)
            name = f"k{i}"
            counts = {conn.key("limits", name, kind, str(index + back)): n
                      for kind, prev, cur in (("r", rp, rc), ("t", tp, tc))
                      for back, n in ((-1, prev), (0, cur))}
            await conn.call(lambda r, c=counts: r.mset(c))
            verdict, _ = await lim.acquire(name, limits, now, clock=time.time)
            fraction = now / WINDOW_S - index
            want = decide(limits, WindowCounts(fraction=fraction, requests=(rp, rc),
                                               tokens=(tp, tc)))
            assert verdict == want, (limits, rp, rc, tp, tc, fraction)
        await conn.aclose()

    asyncio.run(main())


def test_two_instances_share_one_count_and_one_round_trip_decides(
        redis_server: RedisServer) -> None:
    async def main() -> None:
        conns = [conn_for(redis_server) for _ in range(2)]
        a, b = (KeyLimiter(c, clock=Clock(T0)) for c in conns)
        k = key("shared", rpm=5)
        admitted = []
        for i in range(12):
            verdict, lease = await (a if i % 2 else b).acquire(k)
            admitted.append(verdict.admitted)
            if lease is not None:
                (a if i % 2 else b).release(lease, 0)
        assert admitted.count(True) == 5 and not any(admitted[5:])
        # rpm only: one round trip per decision, none at the end
        assert sum(c.calls for c in conns) == 12
        for c in conns:
            await c.aclose()

    asyncio.run(main())


def test_a_dead_instance_leases_expire_and_a_live_one_renews(redis_server: RedisServer) -> None:
    async def main() -> None:
        conn = conn_for(redis_server)
        dead, live, other = RedisLimiter(conn), RedisLimiter(conn), RedisLimiter(conn)
        limits = KeyLimits(max_concurrent=2)
        (v1, l1), (v2, l2) = [await x.acquire("c", limits, T0, clock=lambda: T0)
                              for x in (dead, live)]
        assert v1.admitted and v2.admitted and l1 and l2
        refused, _ = await other.acquire("c", limits, T0 + 1, clock=lambda: T0)
        assert refused.refused is Limit.CONCURRENT
        # "dead" never renews nor releases; "live" renews before the TTL runs out
        await live.renew_now(T0 + LEASE_TTL_S - 1)
        later = T0 + LEASE_TTL_S + 1
        v3, _ = await other.acquire("c", limits, later, clock=lambda: later)
        assert v3.admitted  # the dead instance's slot came back
        v4, _ = await other.acquire("c", limits, later, clock=lambda: later)
        assert v4.refused is Limit.CONCURRENT  # the live instance still holds its slot
        await live.release("c", 0, later, l2)
        v5, _ = await other.acquire("c", limits, later, clock=lambda: later)
        assert v5.admitted
        for x in (dead, live, other):
            await x.aclose()
        await conn.aclose()

    asyncio.run(main())


def test_tokens_are_charged_in_redis_at_release(redis_server: RedisServer) -> None:
    async def main() -> None:
        conn = conn_for(redis_server)
        lim = KeyLimiter(conn, clock=Clock(T0))
        k = key("tok", tpm=100)

        class Usage:
            def charged_tokens(self) -> int:
                return 120

        verdict, lease = await lim.acquire(k)
        assert verdict.admitted and lease is not None
        lease.usage = Usage()
        before = conn.calls
        lim.release(lease, lease.tokens())
        await lim.drain()
        assert conn.calls == before + 1  # tpm: one round trip to charge
        refused, _ = await lim.acquire(k)
        assert refused.refused is Limit.TOKENS and refused.retry_after > 60
        await lim.aclose()
        await conn.aclose()

    asyncio.run(main())


def test_redis_killed_falls_back_to_local_limits_then_shares_again(
        redis_server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tokenwire.state")
    link = Clock(0.0)  # the connection's backoff clock

    async def main() -> None:
        conn = conn_for(redis_server, link)
        modes: list[bool] = []
        lim = KeyLimiter(conn, clock=Clock(T0), on_mode=modes.append)
        k = key("deg", rpm=3)
        assert [(await lim.acquire(k))[0].admitted for _ in range(2)] == [True, True]
        redis_server.kill()
        # Local counts start empty: this instance alone now admits the whole limit.
        local = [(await lim.acquire(k))[0].admitted for _ in range(4)]
        assert local == [True, True, True, False] and lim.local_only and modes == [True]
        redis_server.start()  # AOF: the shared count (2) survived
        link.now += INITIAL_BACKOFF_S
        verdict, _ = await lim.acquire(k)
        assert verdict.admitted and not lim.local_only and modes == [True, False]
        verdict, _ = await lim.acquire(k)
        assert verdict.refused is Limit.REQUESTS  # the shared count again: 3 of 3
        await lim.aclose()
        await conn.aclose()

    asyncio.run(main())
    lines = [r.getMessage() for r in caplog.records if "per-key limits" in r.getMessage()]
    assert len(lines) == 2 and "N x the limit" in lines[0] and "shared again" in lines[1]


def test_one_key_s_foreign_counters_leave_every_other_key_shared(
        redis_server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """A string under one key's lease set and garbage in its request counter (another
    application or version under the prefix): the scripts' WRONGTYPE / arithmetic errors
    made the whole connection degraded, so every key, and the response store, went
    local-only or unavailable, for good while the value stayed ("Redis is unreachable" while
    it answered). Now that key alone is decided locally and says so once; the others stay
    shared and the connection up."""
    caplog.set_level(logging.INFO, logger="tokenwire.state")

    async def main() -> None:
        conn = conn_for(redis_server, Clock(0.0))
        modes: list[bool] = []
        lim = KeyLimiter(conn, clock=Clock(T0), on_mode=modes.append)
        bad, good = key("bad", rpm=2, max_concurrent=5), key("good", rpm=2)
        index = int(T0 // WINDOW_S)
        await conn.call(lambda r: r.set(conn.key("limits", "bad", "c"), "not a sorted set"))
        await conn.call(lambda r: r.set(conn.key("limits", "bad", "r", str(index)), "junk"))
        # Still limited, locally: 2 a minute on this instance.
        got = [(await lim.acquire(bad))[0].admitted for _ in range(3)]
        assert got == [True, True, False] and lim.unreadable == {"bad"}
        assert [(await lim.acquire(good))[0].admitted for _ in range(3)] == [True, True, False]
        assert conn.up and not lim.local_only and modes == []
        assert await conn.call(lambda r: r.get(conn.key("limits", "good", "r", str(index))))
        assert conn.counts["data_error"] == 3 and conn.snapshot()["data_errors"] == 3
        await conn.call(lambda r: r.delete(conn.key("limits", "bad", "c"),
                                           conn.key("limits", "bad", "r", str(index))))
        assert (await lim.acquire(bad))[0].admitted and lim.unreadable == set()
        await lim.aclose()
        await conn.aclose()

    asyncio.run(main())
    lines = [r.getMessage() for r in caplog.records if r.name == "tokenwire.state"]
    # One line from the connection (the first refusal), one each way for the key.
    assert len(lines) == 3, lines
    assert "refused a value under the key prefix" in lines[0]
    assert "'bad'" in lines[1] and "N x the limit" in lines[1] and "read again" in lines[2]
