"""The replica breaker (routing/breaker.py): every decision with an injected clock."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenwire.errors import ConfigError
from tokenwire.gateway.ir import Failure, FailureClass
from tokenwire.gateway.routing.breaker import (
    Breaker,
    BreakerPolicy,
    BreakerState,
    counts_against_replica,
)

POLICY = BreakerPolicy(consecutive_failures=3, error_rate=0.5, window_s=10, min_requests=6,
                       base_cooldown_s=5, max_cooldown_s=40, close_after=2)


def fail(b: Breaker, now: float, n: int = 1) -> None:
    for _ in range(n):
        trial = b.start(now)
        b.on_failure(now, trial=trial)


def test_consecutive_failures_eject_for_the_base_cooldown() -> None:
    b = Breaker(POLICY)
    fail(b, 0.0, 2)
    assert b.state is BreakerState.CLOSED and b.admits(0.0)
    fail(b, 1.0)
    assert b.state is BreakerState.OPEN and b.ejections == 1
    assert not b.admits(5.999) and b.known_down(5.999)
    assert b.cooldown_left(2.0) == pytest.approx(4.0)
    assert b.admits(6.0)  # the cool-down passed: one trial may go


def test_a_success_resets_the_consecutive_count() -> None:
    b = Breaker(BreakerPolicy(consecutive_failures=3, min_requests=1000))
    for t in range(10):
        fail(b, float(t), 2)
        b.on_success(float(t), trial=b.start(float(t)))
    assert b.state is BreakerState.CLOSED  # never three in a row
    b = Breaker(POLICY)
    for t in range(3):
        fail(b, float(t), 2 if t < 2 else 1)
        if t < 2:
            b.on_success(float(t), trial=b.start(float(t)))
    # 5 failures and 2 successes in 10 s, never 3 in a row: a 71 % error rate ejects it
    assert b.state is BreakerState.OPEN and b.consecutive == 0


def test_error_rate_needs_min_requests_in_the_window() -> None:
    b = Breaker(BreakerPolicy(consecutive_failures=100, min_requests=6, window_s=10))
    for t in range(5):  # 5 requests, alternating: 60 % failed but too few
        (fail(b, t) if t % 2 == 0 else b.on_success(t, trial=b.start(t)))
    assert b.state is BreakerState.CLOSED
    fail(b, 5.0)  # the sixth: 4 of 6 failed
    assert b.state is BreakerState.OPEN


def test_old_outcomes_leave_the_window() -> None:
    b = Breaker(BreakerPolicy(consecutive_failures=100, min_requests=4, window_s=10))
    fail(b, 0.0, 3)
    for t in (20.0, 21.0, 22.0):
        b.on_success(t, trial=b.start(t))
    fail(b, 23.0)  # the three old failures are out of the window: 1 of 4
    assert b.state is BreakerState.CLOSED


def test_half_open_admits_exactly_one_trial_and_closes_after_successes() -> None:
    b = Breaker(POLICY)
    fail(b, 0.0, 3)
    assert b.start(5.0) is True  # the trial
    assert b.state is BreakerState.HALF_OPEN
    assert not b.admits(5.0) and not b.admits(100.0)  # nothing else while it runs
    with pytest.raises(RuntimeError):
        b.start(5.0)
    b.on_success(6.0, trial=True)
    assert b.state is BreakerState.HALF_OPEN and b.admits(6.0)  # one success is not enough
    assert b.start(6.0) is True
    b.on_success(7.0, trial=True)
    assert b.state is BreakerState.CLOSED and b.admits(7.0)


def test_a_failed_trial_reopens_for_a_doubled_cooldown_capped() -> None:
    b = Breaker(POLICY)
    fail(b, 0.0, 3)  # 5 s
    now, cooldowns = 0.0, []
    for _ in range(5):
        now += b.cooldown_left(now)
        assert b.start(now) is True
        b.on_failure(now, trial=True)
        cooldowns.append(b.cooldown_left(now))
    assert cooldowns == [10, 20, 40, 40, 40]


def test_the_streak_is_forgotten_after_a_long_healthy_spell() -> None:
    b = Breaker(POLICY)
    fail(b, 0.0, 3)
    for t in (5.0, 6.0):
        b.start(t)
        b.on_success(t, trial=True)
    fail(b, 7.0, 3)
    assert b.cooldown_left(7.0) == 10  # ejected again soon after: doubled
    for t in (17.0, 18.0):
        b.start(t)
        b.on_success(t, trial=True)
    fail(b, 18.0 + 40, 3)  # closed for max_cooldown_s: back to the base
    assert b.cooldown_left(58.0) == 5


def test_a_neutral_trial_gives_its_turn_back() -> None:
    b = Breaker(POLICY)
    fail(b, 0.0, 3)
    b.start(5.0)
    b.on_neutral(5.5, trial=True)  # the client went away
    assert b.state is BreakerState.HALF_OPEN and b.admits(5.5)


def test_late_outcomes_of_requests_started_before_the_ejection_change_nothing() -> None:
    b = Breaker(POLICY)
    early = [b.start(0.0) for _ in range(4)]
    for trial in early[:3]:
        b.on_failure(0.0, trial=trial)
    assert b.state is BreakerState.OPEN
    b.on_success(1.0, trial=early[3])
    b.on_failure(1.0, trial=False)
    assert b.state is BreakerState.OPEN and b.ejections == 1


def test_force_open_ejects_a_closed_replica() -> None:
    b = Breaker(POLICY)
    b.force_open(3.0)
    assert b.known_down(3.0) and b.admits(8.0)


@pytest.mark.parametrize(("cls", "counts"), [
    (FailureClass.CONNECTION, True), (FailureClass.UPSTREAM, True),
    (FailureClass.CAPACITY, True), (FailureClass.TIMEOUT, True),
    (FailureClass.INVALID_REQUEST, False), (FailureClass.CONTEXT_LENGTH, False),
    (FailureClass.RATE_LIMITED, False), (FailureClass.CONTENT_FILTER, False),
    (FailureClass.AUTHENTICATION, False), (FailureClass.QUOTA, False),
])
def test_only_the_replicas_own_faults_count(cls: FailureClass, counts: bool) -> None:
    assert counts_against_replica(Failure(failure_class=cls, message="x")) is counts


@pytest.mark.parametrize("bad", [{"consecutive_failures": 0}, {"error_rate": 0},
                                 {"error_rate": 1.5}, {"window_s": 0},
                                 {"base_cooldown_s": 10, "max_cooldown_s": 5},
                                 {"close_after": 0}, {"min_requests": 0}])
def test_bad_policies_are_config_errors(bad: dict) -> None:
    with pytest.raises(ConfigError):
        BreakerPolicy(**bad)


# -- the property: a breaker never admits while open -----------------------------------------

_OPS = st.lists(st.tuples(st.sampled_from(["start", "ok", "fail", "neutral"]),
                          st.floats(min_value=0.0, max_value=12.0), st.integers(0, 7)),
                max_size=120)


@given(_OPS)
def test_a_breaker_never_admits_while_open_and_half_open_runs_one_trial(ops) -> None:
    b = Breaker(POLICY)
    now = 0.0
    running: list[bool] = []  # the trial flag of each request started and not ended
    for op, step, pick in ops:
        now += step
        if b.known_down(now):  # open and cooling down: nothing at all may be sent
            assert not b.admits(now)
            with pytest.raises(RuntimeError):
                b.start(now)
        if op == "start":
            if b.admits(now):
                was_closed = b.state is BreakerState.CLOSED
                trial = b.start(now)
                assert trial is not was_closed  # only a non-closed breaker runs trials
                running.append(trial)
        elif running:
            trial = running.pop(pick % len(running))
            {"ok": b.on_success, "fail": b.on_failure, "neutral": b.on_neutral}[op](
                now, trial=trial)
        assert sum(running) <= 1  # never two trials at once
        assert b.trial_in_flight == any(running)
        if b.state is BreakerState.HALF_OPEN and b.trial_in_flight:
            assert not b.admits(now)
