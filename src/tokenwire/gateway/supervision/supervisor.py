"""Between the upstreams and the APIs, written once: queue, retries, deadlines, heartbeats.

Every generation, whatever API it came through and whatever upstream serves it, is a
:class:`SupervisedStream`. It is an :class:`~tokenwire.gateway.ir.EventStream` like the
upstream's own, so the APIs render it without knowing what it did (DESIGN.md: N upstreams
+ M APIs). Its one task, started by the first :meth:`~SupervisedStream.next_event`:

1. **Waits for a slot** (:mod:`.admission`), in arrival order.
   A prompt its model's context window certainly cannot hold is refused first, without
   queueing or an attempt (``ServedModel.preflight``, ``gateway/context_window.py``).
2. **Runs attempts** under :class:`~.retry.RetryState`: a failure before any
   output was published may be retried on its budget (seed, "Provider failures and retry
   budgets"); once text, reasoning or a tool call went to the client nothing is replayed,
   and the failure goes to the client as the stream's terminal. Facts that are not output
   (``ResponseMeta``, ``MessageStart``, ``Usage``) are held back until the first output, so
   a retried attempt's facts never reach the client twice; only a prompt count goes with
   a heartbeat that opens the stream first (a retry's count replaces it).
3. **Keeps time** with the event loop's clock (tests run it under ``looptime``):
   ``idle_timeout_s`` (the seed's ``timeoutMs``, ten minutes) bounds *silence*: it counts
   from arrival (so the body upload and the queue wait are in it), restarts at admission and
   on every upstream event, and a stalled upstream fails with ``idle_timeout``. Every request
   also ends at ``request_cap_s`` (one hour) after arrival, ``request_timeout``. Both are
   final here (a stall is not retried) and retryable for the client.
4. **Sends heartbeats**: a :class:`~tokenwire.gateway.ir.Heartbeat` after every
   ``heartbeat_s`` (15 s) in which nothing was sent, while queued, waiting to retry, or
   waiting on a quiet upstream. They stop with the terminal, the deadline or a disconnect.
5. **Falls back** (opt-in, ``gateway/routing/fallbacks.py``): when the routed model's budget
   gave up *before any output was published* (or the idle timeout fired before any), or its
   preflight refused a prompt it certainly cannot hold, the request moves to the next
   compatible model of its :class:`~tokenwire.gateway.routing.fallbacks.FallbackPlan`, with
   a budget of its own and a slot of that model's upstream. The failed model's held facts
   are dropped and a :class:`~tokenwire.gateway.ir.ResponseMeta` naming the serving model
   is held instead. When no model serves it, the client gets the routed model's own failure
   (as without fallbacks), with the targets that could not take the request named.

An upstream stream that can push (``push_to``: the SSE adapters over the lean transport,
through the retokenizer and the usage meter) hands each text or id delta to
:meth:`~SupervisedStream._push` as its connection's callback parses it, while the task waits
for the next event: the same forwarding (the first output after the facts held before it),
without waking the task per token. Everything else (facts, terminals, a full hand-off,
anything while the task is busy) is left to the task.

:meth:`~SupervisedStream.cancel` (the client went away) cancels the task: an upstream
attempt in flight is cancelled (its adapter closes the connection), a queued request leaves
the line without touching an upstream, and the slot is given back at once.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass
from typing import Protocol

import msgspec

from tokenwire.errors import RetryDeadlinePassed, ServerBusy
from tokenwire.gateway.context_window import INLINE_COUNT_CHARS, prompt_chars
from tokenwire.gateway.ir import (
    Event,
    EventStream,
    Failure,
    FailureClass,
    Finish,
    FinishKind,
    GenerationRequest,
    Heartbeat,
    ReasoningDelta,
    ResponseMeta,
    TokenDelta,
    ToolCallDelta,
    Usage,
    fail_attempt,
    is_terminal,
    push_through,
    replica_of,
)
from tokenwire.gateway.routing.fallbacks import FallbackPlan
from tokenwire.gateway.supervision.admission import Ticket
from tokenwire.gateway.supervision.handoff import Handoff
from tokenwire.gateway.supervision.retry import GiveUp, RetryPolicy, RetryState
from tokenwire.gateway.wakeups import EXPIRED, DeadlineWaits, wake

__all__ = [
    "DEFAULT_HEARTBEAT_S",
    "DEFAULT_IDLE_TIMEOUT_S",
    "DEFAULT_REQUEST_CAP_S",
    "FALLBACK_HEADER",
    "MAX_ANSWER_SIZE",
    "SERVED_MODEL_HEADER",
    "RequestObserver",
    "SupervisedStream",
    "Timing",
    "is_output",
]

log = logging.getLogger(__name__)

#: Seed: "genuine response.in_progress data events keep the Codex connection alive every
#: fifteen seconds" (well inside Codex's 300 s idle window).
DEFAULT_HEARTBEAT_S = 15.0
#: Seed: "timeoutMs (ten minutes by default) bounds silence, not total length."
DEFAULT_IDLE_TIMEOUT_S = 600.0
#: Seed: "Every request also has a one-hour cap."
DEFAULT_REQUEST_CAP_S = 3600.0
#: asyncio may run a timer up to its clock resolution early: a wake-up this close to its
#: due time counts as due (else a heartbeat due at 75.02000000000001 s, woken at 75.02 s,
#: would re-arm for 1e-14 s, over and over).
_TIMER_SLACK_S = 1e-3
#: Events buffered between the task and the response writer: enough to ride over a slow
#: socket write, small enough that a stalled client pushes back on the upstream.
_BUFFERED_EVENTS = 64
#: The most one answer may carry: characters of text, reasoning and tool calls, and token
#: ids, together. Every API's whole answer (a non-streamed one, the Responses snapshot, a
#: stored response) is held by the gateway; an upstream that sent without end held more,
#: for the one-hour cap. 64 Mi is a hundred times a long answer, and tool arguments of a
#: large patch. Past it the answer ends with ``answer_too_large`` (502, final).
MAX_ANSWER_SIZE = 64 * 1024 * 1024
#: Retry jitter for every stream that is not given its own ``rng`` (tests pass seeded ones).
#: One generator: ``random.Random()`` seeds itself from ``os.urandom`` on every creation, a
#: cost per request that jitter (not a secret) does not need.
_JITTER = random.Random()
#: Response headers naming the model that served the request, when a fallback did; sent
#: only when the fallback happened before the response head went out (README "Fallbacks").
SERVED_MODEL_HEADER = "Tokenwire-Served-Model"
FALLBACK_HEADER = "Tokenwire-Fallback"


@dataclass(frozen=True, slots=True)
class Timing:
    """The clocks of one request; defaults are the seed's. ``heartbeat_s=None`` sends none
    (a non-streaming request has no open stream to keep alive)."""

    heartbeat_s: float | None = DEFAULT_HEARTBEAT_S
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    request_cap_s: float = DEFAULT_REQUEST_CAP_S


class RequestObserver(Protocol):
    """What the supervisor reports about a request (metrics and the request log)."""

    def admitted(self, waited_s: float) -> None: ...
    def attempt_started(self, attempt: int) -> None: ...
    def retry_scheduled(self, budget: str, delay_s: float, failure_class: str,
                        code: str | None) -> None: ...
    def heartbeat(self) -> None: ...
    def fallback(self, from_model: str, to_model: str, reason: str,
                 upstream: str) -> None: ...
    def first_output(self) -> None: ...
    def tokens(self, n: int) -> None: ...
    def usage(self, prompt_tokens: int | None, completion_tokens: int | None,
              source: str | None = None) -> None: ...
    def finished(self, *, outcome: str, status: int, failure_class: str | None = None,
                 code: str | None = None) -> None: ...


class _NoObserver:
    def admitted(self, waited_s: float) -> None: pass
    def attempt_started(self, attempt: int) -> None: pass
    def retry_scheduled(self, budget: str, delay_s: float, failure_class: str,
                        code: str | None) -> None: pass
    def heartbeat(self) -> None: pass
    def fallback(self, from_model: str, to_model: str, reason: str,
                 upstream: str) -> None: pass
    def first_output(self) -> None: pass
    def tokens(self, n: int) -> None: pass
    def usage(self, prompt_tokens: int | None, completion_tokens: int | None,
              source: str | None = None) -> None: pass
    def finished(self, *, outcome: str, status: int, failure_class: str | None = None,
                 code: str | None = None) -> None: pass


def _output_size(event: Event) -> int:
    """What an output event adds to the answer (:data:`MAX_ANSWER_SIZE`)."""
    if isinstance(event, TokenDelta):
        return len(event.text) + len(event.ids)
    if isinstance(event, ToolCallDelta):
        return len(event.arguments) + len(event.name or "") + len(event.id or "")
    if isinstance(event, ReasoningDelta):
        return len(event.text) + sum(len(k) + len(v) for k, v in event.encrypted)
    return 0


def _answer_too_large() -> Failure:
    return Failure(failure_class=FailureClass.UPSTREAM, status=502, code="answer_too_large",
                   message=f"the upstream's answer passed {MAX_ANSWER_SIZE:,} characters and "
                           "token ids, the most one answer may carry")


def is_output(event: Event) -> bool:
    """True for what the seed calls published output: text, reasoning state, tool calls."""
    match event:
        case TokenDelta(ids=ids, text=text):
            return bool(ids or text)
        case ReasoningDelta(text=text, encrypted=encrypted):
            return bool(text or encrypted)
        case ToolCallDelta():
            return True
    return False


class Upstreamish(Protocol):
    """What the supervisor needs of a routed model (a :class:`~.router.ServedModel`).

    A model served by a pool of replicas also takes ``submit(request, avoid=names)`` (the
    replicas this request already failed on) and has ``can_fail_over(failure, avoid,
    request)``; its streams name their ``replica``. Nothing else needs them."""

    upstream: object
    name: str

    def submit(self, request: GenerationRequest) -> EventStream: ...

    def preflight(self, request: GenerationRequest) -> Failure | None:
        """A refusal before the request queues (a prompt that cannot fit); by default none."""
        return None

    def can_fail_over(self, failure: Failure, avoid: frozenset[str],
                      request: GenerationRequest) -> bool:
        """Should another replica get ``failure``'s request now? By default no (one
        upstream); a pool's model says."""
        return False


