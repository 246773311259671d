"""Per-request metrics and private structured logs for the gateway (issue 6 item 5).

Two outputs, both fed by one :class:`RequestRecord` per admitted request:

* **Prometheus metrics** on a private :class:`~prometheus_client.CollectorRegistry` (one per
  app, so tests and several apps in one process never share counters), served as text by
  :meth:`Observability.metrics_response_body`.
* **One log line per request**, ``request_completed`` or ``request_failed`` (plus
  ``request_rejected`` for requests refused before they became a record), through the stdlib
  logger ``tokenwire.requests`` and rendered as one JSON object per line by
  :class:`~tokenwire.gateway.observability.request_log.JsonLineFormatter`.

Privacy, from the gateway seed ("Private failure logs contain a UTC timestamp, bounded
request/provider/model identifiers, elapsed time, error code, and status, excluding request
bodies, exception messages, stacks, and credentials"). The rules are enforced here, by
construction, not left to callers:

* nothing in this module accepts a body, a message, an exception, a header or a key, so none
  can be logged; the formatter ignores ``exc_info``/``stack_info`` and never calls
  ``getMessage()`` (a ``%s`` argument could carry anything);
* free-form identifiers (request id, model, upstream) are cut to 128 characters of printable
  ASCII; error codes appear only when they look like codes (``^[a-z0-9_.-]{1,64}$``), else as
  ``"other"``; every other string field comes from a closed vocabulary (``"other"`` when not
  in it);
* numbers are clamped to finite values (counts and durations to non-negative ones), so a
  line is always valid JSON.

Cardinality: metric label values for open sets (model, upstream, rejection reason) are cut
to 64 characters and at most 64 distinct values per label are kept, later ones becoming
``"other"``: model names come from clients, who must not be able to grow the registry
without bound. Request ids are never labels.

The bounds, vocabularies and sanitisers themselves are :mod:`.bounds`.

Cost: label children are resolved once per record; streamed tokens reach the shared counter
in batches (:data:`TOKEN_FLUSH_EVERY`). No method of a record raises: observability must
never fail a request, so an internal error is counted in
``tokenwire_observability_errors_total`` and dropped.
"""

from __future__ import annotations

import functools
import logging
import math
import re
import time
from collections.abc import Callable, Iterable
from typing import Any, Concatenate, Final, ParamSpec, TypeVar

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.process_collector import ProcessCollector

from tokenwire.gateway.observability.bounds import (
    APIS,
    BUDGETS,
    ENCODINGS,
    FAILOVER,
    FAILURE_CLASSES,
    MAX_COUNT,
    OTHER,
    OUTCOMES,
    UNSPECIFIED,
    USAGE_SOURCES,
    LabelGuard,
    bounded_count,
    bounded_id,
    bounded_seconds,
    closed_value,
    safe_code,
    to_ms,
)
from tokenwire.gateway.observability.children import Children
from tokenwire.gateway.observability.metrics import (
    DURATION_BUCKETS_S,
    CapacityCollector,
    Metrics,
    ReplicaCollector,
    WithoutCreated,
)
from tokenwire.gateway.state.limits import charged_tokens

__all__ = [
    "DURATION_BUCKETS_S", "LOGGER_NAME", "MAX_LINE_CHARS", "MAX_NOTES", "METRICS_CONTENT_TYPE",
    "TOKEN_FLUSH_EVERY", "Observability", "RequestRecord",
]

# -- limits and vocabularies -----------------------------------------------------------------

#: The logger every request record goes to; the CLI attaches the JSON handler to it.
LOGGER_NAME: Final = "tokenwire.requests"
#: Defence in depth for the formatter: no line is longer, whatever a caller puts in a record.
MAX_LINE_CHARS: Final = 4096
#: The classic text format, pinned rather than the library's version-dependent default
#: (``version=1.0.0`` in 0.26): our names are legacy-valid, so the body is 0.0.4 either way.
METRICS_CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"

