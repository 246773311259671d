"""The one Redis connection (``state/redis_conn.py``): the degraded-mode state machine on a
fake clock, then the real connection against a real ``redis-server`` killed and restarted."""

from __future__ import annotations

import asyncio
import contextlib
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
    StateDataError,
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


def test_a_probe_that_fails_after_a_late_call_succeeded_still_lets_the_next_one_go() -> None:
    # With a deadline longer than the first re-check (timeout_ms may be up to 5 s), a call
    # sent while Redis was up can still be running when the probe goes: it answers (up
    # again), then the probe fails (degraded again). The probe's slot must be free, or no
    # call and no probe is ever admitted again: degraded for good, with Redis back.
    h = LinkHealth()
    assert h.admit(0.0) == "call"  # slow, still in flight
    assert h.failed(0.1, "call") is True  # another call fails: degraded
    assert h.admit(0.1 + INITIAL_BACKOFF_S) == "probe"
    assert h.succeeded(1.0, "call") is True  # the slow call answers: up
    assert h.failed(1.1, "probe") is True  # the probe fails: degraded again
    assert h.admit(1.1 + INITIAL_BACKOFF_S) == "probe"
    assert h.succeeded(1.1 + INITIAL_BACKOFF_S, "probe") is True
    assert h.up


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


# -- the retry: only where it cannot count twice ---------------------------------------------


