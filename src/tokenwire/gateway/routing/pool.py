"""A pool of replicas serving one upstream's models: balancing, breakers, affinity, pins.

A :class:`ReplicaPool` is what a :class:`~.router.ServedModel` holds as its ``upstream`` when
the configuration gives several replicas (README "Replica pools"). It is an upstream like
any other (``submit``, ``probe``, ``aclose``); behind it, each :class:`Replica` is one
adapter (one URL, key, weight, concurrency limit) with its own :class:`~.breaker.Breaker`.

Each :meth:`ReplicaPool.submit` is one attempt of the supervisor's retry loop and picks one
replica (:meth:`ReplicaPool.choose`), in this order:

1. **Hard pins**: state only one replica can read (encrypted reasoning it produced, the
   ``x-codex-turn-state`` value its upstream issued) goes to that replica and nowhere else.
   When it is down the attempt fails with ``replica_unavailable`` (503, ``Retry-After`` =
   its cool-down left), never with the state sent elsewhere.
2. **Turn pins**: every attempt's first event is a turn-state token naming its replica
   (``affinity.replica_token``; signed, so a client cannot aim it elsewhere). Codex sends
   it back on every later request of the turn, which continues on that replica. When that
   replica is down or full, the request is re-routed (steps 3-5) and logged: the gateway
   replays the conversation itself, so nothing unreadable is sent anywhere.
3. **Soft pins**: a ``previous_response_id`` continues on the replica that produced it
   (its prefix cache holds the conversation); the gateway replays the items itself, so when
   that replica is down any other can continue.
4. **Affinity keys** (:func:`affinity_key`): an explicit ``x-tokenwire-affinity`` header,
   ``prompt_cache_key``, ``session-id`` / ``x-session-id`` / ``thread-id``, or (opt-in) a
   hash of the prompt's first characters, choose by rendezvous hashing over the replicas
   the breakers admit, with bounded loads (``balance.affinity_choice``): a replica that is
   full, or would hold more than ``affinity_load_factor`` times its share of the pool's
   in-flight work, passes the key to the next one in its order.
5. Otherwise the less loaded of two random replicas (``balance.py``).

Replicas an earlier attempt of the same request failed on (``avoid``) are skipped while
another can take the request; breakers open on a dead replica so that later requests do
not even try it, and the active probe (:meth:`ReplicaPool.probe`, run every
``probe_interval_s`` by the one health loop, ``routing/health.py``) half-opens and closes
them again. **Panic**: when the share of replicas the breakers admit is at or below
``panic_threshold`` (default 0: only when every replica is ejected), the breakers are
ignored and requests spread over every replica (Envoy's panic mode; README "Replica
pools" says why the default is 0). The pool never queues: admission
(``supervision/admission.py``) asks :meth:`ReplicaPool.has_free_slot` and waits in its
own queue.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tokenwire.errors import ConfigError
from tokenwire.gateway.affinity import TURN_STATE_HEADER, read_turn_state, replica_token
from tokenwire.gateway.ir import (
    ChatPrompt,
    Event,
    EventStream,
    Failure,
    FailureClass,
    Finish,
    GenerationRequest,
    PromptIds,
    PromptText,
    ResponseMeta,
    is_terminal,
)
from tokenwire.gateway.routing.balance import (
    DEFAULT_LOAD_FACTOR,
    DEFAULT_LOAD_SLACK,
    Candidate,
    affinity_choice,
    least_loaded_of_two,
)
from tokenwire.gateway.routing.breaker import Breaker, BreakerState, counts_against_replica
from tokenwire.gateway.routing.health import probe_within_deadline
from tokenwire.gateway.state.pins import PinStore
from tokenwire.gateway.upstreams.base import UpstreamHealth, UpstreamState

__all__ = [
    "AFFINITY_HEADER",
    "DEFAULT_PANIC_THRESHOLD",
    "DEFAULT_PROBE_INTERVAL_S",
    "FAILOVER_CLASSES",
    "PINNED_STATE_KINDS",
    "Replica",
    "ReplicaPool",
    "affinity_key",
    "parse_load_factor",
    "parse_load_slack",
    "parse_panic_threshold",
]

log = logging.getLogger(__name__)

#: The explicit affinity header a client (or a proxy in front) sets to keep a conversation
#: on one replica; it wins over every other key.
AFFINITY_HEADER = "x-tokenwire-affinity"
#: Hints that name a conversation, strongest first (gateway/affinity.py collects them).
_KEY_HINTS = (AFFINITY_HEADER, "prompt_cache_key", "session-id", "x-session-id", "thread-id")
#: Active probes of every replica run this often: a restarted replica is half-opened within
#: a cool-down plus this, and a probe is one ``GET /v1/models``.
DEFAULT_PROBE_INTERVAL_S = 5.0
#: Panic (route over every replica, breakers ignored) only when no replica is admitted. A
#: higher share (Envoy's default is 50 %) protects the survivors from overload; here the
#: admission queue already bounds each replica at its ``max_concurrent``, so the survivors
#: cannot be overloaded and panicking early would only send requests to replicas known to
#: be down. With all of them ejected, though, the breakers are more likely wrong (one
#: network blip, a burst of 503s seen by this gateway) than every replica dead at once, and
#: an attempt on a dead one costs a fast connection failure.
DEFAULT_PANIC_THRESHOLD = 0.0
#: Failures another replica may answer differently, so the supervisor retries them there at
#: once (the replica's own faults); a client error would fail the same way everywhere.
FAILOVER_CLASSES = frozenset({FailureClass.CONNECTION, FailureClass.UPSTREAM,
                              FailureClass.CAPACITY, FailureClass.TIMEOUT})
#: Upstream kinds whose adapters send a replica its own encrypted reasoning and turn state
#: back (gateway/affinity.py, responses_upstream.py, anthropic_upstream.py): only there is
#: such state a hard pin. Other kinds never send it anywhere.
PINNED_STATE_KINDS = frozenset({"responses", "anthropic"})
#: Above this the bound never binds in practice (a replica would hold 100x its share):
#: say ``false`` instead, so that a typo like 125 (a percentage) is refused, not obeyed.
_MAX_LOAD_FACTOR = 100.0
#: Past this many requests of slack the bound never binds before a replica's own limit.
_MAX_LOAD_SLACK = 10_000


def parse_panic_threshold(value: object, where: str = "pool") -> float | None:
    """A ``panic_threshold`` setting: a share in [0, 1), or ``false`` for no panic (an
    all-ejected pool then answers ``no_healthy_replica`` at once)."""
    if value is False:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 1:
        return float(value)
    raise ConfigError(f"{where}: panic_threshold must be a share in [0, 1) or false")


def parse_load_factor(value: object, where: str = "pool") -> float | None:
    """An ``affinity_load_factor`` setting: a number >= 1 (a replica's bound is that many
    times its share of the in-flight work), or ``false`` for plain rendezvous hashing."""
    if value is False:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool) \
            and 1 <= value <= _MAX_LOAD_FACTOR:
        return float(value)
    raise ConfigError(f"{where}: affinity_load_factor must be a number from 1 to "
                      f"{_MAX_LOAD_FACTOR:g}, or false (no load bound)")


def parse_load_slack(value: object, where: str = "pool") -> int:
    """An ``affinity_load_slack`` setting: the requests a replica may hold past its bounded
    share before a conversation's turn leaves it (``balance.DEFAULT_LOAD_SLACK``)."""
    if isinstance(value, int) and not isinstance(value, bool) \
            and 0 <= value <= _MAX_LOAD_SLACK:
        return value
    raise ConfigError(f"{where}: affinity_load_slack must be a whole number of requests "
                      f"from 0 to {_MAX_LOAD_SLACK}")


