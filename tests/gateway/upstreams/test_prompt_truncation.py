"""The truncation check and the stream that waits for a long prompt's count (sans-IO parts
with a scripted inner stream; the adapter's own tests run it against a scripted Ollama)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tokenwire.gateway.ir import Event, Failure, FailureClass, Finish, FinishKind, TokenDelta, Usage
from tokenwire.gateway.upstreams.prompt_truncation import CountedStream, truncation_failure


@pytest.mark.parametrize(("bound", "read", "cut"), [
    (100, 99, True), (100, 100, False), (100, 120, False), (None, 5, False), (100, None, False),
    (100, 0, False),  # a server that reports 0 prompt tokens reports nothing
])
def test_a_prompt_is_cut_only_when_the_upstream_read_fewer_tokens_than_it_certainly_has(
        bound, read, cut) -> None:
    failure = truncation_failure(bound, read)
    assert (failure is not None) is cut
    if cut:
        assert (failure.failure_class, failure.status, failure.code, failure.prompt_tokens,
                failure.context_tokens) == (FailureClass.CONTEXT_LENGTH, 400,
                                            "prompt_truncated", bound, read)


class _Script:
    def __init__(self, events: list[Event]) -> None:
        self.events = list(events)
        self.cancelled = False

    async def next_event(self) -> Event:
        return self.events.pop(0) if self.events else Finish(reason=FinishKind.ABORT)

    def cancel(self) -> None:
        self.cancelled = True


class _Check:
    def __init__(self, read: int) -> None:
        self.read = read
        self.check_due = False

    def truncation(self, bound: int | None) -> Failure | None:
        return truncation_failure(bound, self.read)


@pytest.mark.parametrize("terminal", [Finish(reason=FinishKind.EOS),
                                      Failure(failure_class=FailureClass.UPSTREAM, status=502,
                                              message="cut answer")])
def test_the_terminal_waits_for_the_count_across_cancelled_waits(terminal) -> None:
    release = threading.Event()
    threads: list[threading.Thread] = []

    def count() -> int:
        threads.append(threading.current_thread())
        release.wait(30)
        return 500

    check = _Check(read=128)
    usage = Usage(prompt_tokens=128, completion_tokens=1)
    inner = _Script([TokenDelta(text="ok"), usage, terminal])

    async def main() -> list[Event]:
        stream = CountedStream(inner, count, check)
        out = [await stream.next_event()]
        check.check_due = True  # the parser saw the usage: its terminal is checked
        out.append(await stream.next_event())  # the usage passes, though the check is due
        for _ in range(2):  # heartbeats cancel the wait; the count goes on, only once
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(stream.next_event(), 0.02)
        release.set()
        out.append(await stream.next_event())
        out.append(await stream.next_event())  # after the terminal: the inner stream's
        return out

    out = asyncio.run(main())
    assert out[:2] == [TokenDelta(text="ok"), usage]
    assert isinstance(out[2], Failure) and out[2].code == "prompt_truncated"
    assert out[3] == Finish(reason=FinishKind.ABORT)
    assert len(threads) == 1 and threads[0] is not threading.main_thread()


def test_a_terminal_without_a_usage_to_check_passes_at_once() -> None:
    inner = _Script([Finish(reason=FinishKind.EOS)])

    async def main() -> Event:
        stream = CountedStream(inner, lambda: 10**6, _Check(read=1))
        stream.cancel()
        return await stream.next_event()

    assert asyncio.run(main()) == Finish(reason=FinishKind.EOS)
    assert inner.cancelled
