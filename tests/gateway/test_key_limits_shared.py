"""Per-key limits shared by three gateway instances on one real ``redis-server`` (issue 16).

Each instance is its own app, its own ``GatewayState`` and Redis connection pool, served by
its own uvicorn loop on its own port: they share nothing but Redis. The limiter's clock is
pinned (a window never turns during a run, whatever the machine's speed), so the counts are
exact: a key limited to 60 requests a minute, hammered through all three, gets exactly 60
(the shared backend's overshoot for ``rpm`` is 0: one atomic script decides) and 429s for the
rest. Then Redis is killed mid-run: the instances keep answering on local limits (N x the
limit), say so in ``/metrics`` and the log, and share again once Redis is back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator

import httpx
import pytest
import redis

from tests.redis_server import RedisServer
from tokenwire.gateway.http.app import create_app
from tokenwire.gateway.http.security import harden
from tokenwire.gateway.http.state import GatewayState
from tokenwire.gateway.ir import IdsSource
from tokenwire.gateway.routing.router import Router, ServedModel
from tokenwire.gateway.settings import ServerSettings
from tokenwire.gateway.state.api_keys import ApiKey, digest
from tokenwire.gateway.state.config import StateConfig
from tokenwire.gateway.state.key_limiter import KeyLimiter
from tokenwire.gateway.state.limits import KeyLimits

from .conftest import Served, start_server
from .test_key_limits import T0, WAIT_S, Clock, UsageUpstream

SECRET = "sk-shared-0123456789abcdef"
#: Requests sent at once across the instances: enough to race for the last slots.
PARALLEL = 12


class _StateCloser:
    def __init__(self, state: GatewayState) -> None:
        self.state = state

    async def aclose(self) -> None:
        await self.state.aclose_state()


@pytest.fixture
def instances(redis_server: RedisServer) -> Iterator[Callable[..., list[Served]]]:
    """``instances(key, n=3) -> [Served]``: n hardened gateways on ``redis_server``, each
    over its own scripted upstream, their limiters' clocks pinned to ``T0``."""
    started: list[Served] = []

    def start(key: ApiKey, n: int = 3) -> list[Served]:
        for _ in range(n):
            # A generous deadline: the machine is shared; the faults here are kills.
            settings = ServerSettings(named_keys=(key,), auth="keys",
                                      state=StateConfig(url=redis_server.url, timeout_s=5.0))
            upstream = UsageUpstream()
            router = Router([ServedModel(name="scripted", upstream=upstream,
                                         ids_source=IdsSource.NONE, upstream_name="scripted")],
                            default="scripted")
            state = GatewayState(settings=settings, router=router,
                                 limiter=KeyLimiter(clock=Clock(T0)))
            assert state.redis is not None and state.limiter.shared is not None
            served = start_server(state, harden(create_app(state), settings))
            started.append(served)
        return started[-n:]

    yield start
    for s in started:
        s.stop(_StateCloser(s.state))


def hammer(urls: list[str], total: int) -> list[httpx.Response]:
    """``total`` chat requests, round-robin over ``urls``, PARALLEL at a time."""
    async def main() -> list[httpx.Response]:
        gate = asyncio.Semaphore(PARALLEL)
        async with httpx.AsyncClient(timeout=WAIT_S) as client:
            async def one(i: int) -> httpx.Response:
                async with gate:
                    return await client.post(
                        urls[i % len(urls)] + "/v1/chat/completions",
                        headers={"Authorization": f"Bearer {SECRET}"},
                        json={"model": "scripted",
                              "messages": [{"role": "user", "content": "Hi"}]})
            return await asyncio.gather(*(one(i) for i in range(total)))
    return asyncio.run(main())


def scrape(served: Served, name: str) -> float:
    text = httpx.get(served.url + "/metrics", timeout=WAIT_S,
                     headers={"Authorization": f"Bearer {SECRET}"}).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_sixty_a_minute_through_three_instances_is_sixty(instances,
                                                         redis_server: RedisServer) -> None:
    key = ApiKey(name="hammer", sha256=digest(SECRET), limits=KeyLimits(rpm=60))
    gateways = instances(key)
    responses = hammer([g.url for g in gateways], 150)
    statuses = Counter(r.status_code for r in responses)
    assert statuses == {200: 60, 429: 90}  # overshoot 0
    refused = [r for r in responses if r.status_code == 429]
    # 60 counted at the window's start: the first slot is back 61 s later.
    assert {r.headers["retry-after"] for r in refused} == {"61"}
    assert {r.json()["error"]["code"] for r in refused} == {"rate_limit_exceeded"}
    # every instance served some and refused some: the count was shared, not split
    per_instance = [scrape(g, 'tokenwire_key_requests_total{key="hammer"}') for g in gateways]
    assert sum(per_instance) == 60 and all(n > 0 for n in per_instance)
    # rpm only: one Redis round trip per request, none at its end
    assert sum(g.state.redis.calls for g in gateways) == 150
    assert sum(len(g.state.router.models[0].upstream.requests) for g in gateways) == 60