def affinity_key(request: GenerationRequest, *, prefix_chars: int = 0) -> str | None:
    """The key that names the request's conversation, or None (see the module docstring).
    ``prefix_chars`` > 0 hashes that many leading characters (or ids) of the prompt when no
    key was sent: the same stateless choice on every gateway instance."""
    hints = dict(request.affinity)
    for name in _KEY_HINTS:
        if hints.get(name):
            return f"{name}:{hints[name]}"
    if prefix_chars <= 0:
        return None
    prefix = _prompt_prefix(request, prefix_chars)
    return "prefix:" + hashlib.blake2b(prefix.encode(), digest_size=16).hexdigest()


def _prompt_prefix(request: GenerationRequest, n: int) -> str:
    prompt = request.prompt
    if isinstance(prompt, PromptText):
        return prompt.text[:n]
    if isinstance(prompt, PromptIds):
        return ",".join(map(str, prompt.ids[:n]))
    if isinstance(prompt, ChatPrompt):
        out: list[str] = []
        size = 0
        for m in prompt.messages:
            text = m.content if isinstance(m.content, str) else repr(m.content)
            piece = f"{m.role}\x00{text}\x00"
            out.append(piece)
            size += len(piece)
            if size >= n:
                break
        return "".join(out)[:n]
    return ""


