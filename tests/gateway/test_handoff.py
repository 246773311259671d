"""The supervisor's event hand-off (``supervision/handoff.py``): a bounded FIFO between one
producer and one reader that loses nothing when a wait is cancelled."""

from __future__ import annotations

import asyncio

import pytest

from tokenwire.gateway.supervision.handoff import Handoff


def run(coro):
    return asyncio.run(coro)


def test_items_come_out_in_order_and_take_all_empties() -> None:
    async def main() -> None:
        h: Handoff[int] = Handoff(8)
        for i in range(5):
            await h.put(i)
        assert len(h) == 5
        assert await h.get() == 0
        assert h.take_all() == [1, 2, 3, 4]
        assert len(h) == 0 and h.take_all() == []

    run(main())


def test_a_full_buffer_holds_the_producer_until_the_reader_takes() -> None:
    async def main() -> None:
        h: Handoff[int] = Handoff(2)
        await h.put(1)
        await h.put(2)
        third = asyncio.ensure_future(h.put(3))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert not third.done() and len(h) == 2  # back-pressure: the producer waits
        assert await h.get() == 1
        await asyncio.wait_for(third, 1)
        assert h.take_all() == [2, 3]
        fourth = asyncio.ensure_future(h.put(4))
        await asyncio.sleep(0)
        assert fourth.done()  # room again: no wait

    run(main())


def test_a_waiting_reader_wakes_for_the_next_item() -> None:
    async def main() -> None:
        h: Handoff[str] = Handoff(4)
        reader = asyncio.ensure_future(h.get())
        await asyncio.sleep(0)
        assert not reader.done()
        await h.put("a")
        assert await asyncio.wait_for(reader, 1) == "a"

    run(main())


def test_a_cancelled_get_loses_nothing() -> None:
    async def main() -> None:
        h: Handoff[str] = Handoff(4)
        reader = asyncio.ensure_future(h.get())
        await asyncio.sleep(0)
        await h.put("kept")  # wakes the reader...
        reader.cancel()  # ...which is cancelled before it runs
        with pytest.raises(asyncio.CancelledError):
            await reader
        assert await h.get() == "kept"

    run(main())


def test_a_cancelled_put_adds_nothing() -> None:
    async def main() -> None:
        h: Handoff[int] = Handoff(1)
        await h.put(1)
        blocked = asyncio.ensure_future(h.put(2))
        await asyncio.sleep(0)
        blocked.cancel()
        with pytest.raises(asyncio.CancelledError):
            await blocked
        assert h.take_all() == [1]
        await h.put(3)  # a new put finds room and no stale waiter
        assert h.take_all() == [3]

    run(main())


def test_force_always_gets_in_and_wakes_the_reader() -> None:
    async def main() -> None:
        h: Handoff[str] = Handoff(2)
        await h.put("a")
        await h.put("b")
        h.force("end")  # full: the oldest makes room
        assert h.take_all() == ["b", "end"]
        reader = asyncio.ensure_future(h.get())
        await asyncio.sleep(0)
        h.force("abort")
        assert await asyncio.wait_for(reader, 1) == "abort"

    run(main())
