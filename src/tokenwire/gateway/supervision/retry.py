"""Retry budgets for upstream failures: a pure decision object, no sleeping, no clock reads.

Seed, "Provider failures and retry budgets". One :class:`RetryState` per client request; the
caller (the code between upstreams and APIs) passes ``now`` and an ``rng`` in and does the
waiting, the heartbeats during it and the cancellation itself::

    state = RetryState(started_at=now, request_deadline=now + 3600)
    while True:
        state.on_attempt_started(now)
        failure = await run_attempt()                 # None on success
        decision = state.on_failure(failure, now=now, output_published=..., rng=rng)
        if isinstance(decision, GiveUp):
            fail_with(decision.failure)
        await abortable_sleep(decision.delay_s)       # heartbeats keep the stream alive
        if not state.check_after_wait(now):
            fail_with(state.abandon().failure)

Which budget a failure spends is read from its structured fields only (``failure_class``,
``code``, ``retry_after``), which the upstream adapters fill at their boundary
(``upstreams/failures.py``); nothing here reads message text (STYLE §6 item 3).

The budgets, independent of each other:

* **single**: upstream 5xx (``UPSTREAM``, ``CAPACITY``, ``TIMEOUT``) and a clean EOF without a
  terminal get one retry per request after one second, whichever attempt it lands on.
* **connection**: transient connection failures wait 1, 2, 4, 8, 8 ... s (+-20% jitter) for
  up to 120 s from the *first* connection failure; a wait that would reach the deadline is
  refused and the triggering failure returned unchanged.
* **throttle**: 429 throttles wait the provider's ``Retry-After`` (at least 1 s) or the same
  backoff, for up to 120 s from the first throttle; exhaustion gives up as
  ``rate_limit_exceeded`` with the seed's fixed message.

Nothing is ever replayed once output was published. The lifecycle is a table (STYLE §6
item 6): an illegal call raises :class:`RetryStateError` naming the state and the input and
leaves the state in ``ERROR`` for good.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass, field

from tokenwire.errors import RetryDeadlinePassed, RetryStateError
from tokenwire.gateway.ir import Failure, FailureClass

__all__ = [
    "CONNECTION_BUDGET_S",
    "FINAL_UPSTREAM_CODES",
    "JITTER_FRACTION",
    "MAX_BACKOFF_S",
    "MIN_RETRY_AFTER_S",
    "NON_TRANSIENT_CONNECTION_CODES",
    "QUOTA_CODES",
    "SINGLE_RETRY_DELAY_S",
    "THROTTLE_BUDGET_S",
    "THROTTLE_CODES",
    "THROTTLE_EXHAUSTED_CODE",
    "THROTTLE_EXHAUSTED_MESSAGE",
    "UNNAMED_429_MAX_RETRY_AFTER_S",
    "Budget",
    "GiveUp",
    "Retry",
    "RetryDeadlinePassed",
    "RetryPolicy",
    "RetryState",
    "RetryStateError",
    "budget_for",
]

# -- the seed's numbers ----------------------------------------------------------------------

#: Seed: server errors and a clean EOF without a terminal "retry once after one second".
SINGLE_RETRY_DELAY_S = 1.0
#: Seed: a short connection outage "is absorbed here rather than ending the chat" for up to
#: 120 s, timed from the first connection failure.
CONNECTION_BUDGET_S = 120.0
#: Seed: throttles have their own 120 s budget from the first throttle (the ChatGPT backend
#: throttles for longer than Codex's own ~10 s retry schedule).
THROTTLE_BUDGET_S = 120.0
#: Seed: "one, two, four and then eight seconds per retry": the doubling stops at eight.
MAX_BACKOFF_S = 8.0
#: Seed: each backoff wait is "within twenty percent of jitter", so retries of many clients
#: cut off by one outage do not arrive in lockstep.
JITTER_FRACTION = 0.2
#: Seed: "a provider's Retry-After of at least one second": a shorter one is raised to 1 s,
#: so a ``Retry-After: 0`` cannot turn the budget into a busy loop.
MIN_RETRY_AFTER_S = 1.0
#: Seed: an unnamed 429 is a throttle only when it "asks for a Retry-After of at most 60
#: seconds"; longer (or none) is a final usage limit.
UNNAMED_429_MAX_RETRY_AFTER_S = 60.0
#: Seed: the fixed message of a throttle that outlived its budget (HTTP 429, retryable).
THROTTLE_EXHAUSTED_MESSAGE = "Provider is temporarily rate limiting requests; retry shortly"
#: The code that message is sent with; clients (Codex) retry it by themselves.
THROTTLE_EXHAUSTED_CODE = "rate_limit_exceeded"

#: Codes naming a *temporary* rate limit (seed: "rate_limit_exceeded, rate_limit_error or
#: limit_requests"), plus ``rate_limited``, the class name a Codec peer sends as its code.
THROTTLE_CODES = frozenset({
    "rate_limit_exceeded", "rate_limit_error", "limit_requests", "limit_tokens",
    "rate_limited",
})
#: Codes naming quota, billing, spend or plan limits: final, and they take precedence over a
#: temporary rate-limit class (seed: "A named quota takes precedence").
QUOTA_CODES = frozenset({
    "insufficient_quota", "usage_limit_reached", "usage_not_included",
    "billing_hard_limit_reached", "billing_error", "subscription_sharing_usage_limit_exceeded",
    "quota", "spend_limit_reached", "credit_balance_too_low",
})
#: Connection failures the seed excludes from the connection budget ("certificate failures,
#: permanent DNS failures, refused connections, unknown network faults"), when an adapter
#: names them in ``code``. A ``CONNECTION`` failure without a code is the adapters' "lost
#: before any byte came back", which is the transient kind.
NON_TRANSIENT_CONNECTION_CODES = frozenset({
    "certificate_error", "dns_permanent", "connection_refused", "unknown_network_fault",
    "oauth_refresh_failed", "cancelled",
})
#: ``UPSTREAM`` codes that would repeat identically (seed: "malformed streams ... never retry
#: automatically"): the adapters' protocol and configuration mismatches.
FINAL_UPSTREAM_CODES = frozenset({
    "protocol_error", "read_timeout", "content_type_mismatch", "tokenizer_map_mismatch",
    "codec_version_required", "discovery_failed", "no_tokenizer_map", "model_not_found",
    "answer_too_large",
})


# -- values ----------------------------------------------------------------------------------


class Budget(enum.StrEnum):
    """Which retry budget a failure spends; ``FINAL`` spends none."""

    SINGLE = "single"
    CONNECTION = "connection"
    THROTTLE = "throttle"
    FINAL = "final"


@dataclass(frozen=True, slots=True)
class Retry:
    """Wait ``delay_s`` (abortably, with heartbeats), then call ``check_after_wait``."""

    delay_s: float
    budget: Budget


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Report ``failure`` to the client; no further attempt."""

    failure: Failure


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """The numbers, overridable for tests and configuration; defaults are the seed's."""

    single_retry_delay_s: float = SINGLE_RETRY_DELAY_S
    connection_budget_s: float = CONNECTION_BUDGET_S
    throttle_budget_s: float = THROTTLE_BUDGET_S
    max_backoff_s: float = MAX_BACKOFF_S
    jitter_fraction: float = JITTER_FRACTION
    min_retry_after_s: float = MIN_RETRY_AFTER_S
    unnamed_429_max_retry_after_s: float = UNNAMED_429_MAX_RETRY_AFTER_S
    #: False: every failure goes to the client as it came (an operator whose clients retry
    #: by themselves, or a test of status mapping).
    enabled: bool = True

    def backoff(self, retries_so_far: int, rng: random.Random) -> float:
        """1, 2, 4, 8, 8 ... s for the n-th retry of a budget, each jittered by +-20%."""
        base = min(self.max_backoff_s, 2.0 ** min(retries_so_far, 16))
        return base * rng.uniform(1 - self.jitter_fraction, 1 + self.jitter_fraction)


