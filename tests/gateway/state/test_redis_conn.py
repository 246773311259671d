"""The one Redis connection (``state/redis_conn.py``): the degraded-mode state machine on a
fake clock, then the real connection against a real ``redis-server`` killed and restarted."""

from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tests.redis_server import RedisServer
from tokenwire.gateway.state.config import StateConfig
from tokenwire.gateway.state.redis_conn import (
    INITIAL_BACKOFF_S,
    MAX_BACKOFF_S,
    LinkHealth,
    RedisConn,
    StateUnavailable,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# -- the sans-IO decisions -------------------------------------------------------------------


def test_up_admits_every_call() -> None:
    h = LinkHealth()
    assert [h.admit(0.0) for _ in range(3)] == ["call"] * 3


def test_a_failure_degrades_and_calls_are_skipped_until_the_recheck() -> None:
    h = LinkHealth()
    assert h.failed(10.0, "call") is True
    assert not h.up
    assert h.admit(10.0) is None
    assert h.admit(10.0 + INITIAL_BACKOFF_S - 0.01) is None
    assert h.admit(10.0 + INITIAL_BACKOFF_S) == "probe"
    # One probe at a time: the others still skip while it runs.
    assert h.admit(10.0 + INITIAL_BACKOFF_S) is None


def test_failed_probes_double_the_backoff_up_to_the_cap() -> None:
    h = LinkHealth()
    h.failed(0.0, "call")
    now, waits = 0.0, []
    for _ in range(8):
        now = h.next_check
        assert h.admit(now) == "probe"
        assert h.failed(now, "probe") is False  # no new transition
        waits.append(h.next_check - now)
    assert waits[:4] == [1.0, 2.0, 4.0, MAX_BACKOFF_S]
    assert set(waits[3:]) == {MAX_BACKOFF_S}


def test_calls_in_flight_when_redis_died_do_not_multiply_the_backoff() -> None:
    h = LinkHealth()
    assert h.failed(0.0, "call") is True
    for _ in range(50):
        assert h.failed(0.0, "call") is False
    assert h.next_check == INITIAL_BACKOFF_S


def test_a_successful_probe_recovers_and_resets_the_backoff() -> None:
    h = LinkHealth()
    h.failed(0.0, "call")
    h.admit(1.0)
    h.failed(1.0, "probe")
    assert h.admit(h.next_check) == "probe"
    assert h.succeeded(h.next_check, "probe") is True
    assert h.up and h.admit(5.0) == "call"
    h.failed(6.0, "call")
    assert h.next_check == 6.0 + INITIAL_BACKOFF_S


def test_an_abandoned_probe_lets_the_next_one_go() -> None:
    h = LinkHealth()
    h.failed(0.0, "call")
    assert h.admit(1.0) == "probe"
    h.abandoned("probe")
    assert h.admit(1.0) == "probe"


# -- the real connection ---------------------------------------------------------------------


def conn_for(server: RedisServer, clock: Clock, **kw: object) -> RedisConn:
    # A generous deadline: the machine is shared and loaded; the fault here is a killed
    # server (refused at once), not a slow one.
    return RedisConn(StateConfig(url=server.url, timeout_s=5.0, **kw), clock=clock)


def test_calls_reach_redis_under_the_prefix(redis_server: RedisServer) -> None:
    async def main() -> None:
        conn = conn_for(redis_server, Clock(), key_prefix="tw-test:")
        key = conn.key("resp", "abc")
        assert key == "tw-test:resp:abc"
        await conn.call(lambda r: r.set(key, b"v"))
        assert await conn.call(lambda r: r.get(key)) == b"v"
        assert conn.calls == 2 and conn.up
        await conn.aclose()
    asyncio.run(main())


def test_kill_degrades_once_skips_without_io_and_recovers(
        redis_server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tokenwire.state")
    clock = Clock()

    async def main() -> None:
        conn = conn_for(redis_server, clock)
        assert await conn.check()
        redis_server.kill()
        with pytest.raises(StateUnavailable) as failed:
            await conn.call(lambda r: r.get("k"))
        assert not failed.value.skipped and not conn.up
        sent = conn.calls
        for _ in range(20):  # known down: no round trip at all
            with pytest.raises(StateUnavailable) as skipped:
                await conn.call(lambda r: r.get("k"))
            assert skipped.value.skipped
        assert conn.calls == sent and conn.counts["skipped"] == 20
        redis_server.start()
        assert not await conn.check()  # the re-check is not due yet: still skipped
        clock.now += INITIAL_BACKOFF_S
        assert await conn.check()  # the probe finds it back
        assert await conn.call(lambda r: r.ping())
        snap = conn.snapshot()
        assert snap["state"] == "up" and snap["url"] == redis_server.url
        await conn.aclose()

    asyncio.run(main())
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "tokenwire.state"]
    assert [lvl for lvl, _ in lines] == ["WARNING", "WARNING"], lines
    assert "degraded" in lines[0][1] and "recovered" in lines[1][1]


def test_metrics_and_health_name_the_state_without_the_password(tmp_path) -> None:
    server = RedisServer(tmp_path / "r", password="s3cret-pw")
    with server:
        async def main() -> tuple[bytes, dict]:
            conn = RedisConn(StateConfig(url=server.url, timeout_s=5.0), clock=Clock())
            await conn.check()
            registry = CollectorRegistry()
            registry.register(conn.collector())
            up = generate_latest(registry)
            server.kill()
            await conn.check()
            down = conn.snapshot()
            await conn.aclose()
            return up + generate_latest(registry), down
        text, snap = asyncio.run(main())
    assert b"tokenwire_state_up 1.0" in text and b"tokenwire_state_up 0.0" in text
    assert b'tokenwire_state_calls_total{outcome="ok"} 1.0' in text
    assert snap["state"] == "degraded" and "s3cret-pw" not in str(snap)
    assert snap["url"] == f"redis://:***@127.0.0.1:{server.port}/0"


def test_password_from_password_env_authenticates(tmp_path) -> None:
    from tokenwire.gateway.state.config import resolve_state
    server = RedisServer(tmp_path / "r", password="pw-from-env")
    with server:
        url = f"redis://127.0.0.1:{server.port}/0"
        cfg = resolve_state({"url": url, "password_env": "TW_STATE_PW"},
                            env={"TW_STATE_PW": "pw-from-env"})
        wrong = resolve_state({"url": url, "password_env": "TW_STATE_PW"},
                              env={"TW_STATE_PW": "nope"})

        async def main() -> tuple[bool, bool]:
            good, bad = RedisConn(cfg, clock=Clock()), RedisConn(wrong, clock=Clock())
            try:
                return await good.check(), await bad.check()
            finally:
                await good.aclose()
                await bad.aclose()
        assert asyncio.run(main()) == (True, False)


def test_a_hung_redis_costs_one_deadline_then_nothing(redis_server: RedisServer) -> None:
    """SIGSTOP: the server accepts nothing and answers nothing (a partition). The call ends
    at its deadline (a StateUnavailable, not a hang), and later calls skip."""
    import os
    import signal
    clock = Clock()

    async def main() -> None:
        conn = RedisConn(StateConfig(url=redis_server.url, timeout_s=0.5), clock=clock)
        while not await conn.check():  # connected first (a loaded machine may need tries)
            clock.now += MAX_BACKOFF_S  # the re-check is due at once: no waiting
        assert conn.up
        assert redis_server.process is not None
        os.kill(redis_server.process.pid, signal.SIGSTOP)
        try:
            with pytest.raises(StateUnavailable):
                await asyncio.wait_for(conn.call(lambda r: r.get("k")), 60)
            with pytest.raises(StateUnavailable) as skipped:
                await conn.call(lambda r: r.get("k"))
            assert skipped.value.skipped
        finally:
            os.kill(redis_server.process.pid, signal.SIGCONT)
        await conn.aclose()
    asyncio.run(main())
