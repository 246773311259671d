"""DeadlineWaits (gateway/wakeups.py): one timer per deadline, never a stray cancellation.

Every test runs on a ``looptime`` loop (the loop's clock is fast-forwarded), so deadlines of
seconds run at once and the tests read loop time, never wall time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import looptime

from tokenwire.gateway.wakeups import EXPIRED, DeadlineWaits


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    with asyncio.Runner(loop_factory=lambda: looptime.new_event_loop(start=0)) as runner:
        return runner.run(coro)


def later(queue: asyncio.Queue, delay: float, item: object) -> None:
    asyncio.get_running_loop().call_later(delay, queue.put_nowait, item)


def test_the_value_comes_back_when_it_arrives_before_the_deadline() -> None:
    async def main() -> object:
        queue: asyncio.Queue = asyncio.Queue()
        later(queue, 1.0, "a")
        return await DeadlineWaits().wait(queue.get, 5.0)

    assert run(main()) == "a"


def test_the_deadline_first_returns_expired_and_the_item_stays_queued() -> None:
    async def main() -> tuple[object, float, object]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        later(queue, 3.0, "a")
        waits = DeadlineWaits()
        first = await waits.wait(queue.get, 2.0)
        at = loop.time()
        return first, at, await waits.wait(queue.get, 10.0)

    first, at, second = run(main())
    assert first is EXPIRED and at == 2.0
    assert second == "a"  # nothing lost by the cancelled wait


def test_a_past_deadline_expires_without_calling() -> None:
    calls = []

    async def call() -> str:
        calls.append(1)
        return "x"

    async def main() -> object:
        await asyncio.sleep(3)
        return await DeadlineWaits().wait(call, 2.0)

    assert run(main()) is EXPIRED and calls == []


def test_many_waits_under_one_deadline_arm_one_timer() -> None:
    async def main() -> int:
        loop = asyncio.get_running_loop()
        armed = []
        real_call_at = loop.call_at

        def call_at(when: float, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
            armed.append(when)
            return real_call_at(when, *args, **kwargs)

        loop.call_at = call_at  # type: ignore[method-assign]
        queue: asyncio.Queue = asyncio.Queue()
        waits = DeadlineWaits()
        for i in range(50):
            later(queue, 0.01, i)
            assert await waits.wait(queue.get, 100.0) == i
        waits.close()
        return len([w for w in armed if w == 100.0])

    assert run(main()) == 1


def test_a_timer_outliving_its_wait_never_cancels_what_follows() -> None:
    """The event arrives just before the deadline; the code after the wait (forwarding it)
    then runs past the deadline and must not be interrupted."""

    async def main() -> list[str]:
        queue: asyncio.Queue = asyncio.Queue()
        later(queue, 0.9, "a")
        waits = DeadlineWaits()
        done = []
        assert await waits.wait(queue.get, 1.0) == "a"
        await asyncio.sleep(5)  # "forwarding", across the deadline of the wait above
        done.append("forwarded")
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0
        return done

    assert run(main()) == ["forwarded"]


def test_a_later_deadline_rearms_instead_of_expiring() -> None:
    async def main() -> tuple[object, float]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        waits = DeadlineWaits()
        later(queue, 0.5, "a")
        assert await waits.wait(queue.get, 1.0) == "a"  # a timer is armed for 1.0
        later(queue, 1.5, "b")
        got = await waits.wait(queue.get, 3.0)  # the deadline moved later: no expiry at 1.0
        return got, loop.time()

    assert run(main()) == ("b", 2.0)


def test_an_earlier_deadline_rearms_the_timer() -> None:
    async def main() -> tuple[object, float]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        waits = DeadlineWaits()
        later(queue, 0.5, "a")
        assert await waits.wait(queue.get, 10.0) == "a"
        got = await waits.wait(queue.get, 2.0)
        return got, loop.time()

    assert run(main()) == (EXPIRED, 2.0)


def test_an_outside_cancellation_is_raised_even_when_the_timer_fires_with_it() -> None:
    async def waiter(waits: DeadlineWaits, queue: asyncio.Queue) -> object:
        return await waits.wait(queue.get, 1.0)

    async def main() -> tuple[bool, int]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        waits = DeadlineWaits()
        task = asyncio.create_task(waiter(waits, queue))
        loop.call_at(1.0, task.cancel)  # the same instant as the deadline's timer
        try:
            await task
        except asyncio.CancelledError:
            return True, queue.qsize()
        return False, queue.qsize()

    assert run(main()) == (True, 0)


def test_an_outside_cancellation_before_the_deadline_is_raised() -> None:
    async def main() -> bool:
        queue: asyncio.Queue = asyncio.Queue()
        waits = DeadlineWaits()
        task = asyncio.create_task(waits.wait(queue.get, 10.0))
        await asyncio.sleep(1)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return True
        return False

    assert run(main())


def test_close_drops_the_timer() -> None:
    async def main() -> bool:
        queue: asyncio.Queue = asyncio.Queue()
        waits = DeadlineWaits()
        later(queue, 0.1, "a")
        await waits.wait(queue.get, 600.0)
        timer = waits._timer
        waits.close()
        return timer is not None and timer.cancelled() and waits._timer is None

    assert run(main())


def test_a_call_that_absorbs_the_timer_then_fails_leaves_no_cancellation_counted() -> None:
    """The awaited call swallowed the timer's cancel and raised something else: the error
    comes through, and the task's cancel count is back to 0 (a later ``asyncio.timeout`` in
    the task would otherwise raise CancelledError instead of TimeoutError)."""

    async def absorbs_then_fails() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            pass
        raise ValueError("after the cancel")

    async def main() -> tuple[str, int]:
        try:
            await DeadlineWaits().wait(absorbs_then_fails, 2.0)
        except ValueError as exc:
            task = asyncio.current_task()
            assert task is not None
            return str(exc), task.cancelling()
        return "no error", -1

    assert run(main()) == ("after the cancel", 0)