#: Extra log facts per record (:meth:`RequestRecord.note`), and the shape of their keys.
MAX_NOTES: Final = 16
_NOTE_KEY_RE: Final = re.compile(r"[a-z][a-z0-9_]{0,39}")
_RESERVED_NOTE_KEYS: Final = frozenset((  # the standard fields of a request record
    "ts event request_id api model upstream stream outcome status failure_class code elapsed_ms "
    "queue_wait_ms ttft_ms attempts retries retry_wait_ms heartbeats completion_tokens "
    "usage_prompt_tokens usage_completion_tokens usage_source wire_bytes encoding "
    "retried_failure_class retried_code served_model fallbacks fallback_reason").split())
#: Streamed tokens are added to the shared counter in batches of this many (see ``tokens``).
TOKEN_FLUSH_EVERY: Final = 32
_CANCEL_CODE: Final = "client_disconnected"
#: A record's retries by budget before any (a log line names every budget).
_NO_RETRIES: Final = dict.fromkeys(sorted(BUDGETS), 0)

_internal_log = logging.getLogger("tokenwire.observability")
# A library does not print by default: the CLI decides where request records go.
logging.getLogger(LOGGER_NAME).addHandler(logging.NullHandler())


# -- the "never raise" rule ------------------------------------------------------------------

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _never_raises(
    fn: Callable[Concatenate[Any, _P], _R],
) -> Callable[Concatenate[Any, _P], _R | None]:
    """Observability must not fail a request: an error is counted, typed and dropped.

    Only the exception's type name is logged (to ``tokenwire.observability``, at debug):
    its message could quote anything the failing call was given.
    """

    @functools.wraps(fn)
    def wrapper(self: Any, *args: _P.args, **kwargs: _P.kwargs) -> _R | None:
        try:
            return fn(self, *args, **kwargs)
        except Exception as exc:  # the point of the wrapper
            obs = self if isinstance(self, Observability) else getattr(self, "_obs", None)
            if obs is not None:
                obs._internal_error(fn.__name__, exc)
            return None

    return wrapper


# -- the app-wide object ---------------------------------------------------------------------