def wait_for(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_tokens_charged_on_one_instance_count_on_the_others(instances,
                                                            redis_server: RedisServer) -> None:
    key = ApiKey(name="tok", sha256=digest(SECRET), limits=KeyLimits(tpm=35))
    gateways = instances(key)
    tokens_key = f"tokenwire:limits:tok:t:{int(T0 // 60)}"
    with redis.Redis.from_url(redis_server.url) as r:
        for i in range(4):  # 0, 10, 20, 30 used before each: room for one more token
            assert hammer([gateways[i % 3].url], 1)[0].status_code == 200
            # the charge's Redis round trip runs as its own task: it may land after the
            # response went out
            wait_for(lambda n=i: int(r.get(tokens_key) or 0) == 10 * (n + 1),
                     "the usage was never charged")
    refused = hammer([g.url for g in gateways], 3)
    assert [r.status_code for r in refused] == [429] * 3
    assert {r.json()["error"]["type"] for r in refused} == {"tokens"}
    # tpm: two round trips per admitted request (decide, charge), one per refused one
    assert sum(g.state.redis.calls for g in gateways) == 2 * 4 + 3


def test_concurrency_is_shared_and_a_stream_cut_gives_its_slot_back(instances) -> None:
    key = ApiKey(name="conc", sha256=digest(SECRET), limits=KeyLimits(max_concurrent=2))
    a, b, c = instances(key)
    auth = {"Authorization": f"Bearer {SECRET}"}
    body = {"model": "scripted", "stream": True,
            "messages": [{"role": "user", "content": "hold on"}]}
    with httpx.Client(timeout=WAIT_S) as client:
        with client.stream("POST", a.url + "/v1/chat/completions", json=body,
                           headers=auth) as held_a, \
                client.stream("POST", b.url + "/v1/chat/completions", json=body,
                              headers=auth) as held_b:
            chunks = [held_a.iter_raw(), held_b.iter_raw()]  # kept: they hold the slots
            assert all(next(it) for it in chunks)
            third = hammer([c.url], 1)[0]
            assert third.status_code == 429 and third.headers["retry-after"] == "1"
            assert "concurrent requests" in third.json()["error"]["message"]
    # both clients left mid-stream: their instances give the leases back in Redis
    wait_for(lambda: hammer([c.url], 1)[0].status_code == 200, "the slots never came back")


def test_redis_killed_mid_run_means_local_limits_then_shared_again(
        instances, redis_server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tokenwire.state")
    key = ApiKey(name="deg", sha256=digest(SECRET), limits=KeyLimits(rpm=5))
    gateways = instances(key)
    urls = [g.url for g in gateways]
    assert Counter(r.status_code for r in hammer(urls, 5)) == {200: 5}
    redis_server.kill()
    # Every instance keeps answering; each enforces the whole limit alone (3 x 5).
    during = hammer(urls, 3 * 7)
    assert Counter(r.status_code for r in during) == {200: 15, 429: 6}
    assert [scrape(g, "tokenwire_key_limits_local_only") for g in gateways] == [1.0] * 3
    assert [scrape(g, "tokenwire_state_up") for g in gateways] == [0.0] * 3
    redis_server.start()  # with its data (AOF): the shared count is still 5 of 5
    deadline = time.monotonic() + WAIT_S  # re-checks come every 0.5-5 s
    for g in gateways:
        while scrape(g, "tokenwire_key_limits_local_only") != 0.0:
            assert time.monotonic() < deadline, "the limits never went back to Redis"
            hammer([g.url], 1)  # a request is what lets the connection re-check
            time.sleep(0.2)
    after = hammer(urls, 3)
    assert Counter(r.status_code for r in after) == {429: 3}  # Redis's count again
    lines = [r.getMessage() for r in caplog.records if "per-key limits" in r.getMessage()]
    assert sum("N x the limit" in m for m in lines) == 3  # one per instance, not per request
    assert sum("shared again" in m for m in lines) == 3
