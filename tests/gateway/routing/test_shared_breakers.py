"""Shared breaker ejections: the sans-IO decisions (routing/shared_breakers.py) and the sync
layer (routing/breaker_sync.py) over a fake Redis with an injected clock.

The fake stands in for Redis only in these unit tests (GET, PTTL, SET PX in a pipeline);
the sharing between real processes over a real redis-server is
tests/cluster/test_cluster_breakers.py.
"""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from tokenwire.gateway.routing.breaker import Breaker, BreakerPolicy, BreakerState
from tokenwire.gateway.routing.breaker_sync import BreakerSync
from tokenwire.gateway.routing.pool import Replica, ReplicaPool
from tokenwire.gateway.routing.shared_breakers import Ejection, adopt, ejection_of
from tokenwire.gateway.state.config import StateConfig
from tokenwire.gateway.state.redis_conn import RedisConn

POLICY = BreakerPolicy(consecutive_failures=3, base_cooldown_s=10.0, max_cooldown_s=80.0)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class FakeRedis:
    """GET / PTTL / SET PX in pipelines, expiring on the injected clock; ``down`` fails; a
    value that is not a string is another type (GET answers ``WRONGTYPE``, as Redis)."""

    def __init__(self, clock: Clock) -> None:
        self.clock, self.data, self.down, self.round_trips = clock, {}, False, 0

    def pipeline(self, transaction: bool = True) -> FakePipe:
        return FakePipe(self)

    def _live(self, key: str):
        found = self.data.get(key)
        if found is None or found[1] <= self.clock():
            self.data.pop(key, None)
            return None
        return found


class FakePipe:
    def __init__(self, redis: FakeRedis) -> None:
        self.redis, self.ops = redis, []

    def get(self, key: str) -> None:
        def op() -> bytes | None:
            f = self.redis._live(key)
            if f is not None and not isinstance(f[0], str):
                raise ResponseError("WRONGTYPE Operation against a key holding the wrong "
                                    "kind of value")
            return f and f[0].encode()
        self.ops.append(op)

    def pttl(self, key: str) -> None:
        self.ops.append(lambda: -2 if (f := self.redis._live(key)) is None
                        else round((f[1] - self.redis.clock()) * 1000))

    def set(self, key: str, value: str, px: int) -> None:
        def op() -> bool:
            self.redis.data[key] = (value, self.redis.clock() + px / 1000)
            return True
        self.ops.append(op)

    async def execute(self, raise_on_error: bool = True) -> list:
        if self.redis.down:
            raise RedisConnectionError("scripted: redis is down")
        self.redis.round_trips += 1
        answers = []
        for op in self.ops:  # redis-py's: an error reply is raised, or returned in place
            try:
                answers.append(op())
            except ResponseError as exc:
                if raise_on_error:
                    raise
                answers.append(exc)
        return answers


class _Adapter:
    model_id = "m"


def _instance(redis: FakeRedis, clock: Clock, name: str) -> tuple[ReplicaPool, BreakerSync]:
    """One gateway instance's view: its own pool (own breakers) over the shared Redis."""
    pool = ReplicaPool("pool", "openai", [Replica(n, _Adapter(), breaker=Breaker(POLICY))
                                          for n in ("a", "b")], clock=clock)
    conn = RedisConn(StateConfig(url="redis://fake"), client=redis, clock=clock)
    return pool, BreakerSync(conn, [pool], instance_id=name, clock=clock)


def _fail(pool: ReplicaPool, replica: Replica, clock: Clock, times: int) -> None:
    """``times`` failures of real requests, reported the way the pool reports them."""
    for _ in range(times):
        before = replica.breaker.state
        replica.breaker.on_failure(clock(), trial=False)
        if replica.breaker.state is not before:
            pool.on_transition(replica, before)


# -- the decisions -------------------------------------------------------------------------


def test_only_a_transition_into_open_is_published() -> None:
    b, now = Breaker(POLICY), 0.0
    b.on_failure(now, trial=False)
    assert ejection_of(b, BreakerState.CLOSED, now, "me") is None
    for _ in range(2):
        b.on_failure(now, trial=False)
    e = ejection_of(b, BreakerState.CLOSED, now, "me")
    assert e == Ejection(cooldown_s=10.0, streak=1, origin="me") and e.ttl_ms == 10_000
    assert ejection_of(b, BreakerState.OPEN, now, "me") is None  # already open before


def test_an_adopted_ejection_opens_a_closed_breaker_until_the_same_moment() -> None:
    b = Breaker(POLICY)
    assert adopt(b, Ejection(7.5, 2, "other"), 100.0, "me")
    assert b.state is BreakerState.OPEN and b.open_until == 107.5 and b.streak == 2
    assert not b.admits(107.4) and b.admits(107.5)
    assert b.ejections == 0 and b.adopted == 1  # this instance's own count is untouched
    assert not adopt(b, Ejection(1.0, 1, "other"), 100.0, "me")  # an earlier end: no change
    assert adopt(b, Ejection(20.0, 3, "other"), 100.0, "me") and b.open_until == 120.0


def test_an_adopted_ejection_lasts_at_most_this_instance_s_longest_cool_down() -> None:
    """A record with a TTL of a year (set by hand, by another application or by an instance
    with another policy) opened the replica here for the year: an open breaker is not
    probed, so it was gone from every instance until someone deleted the key."""
    b = Breaker(POLICY)
    year = 365 * 24 * 3600.0
    ejection = Ejection.decode(b'{"streak": 1, "by": "other"}', round(year * 1000))
    assert adopt(b, ejection, 100.0, "me")
    assert b.open_until == 100.0 + POLICY.max_cooldown_s
    assert b.admits(100.0 + POLICY.max_cooldown_s)  # half-open: its trial decides