class Observability:
    """One per app: a private prometheus registry + the structured request logger."""

    def __init__(
        self,
        *,
        registry: CollectorRegistry | None = None,
        logger: logging.Logger | None = None,
        clock: Callable[[], float] = time.monotonic,
        process_metrics: bool = True,
    ) -> None:
        own_registry = registry is None
        self.registry = registry if registry is not None else CollectorRegistry()
        self.logger = logger if logger is not None else logging.getLogger(LOGGER_NAME)
        self.clock = clock
        self._m = Metrics(self.registry)
        self._child = Children()  # labelled children of self._m, looked up once
        self._capacity = CapacityCollector(self._internal_error)
        self.registry.register(self._capacity)
        self._replicas = ReplicaCollector(self._internal_error)
        self.registry.register(self._replicas)
        if own_registry and process_metrics:
            # Resident memory and open fds per app registry (the load test watches memory).
            ProcessCollector(registry=self.registry)
        self._model = LabelGuard()
        self._upstream = LabelGuard()
        self._reason = LabelGuard()

    def new_request(
        self, *, api: str, model: str, upstream: str, request_id: str, stream: bool
    ) -> RequestRecord:
        """Start the record of one admitted request; its clock starts now."""
        return RequestRecord(self, api=api, model=model, upstream=upstream,
                             request_id=request_id, stream=stream)

    def set_capacity_source(self, fn: Callable[[], tuple[int, int]]) -> None:
        """``fn() -> (running, queued)``, called at scrape time only."""
        self._capacity.source = fn

    def set_pools_source(self, fn: Callable[[], Iterable[object]]) -> None:
        """``fn() -> pools`` (each with ``name`` and ``snapshot()``), read at scrape time."""
        self._replicas.source = fn

    @_never_raises
    def rejected(
        self, *, api: str, status: int, reason: str, request_id: str | None = None
    ) -> None:
        """A request refused before it became a record (429 queue full, 401, 403, 413, 400).

        ``reason`` is a code (``queue_full``, ``invalid_api_key``...): kept when code-shaped,
        bounded in cardinality like a model name.
        """
        api_l = closed_value(api, APIS)
        reason_l = self._reason(safe_code(reason) or UNSPECIFIED)
        self._m.rejected.labels(api_l, reason_l).inc()
        fields: dict[str, Any] = {"event": "request_rejected", "api": api_l,
                                  "status": _status(status), "reason": reason_l}
        if request_id is not None:
            fields["request_id"] = bounded_id(request_id)
        if self.logger.isEnabledFor(logging.INFO):
            emit(self.logger, logging.INFO, "request_rejected", fields)

    @_never_raises
    def not_stored(self, reason: str) -> None:
        """A response served but not stored (``http/responses_routes.py``): a closed set of
        reasons, so the label needs no guard beyond :func:`safe_code`."""
        self._m.not_stored.labels(safe_code(reason) or UNSPECIFIED).inc()

    @_never_raises
    def upstream_socket(self, upstream: str, outcome: str) -> None:
        """An upstream Responses WebSocket event (``upstreams/responses_socket.py``): a closed
        set of outcomes, the upstream label bounded as everywhere."""
        self._m.upstream_sockets.labels(self._upstream(upstream),
                                        safe_code(outcome) or UNSPECIFIED).inc()

    def metrics_response_body(self) -> tuple[bytes, str]:
        """``(body, content_type)`` for ``GET /metrics`` in the Prometheus text format."""
        return generate_latest(WithoutCreated(self.registry)), METRICS_CONTENT_TYPE

    def _internal_error(self, where: str, exc: Exception) -> None:
        try:
            self._m.errors.inc()
            _internal_log.debug("observability error in %s: %s", where, type(exc).__name__)
        except Exception:  # the last line of "never raise"
            pass


def _status(status: object) -> int:
    return status if isinstance(status, int) and 0 <= status <= 999 else 0


# -- one request -----------------------------------------------------------------------------


