"""The replica pool (routing/pool.py) under the real supervisor and admission, with scripted
replicas (fault injection) and an injected clock for the breakers."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Any

import looptime
import pytest

from tokenwire.errors import ConfigError
from tokenwire.gateway.affinity import (
    read_turn_state,
    replica_token,
    set_turn_state_secret,
    wrap_turn_state,
)
from tokenwire.gateway.ir import (
    ChatMessage,
    ChatPrompt,
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
)
from tokenwire.gateway.routing.breaker import Breaker, BreakerPolicy, BreakerState
from tokenwire.gateway.routing.pool import (
    Replica,
    ReplicaPool,
    affinity_key,
    parse_load_factor,
    parse_load_slack,
    parse_panic_threshold,
)
from tokenwire.gateway.routing.router import ServedModel
from tokenwire.gateway.supervision.admission import Admission, limits_of
from tokenwire.gateway.supervision.retry import RetryPolicy
from tokenwire.gateway.supervision.supervisor import SupervisedStream, Timing, _NoObserver
from tokenwire.gateway.upstreams.base import UpstreamHealth, UpstreamState

REFUSED = Failure(failure_class=FailureClass.CONNECTION, status=502, code="connection_refused",
                  message="could not connect")
CUT = Failure(failure_class=FailureClass.UPSTREAM, status=502, message="broke the stream")
BAD = Failure(failure_class=FailureClass.INVALID_REQUEST, status=400, message="bad prompt")
OK = [TokenDelta(ids=(1,), text="hi"), Finish(reason=FinishKind.EOS)]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeReplica:
    """A scripted replica: ``mode`` says what each request gets."""

    name: str
    mode: str = "ok"  # ok | refuse | cut | bad | hold
    model_id: str = "m"
    kind: str = "openai"
    requests: list[GenerationRequest] = field(default_factory=list)
    up: bool = True
    release: asyncio.Event | None = None
    #: Seconds (loop time) every answer takes before its first event.
    slow_s: float = 0.0

    def submit(self, request: GenerationRequest) -> Any:
        self.requests.append(request)
        events: list[Event] = {"ok": OK, "refuse": [REFUSED], "bad": [BAD],
                               "cut": [TokenDelta(ids=(1,), text="h"), CUT],
                               "hold": OK}[self.mode]
        return _Stream(list(events), self.release if self.mode == "hold" else None,
                       self.slow_s)

    async def probe(self) -> UpstreamHealth:
        return UpstreamHealth(name=self.name, kind="openai",
                              state=UpstreamState.UP if self.up else UpstreamState.DOWN)


class _Stream:
    def __init__(self, events: list[Event], gate: asyncio.Event | None,
                 delay_s: float = 0.0) -> None:
        self._events, self._gate, self._delay_s = events, gate, delay_s
        self._due: float | None = None

    async def next_event(self) -> Event:
        if self._gate is not None:
            await self._gate.wait()
        loop = asyncio.get_running_loop()
        if self._due is None:  # a due time, so a wait cancelled by a heartbeat loses nothing
            self._due = loop.time() + self._delay_s
        await asyncio.sleep(max(0.0, self._due - loop.time()))
        return self._events.pop(0)

    def cancel(self) -> None:
        pass


POLICY = BreakerPolicy(consecutive_failures=3, base_cooldown_s=10, max_cooldown_s=40,
                       close_after=2)


def make_pool(*modes: str, kind: str = "openai", limit: int = 4, clock: Clock | None = None,
              weights: tuple[float, ...] = ()) -> tuple[ReplicaPool, list[FakeReplica]]:
    fakes = [FakeReplica(f"p/r{i + 1}", mode=m, kind=kind) for i, m in enumerate(modes)]
    reps = [Replica(name=f.name, adapter=f, limit=limit, breaker=Breaker(POLICY),
                    weight=weights[i] if weights else 1.0) for i, f in enumerate(fakes)]
    return ReplicaPool("p", kind, reps, clock=clock or Clock(), rng=random.Random(3)), fakes


def request(**kw: Any) -> GenerationRequest:
    return GenerationRequest(prompt=PromptText(text="hello"), request_id=kw.pop("rid", "r"),
                             **kw)


async def run_one(pool: ReplicaPool, req: GenerationRequest,
                  admission: Admission | None = None) -> tuple[list[Event], SupervisedStream]:
    served = ServedModel(name="m", upstream=pool)
    admission = admission or Admission(limits=limits_of([pool]), all_limited=True)
    ticket = admission.reserve(asyncio.get_running_loop().time())
    assert ticket is not None
    stream = SupervisedStream(served, req, ticket, policy=RetryPolicy(),
                              rng=random.Random(1))
    out: list[Event] = []
    while True:
        event = await stream.next_event()
        out.append(event)
        if isinstance(event, Finish | Failure):
            ticket.release()
            return out, stream


# -- failover ---------------------------------------------------------------------------------


def test_a_refused_connection_fails_over_to_another_replica_at_once() -> None:
    async def main() -> None:
        pool, fakes = make_pool("refuse", "refuse", "ok")
        for i in range(6):  # wherever the choice lands first, the answer comes from r3
            events, stream = await run_one(pool, request(rid=f"q{i}"))
            assert isinstance(events[-1], Finish), events
            assert stream.attempts <= 3
        assert len(fakes[2].requests) == 6
        # r1 and r2 were each tried until their breakers opened (3 failures), then never
        assert len(fakes[0].requests) <= 3 and len(fakes[1].requests) <= 3
    asyncio.run(main())


class Retries(_NoObserver):
    def __init__(self) -> None:
        self.scheduled: list[tuple[str, float]] = []

    def retry_scheduled(self, budget: str, delay_s: float, failure_class: str,
                        code: str | None) -> None:
        self.scheduled.append((budget, delay_s))


def test_failover_spends_no_retry_budget_and_no_wait() -> None:
    async def main() -> None:
        pool, fakes = make_pool("refuse", "ok")
        pool.replicas[1].breaker.force_open(pool._clock())  # r2 out: r1 first, surely
        pool.replicas[1].breaker.open_until = 0  # ...but its cool-down is over
        admission = Admission(limits=limits_of([pool]), all_limited=True)
        ticket = admission.reserve(asyncio.get_running_loop().time())
        assert ticket is not None
        seen = Retries()
        stream = SupervisedStream(ServedModel(name="m", upstream=pool), request(), ticket,
                                  observer=seen, rng=random.Random(1))
        while not isinstance(event := await stream.next_event(), Finish | Failure):
            pass
        assert isinstance(event, Finish) and stream.attempts == 2
        # connection_refused spends no budget (it is final for one upstream): a failover
        # with no wait, recorded as such
        assert seen.scheduled == [("failover", 0.0)]
        assert len(fakes[0].requests) == len(fakes[1].requests) == 1
    asyncio.run(main())


def test_a_failover_waits_in_admission_for_a_busy_replica_instead_of_failing() -> None:
    async def main() -> None:
        pool, fakes = make_pool("refuse", "hold", limit=1)
        fakes[1].release = asyncio.Event()
        admission = Admission(max_concurrent=10, queue_size=10, limits=limits_of([pool]),
                              all_limited=True)
        pool.on_capacity = admission.regrant
        tasks = [asyncio.create_task(run_one(pool, request(rid=f"q{i}"), admission))
                 for i in range(4)]
        for _ in range(20):
            await asyncio.sleep(0)
        assert pool.replicas[1].in_flight == 1  # r2 busy, the others wait in admission
        assert pool.replicas[0].in_flight == 0
        fakes[1].release.set()
        results = await asyncio.gather(*tasks)
        assert all(isinstance(ev[-1], Finish) for ev, _ in results), results
        assert len(fakes[1].requests) == 4  # every one answered by r2, none failed
    asyncio.run(main())


def test_every_replica_refusing_ends_with_the_failure_not_a_loop() -> None:
    async def main() -> None:
        pool, fakes = make_pool("refuse", "refuse", "refuse")
        events, stream = await run_one(pool, request())
        assert events[-1] == REFUSED  # connection_refused is final once no replica is left
        assert stream.attempts == 3
        assert sorted(len(f.requests) for f in fakes) == [1, 1, 1]
    asyncio.run(main())


def test_a_failure_after_output_is_never_replayed_elsewhere() -> None:
    async def main() -> None:
        pool, _fakes = make_pool("cut", "cut", "cut")
        events, stream = await run_one(pool, request())
        assert events[-1] == CUT and stream.attempts == 1
    asyncio.run(main())


def test_a_client_error_is_not_failed_over_nor_held_against_the_replica() -> None:
    async def main() -> None:
        pool, _fakes = make_pool("bad", "bad")
        events, stream = await run_one(pool, request())
        assert events[-1] == BAD and stream.attempts == 1
        assert all(r.breaker.consecutive == 0 and r.failed == 0 for r in pool.replicas)
    asyncio.run(main())


# -- ejection and recovery --------------------------------------------------------------------


def test_a_dead_replica_is_ejected_and_later_requests_never_reach_it() -> None:
    async def main() -> None:
        clock = Clock()
        pool, fakes = make_pool("refuse", "ok", clock=clock)
        for i in range(20):
            events, _ = await run_one(pool, request(rid=f"q{i}"))
            assert isinstance(events[-1], Finish)
        assert pool.replicas[0].breaker.state is BreakerState.OPEN
        assert len(fakes[0].requests) == 3  # the threshold, then never again
        # The cool-down passes; the probe is the half-open trial; two successes close it.
        fakes[0].mode, clock.now = "ok", clock.now + 10
        await pool.probe()
        assert pool.replicas[0].breaker.state is BreakerState.HALF_OPEN
        await pool.probe()
        assert pool.replicas[0].breaker.state is BreakerState.CLOSED
        for i in range(20):
            await run_one(pool, request(rid=f"z{i}"))
        assert len(fakes[0].requests) > 3  # it serves again
    asyncio.run(main())


def test_a_probe_failure_counts_and_a_down_replica_is_not_probed_while_cooling() -> None:
    async def main() -> None:
        clock = Clock()
        pool, fakes = make_pool("ok", "ok", clock=clock)
        fakes[0].up = False
        for _ in range(3):
            await pool.probe()
        assert pool.replicas[0].breaker.state is BreakerState.OPEN
        assert pool.replicas[1].breaker.state is BreakerState.CLOSED
        events, _ = await run_one(pool, request())
        assert isinstance(events[-1], Finish) and not fakes[0].requests
    asyncio.run(main())


def test_all_replicas_ejected_fails_fast_with_a_typed_error_when_panic_is_off() -> None:
    async def main() -> None:
        clock = Clock()
        pool, _fakes = make_pool("ok", "ok", clock=clock)
        pool.panic_threshold = None  # panic_threshold = false
        for r in pool.replicas:
            r.breaker.force_open(clock.now)
        assert pool.has_free_slot()  # admission lets it through, to fail at once
        choice = pool.choose(request())
        assert choice.replica is None and choice.failure is not None
        assert choice.failure.code == "no_healthy_replica"
        assert choice.failure.status == 503 and choice.failure.retry_after == 10
    asyncio.run(main())


def test_half_open_lets_exactly_one_real_request_through() -> None:
    async def main() -> None:
        clock = Clock()
        pool, fakes = make_pool("hold", "ok", clock=clock)
        fakes[0].release = asyncio.Event()
        pool.replicas[0].breaker.force_open(clock.now)
        clock.now += 10
        key = next(k for k in (f"k{i}" for i in range(100))
                   if pool.choose(request(affinity=(("x-tokenwire-affinity", k),))).replica
                   is pool.replicas[0])
        req = request(affinity=(("x-tokenwire-affinity", key),))
        first = pool.submit(req)  # the trial
        assert pool.replicas[0].breaker.trial_in_flight
        for _ in range(5):  # the same key now goes elsewhere: the trial is running
            assert pool.choose(req).replica is pool.replicas[1]
        fakes[0].release.set()
        while not isinstance(await first.next_event(), Finish):
            pass
        assert pool.choose(req).replica is pool.replicas[0]
    asyncio.run(main())


# -- capacity ---------------------------------------------------------------------------------


def test_a_pool_at_its_limits_waits_in_admission_and_never_exceeds_a_limit() -> None:
    async def main() -> None:
        pool, fakes = make_pool("hold", "hold", "hold", limit=2)
        gate = asyncio.Event()
        for f in fakes:
            f.release = gate
        admission = Admission(max_concurrent=100, queue_size=100,
                              limits=limits_of([pool]), all_limited=True)
        pool.on_capacity = admission.regrant
        peak: list[int] = []
        tasks = [asyncio.create_task(run_one(pool, request(rid=f"q{i}"), admission))
                 for i in range(15)]
        for _ in range(20):
            await asyncio.sleep(0)
            peak.append(max(r.in_flight for r in pool.replicas))
        assert sum(r.in_flight for r in pool.replicas) == 6  # three replicas, two each
        assert admission.queued == 9  # the rest wait in admission, not inside the pool
        gate.set()
        results = await asyncio.gather(*tasks)
        assert all(isinstance(ev[-1], Finish) for ev, _ in results)
        assert max(peak) <= 2
    asyncio.run(main())


def test_requests_granted_together_wait_for_a_slot_instead_of_failing_in_the_pool() -> None:
    """r1 is ejected, so the pool's admission limit (both replicas' limits, 4) is more than
    the slots it has (r2's 2). When one of r2's requests ends, admission grants its slot,
    and also a second one: r2's count has not moved yet for the first grant, which has not
    reached the pool. The second found r2 full and failed with ``no_healthy_replica``;
    retried on the connection budget while later arrivals took every freed slot from the
    queue, it ended in a 503 after 120 s although it came third. Every request must wait
    in the one admission queue for a slot (README "Replica pools": "never inside the
    pool"), in arrival order, and be answered."""
    async def main() -> None:
        clock = Clock()
        pool, fakes = make_pool("ok", "ok", limit=2, clock=clock)
        pool.probe_interval_s = 1e9
        pool.replicas[0].breaker.force_open(clock.now)  # the pool's clock never moves
        fakes[1].slow_s = 200.0
        admission = Admission(max_concurrent=100, queue_size=100, limits=limits_of([pool]),
                              all_limited=True)
        pool.on_capacity = admission.regrant
        tasks = []
        for i, at in enumerate((0.0, 10.0, 20.0, 20.0, 20.0)):
            await asyncio.sleep(at - asyncio.get_running_loop().time())
            tasks.append(asyncio.create_task(run_one(pool, request(rid=f"q{i}"),
                                                     admission)))
        results = await asyncio.gather(*tasks)
        assert [type(ev[-1]).__name__ for ev, _ in results] == ["Finish"] * 5
        assert [stream.attempts for _, stream in results] == [1] * 5
        assert not fakes[0].requests and len(fakes[1].requests) == 5
    with asyncio.Runner(loop_factory=lambda: looptime.new_event_loop(start=0)) as runner:
        runner.run(main())


def test_a_half_open_probe_that_succeeds_starts_a_request_waiting_for_the_replica() -> None:
    """A successful half-open probe that does not yet close the breaker (``close_after``
    is 2) still gives the trial's turn back: the replica admits a request again, so a
    request waiting in admission for a slot starts now. Before, nothing re-granted: it
    waited for the next probe to close the breaker, ``probe_interval_s`` later (a minute,
    with the interval set to one), while the replica could take it."""
    async def main() -> None:
        clock = Clock()
        pool, fakes = make_pool("ok", "hold", limit=1, clock=clock)
        fakes[1].release = asyncio.Event()
        pool.replicas[0].breaker.force_open(clock.now)
        admission = Admission(max_concurrent=10, queue_size=10, limits=limits_of([pool]),
                              all_limited=True)
        pool.on_capacity = admission.regrant
        busy = asyncio.create_task(run_one(pool, request(rid="busy"), admission))
        while pool.replicas[1].in_flight == 0:
            await asyncio.sleep(0)
        waiting = asyncio.create_task(run_one(pool, request(rid="w"), admission))
        for _ in range(20):
            await asyncio.sleep(0)
        assert admission.queued == 1  # r1 ejected, r2 full: it waits
        clock.now += 10  # the cool-down passes; the probe is the half-open trial
        await pool.probe()
        assert pool.replicas[0].breaker.state is BreakerState.HALF_OPEN
        for _ in range(50):  # loop turns, no clock: admission grants, r1 answers
            await asyncio.sleep(0)
        assert waiting.done() and len(fakes[0].requests) == 1
        assert isinstance(waiting.result()[0][-1], Finish)
        fakes[1].release.set()
        await busy
    asyncio.run(main())


def test_an_ejected_replica_takes_its_slots_out_of_admission() -> None:
    clock = Clock()
    pool, _ = make_pool("ok", "ok", limit=1, clock=clock)
    pool.replicas[1].in_flight = 1
    assert pool.has_free_slot()
    pool.replicas[0].breaker.force_open(clock.now)
    assert not pool.has_free_slot()  # r1 down, r2 full: no slot (a request waits)


# -- affinity ---------------------------------------------------------------------------------


def test_an_affinity_key_keeps_a_conversation_on_one_replica() -> None:
    pool, _fakes = make_pool("ok", "ok", "ok")
    for hint in ("x-tokenwire-affinity", "prompt_cache_key", "session-id", "thread-id"):
        picks = {pool.choose(request(affinity=((hint, "conv-7"),))).replica for _ in range(10)}
        assert len(picks) == 1
    spread = {pool.choose(request(affinity=(("session-id", f"c{i}"),))).replica.name
              for i in range(60)}
    assert len(spread) == 3  # many conversations use every replica


def test_the_explicit_header_wins_over_other_keys() -> None:
    req = request(affinity=(("session-id", "s"), ("x-tokenwire-affinity", "e"),
                            ("prompt_cache_key", "k")))
    assert affinity_key(req) == "x-tokenwire-affinity:e"
    assert affinity_key(request()) is None


def test_an_ejected_replica_moves_only_its_own_conversations() -> None:
    clock = Clock()
    pool, _ = make_pool("ok", "ok", "ok", clock=clock)
    keys = [f"conv-{i}" for i in range(90)]
    before = {k: pool.choose(request(affinity=(("session-id", k),))).replica for k in keys}
    pool.replicas[0].breaker.force_open(clock.now)
    after = {k: pool.choose(request(affinity=(("session-id", k),))).replica for k in keys}
    moved = [k for k in keys if before[k] is not after[k]]
    assert moved and all(before[k] is pool.replicas[0] for k in moved)


def test_a_full_replica_passes_the_key_to_its_next_in_order() -> None:
    pool, _ = make_pool("ok", "ok", "ok", limit=1)
    req = request(affinity=(("session-id", "s"),))
    first = pool.choose(req).replica
    assert first is not None
    first.in_flight = 1
    second = pool.choose(req).replica
    assert second is not None and second is not first


def test_a_busy_home_replica_passes_new_turns_on_within_the_load_bound() -> None:
    """Bounded loads: three turns of conversations that all hash to one replica, in flight
    at once, do not queue three deep there while the others sit idle (the bench's 4 / 2 / 0
    run); with ``load_factor=None`` (plain rendezvous) they do, and so they do within the
    default slack of one request (``balance.DEFAULT_LOAD_SLACK``)."""
    for factor, slack, deepest in ((1.25, 0, 2), (None, 0, 3), (1.25, 1, 3)):
        pool, _ = make_pool("ok", "ok", "ok")
        pool.load_factor, pool.load_slack = factor, slack
        home = pool.choose(request(affinity=(("session-id", "conv-1"),))).replica
        assert home is not None
        keys = [k for k in (f"conv-{i}" for i in range(200))
                if pool.choose(request(affinity=(("session-id", k),))).replica is home][:3]
        for k in keys:  # each takes a slot, as an attempt in flight would
            picked = pool.choose(request(affinity=(("session-id", k),))).replica
            assert picked is not None
            picked.in_flight += 1
        assert home.in_flight == deepest
        assert sum(r.in_flight for r in pool.replicas) == 3


@pytest.mark.parametrize("value", [0.5, 0, 101, "1.5", True])
def test_a_bad_load_factor_is_a_config_error(value: object) -> None:
    with pytest.raises(ConfigError, match="affinity_load_factor"):
        parse_load_factor(value)
    assert parse_load_factor(False) is None and parse_load_factor(2) == 2.0


@pytest.mark.parametrize("value", [-1, 1.5, "2", True, 10_001])
def test_a_bad_load_slack_is_a_config_error(value: object) -> None:
    with pytest.raises(ConfigError, match="affinity_load_slack"):
        parse_load_slack(value)
    assert parse_load_slack(0) == 0 and parse_load_slack(8) == 8


def test_the_prefix_hash_is_a_stateless_choice() -> None:
    pool, _ = make_pool("ok", "ok", "ok")
    pool.prefix_chars = 64
    shared = "You are a helpful assistant. " * 4
    picks = {pool.choose(GenerationRequest(prompt=PromptText(text=shared + f"q{i}"))).replica
             for i in range(10)}
    assert len(picks) == 1  # the same first 64 characters: the same replica
    pool.prefix_chars = 0
    assert affinity_key(GenerationRequest(prompt=PromptText(text=shared))) is None


def test_a_response_continues_on_the_replica_that_produced_it() -> None:
    async def main() -> None:
        clock = Clock()
        pool, _fakes = make_pool("ok", "ok", "ok", clock=clock)
        await run_one(pool, request(rid="resp_1"))
        producer = next(r for r in pool.replicas if r.completed == 1)
        for _ in range(10):
            nxt = request(rid="resp_2", affinity=(("previous_response_id", "resp_1"),))
            assert pool.choose(nxt).replica is producer
        # Down: the gateway replays the stored items itself, so another replica continues.
        producer.breaker.force_open(clock.now)
        other = pool.choose(request(affinity=(("previous_response_id", "resp_1"),))).replica
        assert other is not None and other is not producer
    asyncio.run(main())


def _with_encrypted(replica: str) -> GenerationRequest:
    msg = ChatMessage(role="assistant", content="", reasoning_encrypted=((replica, "{}"),))
    return GenerationRequest(prompt=ChatPrompt(messages=(
        ChatMessage(role="user", content="hi"), msg, ChatMessage(role="user", content="go"))))


def test_encrypted_reasoning_goes_only_to_the_replica_that_can_read_it() -> None:
    async def main() -> None:
        clock = Clock()
        pool, fakes = make_pool("ok", "refuse", "ok", kind="responses", clock=clock)
        for _ in range(5):
            assert pool.choose(_with_encrypted("p/r3")).replica is pool.replicas[2]
        # Its replica refuses the connection: the state is never sent to another one.
        events, stream = await run_one(pool, _with_encrypted("p/r2"))
        assert isinstance(events[-1], Failure) and stream.attempts >= 1
        assert not fakes[0].requests and not fakes[2].requests
        pool.replicas[1].breaker.force_open(clock.now)
        failure = pool.choose(_with_encrypted("p/r2")).failure
        assert failure is not None and failure.code == "replica_unavailable"
        assert failure.status == 503 and failure.retry_after == 10
        assert "p/r2" in failure.message
    asyncio.run(main())


def test_turn_state_pins_its_replica() -> None:
    pool, _ = make_pool("ok", "ok", "ok", kind="responses")
    wrapped = wrap_turn_state("p/r2", "state-1")
    assert wrapped is not None
    req = request(affinity=(("x-codex-turn-state", wrapped), ("session-id", "s")))
    assert {pool.choose(req).replica.name for _ in range(10)} == {"p/r2"}


def test_an_openai_pool_never_pins_on_state_it_does_not_forward() -> None:
    pool, _ = make_pool("ok", "ok", "ok", kind="openai")
    assert pool._turn_pin(_with_encrypted("p/r2")) == (None, False)


# -- the gateway's turn-state token (x-codex-turn-state) ----------------------------------------


def _turn(token: str, **kw: Any) -> GenerationRequest:
    return request(affinity=(("x-codex-turn-state", token), ("session-id", "s")), **kw)


def test_every_attempt_starts_with_a_signed_token_naming_its_replica() -> None:
    async def main() -> None:
        pool, _ = make_pool("ok", "ok")
        events, _ = await run_one(pool, request())
        [meta] = [e for e in events if isinstance(e, ResponseMeta)]
        scope, value = read_turn_state(meta.turn_state)
        assert value is None and scope in {"p/r1", "p/r2"}
        assert events.index(meta) < next(i for i, e in enumerate(events)
                                         if isinstance(e, TokenDelta))
    asyncio.run(main())


def test_a_replica_token_keeps_the_turn_on_its_replica_and_reroutes_when_it_is_down() -> None:
    clock = Clock()
    pool, _ = make_pool("ok", "ok", "ok", kind="openai", clock=clock)
    token = replica_token("p/r3")
    assert {pool.choose(_turn(token)).replica.name for _ in range(10)} == {"p/r3"}
    # Down: the turn's state is the gateway's own (it replays the items), so the request
    # goes on elsewhere, and never fails for it.
    pool.replicas[2].breaker.force_open(clock.now)
    names = {pool.choose(_turn(token)).replica.name for _ in range(10)}
    assert names and "p/r3" not in names


def test_a_forged_or_foreign_token_is_ignored() -> None:
    pool, _ = make_pool("ok", "ok", "ok", kind="responses")
    token = replica_token("p/r3")
    forged = token[:-1] + ("A" if token[-1] != "A" else "B")
    assert read_turn_state(forged) is None
    assert pool._turn_pin(_turn(forged)) == (None, False)
    set_turn_state_secret(b"another-instance-secret-0123")
    try:  # a token signed by a gateway with another secret names nothing here
        assert read_turn_state(token) is None
    finally:
        set_turn_state_secret(None)
    assert pool._turn_pin(_turn(replica_token("q/r1"))) == (None, False)  # another pool


def test_a_token_with_non_ascii_characters_is_ignored_not_a_crash() -> None:
    # Header values are latin-1; compare_digest raises TypeError on non-ASCII str.
    pool, _ = make_pool("ok", "ok", "ok", kind="responses")
    for odd in ("tw2.AAAA.\xe9x", replica_token("p/r1")[:-2] + "\xe9\xe9"):
        assert read_turn_state(odd) is None
        assert pool._turn_pin(_turn(odd)) == (None, False)


# -- panic ---------------------------------------------------------------------------------------


def test_panic_routes_over_every_replica_when_all_are_ejected() -> None:
    async def main() -> None:
        clock = Clock()
        pool, fakes = make_pool("ok", "ok", clock=clock)
        for r in pool.replicas:
            r.breaker.force_open(clock.now)
        assert pool.panicking(clock.now)
        events, _ = await run_one(pool, request())
        assert isinstance(events[-1], Finish)  # served, not refused
        assert sum(len(f.requests) for f in fakes) == 1
        # A success in panic is no trial: the breakers still decide recovery.
        assert all(r.breaker.state is BreakerState.OPEN for r in pool.replicas)
        clock.now += 10  # cooled down: no longer panicking, the trials go first
        assert not pool.panicking(clock.now)
    asyncio.run(main())


@pytest.mark.parametrize(("threshold", "ejected", "panics"), [
    (0.0, 2, False), (0.0, 3, True), (0.5, 1, False), (0.5, 2, True), (None, 3, False)])
def test_the_panic_threshold_is_the_share_of_replicas_not_cooling_down(
        threshold: float | None, ejected: int, panics: bool) -> None:
    clock = Clock()
    pool, _ = make_pool("ok", "ok", "ok", clock=clock)
    pool.panic_threshold = threshold
    for r in pool.replicas[:ejected]:
        r.breaker.force_open(clock.now)
    assert pool.panicking(clock.now) is panics
    choice = pool.choose(request())
    if panics or ejected < 3:
        assert choice.replica is not None
        if not panics:
            assert choice.replica in pool.replicas[ejected:]
    else:
        assert choice.failure is not None and choice.failure.code == "no_healthy_replica"


def test_panic_never_exceeds_a_replica_limit() -> None:
    clock = Clock()
    pool, _ = make_pool("ok", "ok", limit=1, clock=clock)
    for r in pool.replicas:
        r.breaker.force_open(clock.now)
        r.in_flight = 1
    assert not pool.has_free_slot()  # wait in admission, not over the limit
    assert pool.choose(request()).replica is None


@pytest.mark.parametrize("value", [1, 1.5, -0.1, "0.5", True])
def test_a_bad_panic_threshold_is_a_config_error(value: object) -> None:
    with pytest.raises(ConfigError, match="panic_threshold"):
        parse_panic_threshold(value)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_weights_and_limits_are_the_admission_limit(n: int) -> None:
    pool, _ = make_pool(*["ok"] * n, limit=3)
    assert limits_of([pool]) == {id(pool): 3 * n}


# -- counting -----------------------------------------------------------------------------------


class _GateOnHeartbeats(_NoObserver):
    """Opens the replica's gate after ``n`` heartbeats, noting its in-flight count each time."""

    def __init__(self, gate: asyncio.Event, replica: Replica, n: int = 2) -> None:
        self.gate, self.replica, self.left = gate, replica, n
        self.in_flight_seen: list[int] = []

    def heartbeat(self) -> None:
        self.in_flight_seen.append(self.replica.in_flight)
        self.left -= 1
        if self.left == 0:
            self.gate.set()


def test_a_stream_quiet_past_a_heartbeat_counts_as_completed_and_closes_its_breaker() -> None:
    """The supervisor's heartbeat timer stops waiting on a quiet upstream and asks again
    (EventStream: "cancelling the wait loses nothing"). Such a wait is not the attempt's end:
    the replica stays in flight, its Finish counts as completed once and is the breaker's
    success (a half-open trial closes). Before the fix the first heartbeat ended the attempt
    as neutral: ``completed`` stayed 0, ``in_flight`` dropped while the replica was working,
    and the trial never closed the breaker."""
    async def main() -> None:
        clock = Clock()
        pool, fakes = make_pool("hold", clock=clock)
        pool.probe_interval_s = 1e9  # only the request may close the breaker
        replica = pool.replicas[0]
        replica.breaker = Breaker(BreakerPolicy(consecutive_failures=3, base_cooldown_s=10,
                                                max_cooldown_s=40, close_after=1))
        replica.breaker.force_open(clock.now)
        clock.now += 10  # cooled down: the next request is the half-open trial
        fakes[0].release = asyncio.Event()
        obs = _GateOnHeartbeats(fakes[0].release, replica)
        admission = Admission(limits=limits_of([pool]), all_limited=True)
        ticket = admission.reserve(asyncio.get_running_loop().time())
        assert ticket is not None
        stream = SupervisedStream(ServedModel(name="m", upstream=pool), request(), ticket,
                                  timing=Timing(heartbeat_s=15.0), observer=obs,
                                  rng=random.Random(1))
        events = [await stream.next_event()]
        while not isinstance(events[-1], Finish | Failure):
            events.append(await stream.next_event())
        ticket.release()
        assert isinstance(events[-1], Finish), events
        assert sum(isinstance(e, Heartbeat) for e in events) == 2
        assert obs.in_flight_seen == [1, 1]  # still working on it while quiet
        assert (replica.completed, replica.in_flight, replica.failed) == (1, 0, 0)
        assert replica.breaker.state is BreakerState.CLOSED  # the trial's success counted
    with asyncio.Runner(loop_factory=lambda: looptime.new_event_loop(start=0)) as runner:
        runner.run(main())


def test_a_client_that_goes_away_mid_attempt_frees_the_replica_as_neutral() -> None:
    """The other side of the test above: the owner's cancel still ends the attempt once."""
    async def main() -> None:
        pool, fakes = make_pool("hold")
        pool.probe_interval_s = 1e9
        replica = pool.replicas[0]
        fakes[0].release = asyncio.Event()  # never set: the replica stays quiet
        admission = Admission(limits=limits_of([pool]), all_limited=True)
        ticket = admission.reserve(asyncio.get_running_loop().time())
        assert ticket is not None
        stream = SupervisedStream(ServedModel(name="m", upstream=pool), request(), ticket,
                                  timing=Timing(heartbeat_s=15.0), rng=random.Random(1))
        reader = asyncio.create_task(stream.next_event())
        while replica.in_flight == 0:
            await asyncio.sleep(1.0)
        await asyncio.sleep(40.0)  # past two heartbeats' timers
        assert replica.in_flight == 1
        stream.cancel()
        await asyncio.sleep(1.0)
        reader.cancel()
        assert (replica.completed, replica.in_flight, replica.failed) == (0, 0, 0)
        assert not replica.breaker.trial_in_flight
    with asyncio.Runner(loop_factory=lambda: looptime.new_event_loop(start=0)) as runner:
        runner.run(main())


def test_the_websocket_upgrade_names_a_replica_or_echoes_a_signed_token() -> None:
    from types import SimpleNamespace

    from tokenwire.gateway.http.responses_ws import upgrade_turn_state
    from tokenwire.gateway.routing.router import Router

    pool, _ = make_pool("ok", "ok", kind="responses")
    state = SimpleNamespace(router=Router([ServedModel(name="m", upstream=pool)]))
    token = upgrade_turn_state(state, {})  # type: ignore[arg-type]
    assert token is not None and read_turn_state(token)[0] in {"p/r1", "p/r2"}
    mine = replica_token("p/r2")
    assert upgrade_turn_state(state, {"x-codex-turn-state": mine}) == mine  # type: ignore[arg-type]
    forged = mine[:-2] + "zz"
    assert upgrade_turn_state(state, {"x-codex-turn-state": forged}) != forged  # type: ignore[arg-type]
    single = SimpleNamespace(router=Router([ServedModel(name="m", upstream=FakeReplica("u"))]))
    assert upgrade_turn_state(single, {}) is None  # type: ignore[arg-type]


def test_a_replica_silent_past_the_idle_timeout_before_output_fails_over_and_counts() -> None:
    """A replica that takes the request and never answers (a hung engine whose HTTP server
    still answers the probe's model list), with ``idle_timeout_s`` below the adapters' read
    timeout: the silence is the replica's 504 before any output, like a read timeout. Another
    replica takes the request (README "When a replica fails"), and the stall counts against
    the silent one, so its breaker ejects it. Before, the request failed with
    ``idle_timeout`` although r2 was idle, and the attempt was cancelled as neutral: every
    request routed there waited out the idle timeout and failed, and r1 was never ejected."""
    async def main() -> None:
        pool, fakes = make_pool("hold", "ok")
        pool.probe_interval_s = 1e9
        fakes[0].release = asyncio.Event()  # never set: r1 stays silent
        key = next(k for k in (f"k{i}" for i in range(100))
                   if pool.choose(request(affinity=(("x-tokenwire-affinity", k),))).replica
                   is pool.replicas[0])
        for i in range(POLICY.consecutive_failures):
            admission = Admission(limits=limits_of([pool]), all_limited=True)
            ticket = admission.reserve(asyncio.get_running_loop().time())
            assert ticket is not None
            stream = SupervisedStream(
                ServedModel(name="m", upstream=pool),
                request(rid=f"q{i}", affinity=(("x-tokenwire-affinity", key),)), ticket,
                timing=Timing(heartbeat_s=15.0, idle_timeout_s=60.0), rng=random.Random(1))
            events = [await stream.next_event()]
            while not isinstance(events[-1], Finish | Failure):
                events.append(await stream.next_event())
            ticket.release()
            assert isinstance(events[-1], Finish), events[-1]
            text = "".join(e.text for e in events if isinstance(e, TokenDelta))
            assert text == "hi" and stream.attempts == 2
        r1 = pool.replicas[0]
        assert (r1.failed, r1.in_flight, r1.completed) == (POLICY.consecutive_failures, 0, 0)
        assert r1.breaker.state is BreakerState.OPEN
        assert pool.replicas[1].completed == POLICY.consecutive_failures
    with asyncio.Runner(loop_factory=lambda: looptime.new_event_loop(start=0)) as runner:
        runner.run(main())