# -- classification --------------------------------------------------------------------------

_FINAL_CLASSES = frozenset({
    FailureClass.INVALID_REQUEST, FailureClass.CONTEXT_LENGTH, FailureClass.AUTHENTICATION,
    FailureClass.QUOTA, FailureClass.CONTENT_FILTER, FailureClass.INTERNAL,
})
#: Seed: "HTTP 500/502/503/504 failures have the same single retry before output"; the
#: adapters class those as UPSTREAM, CAPACITY (503/529) and TIMEOUT (504).
_SINGLE_CLASSES = frozenset({FailureClass.UPSTREAM, FailureClass.CAPACITY,
                             FailureClass.TIMEOUT})


def budget_for(failure: Failure, policy: RetryPolicy | None = None) -> Budget:
    """The budget ``failure`` may spend, from its class, code and ``retry_after`` only."""
    policy = policy or RetryPolicy()
    cls, code = failure.failure_class, failure.code
    if cls in _FINAL_CLASSES or code in QUOTA_CODES:
        return Budget.FINAL
    if cls is FailureClass.RATE_LIMITED:
        if code in THROTTLE_CODES:
            return Budget.THROTTLE
        # Seed: an otherwise unnamed 429 is a throttle only with a short Retry-After; any
        # other 429 is a final usage limit.
        ra = failure.retry_after
        if ra is not None and ra <= policy.unnamed_429_max_retry_after_s:
            return Budget.THROTTLE
        return Budget.FINAL
    if cls is FailureClass.CONNECTION:
        return Budget.FINAL if code in NON_TRANSIENT_CONNECTION_CODES else Budget.CONNECTION
    if cls in _SINGLE_CLASSES:
        return Budget.FINAL if code in FINAL_UPSTREAM_CODES else Budget.SINGLE
    return Budget.FINAL