class CuttingProxy:
    """A TCP proxy in front of a real Redis that can cut a connection at a chosen moment:
    ``cut_after_write`` lets Redis receive and run the next command, then closes the client
    side instead of passing the reply on (a reply lost in a network fault); ``reset_idle``
    resets every open client connection with an RST (a pooled socket gone stale)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.cut_after_write = False
        self.clients: list[asyncio.StreamWriter] = []
        self.handlers: set[asyncio.Task] = set()
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"redis://127.0.0.1:{port}/0"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.clients:
            writer.close()
        await asyncio.gather(*self.handlers, return_exceptions=True)
        await self.server.wait_closed()

    def reset_idle(self) -> None:
        import socket
        import struct
        for writer in self.clients:
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        self.clients.clear()

    async def _serve(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter):
        self.clients.append(cwriter)
        self.handlers.add(asyncio.current_task())  # type: ignore[arg-type]
        sreader, swriter = await asyncio.open_connection("127.0.0.1", self.target_port)

        async def up() -> None:
            while data := await creader.read(65536):
                swriter.write(data)
                await swriter.drain()

        async def down() -> None:
            while data := await sreader.read(65536):
                if self.cut_after_write:  # Redis ran it and answered: the answer is lost
                    self.cut_after_write = False
                    cwriter.close()
                    return
                cwriter.write(data)
                await cwriter.drain()

        tasks = [asyncio.ensure_future(up()), asyncio.ensure_future(down())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for writer in (swriter, cwriter):
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()


async def _counter(server: RedisServer) -> int:
    import redis.asyncio as aioredis
    direct = aioredis.Redis.from_url(server.url)
    try:
        return int(await direct.get("n") or 0)
    finally:
        await direct.aclose()


def test_a_lost_reply_is_not_resent_so_incr_counts_once(redis_server: RedisServer) -> None:
    """The reviewer's case: INCR reached Redis and ran, its reply was lost. Resending it on a
    fresh connection (redis-py's retry did) would count 2."""
    async def main() -> None:
        proxy = CuttingProxy(redis_server.port)
        async with proxy as url:
            conn = RedisConn(StateConfig(url=url, timeout_s=5.0), clock=Clock())
            assert await conn.check()
            proxy.cut_after_write = True
            with pytest.raises(StateUnavailable):
                await conn.call(lambda r: r.incr("n"))
            assert await _counter(redis_server) == 1
            await conn.aclose()
    asyncio.run(main())


def test_a_lost_reply_of_an_idempotent_call_is_resent(redis_server: RedisServer) -> None:
    async def main() -> None:
        proxy = CuttingProxy(redis_server.port)
        async with proxy as url:
            conn = RedisConn(StateConfig(url=url, timeout_s=5.0), clock=Clock())
            await conn.call(lambda r: r.set("n", 7))
            proxy.cut_after_write = True
            assert await conn.call(lambda r: r.get("n"), idempotent=True) == b"7"
            assert conn.up and conn.counts["error"] == 0
            await conn.aclose()
    asyncio.run(main())


def test_a_reset_pooled_socket_is_retried_on_a_fresh_one(redis_server: RedisServer) -> None:
    """The reason the retry exists: a pooled socket that died while idle (reset) fails the
    send before any byte goes; the call goes once more on a new connection, counted once."""
    async def main() -> None:
        proxy = CuttingProxy(redis_server.port)
        async with proxy as url:
            conn = RedisConn(StateConfig(url=url, timeout_s=5.0), clock=Clock())
            assert await conn.check()
            proxy.reset_idle()  # on loopback the RST is in the client's socket at once
            assert await conn.call(lambda r: r.incr("n")) == 1
            assert conn.up and conn.counts["error"] == 0
            assert await _counter(redis_server) == 1
            await conn.aclose()
    asyncio.run(main())


def test_a_server_refusal_inside_a_script_degrades_and_a_value_error_does_not(
        redis_server: RedisServer) -> None:
    """A reply with an error code of its own is about the server whether a command or a
    script's ``redis.call`` met it: ``NOREPLICAS`` (a primary that lost the replicas
    ``min-replicas-to-write`` asks for; ``MISCONF`` is the same case, a failed save) makes
    the connection degraded, as the plain command's reply does. Inside a script, Redis
    appends "script: ..., on @user_script:1." to it, and it was read as a value that is not
    ours: the connection stayed up, the store reported every write as refused by a foreign
    value and the limiter marked key after key unreadable, each with a warning to delete
    its counters. A script's error on a value (an ``ERR`` reply) is still a data error."""
    script = "return redis.call('SET', KEYS[1], 'v')"

    async def main() -> None:
        conn = conn_for(redis_server, Clock())
        await conn.call(lambda r: r.set(conn.key("s"), b"not a number"))
        with pytest.raises(StateDataError):  # a script's arithmetic on a foreign value
            await conn.call(lambda r: r.eval("return redis.call('INCR', KEYS[1])", 1,
                                             conn.key("s")))
        assert conn.up and conn.counts["data_error"] == 1
        await conn.call(lambda r: r.config_set("min-replicas-to-write", 1))
        try:
            with pytest.raises(StateUnavailable) as refused:
                await conn.call(lambda r: r.eval(script, 1, conn.key("k")))
            assert not isinstance(refused.value, StateDataError)
            assert not conn.up and conn.counts["data_error"] == 1
            assert conn.last_error is not None and "NOREPLICAS" in conn.last_error
        finally:
            conn.health.up = True  # to undo the setting through the same connection
            await conn.call(lambda r: r.config_set("min-replicas-to-write", 0))
            await conn.aclose()
    asyncio.run(main())


def test_a_probe_whose_operation_raises_something_else_frees_the_probe(
        redis_server: RedisServer) -> None:
    """The probe's slot is freed whatever its call raises: an operation that fails with an
    error that is not Redis's (a caller's bug: an infinite TTL's OverflowError did, before
    the breaker's cool-down was bounded) says nothing about Redis. Left taken, the
    connection was degraded for good: no call and no probe was ever admitted again."""
    clock = Clock()

    async def main() -> None:
        conn = conn_for(redis_server, clock)
        conn.health.failed(clock.now, "call")  # degraded; the re-check is due below
        clock.now += INITIAL_BACKOFF_S

        async def broken(client: object) -> None:
            raise OverflowError("cannot convert float infinity to integer")

        with pytest.raises(OverflowError):
            await conn.call(broken)
        assert await conn.check()  # the next re-check goes, and finds Redis up
        await conn.aclose()
    asyncio.run(main())
