"""The supervisor between upstreams and APIs: queue, retries, deadlines, heartbeats.

Everything runs on a ``looptime`` event loop: the loop's clock is the only clock the
supervisor reads, so a 120 s retry budget or a 600 s silence runs in milliseconds and the
tests assert *loop* time exactly, never wall time. The upstreams here are in-memory scripts
(the same scripts over real sockets and real APIs are in tests/gateway/faults).
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import looptime
import pytest

from tokenwire.gateway.ir import (
    Event,
    Failure,
    FailureClass,
    Finish,
    FinishKind,
    GenerationRequest,
    Heartbeat,
    PromptText,
    ResponseMeta,
    TokenDelta,
    Usage,
)
from tokenwire.gateway.supervision import supervisor as supervisor_module
from tokenwire.gateway.supervision.admission import Admission
from tokenwire.gateway.supervision.retry import THROTTLE_EXHAUSTED_MESSAGE
from tokenwire.gateway.supervision.supervisor import SupervisedStream, Timing, Upstreamish

REQUEST = GenerationRequest(prompt=PromptText(text="hi"))
EOS = Finish(reason=FinishKind.EOS)


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    with asyncio.Runner(loop_factory=lambda: looptime.new_event_loop(start=0)) as runner:
        return runner.run(coro)


def now() -> float:
    return asyncio.get_running_loop().time()


# -- a scripted in-memory upstream -------------------------------------------------------------

Step = tuple[float, Event]  # (seconds of silence before it, event); inf = never


@dataclass
class Script(Upstreamish):
    """Attempt n plays ``attempts[min(n, last)]``; records when each attempt started (a
    served model of one upstream: the protocol's preflight and fail-over defaults)."""

    attempts: list[list[Step]]
    started_at: list[float] = field(default_factory=list)
    cancelled: int = 0
    upstream: object = field(default_factory=object)

    def submit(self, request: GenerationRequest) -> _Play:
        self.started_at.append(now())
        steps = self.attempts[min(len(self.started_at) - 1, len(self.attempts) - 1)]
        return _Play(self, list(steps))


class _Play:
    def __init__(self, script: Script, steps: list[Step]) -> None:
        self._script, self._steps = script, steps
        self._due: float | None = None

    async def next_event(self) -> Event:
        delay, event = self._steps[0]
        if self._due is None:  # cancellation-safe: a retried wait keeps its due time
            self._due = now() + delay
        if self._due == float("inf"):
            await asyncio.Event().wait()
        await asyncio.sleep(max(0.0, self._due - now()))
        self._steps.pop(0)
        self._due = None
        return event

    def cancel(self) -> None:
        self._script.cancelled += 1


def fail(cls: FailureClass, status: int, **kw: Any) -> Failure:
    return Failure(failure_class=cls, message="scripted", status=status, **kw)


def tokens(*texts: str, gap: float = 0.0) -> list[Step]:
    return [(gap, TokenDelta(ids=(i,), text=t)) for i, t in enumerate(texts)]


async def collect(stream: SupervisedStream) -> list[tuple[float, Event]]:
    out = []
    while True:
        ev = await stream.next_event()
        out.append((now(), ev))
        if isinstance(ev, Finish | Failure):
            return out


DEFAULT_TIMING = Timing()


def supervise(script: Script, admission: Admission | None = None, *,
              timing: Timing = DEFAULT_TIMING, seed: int = 1) -> SupervisedStream:
    admission = admission or Admission()
    ticket = admission.reserve(now())
    assert ticket is not None
    return SupervisedStream(script, REQUEST, ticket, timing=timing, rng=random.Random(seed))


def scenario(fn: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    return run(fn())


# -- heartbeats and deadlines ------------------------------------------------------------------


def test_a_quiet_upstream_gets_a_heartbeat_every_15_s_then_the_answer() -> None:
    async def go():
        script = Script([[(40.0, TokenDelta(ids=(1,), text="a")), (0.0, EOS)]])
        return await collect(supervise(script))

    events = run(go())
    assert [(t, type(e).__name__) for t, e in events] == [
        (15.0, "Heartbeat"), (30.0, "Heartbeat"), (40.0, "TokenDelta"), (40.0, "Finish")]


def test_a_heartbeat_before_output_carries_the_held_prompt_count_first() -> None:
    """The heartbeat opens the client's stream (Anthropic's message_start): the prompt's
    count, already known, must not wait for the first token."""
    early = Usage(prompt_tokens=9, completion_tokens=None)

    async def go():
        script = Script([[(0.0, early), (20.0, TokenDelta(ids=(1,), text="a")), (0.0, EOS)]])
        return await collect(supervise(script))

    assert [(t, e) for t, e in run(go())][:2] == [(15.0, early), (15.0, Heartbeat())]


def test_heartbeats_count_from_the_last_event_sent() -> None:
    async def go():
        script = Script([[(10.0, TokenDelta(ids=(1,), text="a")),
                          (20.0, TokenDelta(ids=(2,), text="b")), (0.0, EOS)]])
        return await collect(supervise(script))

    assert [(t, type(e).__name__) for t, e in run(go())] == [
        (10.0, "TokenDelta"), (25.0, "Heartbeat"), (30.0, "TokenDelta"), (30.0, "Finish")]


def test_no_heartbeats_for_a_non_streaming_request() -> None:
    async def go():
        script = Script([[(40.0, TokenDelta(ids=(1,), text="a")), (0.0, EOS)]])
        return await collect(supervise(script, timing=Timing(heartbeat_s=None)))

    assert [type(e) for _, e in run(go())] == [TokenDelta, Finish]


def test_a_stalled_upstream_fails_at_the_idle_timeout_and_is_cancelled() -> None:
    async def go():
        script = Script([[*tokens("a"), (float("inf"), EOS)]])
        events = await collect(supervise(script, timing=Timing(idle_timeout_s=100)))
        return script, events

    script, events = run(go())
    t, last = events[-1]
    assert isinstance(last, Failure) and last.code == "idle_timeout" and t == 100.0
    assert last.failure_class is FailureClass.TIMEOUT  # retryable for the client
    assert sum(isinstance(e, Heartbeat) for _, e in events) == 6  # 15, 30, ... 90
    assert len(script.started_at) == 1 and script.cancelled == 1  # a stall is not retried


def test_the_idle_timer_restarts_on_every_upstream_event() -> None:
    async def go():
        script = Script([[*tokens("a", "b", "c", gap=90.0), (0.0, EOS)]])
        return await collect(supervise(script, timing=Timing(idle_timeout_s=100)))

    assert isinstance(run(go())[-1][1], Finish)  # 270 s in all, never 100 s of silence


def test_every_request_ends_at_the_one_hour_cap() -> None:
    async def go():
        steps = [(500.0, TokenDelta(ids=(1,), text="x"))] * 100
        return await collect(supervise(Script([steps])))

    t, last = run(go())[-1]
    assert isinstance(last, Failure) and last.code == "request_timeout" and t == 3600.0


# -- retries -----------------------------------------------------------------------------------


def test_a_500_before_output_is_retried_once_after_one_second() -> None:
    async def go():
        script = Script([[(0.0, fail(FailureClass.UPSTREAM, 500))], [*tokens("ok"), (0, EOS)]])
        events = await collect(supervise(script))
        return script, events

    script, events = run(go())
    assert script.started_at == [0.0, 1.0]
    assert [type(e) for _, e in events] == [TokenDelta, Finish]


def test_the_single_retry_is_spent_once_per_request() -> None:
    async def go():
        script = Script([[(0.0, fail(FailureClass.UPSTREAM, 502))]])
        events = await collect(supervise(script))
        return script, events

    script, events = run(go())
    assert script.started_at == [0.0, 1.0]
    assert isinstance(events[-1][1], Failure) and events[-1][1].status == 502


def test_nothing_is_replayed_once_output_was_published() -> None:
    async def go():
        script = Script([[*tokens("par"), (0.0, fail(FailureClass.CONNECTION, 502))]])
        events = await collect(supervise(script))
        return script, events

    script, events = run(go())
    assert len(script.started_at) == 1
    assert [type(e) for _, e in events] == [TokenDelta, Failure]


def test_transient_connection_failures_back_off_within_their_120_s_budget() -> None:
    async def go():
        script = Script([[(0.0, fail(FailureClass.CONNECTION, 502, code="connection_reset"))]])
        events = await collect(supervise(script))
        return script, events

    script, events = run(go())
    starts = script.started_at
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    for gap, base in zip(gaps, [1, 2, 4, 8, 8, 8, 8], strict=False):
        assert base * 0.8 <= gap <= base * 1.2  # the seed's schedule, +-20% jitter
    assert starts[-1] < 120.0  # no attempt at or past the deadline
    last = events[-1][1]
    assert isinstance(last, Failure) and last.code == "connection_reset"  # unchanged
    assert sum(isinstance(e, Heartbeat) for _, e in events) >= 5  # the waits stay covered


def test_a_refused_connection_is_final() -> None:
    async def go():
        script = Script([[(0.0, fail(FailureClass.CONNECTION, 502, code="connection_refused"))]])
        await collect(supervise(script))
        return script

    assert len(run(go()).started_at) == 1


def test_a_throttle_honours_retry_after_until_its_budget_then_says_so() -> None:
    async def go():
        script = Script([[(0.0, fail(FailureClass.RATE_LIMITED, 429, retry_after=25.0))]])
        events = await collect(supervise(script))
        return script, events

    script, events = run(go())
    assert script.started_at == [0.0, 25.0, 50.0, 75.0, 100.0]  # the next would end at 125 s
    last = events[-1][1]
    assert isinstance(last, Failure) and last.status == 429
    assert last.code == "rate_limit_exceeded" and last.message == THROTTLE_EXHAUSTED_MESSAGE


def test_a_quota_429_is_final() -> None:
    async def go():
        script = Script([[(0.0, fail(FailureClass.RATE_LIMITED, 429, code="insufficient_quota",
                                     retry_after=1.0))]])
        events = await collect(supervise(script))
        return script, events

    script, events = run(go())
    assert len(script.started_at) == 1 and events[-1][1].code == "insufficient_quota"


def test_facts_of_a_failed_attempt_never_reach_the_client() -> None:
    async def go():
        script = Script([
            [(0.0, ResponseMeta(turn_state="first")), (0.0, fail(FailureClass.UPSTREAM, 500))],
            [(0.0, ResponseMeta(turn_state="second")), *tokens("ok"), (0.0, EOS)]])
        return await collect(supervise(script))

    metas = [e for _, e in run(go()) if isinstance(e, ResponseMeta)]
    assert metas == [ResponseMeta(turn_state="second")]


# -- capacity ----------------------------------------------------------------------------------


def test_queued_requests_start_in_arrival_order_with_heartbeats_while_waiting() -> None:
    async def go():
        admission = Admission(max_concurrent=1, queue_size=8)
        script = Script([[*tokens("a", gap=24.0), (0.0, EOS)]])
        streams = [supervise(script, admission) for _ in range(3)]
        results = await asyncio.gather(*(collect(s) for s in streams))
        return script, results, admission

    script, results, admission = run(go())
    assert script.started_at == [0.0, 24.0, 48.0]  # one at a time, first come first served
    third = results[2]  # queued until 48 s, then a quiet upstream until 72 s
    assert [t for t, e in third if isinstance(e, Heartbeat)] == [15.0, 30.0, 45.0, 60.0]
    assert admission.counts() == (0, 3)  # slots back; tickets end with their HTTP exchange


def test_a_per_upstream_limit_does_not_block_another_upstream() -> None:
    async def go():
        slow, fast = Script([[(50.0, EOS)]]), Script([[(0.0, EOS)]])
        admission = Admission(max_concurrent=4, limits={id(slow.upstream): 1})
        first, second = supervise(slow, admission), supervise(slow, admission)
        other = supervise(fast, admission)
        done = await asyncio.gather(collect(first), collect(second), collect(other))
        return slow, fast, done

    slow, fast, _ = run(go())
    assert slow.started_at == [0.0, 50.0] and fast.started_at == [0.0]


def test_cancel_while_queued_leaves_the_line_without_calling_the_upstream() -> None:
    async def go():
        admission = Admission(max_concurrent=1, queue_size=8)
        script = Script([[(30.0, EOS)]])
        running, queued = supervise(script, admission), supervise(script, admission)
        first = asyncio.ensure_future(collect(running))
        pending = asyncio.ensure_future(queued.next_event())
        await asyncio.sleep(5)
        queued.cancel()
        assert isinstance(await pending, Finish)  # a waiting reader gets the ABORT ending
        await first
        return script, admission

    script, admission = run(go())
    assert script.started_at == [0.0] and admission.running == 0


def test_cancel_mid_stream_cancels_the_upstream_and_frees_the_slot() -> None:
    async def go():
        admission = Admission(max_concurrent=1, queue_size=8)
        script = Script([[*tokens("a"), (float("inf"), EOS)]])
        stream = supervise(script, admission)
        assert isinstance(await stream.next_event(), TokenDelta)
        stream.cancel()
        await asyncio.sleep(0.1)
        return script, admission

    script, admission = run(go())
    assert script.cancelled == 1 and admission.running == 0


def test_the_queue_wait_counts_against_the_idle_timeout() -> None:
    async def go():
        admission = Admission(max_concurrent=1, queue_size=8)
        script = Script([[*tokens(*"abcdefg", gap=100.0), (0.0, EOS)]])
        timing = Timing(idle_timeout_s=300)
        first, second = supervise(script, admission, timing=timing), \
            supervise(script, admission, timing=timing)
        return await asyncio.gather(collect(first), collect(second))

    first, second = run(go())
    assert isinstance(first[-1][1], Finish)
    t, last = second[-1]
    assert isinstance(last, Failure) and last.code == "idle_timeout" and t == 300.0
    assert "capacity" in last.message


def test_the_gateway_refuses_past_capacity_plus_queue() -> None:
    admission = Admission(max_concurrent=2, queue_size=3)
    tickets = [admission.reserve(0.0) for _ in range(5)]
    assert all(tickets) and admission.reserve(0.0) is None
    tickets[0].release()
    assert admission.reserve(0.0) is not None


def test_a_completed_response_frees_its_place_before_its_last_body_message() -> None:
    """The order, not a race: a client may send its next request the moment it reads the
    end of this one, and the server may run it before this request's task unwinds. At
    exactly the capacity (one connection per place) that request found every place held by
    answered requests and got a 429 (the bench saw 48 in 11,526). So the place must be free
    when the last body message is handed to the server; the record still closes last."""
    from tokenwire.gateway.http.admission import TICKET_SCOPE_KEY, AdmissionMiddleware

    admission = Admission(max_concurrent=1, queue_size=0)
    closed: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        scope[TICKET_SCOPE_KEY].on_release = lambda: closed.append("record")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{", "more_body": True})
        await send({"type": "http.response.body", "body": b"}"})

    seen: list[tuple[str, bool]] = []

    async def send(message: dict[str, Any]) -> None:
        ticket = admission.reserve(0.0)  # "the next request", at this moment
        seen.append((message["type"], ticket is not None))
        if ticket is not None:
            ticket.release()
        assert not closed  # the record closes after the last message, as before

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    middleware = AdmissionMiddleware(app, admission)
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions"}
    asyncio.run(middleware(scope, receive, send))
    assert seen == [("http.response.start", False), ("http.response.body", False),
                    ("http.response.body", True)]
    assert closed == ["record"] and admission.counts() == (0, 0)


def test_abort_ends_a_running_stream_with_the_given_failure() -> None:
    async def go():
        script = Script([[*tokens("a"), (float("inf"), EOS)]])
        stream = supervise(script)
        await stream.next_event()
        stream.abort(fail(FailureClass.CAPACITY, 503, code="server_shutting_down"))
        return await stream.next_event(), script

    last, script = run(go())
    assert isinstance(last, Failure) and last.code == "server_shutting_down"
    assert script.cancelled == 1


@pytest.mark.parametrize("seed", range(5))
def test_jitter_never_lets_an_attempt_start_past_the_budget(seed: int) -> None:
    async def go():
        script = Script([[(0.0, fail(FailureClass.CONNECTION, 502))]])
        await collect(supervise(script, seed=seed))
        return script

    assert run(go()).started_at[-1] < 120.0


def test_capacity_counts_what_can_run_when_every_upstream_has_a_limit() -> None:
    """The embedded engine runs one generation; ``--queue-size 1`` then admits two (one
    running, one waiting), not max_concurrent (4) + 1."""
    from tokenwire.gateway.http.state import GatewayState
    from tokenwire.gateway.settings import ServerSettings

    class OneAtATime:
        model_id = "m"
        max_concurrent = 1

    state = GatewayState(settings=ServerSettings(queue_size=1), upstream=OneAtATime())
    admission = state.admission
    assert (admission.runnable, admission.capacity) == (1, 2)
    assert admission.reserve(0.0) and admission.reserve(0.0) and admission.reserve(0.0) is None


def test_an_upstream_without_a_limit_keeps_max_concurrent_as_the_bound() -> None:
    limited = Admission(max_concurrent=4, queue_size=2, limits={1: 1}, all_limited=False)
    assert (limited.runnable, limited.capacity) == (4, 6)
    bigger = Admission(max_concurrent=4, queue_size=2, limits={1: 8, 2: 8}, all_limited=True)
    assert (bigger.runnable, bigger.capacity) == (4, 6)  # no more than max_concurrent runs


# -- a window's reader: settled() and ready() ----------------------------------------------------


def test_settled_waits_for_the_terminal_and_ready_gives_the_window_in_order() -> None:
    """A writer coalescing a window waits in ``settled()`` instead of waking per event; the
    events it then takes are exactly ``next_event``'s, in order."""
    async def go():
        script = Script([[*tokens("a", "b", "c", gap=1.0), (1.0, EOS)]])
        stream = supervise(script)
        first = await stream.next_event()  # starts the task, as the writer's first read
        await stream.settled()
        woke_at = now()
        return first, woke_at, stream.ready()

    first, woke_at, rest = run(go())
    assert first == TokenDelta(ids=(0,), text="a")
    assert woke_at == 4.0  # at the terminal, not at any token before it
    assert rest == [TokenDelta(ids=(1,), text="b"), TokenDelta(ids=(2,), text="c"), EOS]


def test_settled_returns_once_half_the_buffer_is_waiting() -> None:
    """A fast upstream must not wait for a slow window: half the buffer wakes the reader."""
    async def go():
        texts = [str(i) for i in range(100)]
        script = Script([[*tokens(*texts, gap=0.5), (0.0, EOS)]])
        stream = supervise(script)
        await stream.next_event()
        await stream.settled()
        return now(), stream.ready()

    woke_at, taken = run(go())
    assert len(taken) == 32 and woke_at == 16.5  # token 32, the 32nd queued, came at 16.5 s
    assert [e.text for e in taken] == [str(i) for i in range(1, 33)]


def test_a_cancelled_stream_settles_at_once_and_ends_its_window_with_abort() -> None:
    async def go():
        script = Script([[*tokens("a", "b"), (float("inf"), EOS)]])
        stream = supervise(script)
        await stream.next_event()
        await asyncio.sleep(0.1)  # "b" is queued
        stream.cancel()
        await asyncio.wait_for(stream.settled(), 1.0)  # a safety net: it returns at once
        return stream.ready()

    assert run(go()) == [TokenDelta(ids=(1,), text="b"), Finish(reason=FinishKind.ABORT)]


# -- events pushed by the upstream's connection (push_to) --------------------------------------


@dataclass
class PushScript(Script):
    """One attempt whose events arrive from loop callbacks (as an upstream connection's
    ``data_received`` would parse them), offered to the supervisor's sink while nothing is
    queued, as ``sse_http.SSEUpstreamStream.push_to`` does."""

    plays: list[_PushPlay] = field(default_factory=list)

    def submit(self, request: GenerationRequest) -> _PushPlay:  # type: ignore[override]
        self.started_at.append(now())
        play = _PushPlay(self.attempts[0])
        self.plays.append(play)
        return play


class _PushPlay:
    def __init__(self, steps: list[Step]) -> None:
        self.sink: Callable[[Event], bool] | None = None
        self.ready: list[Event] = []
        self.taken: list[Event] = []
        self._waiter: asyncio.Future[None] | None = None
        at = 0.0
        for delay, event in steps:
            at += delay
            asyncio.get_running_loop().call_later(at, self._arrive, event)

    def push_to(self, sink: Callable[[Event], bool]) -> bool:
        self.sink = sink
        return True

    def _arrive(self, event: Event) -> None:
        if not isinstance(event, Finish) and not self.ready and self.sink is not None \
                and self.sink(event):
            self.taken.append(event)
            return
        self.ready.append(event)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def next_event(self) -> Event:
        while not self.ready:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        return self.ready.pop(0)

    def cancel(self) -> None:
        pass


def test_pushed_deltas_reach_the_client_in_order_without_the_attempt_task() -> None:
    """Facts and the terminal go through the attempt's task; every delta is taken by the
    sink as it arrives, in order, the first one after the facts held before it."""
    async def go():
        count = Usage(prompt_tokens=3, completion_tokens=None)
        script = PushScript([[(0.5, count), *tokens("a", "b", "c", "d", gap=1.0),
                              (1.0, EOS)]])
        stream = supervise(script)
        return await collect(stream), script.plays[0].taken, count

    got, taken, count = run(go())
    assert [(t, e) for t, e in got] == [(1.5, count),
                                        (1.5, TokenDelta(ids=(0,), text="a")),
                                        (2.5, TokenDelta(ids=(1,), text="b")),
                                        (3.5, TokenDelta(ids=(2,), text="c")),
                                        (4.5, TokenDelta(ids=(3,), text="d")), (5.5, EOS)]
    assert [e.text for e in taken] == ["a", "b", "c", "d"]


def test_a_full_hand_off_refuses_pushes_and_loses_or_reorders_nothing() -> None:
    """A client that does not read: the hand-off fills (64), the sink refuses, the stream
    keeps what follows for the attempt's task, which waits for room; the reader then gets
    every event once, in order."""
    async def go():
        texts = [str(i) for i in range(200)]
        script = PushScript([[*tokens(*texts, gap=0.01), (0.01, EOS)]])
        stream = supervise(script)
        first = await stream.next_event()
        await asyncio.sleep(10.0)  # everything has arrived; nobody read
        rest = await collect(stream)
        return [first] + [e for _, e in rest], script.plays[0].taken

    events, taken = run(go())
    assert [e.text for e in events[:-1]] == [str(i) for i in range(200)]
    assert events[-1] == EOS
    assert 0 < len(taken) < 199  # some pushed, the rest through the task once full


def test_a_heartbeat_between_pushed_deltas_keeps_its_place() -> None:
    """The attempt's task wakes for the heartbeat due at 15 s (its timer cancels the wait
    the pushes happen under) and waits again: the delta at 21 s is pushed, after it."""
    async def go():
        script = PushScript([[*tokens("a"), (20.0, TokenDelta(ids=(1,), text="b")),
                              (1.0, EOS)]])
        stream = supervise(script, timing=Timing(heartbeat_s=15.0))
        sink_calls: list[bool] = []
        got = [await stream.next_event()]
        real = script.plays[0].sink
        assert real is not None

        def spy(event: Event) -> bool:
            took = real(event)
            sink_calls.append(took)
            return took
        script.plays[0].sink = spy
        got += [e for _, e in await collect(stream)]
        return got, sink_calls

    got, calls = run(go())
    assert [type(e).__name__ for e in got] == ["TokenDelta", "Heartbeat", "TokenDelta",
                                               "Finish"]
    assert calls == [True]  # "b": taken by the sink, the task waiting again by then


def test_each_state_supervises_with_its_own_settings_clocks() -> None:
    """The clocks and the retry switch are made once per setting (not per request), never
    shared across settings: two gateways with different settings each get their own."""
    from tokenwire.gateway.http.state import GatewayState, _retry_policy
    from tokenwire.gateway.settings import ServerSettings

    class Upstream:
        model_id = "m"
        max_concurrent = 1

    quick = GatewayState(settings=ServerSettings(heartbeat_s=1.0, idle_timeout_s=7.0),
                         upstream=Upstream())
    slow = GatewayState(settings=ServerSettings(heartbeat_s=9.0, retries=False),
                        upstream=Upstream())
    assert quick.timing(streaming=True) == Timing(heartbeat_s=1.0, idle_timeout_s=7.0,
                                                  request_cap_s=quick.settings.request_cap_s)
    assert quick.timing(streaming=False).heartbeat_s is None
    assert slow.timing(streaming=True).heartbeat_s == 9.0
    assert slow.timing(streaming=True).idle_timeout_s == slow.settings.idle_timeout_s
    assert quick.timing(streaming=True) is quick.timing(streaming=True)  # made once
    assert _retry_policy(True).enabled and not _retry_policy(False).enabled


# -- the answer's size -------------------------------------------------------------------------


@pytest.mark.parametrize("pushed", [False, True], ids=["task", "pushed"])
def test_an_answer_past_its_size_ends_with_answer_too_large(monkeypatch, pushed: bool) -> None:
    """Reproduced: an upstream that sent without end was forwarded, and every API's whole
    answer held by the gateway (a non-streamed one, the Responses snapshot), for the whole
    one-hour cap. Past MAX_ANSWER_SIZE (made 10 here) the answer ends, the upstream is
    cancelled, and nothing past the bound is forwarded, however the deltas arrive."""
    monkeypatch.setattr(supervisor_module, "MAX_ANSWER_SIZE", 10)

    async def go():
        steps = [*tokens("abc", "def", "ghi", "jkl", "mno", gap=1.0), (1.0, EOS)]
        script = PushScript([steps]) if pushed else Script([steps])
        return script, await collect(supervise(script))

    script, events = run(go())
    # "abc"+1 id, "def"+1, then "ghi"+1 is 12 > 10: two deltas out, then the failure.
    assert [e.text for _, e in events[:-1]] == ["abc", "def"]
    end = events[-1][1]
    assert isinstance(end, Failure) and (end.status, end.code) == (502, "answer_too_large")
    assert len(script.started_at) == 1
    if pushed:
        assert [e.text for e in script.plays[0].taken] == ["abc", "def"]
    else:
        assert script.cancelled == 1


def test_an_answer_too_large_before_any_output_is_final() -> None:
    async def go():
        huge = TokenDelta(text="x" * (supervisor_module.MAX_ANSWER_SIZE + 1))
        script = Script([[(0.0, huge), (0.0, EOS)]])
        return script, await collect(supervise(script))

    script, events = run(go())
    assert len(script.started_at) == 1  # the same answer would be as large again
    assert [type(e) for _, e in events] == [Failure]
    assert events[-1][1].code == "answer_too_large"