def _throttle_exhausted(failure: Failure) -> Failure:
    return Failure(failure_class=FailureClass.RATE_LIMITED, message=THROTTLE_EXHAUSTED_MESSAGE,
                   status=429, code=THROTTLE_EXHAUSTED_CODE, retry_after=failure.retry_after)


# -- the lifecycle table ---------------------------------------------------------------------


class _State(enum.Enum):
    READY = "ready"  # an attempt may start
    ATTEMPTING = "attempting"
    WAITING = "waiting"  # a Retry was returned; the caller is waiting
    DONE = "done"  # a GiveUp was returned, or a wait overshot its deadline
    ERROR = "error"  # a method was called out of order: permanent


class _Input(enum.Enum):
    START = "on_attempt_started"
    RETRY = "on_failure -> Retry"
    GIVE_UP = "on_failure -> GiveUp"
    WAIT_OK = "check_after_wait -> True"
    WAIT_EXPIRED = "check_after_wait -> False"
    FAILOVER = "on_failover"


_TRANSITIONS: dict[tuple[_State, _Input], _State] = {
    (_State.READY, _Input.START): _State.ATTEMPTING,
    (_State.ATTEMPTING, _Input.RETRY): _State.WAITING,
    (_State.ATTEMPTING, _Input.GIVE_UP): _State.DONE,
    (_State.WAITING, _Input.WAIT_OK): _State.READY,
    (_State.WAITING, _Input.WAIT_EXPIRED): _State.DONE,
    (_State.ATTEMPTING, _Input.FAILOVER): _State.READY,
}


@dataclass(slots=True)
class _Window:
    """One budget's window: opened by its first failure, counting its retries."""

    deadline: float
    retries: int = 0