class _Deadline(Exception):
    """A request deadline passed; carries the failure to report. ``upstream_idle``: the idle
    timeout, while an upstream (not the queue) had the request: a fallback may take it."""

    def __init__(self, failure: Failure, *, upstream_idle: bool = False) -> None:
        super().__init__(failure.code)
        self.failure = failure
        self.upstream_idle = upstream_idle


def _header_safe(name: str) -> str:
    """A model name as a header value: printable ASCII, no list separators."""
    return "".join(c if " " < c <= "~" and c not in ",;" else "?" for c in name)[:128]


class SupervisedStream:
    """One client request's generation, supervised (see the module docstring)."""

    def __init__(self, served: Upstreamish, request: GenerationRequest, ticket: Ticket, *,
                 timing: Timing = Timing(), policy: RetryPolicy | None = None,
                 observer: RequestObserver | None = None,
                 rng: random.Random | None = None,
                 fallbacks: FallbackPlan | None = None) -> None:
        #: The model serving the request now, and the request as it receives it: the routed
        #: ones until a fallback moves them (``_fall_back``).
        self._served = served
        self._plan = fallbacks
        #: The fallbacks taken so far: ``(from model, to model, reason)``.
        self.fallbacks: list[tuple[str, str, str]] = []
        self._counts_released = False
        self._request = request
        self._ticket = ticket
        self._timing = timing
        self._policy = policy or RetryPolicy()
        self._obs: RequestObserver = observer or _NoObserver()
        #: The record the response writer reports wire bytes to (None: nobody listens).
        self.observer = observer
        self._rng = rng or _JITTER
        self._queue: Handoff[Event] = Handoff(_BUFFERED_EVENTS)
        #: The writer waiting in :meth:`settled`, and whether a terminal is queued.
        self._attention: asyncio.Future[None] | None = None
        self._terminal_queued = False
        self._task: asyncio.Task[None] | None = None
        self._upstream_stream: EventStream | None = None
        self._published = False
        #: What the answer's output events carried so far (:data:`MAX_ANSWER_SIZE`).
        self._answer_size = 0
        self._held: list[Event] = []
        #: The attempt's task waits for its upstream's next event: an event pushed now
        #: (:meth:`_push`) is the next one it would have forwarded.
        self._listening = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cancelled = False
        self._ended = False
        #: Upstream attempts made (for tests, logs and the fault-injection report).
        self.attempts = 0
        #: Replicas of a pool this request failed on before output: the next attempt goes
        #: to another one first (``routing/pool.py``).
        self._avoid: frozenset[str] = frozenset()
        # Clocks, in the event loop's time; set when the task starts.
        self._last_sent = 0.0
        self._idle_deadline = 0.0
        self._hard_deadline = 0.0

    # -- the EventStream interface ---------------------------------------------------------

    async def next_event(self) -> Event:
        if self._cancelled and not len(self._queue):
            return Finish(reason=FinishKind.ABORT)
        self.start()  # by the first read, unless a writer started it earlier
        return await self._queue.get()

    def start(self) -> None:
        """Begin the work now, as the first :meth:`next_event` does (``ir.start_early``):
        a writer that creates other tasks first (``http/streaming.py``'s disconnect watch)
        calls this before them, so the loop runs this task's steps to the upstream request
        before theirs. Never from the constructor (it may run outside the loop), never
        after abort() already ended the request."""
        if self._task is None and not self._ended:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def ready(self) -> list[Event]:
        """Every event queued now, without waiting (what a writer takes at its window's
        deadline: :meth:`settled`). Reads as :meth:`next_event` does, in order."""
        out = self._queue.take_all()
        if self._cancelled and not (out and is_terminal(out[-1])):
            out.append(Finish(reason=FinishKind.ABORT))  # as next_event ends a cancelled one
        return out

    async def settled(self) -> None:
        """Return when the reader should take what is queued before it meant to: a terminal
        is queued, or the queue is half full (a fast upstream must not wait for a slow
        reader's window). A writer that coalesces a window's events waits here until the
        window's deadline instead of waking for each event (``http/streaming.py``): one
        task wake-up per window instead of one per token (BENCHMARKS.md, "Session of
        2026-12-04 (2)")."""
        if self._terminal_queued or self._cancelled or \
                len(self._queue) >= _BUFFERED_EVENTS // 2:
            return
        waiter = self._attention = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            self._attention = None

    def _queued(self, event: Event) -> None:
        """An event went into the queue: wake a :meth:`settled` reader if it should look."""
        if is_terminal(event):
            self._terminal_queued = True
        elif len(self._queue) < _BUFFERED_EVENTS // 2:
            return
        wake(self._attention)

    def abort(self, failure: Failure) -> None:
        """End the request with ``failure`` now (the server is shutting down): the upstream
        attempt is cancelled and the client gets ``failure`` as the stream's terminal, so a
        drained stream fails cleanly instead of being cut."""
        if self._ended or self._cancelled:
            return
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._ticket.release_slot()
        self._ended = True
        self._queue.force(failure)  # a stalled reader's oldest event makes room for it
        self._queued(failure)
        self._obs.finished(outcome="failed", status=failure.status,
                           failure_class=failure.failure_class.value, code=failure.code)

    def cancel(self) -> None:
        """The client went away: stop waiting or generating, give the slot back."""
        if self._cancelled:
            return
        self._cancelled = True
        if self._task is not None and not self._task.done():
            self._task.cancel()
        else:
            self._ticket.release_slot()
        if not len(self._queue):  # a reader still waiting gets the documented ending
            self._queue.force(Finish(reason=FinishKind.ABORT))
        self._queued(Finish(reason=FinishKind.ABORT))  # a reader in settled() looks now
        if not self._ended:
            self._ended = True
            self._obs.finished(outcome="cancelled", status=499, code="client_disconnected")

    # -- the task --------------------------------------------------------------------------

    async def _run(self) -> None:
        now = asyncio.get_running_loop().time
        arrived = self._ticket.arrived_at
        self._hard_deadline = arrived + self._timing.request_cap_s
        self._idle_deadline = arrived + self._timing.idle_timeout_s
        self._last_sent = now()
        try:
            try:
                terminal = await self._serve()
            except _Deadline as exc:
                terminal = exc.failure
            await self._emit_terminal(terminal)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug here must end the stream, not hang it
            log.error("supervisor failed: %s", type(exc).__name__)  # no stack: seed privacy
            await self._emit_terminal(Failure(failure_class=FailureClass.INTERNAL,
                                              message="internal error in the gateway",
                                              status=500, code="internal_error"))
        finally:
            if self._upstream_stream is not None:
                self._upstream_stream.cancel()  # a no-op once it ended
            self._ticket.release_slot()

    @property
    def head_waits(self) -> bool:
        """Should a Responses stream hold its head and ``response.created`` for the first
        event? Yes when what that event says may differ from what is known now: a fallback
        may serve the request, or a pool names the replica of the turn (its turn-state
        token, ``routing/pool.py``). The wait ends at the first event or heartbeat."""
        return self._plan is not None or hasattr(self._served.upstream, "replicas")

    @property
    def serving(self) -> Upstreamish:
        """The model serving the request now (the routed one unless a fallback took it)."""
        return self._served

    async def _serve(self) -> Event:
        """The routed model, then its fallbacks while a failure before output allows one:
        the terminal to report."""
        tried, first = {getattr(self._served, "name", "")}, None
        while True:
            terminal = await self._on_model()
            if isinstance(terminal, Finish) or self._published:
                return terminal
            first = first or terminal
            nxt = self._plan.next_for(terminal, tried) if self._plan is not None else None
            if nxt is None:
                return self._final_failure(first)
            self._fall_back(nxt.served, nxt.request, terminal)
            tried.add(nxt.served.name)

    async def _on_model(self) -> Event:
        """One model: its preflight, a slot on its upstream, its attempts under its budget."""
        # A prompt that certainly does not fit is refused before it queues or reaches an
        # upstream: no attempt, final for this model (gateway/context_window.py).
        refusal = (await asyncio.to_thread(self._served.preflight, self._request)
                   if prompt_chars(self._request.prompt) > INLINE_COUNT_CHARS
                   else self._served.preflight(self._request))
        if refusal is not None:
            return refusal
        loop = asyncio.get_running_loop()
        if self._ticket.upstream is not self._served.upstream:
            self._ticket.release_slot()  # a fallback on another upstream waits for its own
            await self._admit()
        else:  # a fallback on the same upstream keeps the slot, with a fresh idle window
            self._idle_deadline = loop.time() + self._timing.idle_timeout_s
        try:
            return await self._attempts()
        except _Deadline as exc:
            if exc.upstream_idle and not self._published and self._plan is not None:
                return exc.failure  # silent before any output: a fallback may serve it
            raise

    def _fall_back(self, target: Upstreamish, request: GenerationRequest,
                   failure: Failure) -> None:
        """Move the request to ``target`` (its own form of the request)."""
        reason, source = failure.failure_class.value, self._served.name
        self.fallbacks.append((source, target.name, reason))
        self._served, self._request = target, request
        upstream = getattr(target, "upstream_name", "") or target.name
        self._obs.fallback(source, target.name, reason, upstream)
        # The failed model's facts are not the answer's; the answer names who served it. A
        # prompt count a heartbeat already released is replaced (renderers keep the last).
        self._held = [ResponseMeta(model=target.name)]
        if self._counts_released:
            self._held.append(Usage(prompt_tokens=None, completion_tokens=None))
        # Nor is its usage what the request is charged (per-key tpm charges the usage the
        # client is shown, the last one reported): unknown until the fallback reports its own.
        self._obs.usage(None, None)

    def _final_failure(self, first: Failure) -> Failure:
        """No model served the request: the routed model's failure, as without fallbacks
        (a fallback's refusal says nothing about the request to the model asked for), naming
        the targets this request could not be sent to."""
        if self.fallbacks:  # the last fallback's facts are not the routed model's failure's
            self._held = []
        note = self._plan.skipped_note(first) if self._plan is not None else ""
        if not note:
            return first
        return msgspec.structs.replace(first, message=first.message + note)

    def served_headers(self) -> list[tuple[str, str]]:
        """:data:`SERVED_MODEL_HEADER` and :data:`FALLBACK_HEADER` once a fallback was taken
        (one ``from;to=...;reason=...`` element per move), else none."""
        if not self.fallbacks:
            return []
        hops = ", ".join(f"{_header_safe(a)};to={_header_safe(b)};reason={r}"
                         for a, b, r in self.fallbacks)
        return [(SERVED_MODEL_HEADER, _header_safe(self.serving.name)), (FALLBACK_HEADER, hops)]

    async def _admit(self, *, requeue: bool = False) -> None:
        """Wait for a slot, sending heartbeats; the wait counts against the deadlines.
        ``requeue``: give the slot back and wait, first in line, for one on a replica of
        the pool this request has not failed on (``routing/pool.py``)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        granted = (self._ticket.admission.requeue(self._ticket, self._avoid) if requeue
                   else self._ticket.admission.enqueue(self._ticket, self._served.upstream))
        try:
            while not granted.done():
                wake = self._next_wake()
                await asyncio.wait({granted}, timeout=max(0.0, wake - loop.time()))
                if not granted.done():
                    await self._on_timer(queued=True)
        finally:
            if not granted.done():
                granted.cancel()  # cancelled or failed while queued: leave the line
        if not requeue:
            self._obs.admitted(loop.time() - started)
        self._idle_deadline = loop.time() + self._timing.idle_timeout_s  # restart at admission

    async def _attempts(self) -> Event:
        """Attempts until a terminal: the Finish, or the Failure to report."""
        loop = asyncio.get_running_loop()
        state = RetryState(started_at=loop.time(), policy=self._policy,
                           request_deadline=self._hard_deadline)
        self._avoid = frozenset()  # replicas of this model's pool failed on so far
        while True:
            try:
                state.on_attempt_started(loop.time())
            except RetryDeadlinePassed:
                raise _Deadline(self._cap_failure()) from None
            self.attempts += 1
            self._obs.attempt_started(self.attempts)
            terminal = await self._attempt()
            if isinstance(terminal, Finish) or self._published:
                return terminal  # a failure after output is reported, never replayed
            if self._fails_over(terminal):  # another replica: no budget, no backoff
                state.on_failover()
                self._held.clear()
                self._obs.retry_scheduled("failover", 0.0, terminal.failure_class.value,
                                          terminal.code)
                await self._admit(requeue=True)
                continue
            decision = state.on_failure(terminal, now=loop.time(), output_published=False,
                                        rng=self._rng)
            if isinstance(decision, GiveUp):
                return decision.failure
            self._held.clear()  # the failed attempt's facts are not the next one's
            self._obs.retry_scheduled(decision.budget.value, decision.delay_s,
                                      terminal.failure_class.value, terminal.code)
            await self._sleep(decision.delay_s)
            if not state.check_after_wait(loop.time()):
                return state.abandon().failure

    async def _attempt(self) -> Finish | Failure:
        """One upstream attempt: forward its events until its terminal."""
        loop = asyncio.get_running_loop()
        try:
            stream = (self._served.submit(self._request, avoid=self._avoid) if self._avoid
                      else self._served.submit(self._request))
        except ServerBusy as exc:  # the upstream's own bound: its 503, retried once
            return Failure(failure_class=FailureClass.CAPACITY, message=str(exc), status=503,
                           code="upstream_busy")
        self._upstream_stream = stream
        self._loop = loop
        push_through(stream, self._push)
        # One timer for the attempt, re-armed when a heartbeat or deadline is due, not one
        # per event: the wake only moves later with each event (gateway/wakeups.py).
        waits = DeadlineWaits()
        try:
            while True:
                self._listening = True
                try:
                    event = await waits.wait(stream.next_event, self._next_wake())
                finally:
                    self._listening = False
                if event is EXPIRED:
                    await self._on_timer(queued=False)
                    continue
                self._idle_deadline = loop.time() + self._timing.idle_timeout_s
                if is_terminal(event):
                    if isinstance(event, Finish) or self._published:
                        await self._flush_held()
                    elif (replica := replica_of(stream)) is not None:
                        self._avoid |= {replica.name}
                    return event
                if is_output(event):
                    self._answer_size += _output_size(event)
                    if self._answer_size > MAX_ANSWER_SIZE:
                        stream.cancel()
                        return _answer_too_large()
                await self._forward(event)
        except _Deadline as exc:
            if self._replica_stalled(stream, exc):
                return exc.failure  # another replica takes it (_attempts fails over)
            raise
        except asyncio.CancelledError:
            stream.cancel()
            raise
        except Exception as exc:  # an adapter bug: a failure, never a crashed stream
            stream.cancel()
            log.error("upstream stream raised %s", type(exc).__name__)
            return Failure(failure_class=FailureClass.INTERNAL,
                           message="the upstream adapter failed", status=502,
                           code="adapter_error")
        finally:
            waits.close()
            self._upstream_stream = None

    def _replica_stalled(self, stream: EventStream, exc: _Deadline) -> bool:
        """End the attempt a deadline interrupted. A pool's replica silent past the idle
        timeout before any output failed as its own read timeout would (a 504: README "When
        a replica fails"): counted against it, and True when another replica may take the
        request. Anything else (one upstream, the cap, a silence after output, which the
        client's back-pressure may have caused) ends the attempt as cancelled."""
        replica = replica_of(stream)
        if not exc.upstream_idle or self._published or replica is None:
            stream.cancel()
            return False
        fail_attempt(stream, exc.failure)
        self._avoid |= {replica.name}
        return self._fails_over(exc.failure)

    def _fails_over(self, failure: Failure) -> bool:
        """True when the served model is a pool with another replica for this failure."""
        return bool(self._avoid) and self._served.can_fail_over(failure, self._avoid,
                                                                self._request)

    async def _forward(self, event: Event) -> None:
        if not is_output(event):
            if self._published:
                await self._put(event)
            else:
                self._held.append(event)  # facts wait for the first output
            if isinstance(event, Usage):
                self._obs.usage(event.prompt_tokens, event.completion_tokens,
                                event.source.value)
            return
        if not self._published:
            self._publish()
            await self._flush_held()
        if isinstance(event, TokenDelta):
            self._count_tokens(event)
        await self._put(event)

    def _publish(self) -> None:
        """The first output goes out: nothing is retried from here on."""
        self._published = True
        self._obs.first_output()

    def _count_tokens(self, event: TokenDelta) -> None:
        # Ids when the client gets ids; else one per text delta (the usage the upstream
        # reports at the end corrects the count). Counting both would count twice: a
        # retokenized stream carries its text and its ids in separate deltas.
        self._obs.tokens(len(event.ids) if self._request.want_ids else int(bool(event.text)))

    def _push(self, event: Event) -> bool:
        """An upstream event handed over as it is parsed, in the upstream connection's
        callback (the stream's ``push_to``; why: ``http_transport._ChunkedBody.listen``).
        Taken (True) when it is what :meth:`_attempt` would forward at once after its wait,
        without waiting: a text or id delta (the first output with the facts held before
        it), with room in the hand-off, while the attempt's task waits for the next event.
        Anything else is left to the stream (False), which then gives it, and all after it,
        to :meth:`_attempt`: facts, terminals, a full hand-off (the client's back-pressure)
        and everything while the task is busy with a heartbeat or a flush."""
        if not self._listening or type(event) is not TokenDelta or self._ended \
                or self._cancelled or not (event.ids or event.text):
            return False
        size = self._answer_size + _output_size(event)
        if size > MAX_ANSWER_SIZE:
            return False  # the task ends the answer (_attempt)
        queue = self._queue
        if queue.room() <= len(self._held):
            return False  # full: the task waits for room (the client's back-pressure)
        self._answer_size = size
        now = self._loop.time()  # type: ignore[union-attr]
        if not self._published:  # as _forward publishes: the held facts first
            self._publish()
            held, self._held = self._held, []
            for fact in held:
                queue.offer(fact)
                self._sent(fact, now)
        queue.offer(event)
        self._idle_deadline = now + self._timing.idle_timeout_s
        self._count_tokens(event)
        self._sent(event, now)
        return True

    async def _flush_held(self) -> None:
        held, self._held = self._held, []
        for event in held:
            await self._put(event)

    async def _release_counts(self) -> None:
        """A heartbeat opens the client's stream before any output: a held prompt count
        goes first, so Anthropic's ``message_start`` can show it. Unlike other facts it may
        go early: if this attempt is retried, the next one's count replaces it (renderers
        keep the last ``Usage``)."""
        if self._published or not any(isinstance(e, Usage) for e in self._held):
            return
        counts = [e for e in self._held if isinstance(e, Usage)]
        self._held = [e for e in self._held if not isinstance(e, Usage)]
        self._counts_released = True
        for event in counts:
            await self._put(event)

    async def _emit_terminal(self, event: Event) -> None:
        if isinstance(event, Failure):
            await self._flush_held()  # facts (turn state) still belong to the answer
        await self._put(event)
        if self._ended:
            return
        self._ended = True
        if isinstance(event, Failure):
            self._obs.finished(outcome="failed", status=event.status,
                               failure_class=event.failure_class.value, code=event.code)
        else:
            self._obs.finished(outcome="completed", status=200)

    async def _put(self, event: Event) -> None:
        await self._queue.put(event)
        self._sent(event, asyncio.get_running_loop().time())

    def _sent(self, event: Event, now: float) -> None:
        """``event`` went into the hand-off at ``now`` (the heartbeats count from it)."""
        self._queued(event)
        self._last_sent = now

    # -- time ------------------------------------------------------------------------------

    def _next_wake(self) -> float:
        """The earliest of: the next heartbeat, the idle deadline, the one-hour cap."""
        wake = min(self._idle_deadline, self._hard_deadline)
        if self._timing.heartbeat_s is not None:
            wake = min(wake, self._last_sent + self._timing.heartbeat_s)
        return wake

    async def _on_timer(self, *, queued: bool) -> None:
        """A wait reached :meth:`_next_wake`: a deadline fails the request, else a heartbeat."""
        now = asyncio.get_running_loop().time() + _TIMER_SLACK_S
        if now >= self._hard_deadline:
            raise _Deadline(self._cap_failure())
        if now >= self._idle_deadline:
            raise _Deadline(self._idle_failure(queued), upstream_idle=not queued)
        hb = self._timing.heartbeat_s
        if hb is not None and now >= self._last_sent + hb:
            self._obs.heartbeat()
            await self._release_counts()
            await self._put(Heartbeat())

    async def _sleep(self, delay: float) -> None:
        """A retry wait: abortable (cancel), heartbeats inside, bounded by the cap."""
        loop = asyncio.get_running_loop()
        until = loop.time() + delay
        while (left := until - loop.time()) > _TIMER_SLACK_S:
            wake = self._next_wake()
            await asyncio.sleep(max(0.0, min(left, wake - loop.time())))
            if until - loop.time() > _TIMER_SLACK_S:
                await self._on_timer(queued=False)
        # The wait is ours, not the upstream's silence: the next attempt gets a full window.
        self._idle_deadline = loop.time() + self._timing.idle_timeout_s

    def _cap_failure(self) -> Failure:
        return Failure(failure_class=FailureClass.TIMEOUT, status=504, code="request_timeout",
                       message=f"the request reached the gateway's "
                               f"{self._timing.request_cap_s:g} s cap")

    def _idle_failure(self, queued: bool) -> Failure:
        where = "waiting for capacity" if queued else "waiting for the upstream"
        return Failure(failure_class=FailureClass.TIMEOUT, status=504, code="idle_timeout",
                       message=f"nothing happened for {self._timing.idle_timeout_s:g} s "
                               f"while {where}")
