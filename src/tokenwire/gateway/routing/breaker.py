"""A circuit breaker for one replica: a pure state machine, fed events with ``now`` passed in.

No clock reads, no sockets (STYLE §6 item 1): the pool (``routing/pool.py``) reports each
request's outcome and each active probe's result, and asks :meth:`Breaker.admits` before it
sends anything. The states::

    CLOSED --(consecutive failures, or error rate over the window)--> OPEN
    OPEN   --(cool-down passed; one trial: a real request or a probe)--> HALF_OPEN
    HALF_OPEN --(close_after successes in a row)--> CLOSED
    HALF_OPEN --(the trial failed)--> OPEN, for a longer cool-down

* **Passive signals**: a connection failure or a 5xx-class failure of the replica
  (:func:`counts_against_replica`) is a failure; a finished generation is a success.
  Client errors (4xx: a bad prompt, a context overflow, a throttle) say nothing about the
  replica and are neutral, as are cancelled requests.
* **Ejection** lasts ``base_cooldown_s`` times 2 per ejection in a row, capped at
  ``max_cooldown_s``; the count of ejections in a row is forgotten after the replica has
  stayed closed for ``max_cooldown_s``.
* **Half-open admits exactly one** request at a time: the trial. Nothing else is sent to
  the replica until the trial has ended.

The defaults and their reasons are :class:`BreakerPolicy`; the lifecycle is the table
:data:`_TRANSITIONS` (STYLE §6 item 6).
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

from tokenwire.config_tables import check_seconds
from tokenwire.errors import ConfigError
from tokenwire.gateway.ir import Failure, FailureClass

__all__ = [
    "DEFAULT_BASE_COOLDOWN_S",
    "DEFAULT_CLOSE_AFTER",
    "DEFAULT_CONSECUTIVE_FAILURES",
    "DEFAULT_ERROR_RATE",
    "DEFAULT_MAX_COOLDOWN_S",
    "DEFAULT_MIN_REQUESTS",
    "DEFAULT_WINDOW_S",
    "REPLICA_FAULT_CLASSES",
    "Breaker",
    "BreakerPolicy",
    "BreakerState",
    "counts_against_replica",
]

#: Envoy's outlier detection ejects after 5 consecutive 5xx (``consecutive_5xx``): enough
#: that one unlucky request does not eject a replica, few enough that a dead one costs a
#: handful of fast failures (each retried on another replica before output).
DEFAULT_CONSECUTIVE_FAILURES = 5
#: A replica failing half its requests is sick even when successes interleave (LiteLLM
#: cools a deployment down past a 50 % failure rate within its minute window).
DEFAULT_ERROR_RATE = 0.5
#: The rate is read over the last 30 s, and only once 10 requests ended in it, so that two
#: failures out of three on a quiet pool do not eject.
DEFAULT_WINDOW_S = 30.0
DEFAULT_MIN_REQUESTS = 10
#: First cool-down. Envoy's ``base_ejection_time`` is 30 s, LiteLLM's cooldown 5 s; a
#: restarted llama.cpp or vLLM process is back in seconds, and a half-open trial is one
#: request, so a short first ejection (10 s) costs little when the replica is still down.
DEFAULT_BASE_COOLDOWN_S = 10.0
#: The cap of a repeatedly ejected replica's cool-down (Envoy's ``max_ejection_time``).
DEFAULT_MAX_COOLDOWN_S = 300.0
#: Successes in a row that close a half-open breaker: one success may be luck (the trial
#: was a tiny request); two sequential ones (probe or real) show the replica serves again.
DEFAULT_CLOSE_AFTER = 2


#: Failure classes that are the replica's fault: it could not be reached, or failed (5xx).
REPLICA_FAULT_CLASSES = frozenset({FailureClass.CONNECTION, FailureClass.UPSTREAM,
                                   FailureClass.CAPACITY, FailureClass.TIMEOUT})


def counts_against_replica(failure: Failure) -> bool:
    """True when ``failure`` says the replica is unwell (connection failure or a 5xx);
    a client's error (4xx, throttle, overflow, filter) says nothing about it."""
    return failure.failure_class in REPLICA_FAULT_CLASSES