def test_its_own_record_and_a_half_open_breaker_are_left_alone() -> None:
    b = Breaker(POLICY)
    assert not adopt(b, Ejection(5.0, 1, "me"), 0.0, "me")
    b.force_open(0.0)
    assert b.start(10.0)  # the half-open trial is in flight
    assert not adopt(b, Ejection(30.0, 1, "other"), 10.0, "me")
    assert b.state is BreakerState.HALF_OPEN


def test_records_that_are_not_ours_are_ignored() -> None:
    for raw, pttl in ((None, 5000), (b'{"streak":1,"by":"x"}', -2), (b"{", 5000),
                      (b'{"by":"x"}', 5000), (b"x" * 600, 5000), (b'{"streak":1,"by":"x"}', -1),
                      (b'{"streak":Infinity,"by":"x"}', 5000)):
        assert Ejection.decode(raw, pttl) is None
    assert Ejection.decode(b'{"streak":900,"by":"x"}', 1500) == Ejection(1.5, 64, "x")


@given(st.lists(st.tuples(st.sampled_from(["fail", "ok", "adopt", "tick"]),
                          st.floats(0.0, 50.0)), max_size=40))
def test_an_adopted_ejection_never_lets_a_request_through_before_it_ends(steps) -> None:
    b, now, until = Breaker(POLICY), 0.0, 0.0
    for op, x in steps:
        if op == "fail" and b.admits(now):
            b.on_failure(now, trial=b.start(now))
        elif op == "ok" and b.admits(now):
            b.on_success(now, trial=b.start(now))
        elif op == "adopt" and adopt(b, Ejection(x + 0.1, 1, "other"), now, "me"):
            until = max(until, now + x + 0.1)
        elif op == "tick":
            now += x
        if now < until:
            assert not b.admits(now)


# -- the sync layer over a fake Redis ------------------------------------------------------


def test_an_ejection_on_one_instance_is_adopted_by_the_others_on_their_next_sync() -> None:
    async def main() -> None:
        clock = Clock()
        redis = FakeRedis(clock)
        (pa, sa), (pb, sb), (pc, sc) = (_instance(redis, clock, n) for n in "ABC")
        _fail(pa, pa.replicas[0], clock, 3)
        await asyncio.gather(*sa._publishing)  # the immediate publish
        assert sa.published == 1 and "tokenwire:breaker:pool:a" in redis.data
        clock.t += 2.0
        assert await sb.sync_once() == 1 and await sc.sync_once() == 1
        for pool in (pb, pc):
            a = pool.replicas[0].breaker
            assert a.state is BreakerState.OPEN and a.cooldown_left(clock()) == 8.0
            assert pool.replicas[1].breaker.state is BreakerState.CLOSED
        assert await sa.sync_once() == 0  # its own record changes nothing
        assert await sb.sync_once() == 0  # already honoured
        clock.t += 8.0  # the key expired with the cool-down: each runs its own trial
        assert pb.replicas[0].breaker.admits(clock())
        for s in (sa, sb, sc):
            await s.aclose()

    asyncio.run(main())


def test_an_ejection_made_while_redis_is_down_is_published_when_it_returns() -> None:
    async def main() -> None:
        clock = Clock()
        redis = FakeRedis(clock)
        (pa, sa), (pb, sb) = (_instance(redis, clock, n) for n in "AB")
        redis.down = True
        _fail(pa, pa.replicas[1], clock, 3)
        await asyncio.gather(*sa._publishing)
        assert sa.published == 0 and not sa.conn.up
        assert await sb.sync_once() == 0  # degraded: local-only, no wait
        redis.down = False
        clock.t += 4.0  # past the connection's first re-check (0.5 s)
        await sa.sync_once()  # publishes what is pending: the 6 s left, not 10
        assert sa.published == 1
        assert await sb.sync_once() == 1  # its connection's re-check call goes through
        assert sb.conn.up and pb.replicas[1].breaker.cooldown_left(clock()) == 6.0
        for s in (sa, sb):
            await s.aclose()

    asyncio.run(main())


def test_one_round_trip_per_sync_whatever_the_number_of_replicas() -> None:
    async def main() -> None:
        clock = Clock()
        redis = FakeRedis(clock)
        _, sb = _instance(redis, clock, "B")
        for _ in range(5):
            await sb.sync_once()
        assert redis.round_trips == 5 == sb.conn.calls
        await sb.aclose()

    asyncio.run(main())


def test_a_foreign_value_under_one_replica_s_key_never_stops_the_others_syncing() -> None:
    """A hash under ``breaker:pool:b`` (another application, another version): the sync's
    pipelined read raised WRONGTYPE for it, so every sync failed, the connection went
    degraded (every piece of shared state with it, for as long as the key stayed) and
    replica a's ejection by instance A was never adopted."""
    async def main() -> None:
        clock = Clock()
        redis = FakeRedis(clock)
        (pa, sa), (pb, sb) = (_instance(redis, clock, n) for n in "AB")
        redis.data["tokenwire:breaker:pool:b"] = ({"field": "value"}, clock() + 3600)
        _fail(pa, pa.replicas[0], clock, 3)
        await asyncio.gather(*sa._publishing)
        assert await sb.sync_once() == 1
        assert pb.replicas[0].breaker.state is BreakerState.OPEN
        assert pb.replicas[1].breaker.state is BreakerState.CLOSED  # read as no record
        assert sb.conn.up and sb.conn.counts["error"] == 0
        for s in (sa, sb):
            await s.aclose()

    asyncio.run(main())
