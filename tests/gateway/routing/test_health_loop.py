"""The one active-probe loop (routing/health.py): pools are probed on their own period by
the HealthMonitor's loop, whether /health is polled or not; other upstreams only when
/health is polled. On a looptime clock: no waiting, no timing asserted."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import looptime

from tokenwire.gateway.routing.breaker import Breaker, BreakerState
from tokenwire.gateway.routing.health import HealthMonitor
from tokenwire.gateway.routing.pool import Replica, ReplicaPool
from tokenwire.gateway.upstreams.base import UpstreamHealth, UpstreamState


@dataclass
class Probed:
    name: str
    up: bool = True
    probes: int = 0
    model_id: str = "m"
    kind: str = "openai"

    async def probe(self) -> UpstreamHealth:
        self.probes += 1
        return UpstreamHealth(name=self.name, kind=self.kind,
                              state=UpstreamState.UP if self.up else UpstreamState.DOWN)


def _run(main) -> None:
    with asyncio.Runner(loop_factory=lambda: looptime.new_event_loop(start=0)) as runner:
        runner.run(main())


def test_the_loop_probes_a_pool_on_its_period_and_feeds_its_breakers() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        dead, alive = Probed("p/r1", up=False), Probed("p/r2")
        pool = ReplicaPool("p", "openai", [Replica(name=r.name, adapter=r, breaker=Breaker())
                                           for r in (dead, alive)],
                           probe_interval_s=5.0, clock=loop.time)
        single = Probed("solo")
        mon = HealthMonitor((("p", pool), ("solo", single)), interval=5.0, clock=loop.time)
        mon.start()
        mon.start()  # idempotent: still one loop
        await asyncio.sleep(26.0)
        assert alive.probes == 5  # at 5, 10, 15, 20, 25 s
        assert single.probes == 0  # passive: nobody polled /health
        # Five failed probes in a row: the breaker's threshold ejected the dead replica.
        assert pool.replicas[0].breaker.state is BreakerState.OPEN
        assert dead.probes == 5
        await asyncio.sleep(5.0)  # the next round: the dead one is cooling down, not probed
        assert (dead.probes, alive.probes) == (5, 6)
        # /health probes the passive entry and reads what the loop found for the pool.
        health = await mon.snapshot()
        assert [h.state for h in health] == [UpstreamState.DEGRADED, UpstreamState.UP]
        assert "ejected" in health[0].detail
        assert single.probes == 1 and alive.probes == 6
        await mon.stop()
        await asyncio.sleep(60.0)
        assert alive.probes == 6  # stopped
    _run(main)


def test_without_a_pool_there_is_no_loop_and_health_probes_on_poll() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        single = Probed("solo")
        mon = HealthMonitor((("solo", single),), interval=5.0, clock=loop.time)
        mon.start()
        await asyncio.sleep(30.0)
        assert single.probes == 0
        await mon.snapshot()
        await asyncio.sleep(0.1)
        assert single.probes == 1
    _run(main)


@dataclass
class Hung(Probed):
    """A replica that accepts the probe and never answers (its read timeout is minutes, and
    per read: a server dripping its answer never reaches it)."""

    async def probe(self) -> UpstreamHealth:
        self.probes += 1
        await asyncio.Event().wait()
        raise AssertionError("never answered")


def test_a_probe_that_never_answers_fails_at_its_deadline_and_stalls_nothing() -> None:
    """One hung replica held its probe, and the loop that waits for every probe of a round
    with it: no replica of any pool was probed again (the other pool's alive replica got 1
    probe in 60 s instead of 12) and the hung one was never ejected."""
    async def main() -> None:
        loop = asyncio.get_running_loop()
        hung, alive = Hung("p/r1"), Probed("q/r1")
        pools = [ReplicaPool(n, "openai", [Replica(name=r.name, adapter=r, breaker=Breaker())],
                             probe_interval_s=5.0, clock=loop.time)
                 for n, r in (("p", hung), ("q", alive))]
        mon = HealthMonitor((("p", pools[0]), ("q", pools[1])), interval=5.0, clock=loop.time)
        mon.start()
        await asyncio.sleep(60.0)
        assert alive.probes >= 3
        assert hung.probes >= 3 and pools[0].replicas[0].breaker.consecutive >= 3
        health = await mon.snapshot()
        assert health[0].state is UpstreamState.DOWN and "timed out" in health[0].detail
        await mon.stop()
    _run(main)
