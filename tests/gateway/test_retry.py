"""Retry budgets (seed, "Provider failures and retry budgets"), on a simulated clock.

Every test drives :class:`RetryState` the way the gateway will: start an attempt, let it fail
after a simulated duration, wait the returned delay, recheck the deadline. Time is a float
the test advances; the RNG is seeded; nothing sleeps.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenwire.gateway.ir import Failure, FailureClass
from tokenwire.gateway.supervision import retry as retry_mod
from tokenwire.gateway.supervision.retry import (
    CONNECTION_BUDGET_S,
    THROTTLE_BUDGET_S,
    THROTTLE_EXHAUSTED_MESSAGE,
    Budget,
    GiveUp,
    Retry,
    RetryDeadlinePassed,
    RetryPolicy,
    RetryState,
    RetryStateError,
    budget_for,
)

C = FailureClass
T0 = 1000.0  # an arbitrary start: nothing may assume the clock starts at zero


def _f(cls: FailureClass, *, code: str | None = None, retry_after: float | None = None,
       status: int = 500, message: str = "boom") -> Failure:
    return Failure(failure_class=cls, message=message, status=status, code=code,
                   retry_after=retry_after)


SERVER_ERROR = _f(C.UPSTREAM, status=502)
EOF_NO_TERMINAL = _f(C.UPSTREAM, status=502,
                     message="the upstream stream ended without a terminal event")
CONN = _f(C.CONNECTION, status=502)
NAMED_THROTTLE = _f(C.RATE_LIMITED, code="rate_limit_exceeded", status=429)


@dataclass
class Run:
    """The outcome of one simulated request."""

    attempts: int
    elapsed: float
    delays: list[tuple[Budget, float]] = field(default_factory=list)
    outcome: GiveUp | None = None


def simulate(failures: list[Failure], *, attempt_s: float = 0.0, published: bool = False,
             seed: int = 0, state: RetryState | None = None, overshoot_s: float = 0.0) -> Run:
    """Run attempts failing with ``failures`` in turn (the last repeats) until a GiveUp."""
    rng = random.Random(seed)
    state = state or RetryState(started_at=T0)
    now, run = T0, Run(attempts=0, elapsed=0.0)
    for i in range(10_000):
        state.on_attempt_started(now)
        run.attempts += 1
        now += attempt_s
        failure = failures[min(i, len(failures) - 1)]
        decision = state.on_failure(failure, now=now, output_published=published, rng=rng)
        if isinstance(decision, GiveUp):
            run.outcome = decision
            break
        run.delays.append((decision.budget, decision.delay_s))
        now += decision.delay_s + overshoot_s
        if not state.check_after_wait(now):
            run.outcome = state.abandon()
            break
    run.elapsed = now - T0
    return run


# -- the single retry ------------------------------------------------------------------------


def test_upstream_5xx_retries_once_after_one_second() -> None:
    run = simulate([SERVER_ERROR], attempt_s=0.5)
    assert run.attempts == 2
    assert run.delays == [(Budget.SINGLE, 1.0)]
    assert run.elapsed == pytest.approx(0.5 + 1.0 + 0.5)
    assert run.outcome == GiveUp(SERVER_ERROR)


@pytest.mark.parametrize("status_class", [C.UPSTREAM, C.CAPACITY, C.TIMEOUT])
def test_http_500_502_503_504_have_the_same_single_retry(status_class: FailureClass) -> None:
    run = simulate([_f(status_class)])
    assert run.attempts == 2 and run.delays == [(Budget.SINGLE, 1.0)]


def test_clean_eof_without_terminal_retries_once_before_output() -> None:
    run = simulate([EOF_NO_TERMINAL, EOF_NO_TERMINAL])
    assert run.attempts == 2 and run.elapsed == pytest.approx(1.0)
    assert simulate([EOF_NO_TERMINAL], published=True).attempts == 1


def test_single_retry_is_one_per_request_whichever_attempt_it_lands_on() -> None:
    # Two connection failures (their own budget), then a 5xx (the single retry), then a 5xx.
    run = simulate([CONN, CONN, SERVER_ERROR, SERVER_ERROR])
    assert run.attempts == 4
    assert [b for b, _ in run.delays] == [Budget.CONNECTION, Budget.CONNECTION, Budget.SINGLE]
    assert run.outcome == GiveUp(SERVER_ERROR)


@pytest.mark.parametrize("code", sorted(retry_mod.FINAL_UPSTREAM_CODES))
def test_malformed_streams_and_mismatches_never_retry(code: str) -> None:
    assert simulate([_f(C.UPSTREAM, code=code)]).attempts == 1


# -- never a replay --------------------------------------------------------------------------


@pytest.mark.parametrize("failure", [SERVER_ERROR, EOF_NO_TERMINAL, CONN, NAMED_THROTTLE,
                                     _f(C.RATE_LIMITED, retry_after=5, status=429)])
def test_never_a_replay_once_output_was_published(failure: Failure) -> None:
    run = simulate([failure], published=True)
    assert run.attempts == 1 and run.delays == [] and run.outcome == GiveUp(failure)


# -- the connection budget -------------------------------------------------------------------


def test_connection_failures_back_off_1_2_4_8_s_with_20_percent_jitter() -> None:
    run = simulate([CONN], seed=7)
    delays = [d for _, d in run.delays]
    for n, delay in enumerate(delays):
        base = min(8.0, 2.0 ** n)
        assert 0.8 * base <= delay <= 1.2 * base
    assert len(set(delays)) == len(delays)  # jittered, not a fixed schedule


@pytest.mark.parametrize("attempt_s", [0.0, 0.3, 5.0])
def test_connection_budget_is_120_s_from_the_first_connection_failure(attempt_s: float) -> None:
    run = simulate([CONN], attempt_s=attempt_s, seed=3)
    first_failure_at = attempt_s
    # Every attempt started before the deadline; the last ended (at most) one attempt later.
    assert run.elapsed < first_failure_at + CONNECTION_BUDGET_S + attempt_s
    assert sum(d for _, d in run.delays) < CONNECTION_BUDGET_S
    assert run.attempts == len(run.delays) + 1
    if attempt_s == 0.0:  # 1 + 2 + 4 + 8 s, then ~8 s steps fill the rest of the 120 s
        assert run.attempts >= 16
    assert run.outcome is not None and run.outcome.failure is CONN  # returned unchanged


def test_connection_wait_that_would_cross_the_deadline_is_refused() -> None:
    state = RetryState(started_at=T0)
    rng = random.Random(1)
    state.on_attempt_started(T0)
    assert isinstance(state.on_failure(CONN, now=T0, output_published=False, rng=rng), Retry)
    assert state.check_after_wait(T0 + 1.2)
    state.on_attempt_started(T0 + 1.2)  # a long attempt: its failure lands 118.5 s in
    decision = state.on_failure(CONN, now=T0 + 118.5, output_published=False, rng=rng)
    assert decision == GiveUp(CONN)  # a 1.6-2.4 s wait would end past T0 + 120


def test_connection_deadline_is_rechecked_after_the_wait() -> None:
    # An event-loop stall overshoots every wait by 30 s: the fourth wait lands past 120 s.
    run = simulate([CONN], overshoot_s=30.0, seed=2)
    assert run.outcome == GiveUp(CONN)
    assert run.attempts == 4 and run.elapsed > CONNECTION_BUDGET_S


def test_no_attempt_starts_at_or_past_the_deadline() -> None:
    state = RetryState(started_at=T0)
    state.on_attempt_started(T0)
    state.on_failure(CONN, now=T0, output_published=False, rng=random.Random(0))
    with pytest.raises(RetryDeadlinePassed):
        state.on_attempt_started(T0 + CONNECTION_BUDGET_S)  # skipped check_after_wait


@pytest.mark.parametrize("code", sorted(retry_mod.NON_TRANSIENT_CONNECTION_CODES))
def test_non_transient_connection_failures_get_no_retry(code: str) -> None:
    assert simulate([_f(C.CONNECTION, code=code)]).attempts == 1


# -- the throttle budget ---------------------------------------------------------------------


def test_named_throttle_honours_retry_after() -> None:
    run = simulate([_f(C.RATE_LIMITED, code="rate_limit_exceeded", retry_after=30.0)])
    assert [d for _, d in run.delays] == [30.0, 30.0, 30.0]  # a 4th would end at 120 s
    assert run.attempts == 4 and run.elapsed == pytest.approx(90.0)


def test_named_throttle_may_use_a_retry_after_over_60_s() -> None:
    run = simulate([_f(C.RATE_LIMITED, code="rate_limit_error", retry_after=90.0)])
    assert run.delays == [(Budget.THROTTLE, 90.0)] and run.attempts == 2


def test_retry_after_under_one_second_waits_one_second() -> None:
    run = simulate([_f(C.RATE_LIMITED, code="limit_requests", retry_after=0.0),
                    _f(C.INVALID_REQUEST)])
    assert run.delays == [(Budget.THROTTLE, 1.0)]


def test_throttle_without_retry_after_uses_the_same_backoff() -> None:
    run = simulate([NAMED_THROTTLE], seed=5)
    for n, (budget, delay) in enumerate(run.delays):
        base = min(8.0, 2.0 ** n)
        assert budget is Budget.THROTTLE and 0.8 * base <= delay <= 1.2 * base
    assert sum(d for _, d in run.delays) < THROTTLE_BUDGET_S


@pytest.mark.parametrize(("retry_after", "budget"), [
    (60.0, Budget.THROTTLE), (1.0, Budget.THROTTLE), (60.5, Budget.FINAL), (None, Budget.FINAL),
])
def test_unnamed_429_is_a_throttle_only_with_retry_after_at_most_60_s(
        retry_after: float | None, budget: Budget) -> None:
    assert budget_for(_f(C.RATE_LIMITED, retry_after=retry_after, status=429)) is budget


def test_exhausted_throttle_gives_up_as_rate_limit_exceeded_with_the_seed_message() -> None:
    run = simulate([NAMED_THROTTLE], seed=11, attempt_s=0.2)
    assert run.outcome is not None
    failure = run.outcome.failure
    assert failure.code == "rate_limit_exceeded" and failure.status == 429
    assert failure.message == THROTTLE_EXHAUSTED_MESSAGE
    assert failure.failure_class is C.RATE_LIMITED
    assert run.elapsed < THROTTLE_BUDGET_S + 0.2


def test_throttle_overshoot_after_the_wait_gives_up_as_rate_limit_exceeded() -> None:
    run = simulate([_f(C.RATE_LIMITED, code="rate_limit_exceeded", retry_after=50.0)],
                   overshoot_s=40.0)
    assert run.attempts == 2
    assert run.outcome is not None and run.outcome.failure.message == THROTTLE_EXHAUSTED_MESSAGE


def test_throttle_and_connection_budgets_are_separate() -> None:
    # 100 s of throttling first: the connection budget still has its full 120 s afterwards.
    throttle = _f(C.RATE_LIMITED, code="rate_limit_exceeded", retry_after=50.0)
    run = simulate([throttle, throttle, CONN], seed=4)
    conn_waits = sum(d for b, d in run.delays if b is Budget.CONNECTION)
    assert [d for b, d in run.delays if b is Budget.THROTTLE] == [50.0, 50.0]
    assert conn_waits > 100.0 and conn_waits < CONNECTION_BUDGET_S
    assert run.outcome == GiveUp(CONN)


# -- final classes ---------------------------------------------------------------------------


@pytest.mark.parametrize("code", sorted(retry_mod.QUOTA_CODES))
def test_quota_billing_and_plan_limits_are_final(code: str) -> None:
    for cls in (C.QUOTA, C.RATE_LIMITED):  # a named quota beats a temporary-throttle class
        failure = _f(cls, code=code, retry_after=5.0, status=429)
        run = simulate([failure])
        assert run.attempts == 1 and run.outcome == GiveUp(failure)


@pytest.mark.parametrize("cls", [C.AUTHENTICATION, C.INVALID_REQUEST, C.CONTEXT_LENGTH,
                                 C.CONTENT_FILTER, C.QUOTA, C.INTERNAL])
def test_authentication_invalid_request_context_length_and_content_filter_are_final(
        cls: FailureClass) -> None:
    failure = _f(cls, status=400)
    assert simulate([failure]).outcome == GiveUp(failure)


def test_classification_reads_fields_never_message_text() -> None:
    for message in ("rate limit exceeded, retry in 1s", "connection reset", "quota", ""):
        assert budget_for(_f(C.INVALID_REQUEST, message=message)) is Budget.FINAL
        assert budget_for(_f(C.CONNECTION, message=message)) is Budget.CONNECTION


def test_request_deadline_bounds_every_wait() -> None:
    state = RetryState(started_at=T0, request_deadline=T0 + 10.0)
    run = simulate([CONN], state=state, seed=9)
    assert run.elapsed < 10.0 and run.outcome == GiveUp(CONN)
    late = RetryState(started_at=T0, request_deadline=T0 + 0.5)
    assert simulate([SERVER_ERROR], state=late).outcome == GiveUp(SERVER_ERROR)


# -- the lifecycle table ---------------------------------------------------------------------


def _drive(state: RetryState, step: str) -> None:
    rng = random.Random(0)
    if step == "start":
        state.on_attempt_started(T0)
    elif step == "retry":
        state.on_failure(CONN, now=T0, output_published=False, rng=rng)
    elif step == "give_up":
        state.on_failure(_f(C.QUOTA), now=T0, output_published=False, rng=rng)
    elif step == "wait_ok":
        assert state.check_after_wait(T0 + 10.0)
    else:
        assert not state.check_after_wait(T0 + 1000.0)


_STEPS = ("start", "retry", "give_up", "wait_ok", "wait_expired")
_PATHS = {  # a way to reach each state through the public API
    "READY": (), "ATTEMPTING": ("start",), "WAITING": ("start", "retry"),
    "DONE": ("start", "give_up"), "ERROR": ("retry",),
}
_LEGAL = {("READY", "start"), ("ATTEMPTING", "retry"), ("ATTEMPTING", "give_up"),
          ("WAITING", "wait_ok"), ("WAITING", "wait_expired")}


@pytest.mark.parametrize("state_name", list(_PATHS))
@pytest.mark.parametrize("step", _STEPS)
def test_lifecycle_every_state_input_pair(state_name: str, step: str) -> None:
    state = RetryState(started_at=T0)
    for earlier in _PATHS[state_name]:
        try:
            _drive(state, earlier)
        except RetryStateError:
            pass  # the path into ERROR
    if (state_name, step) in _LEGAL:
        _drive(state, step)
        return
    with pytest.raises(RetryStateError, match="not allowed in state"):
        _drive(state, step)
    with pytest.raises(RetryStateError):  # ERROR is permanent
        state.on_attempt_started(T0)


def test_abandon_only_after_an_expired_wait() -> None:
    state = RetryState(started_at=T0)
    with pytest.raises(RetryStateError):
        state.abandon()


def test_policy_defaults_are_the_seeds_numbers() -> None:
    p = RetryPolicy()
    assert (p.single_retry_delay_s, p.connection_budget_s, p.throttle_budget_s) == (1, 120, 120)
    assert (p.max_backoff_s, p.jitter_fraction, p.unnamed_429_max_retry_after_s) == (8, 0.2, 60)


# -- the property ----------------------------------------------------------------------------

_FAILURES = st.sampled_from([
    SERVER_ERROR, EOF_NO_TERMINAL, CONN, NAMED_THROTTLE, _f(C.CAPACITY), _f(C.TIMEOUT),
    _f(C.RATE_LIMITED, retry_after=0.0), _f(C.RATE_LIMITED, retry_after=45.0),
    _f(C.RATE_LIMITED, code="rate_limit_exceeded", retry_after=100.0),
    _f(C.RATE_LIMITED, code="insufficient_quota", retry_after=1.0), _f(C.QUOTA),
    _f(C.CONNECTION, code="connection_refused"), _f(C.AUTHENTICATION),
])
_STEP = st.tuples(_FAILURES, st.floats(0.0, 30.0), st.booleans(), st.floats(0.0, 5.0))


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(_STEP, min_size=1, max_size=60), seed=st.integers(0, 2**32 - 1))
def test_waits_never_exceed_120_s_per_budget_and_never_retry_after_output(
        steps: list[tuple[Failure, float, bool, float]], seed: int) -> None:
    rng, state, now = random.Random(seed), RetryState(started_at=T0), T0
    waits: dict[Budget, float] = {}
    for failure, attempt_s, published, overshoot_s in steps:
        state.on_attempt_started(now)
        now += attempt_s
        decision = state.on_failure(failure, now=now, output_published=published, rng=rng)
        if isinstance(decision, GiveUp):
            break
        assert not published, "a retry after output was published"
        assert budget_for(failure) is decision.budget is not Budget.FINAL
        waits[decision.budget] = waits.get(decision.budget, 0.0) + decision.delay_s
        now += decision.delay_s + overshoot_s
        if not state.check_after_wait(now):
            break
    assert waits.get(Budget.CONNECTION, 0.0) < CONNECTION_BUDGET_S
    assert waits.get(Budget.THROTTLE, 0.0) < THROTTLE_BUDGET_S
    assert waits.get(Budget.SINGLE, 0.0) <= 1.0
    assert waits == {b: w for b, w in state.waited_s.items()}