@dataclass(slots=True)
class RetryState:
    """The retry bookkeeping of one client request (see the module docstring for the loop).

    ``request_deadline`` is the caller's bound (the one-hour cap, timeoutMs): no wait may
    reach it either, whichever budget is spending.
    """

    started_at: float
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    request_deadline: float | None = None
    attempts: int = 0
    _state: _State = _State.READY
    _single_used: bool = False
    _windows: dict[Budget, _Window] = field(default_factory=dict)
    _pending: tuple[Budget, Failure] | None = None
    _waits: dict[Budget, float] = field(default_factory=dict)

    @property
    def waited_s(self) -> dict[Budget, float]:
        """Total wait handed out per budget so far (for metrics and logs)."""
        return dict(self._waits)

    def on_attempt_started(self, now: float) -> None:
        """Record an attempt; refused at or past the pending budget's or request deadline."""
        deadline = self._deadline()
        if deadline is not None and now >= deadline:
            self._state = _State.ERROR
            raise RetryDeadlinePassed(
                f"attempt {self.attempts + 1} would start at {now - self.started_at:.3f}s, "
                f"at or past its deadline {deadline - self.started_at:.3f}s")
        self._step(_Input.START)
        self.attempts += 1

    def on_failure(self, failure: Failure, *, now: float, output_published: bool,
                   rng: random.Random) -> Retry | GiveUp:
        """Decide what to do about the failed attempt that just ended at ``now``."""
        decision = self._decide(failure, now, output_published, rng)
        if isinstance(decision, Retry):
            self._step(_Input.RETRY)
            self._pending = (decision.budget, failure)
            self._waits[decision.budget] = self._waits.get(decision.budget, 0.0) + (
                decision.delay_s)
        else:
            self._step(_Input.GIVE_UP)
        return decision

    def on_failover(self) -> None:
        """The failed attempt goes to another replica of a pool at once: no wait and no
        budget spent (the replica, not the request, failed; ``routing/pool.py`` allows one
        failover per replica). The next :meth:`on_attempt_started` still checks deadlines."""
        self._step(_Input.FAILOVER)

    def check_after_wait(self, now: float) -> bool:
        """After the wait: may the next attempt start? False when a stall overshot the
        deadline (then :meth:`abandon` gives the failure to report)."""
        deadline = self._deadline()
        ok = deadline is None or now < deadline
        self._step(_Input.WAIT_OK if ok else _Input.WAIT_EXPIRED)
        return ok

    def abandon(self) -> GiveUp:
        """The GiveUp for the failure whose retry could not start (after a False check)."""
        if self._state is not _State.DONE or self._pending is None:
            raise RetryStateError(f"abandon() not allowed in state {self._state.name}")
        budget, failure = self._pending
        return GiveUp(_throttle_exhausted(failure) if budget is Budget.THROTTLE else failure)

    # -- internals -------------------------------------------------------------------------

    def _step(self, inp: _Input) -> None:
        after = _TRANSITIONS.get((self._state, inp))  # one lookup: an enum hashes in Python
        if after is None:
            state, self._state = self._state, _State.ERROR
            raise RetryStateError(f"{inp.value} not allowed in state {state.name}")
        self._state = after

    def _deadline(self) -> float | None:
        """The earliest deadline bounding the next attempt."""
        bounds = [self.request_deadline] if self.request_deadline is not None else []
        if self._pending is not None and self._pending[0] in self._windows:
            bounds.append(self._windows[self._pending[0]].deadline)
        return min(bounds) if bounds else None

    def _decide(self, failure: Failure, now: float, output_published: bool,
                rng: random.Random) -> Retry | GiveUp:
        if self._state is not _State.ATTEMPTING:
            return GiveUp(failure)  # _step raises for this call; never a retry here
        budget = budget_for(failure, self.policy)
        if output_published or budget is Budget.FINAL or not self.policy.enabled:
            return GiveUp(failure)  # seed: never a replay once output was published
        if budget is Budget.SINGLE:
            if self._single_used:
                return GiveUp(failure)
            self._single_used = True
            return self._bounded(Retry(self.policy.single_retry_delay_s, budget), None,
                                 failure, now)
        total = (self.policy.connection_budget_s if budget is Budget.CONNECTION
                 else self.policy.throttle_budget_s)
        # The window opens at this budget's first failure, so another budget's earlier
        # failures cannot spend it (seed: "a throttle earlier in the request cannot spend it").
        window = self._windows.setdefault(budget, _Window(deadline=now + total))
        delay = self.policy.backoff(window.retries, rng)
        if budget is Budget.THROTTLE and failure.retry_after is not None:
            delay = max(failure.retry_after, self.policy.min_retry_after_s)
        decision = self._bounded(Retry(delay, budget), window.deadline, failure, now)
        if isinstance(decision, Retry):
            window.retries += 1
        return decision

    def _bounded(self, retry: Retry, window_deadline: float | None, failure: Failure,
                 now: float) -> Retry | GiveUp:
        """Refuse a wait that would end at or past the window's or the request's deadline."""
        ends = now + retry.delay_s
        if window_deadline is not None and ends >= window_deadline:
            exhausted = retry.budget is Budget.THROTTLE
            return GiveUp(_throttle_exhausted(failure) if exhausted else failure)
        if self.request_deadline is not None and ends >= self.request_deadline:
            return GiveUp(failure)
        return retry