class BreakerState(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class _Input(enum.Enum):
    TRIP = "trip"  # a threshold was crossed
    TRIAL = "trial"  # the cool-down passed and a trial started
    TRIAL_FAILED = "trial failed"
    RECOVERED = "recovered"  # close_after successes in a row while half-open


_TRANSITIONS: dict[tuple[BreakerState, _Input], BreakerState] = {
    (BreakerState.CLOSED, _Input.TRIP): BreakerState.OPEN,
    (BreakerState.OPEN, _Input.TRIAL): BreakerState.HALF_OPEN,
    (BreakerState.HALF_OPEN, _Input.TRIAL_FAILED): BreakerState.OPEN,
    (BreakerState.HALF_OPEN, _Input.RECOVERED): BreakerState.CLOSED,
}


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    """The thresholds and cool-downs (module docstring; README "Replica pools")."""

    consecutive_failures: int = DEFAULT_CONSECUTIVE_FAILURES
    error_rate: float = DEFAULT_ERROR_RATE
    window_s: float = DEFAULT_WINDOW_S
    min_requests: int = DEFAULT_MIN_REQUESTS
    base_cooldown_s: float = DEFAULT_BASE_COOLDOWN_S
    max_cooldown_s: float = DEFAULT_MAX_COOLDOWN_S
    close_after: int = DEFAULT_CLOSE_AFTER

    def __post_init__(self) -> None:
        if self.consecutive_failures < 1 or self.min_requests < 1 or self.close_after < 1:
            raise ConfigError("breaker counts (consecutive_failures, min_requests, "
                              "close_after) must be at least 1")
        if not 0.0 < self.error_rate <= 1.0:
            raise ConfigError("breaker error_rate must be in (0, 1]")
        # An ejection is published with its cool-down as a Redis TTL (shared_breakers.py)
        # and told to clients as a Retry-After: NaN and infinity are no TTL.
        for name in ("window_s", "base_cooldown_s", "max_cooldown_s"):
            check_seconds(getattr(self, name), f"breaker {name}")
        if self.max_cooldown_s < self.base_cooldown_s:
            raise ConfigError("breaker max_cooldown_s must be at least base_cooldown_s")

    def cooldown(self, ejections: int) -> float:
        """The cool-down of the ``ejections``-th ejection in a row (1 = the first)."""
        return min(self.max_cooldown_s, self.base_cooldown_s * 2.0 ** min(ejections - 1, 32))


@dataclass(slots=True)
class Breaker:
    """One replica's breaker (see the module docstring). Every method takes ``now``."""

    policy: BreakerPolicy = field(default_factory=BreakerPolicy)
    state: BreakerState = BreakerState.CLOSED
    #: Ejections in a row (the cool-down grows with it); total ejections for the metrics.
    streak: int = 0
    ejections: int = 0
    #: Ejections taken over from another instance (:meth:`adopt_open`), not in ``ejections``.
    adopted: int = 0
    open_until: float = 0.0
    consecutive: int = 0
    trial_in_flight: bool = False
    _successes: int = 0  # successes in a row while half-open
    _closed_at: float = 0.0
    _outcomes: deque[tuple[float, bool]] = field(default_factory=deque)  # (when, failed)

    # -- questions -------------------------------------------------------------------------

    def admits(self, now: float) -> bool:
        """May a request (or probe) be sent now? Closed: yes. Open: not before the
        cool-down has passed. Half-open (or open past its cool-down): only when no trial is
        in flight, and then the caller must :meth:`start` it as the trial."""
        if self.state is BreakerState.CLOSED:
            return True
        if self.state is BreakerState.OPEN and now < self.open_until:
            return False
        return not self.trial_in_flight

    def known_down(self, now: float) -> bool:
        """Open and cooling down: nothing may be sent, not even a trial."""
        return self.state is BreakerState.OPEN and now < self.open_until

    def cooldown_left(self, now: float) -> float:
        return max(0.0, self.open_until - now) if self.state is BreakerState.OPEN else 0.0

    # -- events ----------------------------------------------------------------------------

    def start(self, now: float) -> bool:
        """A request (or probe) is about to be sent; True when it is the half-open trial.
        Raises when :meth:`admits` would have said no (the caller must ask first)."""
        if not self.admits(now):
            raise RuntimeError(f"breaker is {self.state.value}: nothing may be sent now")
        if self.state is BreakerState.CLOSED:
            return False
        if self.state is BreakerState.OPEN:
            self._step(_Input.TRIAL)
            self._successes = 0
        self.trial_in_flight = True
        return True

    def on_success(self, now: float, *, trial: bool) -> None:
        self.consecutive = 0
        if self.state is BreakerState.CLOSED:
            self._record(now, failed=False)
            self._forget_streak(now)
            return
        if not trial:
            return  # a request started before the ejection ended after it: not evidence
        self.trial_in_flight = False
        self._successes += 1
        if self.state is BreakerState.HALF_OPEN and self._successes >= self.policy.close_after:
            self._step(_Input.RECOVERED)
            self._closed_at = now
            self._outcomes.clear()

    def on_failure(self, now: float, *, trial: bool) -> None:
        if self.state is BreakerState.CLOSED:
            self.consecutive += 1
            self._record(now, failed=True)
            if self._tripped(now):
                self._eject(now)
            return
        if not trial:
            return  # already ejected: a late failure of an older request adds nothing
        self.trial_in_flight = False
        if self.state is BreakerState.HALF_OPEN:
            self._step(_Input.TRIAL_FAILED)
            self._open(now)

    def on_neutral(self, now: float, *, trial: bool) -> None:
        """The request ended without telling anything (cancelled, a client error): a trial
        gives its turn back, so the next request or probe may be the trial."""
        if trial:
            self.trial_in_flight = False

    def adopt_open(self, now: float, cooldown_s: float, streak: int) -> bool:
        """Another gateway instance ejected this replica for ``cooldown_s`` more seconds
        (``routing/shared_breakers.py``): be open until then too. A closed breaker opens
        (``TRIP``), an open one keeps the later end; a half-open one is left to its own
        trial, which ends within one request. True when the state or the end changed.
        Failure counts stay this process's own (README "Deployment: several instances")."""
        if cooldown_s <= 0 or self.state is BreakerState.HALF_OPEN:
            return False
        until = now + cooldown_s
        if self.state is BreakerState.CLOSED:
            self._step(_Input.TRIP)
            self.consecutive = 0
            self.adopted += 1
        elif until <= self.open_until:
            return False
        self.open_until = until
        self.streak = max(self.streak, streak)
        return True

    def force_open(self, now: float) -> None:
        """Eject a closed replica now (its start-up probe found it down)."""
        if self.state is BreakerState.CLOSED:
            self._eject(now)

    # -- internals -------------------------------------------------------------------------

    def _record(self, now: float, *, failed: bool) -> None:
        self._outcomes.append((now, failed))
        horizon = now - self.policy.window_s
        while self._outcomes and self._outcomes[0][0] < horizon:
            self._outcomes.popleft()

    def _tripped(self, now: float) -> bool:
        if self.consecutive >= self.policy.consecutive_failures:
            return True
        n = len(self._outcomes)
        failed = sum(1 for _, f in self._outcomes if f)
        return n >= self.policy.min_requests and failed / n >= self.policy.error_rate

    def _forget_streak(self, now: float) -> None:
        if self.streak and now - self._closed_at >= self.policy.max_cooldown_s:
            self.streak = 0

    def _eject(self, now: float) -> None:
        self._step(_Input.TRIP)
        self._forget_streak(now)
        self._open(now)

    def _open(self, now: float) -> None:
        self.streak += 1
        self.ejections += 1
        self.consecutive = 0
        self.open_until = now + self.policy.cooldown(self.streak)

    def _step(self, inp: _Input) -> None:
        key = (self.state, inp)
        if key not in _TRANSITIONS:
            raise RuntimeError(f"breaker: {inp.value} not allowed in state {self.state.value}")
        self.state = _TRANSITIONS[key]