@dataclass(eq=False)
class Replica:
    """One replica: its adapter, weight, limit, breaker and live counts."""

    name: str
    adapter: Any
    weight: float = 1.0
    limit: int = 4
    url: str = ""
    breaker: Breaker = field(default_factory=Breaker)
    in_flight: int = 0
    completed: int = 0
    failed: int = 0

    def candidate(self, now: float, avoid: frozenset[str] = frozenset()) -> Candidate:
        return Candidate(name=self.name, weight=self.weight, in_flight=self.in_flight,
                         limit=self.limit,
                         eligible=self.name not in avoid and self.breaker.admits(now))


class _Choice:
    """The replica an attempt goes to, or the Failure it ends with at once."""

    __slots__ = ("failure", "replica")

    def __init__(self, replica: Replica | None = None, failure: Failure | None = None) -> None:
        self.replica, self.failure = replica, failure


class ReplicaPool:
    """Several replicas of one upstream (see the module docstring)."""

    def __init__(self, name: str, kind: str, replicas: Sequence[Replica], *,
                 pins: PinStore | None = None, probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S,
                 prefix_chars: int = 0, panic_threshold: float | None = DEFAULT_PANIC_THRESHOLD,
                 load_factor: float | None = DEFAULT_LOAD_FACTOR,
                 load_slack: int = DEFAULT_LOAD_SLACK,
                 clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None) -> None:
        if not replicas:
            raise ValueError("a pool needs at least one replica")
        if panic_threshold is not None and not 0.0 <= panic_threshold < 1.0:
            raise ValueError("panic_threshold must be in [0, 1), or None for no panic")
        if load_factor is not None and load_factor < 1.0:
            raise ValueError("load_factor must be at least 1, or None for no load bound")
        self.name, self.kind = name, kind
        self.replicas = tuple(replicas)
        self.pins = pins or PinStore()
        #: How often the health loop (``routing/health.py``) probes every replica.
        self.probe_interval_s = probe_interval_s
        self.prefix_chars = prefix_chars
        self.panic_threshold = panic_threshold
        #: Bounded-load affinity (``balance.affinity_choice``); None: plain rendezvous.
        self.load_factor = load_factor
        self.load_slack = load_slack
        self._clock = clock
        self._rng = rng or random.Random()
        self._by_name = {r.name: r for r in self.replicas}
        #: Called when capacity may have grown (a breaker closed, a slot freed): admission
        #: re-grants its waiters (set by GatewayState).
        self.on_capacity: Callable[[], None] = lambda: None
        #: Called after a replica's breaker changed state here, with its state before:
        #: ``breaker_sync.py`` publishes this instance's ejections to the others.
        self.on_transition: Callable[[Replica, BreakerState], None] = lambda r, before: None

    # -- what the router and admission read ------------------------------------------------

    @property
    def model_id(self) -> str:
        return str(self.replicas[0].adapter.model_id)

    @property
    def max_concurrent(self) -> int:
        """The pool's admission limit: the sum of its replicas' limits."""
        return sum(r.limit for r in self.replicas)

    def __getattr__(self, name: str) -> Any:
        # Model facts (maps, ids source, context window, aliases, checks_context_itself)
        # are the same on every replica of one upstream: the first one answers.
        if name.startswith("_") or name in ("replicas",):
            raise AttributeError(name)
        return getattr(self.replicas[0].adapter, name)

    def panicking(self, now: float) -> bool:
        """True when the share of replicas not cooling down is at or below the panic
        threshold: the breakers are then ignored (module docstring)."""
        if self.panic_threshold is None:
            return False
        up = sum(1 for r in self.replicas if not r.breaker.known_down(now))
        return up / len(self.replicas) <= self.panic_threshold

    def _candidates(self, now: float, avoid: frozenset[str], panic: bool) -> list[Candidate]:
        if panic:  # every replica may be tried, as its limit allows
            return [Candidate(name=r.name, weight=r.weight, in_flight=r.in_flight,
                              limit=r.limit, eligible=r.name not in avoid)
                    for r in self.replicas]
        return [r.candidate(now, avoid) for r in self.replicas]

    def has_free_slot(self, avoid: frozenset[str] = frozenset(), running: int = 0) -> bool:
        """May admission start one more request here (on a replica not in ``avoid``), with
        ``running`` requests it already started on this pool? Yes when the replicas its
        breakers admit (every replica, in panic) have more free slots than those of the
        ``running`` that hold no replica's slot yet (granted, their attempt not submitted,
        or waiting to retry): each takes one soon. Counting only the replicas' slots, one
        freed slot was granted to every waiter, and all but one failed in the pool with
        ``no_healthy_replica``. Also yes when no replica is admitted at all: the attempt
        then fails at once with ``no_healthy_replica`` (a request never waits on a replica
        known to be down; the retry budget spaces the next tries)."""
        now = self._clock()
        cands = [c for c in self._candidates(now, avoid, self.panicking(now)) if c.eligible]
        if not cands:
            return True
        slotless = max(0, running - sum(r.in_flight for r in self.replicas))
        return sum(max(0, c.limit - c.in_flight) for c in cands) > slotless

    # -- choosing --------------------------------------------------------------------------

    def choose(self, request: GenerationRequest, avoid: frozenset[str] = frozenset()
               ) -> _Choice:
        """The replica for this attempt (module docstring, steps 1-5)."""
        now = self._clock()
        panic = self.panicking(now)
        pinned, hard = self._turn_pin(request)
        if pinned is not None and hard:
            if (panic or pinned.breaker.admits(now)) and pinned.in_flight < pinned.limit:
                return _Choice(pinned)
            return _Choice(failure=self._unavailable(pinned, now))
        cands = self._candidates(now, avoid, panic)
        if not any(c.free for c in cands):  # every other one tried or full: any will do
            cands = self._candidates(now, frozenset(), panic)
        for preferred in (pinned, self._soft_pin(request)):
            if preferred is not None:
                if cands[self.replicas.index(preferred)].free:
                    return _Choice(preferred)
                if preferred is pinned:
                    log.info("replica %s of %s named by the turn state cannot take the "
                             "request now; re-routed", pinned.name, self.name)
        key = affinity_key(request, prefix_chars=self.prefix_chars)
        if key is not None:
            index = affinity_choice(key, cands, self.load_factor, self.load_slack)
            if index is not None:
                return _Choice(self.replicas[index])
        index = least_loaded_of_two(cands, self._rng)
        if index is not None:
            return _Choice(self.replicas[index])
        return _Choice(failure=self._none_healthy(now))

    def can_fail_over(self, failure: Failure, avoid: frozenset[str],
                      request: GenerationRequest) -> bool:
        """Should the supervisor retry ``failure`` on another replica, without a budget or
        a wait beyond admission's? Yes for a replica's own fault when a replica not in
        ``avoid`` is admitted by its breaker, or by panic (busy or not: the request then
        waits in the admission queue for its slot, first in line)."""
        if failure.failure_class not in FAILOVER_CLASSES or self._turn_pin(request)[1]:
            return False
        now = self._clock()
        return any(c.eligible for c in self._candidates(now, avoid, self.panicking(now)))

    def _turn_pin(self, request: GenerationRequest) -> tuple[Replica | None, bool]:
        """The replica the request's state names, and whether only it can read that state
        (hard: its encrypted reasoning, or its upstream's own turn state) or it is only the
        turn's replica (a :func:`~tokenwire.gateway.affinity.replica_token`)."""
        found: Replica | None = None
        pinned_kind = self.kind in PINNED_STATE_KINDS
        if pinned_kind and isinstance(request.prompt, ChatPrompt):
            for message in request.prompt.messages:
                for name, _ in message.reasoning_encrypted:
                    found = self._by_name.get(name, found)
        wrapped = dict(request.affinity).get(TURN_STATE_HEADER)
        token = read_turn_state(wrapped) if wrapped is not None else None
        named = self._by_name.get(token[0]) if token is not None else None
        if named is not None and token is not None and token[1] is not None and pinned_kind:
            return named, True
        if found is not None:
            return found, True
        return named, False

    def pinned(self, key: str) -> str | None:
        """The replica pinned to ``key`` (a response id), if any."""
        return self.pins.get(key, self._clock())

    def pin(self, key: str, replica: str, *, age_s: float = 0.0) -> None:
        """Pin ``key`` to ``replica`` (known here), as if pinned ``age_s`` ago: a pin read
        from the shared store keeps its own age, so it expires when it would have."""
        if replica in self._by_name:
            self.pins.put(key, replica, self._clock() - max(0.0, age_s))

    def _soft_pin(self, request: GenerationRequest) -> Replica | None:
        previous = dict(request.affinity).get("previous_response_id")
        name = self.pins.get(previous, self._clock()) if previous else None
        return self._by_name.get(name) if name else None

    def _unavailable(self, replica: Replica, now: float) -> Failure:
        left = replica.breaker.cooldown_left(now)
        return Failure(
            failure_class=FailureClass.CAPACITY, status=503, code="replica_unavailable",
            retry_after=max(1.0, round(left)) if left else None,
            message=f"this conversation's state (encrypted reasoning or turn state) can only "
                    f"be read by replica {replica.name!r} of {self.name!r}, which is "
                    f"{'down' if left else 'at its limit'}; retry later, or continue "
                    "without that state (resend the conversation's items without "
                    "encrypted_content and x-codex-turn-state)")

    def _none_healthy(self, now: float) -> Failure:
        left = min((r.breaker.cooldown_left(now) for r in self.replicas), default=0.0)
        return Failure(
            failure_class=FailureClass.CONNECTION, status=503, code="no_healthy_replica",
            retry_after=max(1.0, round(left)) if left else None,
            message=f"no replica of {self.name!r} can take the request now (every one is "
                    "ejected or at its limit)")

    # -- the Upstream interface ------------------------------------------------------------

    def submit(self, request: GenerationRequest, *, avoid: frozenset[str] = frozenset()
               ) -> EventStream:
        choice = self.choose(request, avoid)
        if choice.replica is None:
            assert choice.failure is not None
            return _Ended(choice.failure)
        replica = choice.replica
        now = self._clock()
        # In panic a replica its breaker does not admit is tried anyway, outside the
        # breaker: its outcome is no trial (probes and trials decide its recovery).
        trial = replica.breaker.start(now) if replica.breaker.admits(now) else False
        try:
            inner = replica.adapter.submit(request)
        except BaseException:
            replica.breaker.on_neutral(now, trial=trial)
            raise
        replica.in_flight += 1
        return _ReplicaStream(self, replica, inner, trial, request.request_id)

    def _ended(self, replica: Replica, *, trial: bool, outcome: Event | None,
               request_id: str) -> None:
        """An attempt on ``replica`` ended: ``outcome`` is its terminal (None: cancelled)."""
        now = self._clock()
        replica.in_flight -= 1
        before = replica.breaker.state
        if isinstance(outcome, Finish):
            replica.completed += 1
            replica.breaker.on_success(now, trial=trial)
            if request_id:
                self.pins.put(request_id, replica.name, now)
        elif isinstance(outcome, Failure) and counts_against_replica(outcome):
            replica.failed += 1
            replica.breaker.on_failure(now, trial=trial)
        else:
            replica.breaker.on_neutral(now, trial=trial)
        if replica.breaker.state is not before:
            log.warning("replica %s of %s: %s -> %s", replica.name, self.name, before.value,
                        replica.breaker.state.value)
            self.on_transition(replica, before)
        self.on_capacity()

    # -- active probes ---------------------------------------------------------------------

    async def probe(self) -> UpstreamHealth:
        """Probe every replica not cooling down, feeding its breaker; the pool as one
        upstream: up when every replica is, degraded when some are, down when none is.
        The health loop (``routing/health.py``) calls it every ``probe_interval_s``."""
        results = await asyncio.gather(*(self._probe_one(r) for r in self.replicas))
        up = [h for h in results if h.state is not UpstreamState.DOWN]
        models = next((h.models for h in up if h.models), ())
        state = UpstreamState.UP if len(up) == len(results) else (
            UpstreamState.DEGRADED if up else UpstreamState.DOWN)
        detail = "; ".join(f"{h.name}: {h.detail}" for h in results if h.detail)
        return UpstreamHealth(name=self.name, kind=self.kind, state=state, models=models,
                              detail=detail)

    async def _probe_one(self, replica: Replica) -> UpstreamHealth:
        now = self._clock()
        if not replica.breaker.admits(now):  # cooling down, or a trial is in flight
            left = replica.breaker.cooldown_left(now)
            return UpstreamHealth(name=replica.name, kind=self.kind, state=UpstreamState.DOWN,
                                  detail=f"ejected, {left:.0f} s of cool-down left" if left
                                  else "half-open, a trial is in flight")
        trial = replica.breaker.start(now)
        health = await _safe_probe(replica)
        ok = health.state is not UpstreamState.DOWN
        now, before = self._clock(), replica.breaker.state
        if ok and trial:
            replica.breaker.on_success(now, trial=True)
        elif not ok:
            replica.breaker.on_failure(now, trial=trial)
        if replica.breaker.state is not before:
            log.warning("replica %s of %s: %s -> %s (probe)", replica.name, self.name,
                        before.value, replica.breaker.state.value)
            self.on_transition(replica, before)
        if trial or replica.breaker.state is not before:
            # A trial that ended gave its turn back (half-open admits a request again, even
            # before close_after successes close it): requests waiting in admission may go.
            self.on_capacity()
        return health

    async def aclose(self) -> None:
        for r in self.replicas:
            close = getattr(r.adapter, "aclose", None)
            if close is not None:
                await close()

    def snapshot(self) -> list[dict[str, Any]]:
        """Every replica's state, for ``/health``."""
        now = self._clock()
        return [{"name": r.name, "url": r.url, "weight": r.weight, "limit": r.limit,
                 "in_flight": r.in_flight, "breaker": r.breaker.state.value,
                 "cooldown_left_s": round(r.breaker.cooldown_left(now), 3),
                 "ejections": r.breaker.ejections,
                 "adopted_ejections": r.breaker.adopted, "completed": r.completed,
                 "failed": r.failed} for r in self.replicas]