class RequestRecord:
    """Everything the gateway learns about one request, until :meth:`close`.

    Calls are cheap (the token and byte counters are called per token and per write) and
    never raise. Metrics move as events happen (tokens in small batches), so a scrape during
    a long stream sees it progress. :meth:`finished` says how the request ended (the
    supervisor knows); the bytes of the last write, and of a whole non-streamed body, come
    after that, so the request's metrics and its one log line are written at :meth:`close`,
    when the HTTP exchange is over.

    Everything the metrics learn before the first byte reaches the client (queue wait, the
    first attempts, time to first token) is held in the record and posted with the first
    write's byte count (:meth:`wire_bytes`), or at the first retry, fallback, heartbeat,
    token batch or :meth:`close`, whichever comes first; so are the labels and children that
    posting needs. Those updates sat between the request and its first token (with the
    writer's disconnect watch, ``http/streaming.py``, ~0.1 ms of the gateway's added time to
    first token at 1 stream: BENCHMARKS.md, "Session of 2026-12-05 (5)"); a scrape sees
    them one write later.
    """

    __slots__ = (
        "_api", "_api_given", "_attempts", "_attempts_held", "_c_bytes", "_c_heartbeats",
        "_c_tokens", "_done", "_encoding", "_fallback_reason", "_fallbacks",
        "_first_output_s", "_heartbeats", "_held", "_model", "_model_l", "_notes", "_obs",
        "_outcome", "_queue_wait_s", "_request_id", "_retries", "_retry_class", "_retry_code",
        "_retry_wait_s", "_served_model", "_started", "_stream", "_tokens", "_tokens_pending",
        "_upstream", "_upstream_l", "_usage", "_usage_source", "_wire_bytes",
    )

    def __init__(
        self, obs: Observability, *, api: str, model: str, upstream: str, request_id: str,
        stream: bool,
    ) -> None:
        self._obs = obs
        self._done = False
        self._outcome: tuple[str, int, str | None, str | None] | None = None
        self._started = _safe_clock(obs)
        # As given; bounded when posted or logged (``_post``, ``_log``): labels for series
        # (64 characters, 64 values), log identifiers to 128 characters.
        self._api_given = api
        self._model: object = model
        self._upstream: object = upstream
        self._request_id: object = request_id
        self._stream = stream is True
        #: Metric updates wait for the first write (the class docstring); ``_post`` ends it.
        self._held = True
        self._attempts_held = 0
        self._api = UNSPECIFIED
        self._model_l = self._upstream_l = UNSPECIFIED
        self._c_tokens: Any = None
        self._c_heartbeats: Any = None
        #: wire_bytes' children by encoding: a write looks up one string, no tuple key.
        self._c_bytes: dict[str, Any] = {}
        self._queue_wait_s: float | None = None
        self._first_output_s: float | None = None
        self._attempts = 0
        self._retries: dict[str, int] | None = None  # by budget, once one is used
        self._retry_wait_s = 0.0
        self._retry_class: str | None = None
        self._retry_code: str | None = None
        self._heartbeats = 0
        self._tokens = 0
        self._tokens_pending = 0
        self._notes: dict[str, bool | int | str | None] | None = None
        self._usage: tuple[int | None, int | None] | None = None
        self._usage_source: str | None = None
        self._wire_bytes = 0
        self._encoding: str | None = None
        self._fallbacks = 0
        self._fallback_reason: str | None = None
        self._served_model: str | None = None

    @property
    def done(self) -> bool:
        """Whether :meth:`close` has run (later calls are ignored)."""
        return self._done

    def _post(self) -> None:
        """End the hold: bound the labels, look up the children, and post what was held."""
        self._held = False
        obs = self._obs
        m, child = obs._m, obs._child
        self._api = closed_value(self._api_given, APIS)
        self._model_l = obs._model(self._model)
        self._upstream_l = obs._upstream(self._upstream)
        self._c_tokens = child(m.completion_tokens, self._api, self._model_l)
        self._c_heartbeats = child(m.heartbeats, self._api)
        if self._queue_wait_s is not None:
            m.queue_wait.observe(self._queue_wait_s)
        if self._attempts_held:
            child(m.attempts, self._upstream_l).inc(self._attempts_held)
            self._attempts_held = 0
        if self._first_output_s is not None:
            child(m.ttft, self._api, self._model_l).observe(self._first_output_s)

    @_never_raises
    def admitted(self, waited_s: float) -> None:
        """Left the capacity queue after ``waited_s`` (0 when a slot was free); once."""
        if self._done or self._queue_wait_s is not None:
            return
        self._queue_wait_s = bounded_seconds(waited_s)
        if not self._held:
            self._obs._m.queue_wait.observe(self._queue_wait_s)

    @_never_raises
    def attempt_started(self, attempt: int) -> None:
        """Upstream attempt number ``attempt`` (1, 2, ...) is starting."""
        if self._done:
            return
        self._attempts = max(self._attempts + 1, min(bounded_count(attempt), 1_000_000))
        if self._held:
            self._attempts_held += 1
        else:
            self._obs._child(self._obs._m.attempts, self._upstream_l).inc()

    @_never_raises
    def retry_scheduled(
        self, budget: str, delay_s: float, failure_class: str, code: str | None
    ) -> None:
        """A retry from ``budget`` after ``delay_s``, for a failure of ``failure_class``."""
        if self._done:
            return
        if self._held:  # the attempts so far are this upstream's (a retry is no fast path)
            self._post()
        budget_l = closed_value(budget, BUDGETS | {FAILOVER})
        delay = bounded_seconds(delay_s)
        retries = self._retries = self._retries or dict(_NO_RETRIES)
        if budget_l in retries or budget_l == FAILOVER:
            retries[budget_l] = retries.get(budget_l, 0) + 1
        self._retry_wait_s += delay
        self._retry_class = closed_value(failure_class, FAILURE_CLASSES)
        self._retry_code = safe_code(code)
        m = self._obs._m
        m.retries.labels(self._upstream_l, budget_l).inc()
        m.retry_wait.labels(budget_l).inc(delay)

    @_never_raises
    def fallback(self, from_model: str, to_model: str, reason: str, upstream: str) -> None:
        """The request moved from ``from_model`` to the fallback ``to_model`` (served by
        ``upstream``) for a failure of class ``reason``: later attempts count for it."""
        if self._done:
            return
        if self._held:  # the attempts so far were the routed upstream's
            self._post()
        reason_l = closed_value(reason, FAILURE_CLASSES)
        self._fallbacks += 1
        self._fallback_reason = reason_l
        self._served_model = bounded_id(to_model)
        self._upstream_l = self._obs._upstream(upstream)
        self._upstream = upstream
        self._obs._m.fallbacks.labels(self._obs._model(from_model), self._obs._model(to_model),
                                      reason_l).inc()

    @_never_raises
    def heartbeat(self) -> None:
        """A keep-alive event went to the client."""
        if self._done:
            return
        if self._held:
            self._post()
        self._heartbeats += 1
        self._c_heartbeats.inc()
        self._flush_tokens()  # a quiet stream's tokens become visible within one interval

    @_never_raises
    def first_output(self) -> None:
        """The first output reached the client; time to first token counts from creation
        (queue wait included: that is what the client waited). Later calls are ignored."""
        if self._done or self._first_output_s is not None:
            return
        self._first_output_s = max(0.0, _safe_clock(self._obs) - self._started)
        if not self._held:
            self._obs._child(self._obs._m.ttft, self._api, self._model_l).observe(
                self._first_output_s)

    def tokens(self, n: int) -> None:
        """``n`` completion tokens were streamed (ids, or 1 per text delta without ids).

        The hottest call, so no decorator: the count goes to the record and reaches the
        shared counter every :data:`TOKEN_FLUSH_EVERY` tokens (a locked increment costs
        ~0.6 us), on a heartbeat and at :meth:`finished`; a scrape mid-stream lags by at most
        that many tokens per open stream.
        """
        try:
            if self._done:
                return
            if type(n) is not int or not 0 < n < MAX_COUNT:
                n = bounded_count(n)
                if not n:
                    return
            self._tokens += n
            self._tokens_pending += n
            if self._tokens_pending >= TOKEN_FLUSH_EVERY:
                self._flush_tokens()
        except Exception as exc:
            self._obs._internal_error("tokens", exc)

    def _flush_tokens(self) -> None:
        if self._tokens_pending:
            if self._held:
                self._post()
            pending, self._tokens_pending = self._tokens_pending, 0
            self._c_tokens.inc(pending)

    @_never_raises
    def usage(self, prompt_tokens: int | None, completion_tokens: int | None,
              source: str | None = None) -> None:
        """The usage the client is shown (``gateway/usage.py``); the last one wins (an
        early prompt count, then the final one), and it is counted once, at
        :meth:`finished`. ``None`` is "not known" and stays ``None`` (never a 0)."""
        if self._done:
            return
        self._usage = (None if prompt_tokens is None else bounded_count(prompt_tokens),
                       None if completion_tokens is None else bounded_count(completion_tokens))
        self._usage_source = closed_value(source, USAGE_SOURCES) if source is not None else None

    def charged_tokens(self) -> int:
        """What the request cost in tokens, for per-key limits (``state/key_limiter.py``
        reads it at release; the rule is ``state/limits.py``'s); never raises."""
        try:
            prompt, completion = self._usage if self._usage is not None else (None, None)
            return charged_tokens(prompt, completion, self._tokens)
        except Exception:
            return 0

    def wire_bytes(self, encoding: str, n: int) -> None:
        """``n`` bytes written to the client socket after content-coding (once per write,
        i.e. per coalescing window, so counted straight into the shared counter). The first
        write's count posts what was held (the class docstring): it comes after the write."""
        try:
            if self._done:
                return
            if self._held:
                self._post()
            if type(n) is not int or not 0 < n < MAX_COUNT:
                n = bounded_count(n)
                if not n:
                    return
            enc = encoding if isinstance(encoding, str) and encoding in ENCODINGS else OTHER
            child = self._c_bytes.get(enc)  # at most one child per vocabulary entry
            if child is None:
                child = self._c_bytes[enc] = self._obs._child(self._obs._m.wire_bytes,
                                                              self._api, enc)
            self._encoding = enc
            self._wire_bytes += n
            child.inc(n)
        except Exception as exc:
            self._obs._internal_error("wire_bytes", exc)

    @_never_raises
    def note(self, key: str, value: bool | int | str | None) -> None:
        """An extra fact for the log line, such as the seed's ``turn_state_echoed`` (bool),
        ``dropped_control_items`` (int) or ``translation_reason`` (a code).

        Keys are ``^[a-z][a-z0-9_]{0,39}$`` and cannot replace a standard field; strings are
        kept only when code-shaped (else ``"other"``), so a note cannot carry text; at most
        :data:`MAX_NOTES` keys per record. Notes go to the log only, never to metrics.
        """
        if self._done or not isinstance(key, str) or not _NOTE_KEY_RE.fullmatch(key):
            return
        if key in _RESERVED_NOTE_KEYS:
            return
        notes = self._notes if self._notes is not None else {}
        if key not in notes and len(notes) >= MAX_NOTES:
            return
        if value is None or isinstance(value, bool):
            notes[key] = value
        elif isinstance(value, int):
            notes[key] = max(-MAX_COUNT, min(value, MAX_COUNT))
        else:
            notes[key] = safe_code(value)
        self._notes = notes

    @_never_raises
    def finished(
        self, *, outcome: str, status: int, failure_class: str | None = None,
        code: str | None = None,
    ) -> None:
        """How the request ended; the first call wins (written out at :meth:`close`)."""
        if self._outcome is None:
            self._outcome = (outcome, status, failure_class, code)

    @_never_raises
    def close(self) -> None:
        """The exchange is over: count the request and write its one log line (once). A
        request that never said how it ended was cancelled (the client went away)."""
        if self._done:
            return
        self._emit(*(self._outcome or ("cancelled", 499, None, None)))

    def _emit(self, outcome: str, status: int, failure_class: str | None,
              code: str | None) -> None:
        """``outcome`` is ``completed``, ``failed`` or ``cancelled`` (an unknown outcome counts
        as ``failed``: nothing unexplained is reported as a success). A cancelled request
        (the client went away) is logged as ``request_failed`` with failure class
        ``cancelled`` and code ``client_disconnected`` unless a code is given; it counts in
        ``tokenwire_requests_total{outcome="cancelled"}`` but not in
        ``tokenwire_request_failures_total``, so failure-rate alerts see only the gateway's
        and upstreams' failures.
        """
        if self._done:
            return
        if self._held:
            self._post()
        self._done = True
        outcome_l = outcome if outcome in OUTCOMES else "failed"
        elapsed = max(0.0, _safe_clock(self._obs) - self._started)
        m, child = self._obs._m, self._obs._child
        self._flush_tokens()
        child(m.requests, self._api, self._model_l, outcome_l).inc()
        child(m.duration, self._api, outcome_l).observe(elapsed)
        if self._usage is not None:
            prompt, completion = self._usage
            if prompt:
                child(m.prompt_tokens, self._model_l).inc(prompt)
            if completion is not None and completion > self._tokens:  # non-streamed paths
                self._c_tokens.inc(completion - self._tokens)
        fclass: str | None = None
        fcode: str | None = None
        if outcome_l == "failed":
            fclass = closed_value(failure_class, FAILURE_CLASSES) if failure_class else UNSPECIFIED
            fcode = safe_code(code)
            child(m.failures, self._api, self._model_l, fclass).inc()
        elif outcome_l == "cancelled":
            fclass = "cancelled"
            fcode = safe_code(code) or _CANCEL_CODE
        self._log(outcome_l, _status(status), elapsed, fclass, fcode)

    def _log(
        self, outcome: str, status: int, elapsed: float, fclass: str | None, fcode: str | None
    ) -> None:
        completed = outcome == "completed"
        name = "request_completed" if completed else "request_failed"
        logger = self._obs.logger
        level = logging.INFO if completed or outcome == "cancelled" else logging.WARNING
        if not logger.isEnabledFor(level):
            return
        fields: dict[str, Any] = {
            "event": name,
            "request_id": bounded_id(self._request_id),
            "api": self._api,
            "model": bounded_id(self._model),
            "upstream": bounded_id(self._upstream),
            "stream": self._stream,
            "outcome": outcome,
            "status": status,
        }
        if not completed:
            fields["failure_class"] = fclass
            fields["code"] = fcode
        fields.update({
            "elapsed_ms": to_ms(elapsed),
            "queue_wait_ms": None if self._queue_wait_s is None else to_ms(self._queue_wait_s),
            "ttft_ms": None if self._first_output_s is None else to_ms(self._first_output_s),
            "attempts": self._attempts,
            "retries": dict(self._retries or _NO_RETRIES),
            "retry_wait_ms": to_ms(self._retry_wait_s),
            "heartbeats": self._heartbeats,
            "completion_tokens": self._tokens,
            "usage_prompt_tokens": None if self._usage is None else self._usage[0],
            "usage_completion_tokens": None if self._usage is None else self._usage[1],
            "usage_source": self._usage_source,
            "wire_bytes": self._wire_bytes,
            "encoding": self._encoding,
        })
        if self._retry_class is not None:
            fields["retried_failure_class"] = self._retry_class
            fields["retried_code"] = self._retry_code
        if self._fallbacks:  # README "Fallbacks": who served it, after how many moves, why
            fields["served_model"] = self._served_model
            fields["fallbacks"] = self._fallbacks
            fields["fallback_reason"] = self._fallback_reason
        fields.update(self._notes or {})  # note() refuses the standard keys
        emit(logger, level, name, fields)


def emit(logger: logging.Logger, level: int, name: str, fields: dict[str, Any]) -> None:
    """Hand one record to ``logger``'s handlers, as ``logger.log(level, name,
    extra={"event": fields})`` does, without ``findCaller``: that walks the stack to name a
    source file and line no request line shows (a fifth of ``logger.log``'s cost; the request
    log was a tenth of a short request's CPU, BENCHMARKS.md "Session of 2026-12-04 (2)").
    The caller has checked ``isEnabledFor``."""
    logger.handle(logger.makeRecord(logger.name, level, _NO_SOURCE, 0, name, None, None,
                                    extra={"event": fields}))


#: The source a record from :func:`emit` names (``logging``'s own word for "not looked up").
_NO_SOURCE: Final = "(unknown file)"


def _safe_clock(obs: Observability) -> float:
    """The injected clock, or 0 if it fails or lies (a NaN would poison every duration)."""
    try:
        now = obs.clock()
    except Exception as exc:  # a broken clock must not fail the request
        obs._internal_error("clock", exc)
        return 0.0
    return now if isinstance(now, int | float) and math.isfinite(now) else 0.0


# -- log rendering ---------------------------------------------------------------------------
