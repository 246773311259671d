"""Heartbeats, the idle timeout, the capacity queue and client disconnects, in loop time.

Issue 6 item 2 and 3: a heartbeat every 15 s of silence (``response.in_progress`` on
Responses, an SSE comment on Chat, an empty-ids frame on Codec), including while queued;
silence past ``idle_timeout_s`` fails the request; a full gateway answers 429 with
``Retry-After: 1`` before it reads the body; a client that hangs up aborts the upstream
request and frees its slot. Every time here is the looptime loop's clock.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from tokenwire.gateway.settings import ServerSettings

from .harness import APIS, Env, Outcome, environment, run_in_looptime, send
from .scripted_upstream import Fault
from .table import TEXT

#: Loop-time slack: events land on the loop's ticks, a few milliseconds after their timer.
SLACK_S = 0.1


def _settings(**kw: float | int) -> ServerSettings:
    return dataclasses.replace(ServerSettings(), **kw)


def _near(times: list[float], expected: list[float]) -> bool:
    return len(times) == len(expected) and all(
        abs(t - e) <= SLACK_S for t, e in zip(times, expected, strict=True))


async def _until(cond: object, *, step: float = 0.01, limit: float = 5.0) -> None:
    """Wait (loop time) until ``cond()`` holds; fail after ``limit`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not cond():  # type: ignore[operator]
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(step)


@pytest.mark.parametrize("api", APIS)
def test_slow_first_token_gets_heartbeats_at_15_and_30_s(api: str) -> None:
    async def main() -> Outcome:
        async with environment([Fault.ok(TEXT, delay_s=40)]) as env:
            return await send(env, api)

    out = run_in_looptime(main)
    assert out.succeeded, out
    assert _near(out.heartbeats, [15.0, 30.0]), out.heartbeats
    assert 40.0 <= out.elapsed <= 40.0 + SLACK_S


@pytest.mark.parametrize("api", APIS)
def test_stall_past_the_idle_timeout_fails_with_idle_timeout(api: str) -> None:
    async def main() -> Outcome:
        async with environment([Fault.stall(TEXT, after=2)],
                               settings=_settings(idle_timeout_s=60.0)) as env:
            return await send(env, api)

    out = run_in_looptime(main)
    assert not out.succeeded
    assert 60.0 <= out.elapsed <= 60.0 + SLACK_S  # 60 s after the last upstream event
    assert _near(out.heartbeats, [15.0, 30.0, 45.0]), out.heartbeats
    if api == "codec":
        assert (out.terminal, out.code) == ("frame", "error")
        assert out.ids == [1000, 1001]
    else:
        assert out.text == "Hello there,"
        assert out.terminal == ("failed" if api == "responses" else "error")
        assert "nothing happened for 60 s" in (out.message or "")


@pytest.mark.parametrize("limit", ["gateway", "upstream"])
def test_a_queued_request_gets_heartbeats_while_it_waits(limit: str) -> None:
    """One slot (the gateway's ``max_concurrent``, or the upstream's own limit as the
    embedded engine has): the second request waits 40 s for it, kept alive meanwhile."""
    settings = _settings(max_concurrent=1) if limit == "gateway" else ServerSettings()
    upstream_limit = 1 if limit == "upstream" else 4

    async def main() -> tuple[Outcome, Outcome, dict[str, object], int]:
        async with environment([Fault.ok(TEXT, delay_s=40), Fault.ok(TEXT)],
                               settings=settings, max_concurrent=upstream_limit) as env:
            first = asyncio.create_task(send(env, "chat"))
            await _until(lambda: len(env.upstream.attempts) == 1)
            second = asyncio.create_task(send(env, "responses"))
            await asyncio.sleep(1)
            health = await env.health()
            attempts_while_queued = len(env.upstream.attempts)
            return await first, await second, health, attempts_while_queued

    first, second, health, attempts_while_queued = run_in_looptime(main)
    assert (health["running"], health["queued"]) == (1, 1)
    assert attempts_while_queued == 1  # the queued request has not reached the upstream
    assert first.succeeded and second.succeeded
    assert _near(second.heartbeats, [15.0, 30.0]), second.heartbeats
    assert abs(second.elapsed - 40.0) <= SLACK_S  # it waited for the first one's 40 s


def test_a_full_gateway_answers_429_before_reading_the_body() -> None:
    """``max_concurrent = 1``, ``queue_size = 1``: a third request gets 429 with
    ``Retry-After: 1`` although its body was never sent."""
    async def main() -> tuple[bytes, list[Outcome]]:
        async with environment([Fault.ok(TEXT, delay_s=40)], max_concurrent=1,
                               settings=_settings(max_concurrent=1, queue_size=1)) as env:
            running = asyncio.create_task(send(env, "chat"))
            await _until(lambda: len(env.upstream.attempts) == 1)
            queued = asyncio.create_task(send(env, "chat"))
            await _until(lambda: env.gateway.state.admission.queued == 1)
            head = await _head_without_body(env)
            return head, [await running, await queued]

    head, outcomes = run_in_looptime(main)
    status_line, _, rest = head.partition(b"\r\n")
    assert status_line == b"HTTP/1.1 429 Too Many Requests", head
    assert b"\r\nretry-after: 1\r\n" in b"\r\n" + rest.lower()
    assert all(o.succeeded for o in outcomes)  # the two admitted requests are unharmed


async def _head_without_body(env: Env) -> bytes:
    """Send only the head of a POST announcing a body, and read what comes back."""
    host, port = env.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
        await writer.drain()
        return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 1.0)
    finally:
        writer.close()
        await writer.wait_closed()


def _has_output(out: Outcome) -> bool:
    return bool(out.text or out.ids)


@pytest.mark.parametrize("api", APIS)
def test_a_client_disconnect_aborts_the_upstream_and_frees_the_slot(api: str) -> None:
    async def main() -> tuple[Outcome, int, dict[str, object], Outcome, int]:
        async with environment([Fault.ok(TEXT, gap_s=30), Fault.ok(TEXT)],
                               settings=_settings(max_concurrent=1)) as env:
            gone = await send(env, api, hang_up=_has_output)
            await _until(lambda: env.upstream.disconnects == 1)
            health = await env.health()
            nxt = await send(env, api)
            return gone, env.upstream.disconnects, health, nxt, len(env.upstream.attempts)

    gone, disconnects, health, nxt, attempts = run_in_looptime(main)
    assert _has_output(gone) and not gone.succeeded
    assert disconnects == 1  # the upstream saw its connection closed
    assert (health["running"], health["queued"]) == (0, 0)
    assert nxt.succeeded and nxt.elapsed <= SLACK_S  # the slot was free at once
    assert attempts == 2


def test_a_client_leaving_the_queue_never_reaches_the_upstream() -> None:
    async def main() -> tuple[int, dict[str, object], Outcome]:
        async with environment([Fault.ok(TEXT, delay_s=40), Fault.ok(TEXT)],
                               settings=_settings(max_concurrent=1)) as env:
            running = asyncio.create_task(send(env, "chat"))
            await _until(lambda: len(env.upstream.attempts) == 1)
            # Hangs up on its first heartbeat (15 s), still waiting for a slot.
            await send(env, "responses", hang_up=lambda out: bool(out.heartbeats))
            await asyncio.sleep(0.1)
            health = await env.health()
            first = await running
            return len(env.upstream.attempts), health, first

    attempts, health, first = run_in_looptime(main)
    assert (health["running"], health["queued"]) == (1, 0)
    assert first.succeeded
    assert attempts == 1


def test_a_request_queued_past_the_idle_timeout_fails_without_reaching_the_upstream() -> None:
    """The wait for a slot is silence too (seed: the deadline includes waiting time)."""
    async def main() -> tuple[Outcome, Outcome, int]:
        async with environment([Fault.ok("a b c d e", gap_s=30), Fault.ok(TEXT)],
                               settings=_settings(max_concurrent=1, idle_timeout_s=60.0)
                               ) as env:
            running = asyncio.create_task(send(env, "chat"))
            await _until(lambda: len(env.upstream.attempts) == 1)
            queued = await send(env, "responses")
            return await running, queued, len(env.upstream.attempts)

    running, queued, attempts = run_in_looptime(main)
    assert running.succeeded  # 30 s between chunks: never 60 s of silence
    assert queued.terminal == "failed"
    assert "while waiting for capacity" in (queued.message or "")
    assert abs(queued.elapsed - 60.0) <= SLACK_S
    assert _near(queued.heartbeats, [15.0, 30.0, 45.0]), queued.heartbeats
    assert attempts == 1


@pytest.mark.parametrize("api", APIS)
def test_a_client_leaving_during_a_retry_wait_stops_the_retries(api: str) -> None:
    async def main() -> tuple[int, int, dict[str, object]]:
        async with environment([Fault.status(429, code="rate_limit_exceeded")]) as env:
            # Throttled from the start: hangs up at its first heartbeat (15 s).
            await send(env, api, hang_up=lambda out: bool(out.heartbeats))
            at_hang_up = len(env.upstream.attempts)
            await asyncio.sleep(120)  # the rest of the throttle budget
            return at_hang_up, len(env.upstream.attempts), await env.health()

    at_hang_up, later, health = run_in_looptime(main)
    assert 3 <= at_hang_up <= 5  # 1 + 2 + 4 (+-20%) s of waits fit in 15 s
    assert later == at_hang_up
    assert (health["running"], health["queued"]) == (0, 0)