async def _safe_probe(replica: Replica) -> UpstreamHealth:
    return await probe_within_deadline(replica.name, "?", replica.adapter.probe)


class _ReplicaStream:
    """One attempt's stream on one replica; tells the pool how it ended, exactly once."""

    def __init__(self, pool: ReplicaPool, replica: Replica, inner: EventStream, trial: bool,
                 request_id: str) -> None:
        self._pool, self.replica, self._inner = pool, replica, inner
        self._trial, self._request_id = trial, request_id
        self._done = False
        self._announced = False
        self._pending: Event | None = None

    async def next_event(self) -> Event:
        """The replica's events, the first preceded by a turn-state token naming the
        replica (module docstring, step 2) unless the upstream's own (already naming it)
        comes first."""
        if self._pending is not None:
            event, self._pending = self._pending, None
            return event
        event = await self._next()
        if self._announced:
            return event
        self._announced = True
        if isinstance(event, ResponseMeta) and event.turn_state is not None:
            return event
        self._pending = event
        return ResponseMeta(turn_state=replica_token(self.replica.name))

    async def _next(self) -> Event:
        try:
            event = await self._inner.next_event()
        except asyncio.CancelledError:
            # A cancelled wait is not the attempt's end (EventStream: it loses nothing):
            # the supervisor's heartbeat timer stops waiting on a quiet replica and asks
            # again. Counting it as neutral here lost the Finish that came next (never
            # ``completed``, never the breaker's success) and freed the slot of a replica
            # still generating. The owner ends the attempt with :meth:`cancel`.
            raise
        except Exception:
            self._finish(None)
            raise
        if is_terminal(event):
            self._finish(event)
        return event

    def cancel(self) -> None:
        self._inner.cancel()
        self._finish(None)

    def fail(self, failure: Failure) -> None:
        """The owner ends the attempt with a failure it decided itself (the replica stayed
        silent past the idle timeout before any output): cancelled, and counted as that
        failure, as the adapter's own read timeout would have been."""
        self._inner.cancel()
        self._finish(failure)

    def _finish(self, outcome: Event | None) -> None:
        if not self._done:
            self._done = True
            self._pool._ended(self.replica, trial=self._trial, outcome=outcome,
                              request_id=self._request_id)


class _Ended:
    """An attempt that ends before reaching any replica."""

    replica = None

    def __init__(self, failure: Failure) -> None:
        self._failure = failure

    async def next_event(self) -> Event:
        return self._failure

    def cancel(self) -> None:
        pass
