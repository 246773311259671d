"""The gateway's Prometheus metric families, on a registry of their own per app.

:mod:`tokenwire.gateway.observability.records` owns the per-request records that move these; this
module only declares them (names, help, labels, buckets) and the two collectors that shape
a scrape: the capacity gauges read at scrape time, and the registry view without the
``*_created`` series.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = [
    "DURATION_BUCKETS_S",
    "CapacityCollector",
    "Metrics",
    "ReplicaCollector",
    "WithoutCreated",
]

#: Histogram buckets for LLM latencies, 5 ms (a cached or tiny answer) to 10 min (a long
#: reasoning turn); requests are capped at one hour, beyond which +Inf is enough.
DURATION_BUCKETS_S: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
    600.0,
)


def _gauge(n: object) -> int:
    """A count from the capacity source as a gauge value: a non-negative int, else 0."""
    return n if isinstance(n, int) and n > 0 else 0


class CapacityCollector(Collector):
    """``tokenwire_requests_running`` / ``_queued``, read from the capacity gate at scrape
    time, so the gauges are never stale and the gate needs no hook into this module."""

    def __init__(self, on_error: Callable[[str, Exception], None]) -> None:
        self.source: Callable[[], tuple[int, int]] | None = None
        self._on_error = on_error

    def describe(self) -> Iterable[Metric]:
        # Names only, so registering does not call a source that is not set yet.
        return self._families(0, 0)

    def collect(self) -> Iterable[Metric]:
        source = self.source
        if source is None:
            return []  # absent rather than a misleading 0
        try:
            running, queued = source()
        except Exception as exc:  # a scrape must not fail on the gate's bug
            self._on_error("capacity_source", exc)
            return []
        return self._families(_gauge(running), _gauge(queued))

    @staticmethod
    def _families(running: int, queued: int) -> list[Metric]:
        return [GaugeMetricFamily("tokenwire_requests_running",
                                  "Upstream requests holding a capacity slot.", value=running),
                GaugeMetricFamily("tokenwire_requests_queued",
                                  "Requests waiting in the capacity queue.", value=queued)]


#: Breaker states as gauge values (``tokenwire_replica_state``).
_BREAKER_VALUES: Final = {"closed": 0, "half_open": 1, "open": 2}


class ReplicaCollector(Collector):
    """Every replica of every pool, read at scrape time from the pools' snapshots
    (``routing/pool.py``): breaker state (0 closed, 1 half-open, 2 open), requests in
    flight, its limit, ejections, and attempts that completed or failed on it."""

    def __init__(self, on_error: Callable[[str, Exception], None]) -> None:
        self.source: Callable[[], Iterable[object]] | None = None
        self._on_error = on_error

    def describe(self) -> Iterable[Metric]:
        return self._families([])

    def collect(self) -> Iterable[Metric]:
        if self.source is None:
            return []
        try:
            rows = [(p.name, r) for p in self.source() for r in p.snapshot()]  # type: ignore[attr-defined]
        except Exception as exc:
            self._on_error("replica_source", exc)
            return []
        return self._families(rows) if rows else []

    @staticmethod
    def _families(rows: list[tuple[str, dict]]) -> list[Metric]:
        labels = ["pool", "replica"]
        fams = {
            "state": GaugeMetricFamily("tokenwire_replica_state", "Breaker state of a replica "
                                       "(0 closed, 1 half-open, 2 open: ejected).", labels=labels),
            "in_flight": GaugeMetricFamily("tokenwire_replica_in_flight",
                                           "Attempts running on a replica.", labels=labels),
            "limit": GaugeMetricFamily("tokenwire_replica_limit",
                                       "A replica's concurrency limit.", labels=labels),
            "ejections": CounterMetricFamily("tokenwire_replica_ejections",
                                             "Times a replica's breaker opened.", labels=labels),
            "completed": CounterMetricFamily("tokenwire_replica_completed",
                                             "Attempts that finished on a replica.",
                                             labels=labels),
            "failed": CounterMetricFamily("tokenwire_replica_failed", "Attempts that failed "
                                          "on a replica by its fault (connection, 5xx).",
                                          labels=labels),
        }
        for pool, r in rows:
            key = [pool, r["name"]]
            fams["state"].add_metric(key, _BREAKER_VALUES.get(r["breaker"], 2))
            for name in ("in_flight", "limit", "ejections", "completed", "failed"):
                fams[name].add_metric(key, r[name])
        return list(fams.values())


class Metrics:
    """The metric objects, created once per registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, labels, registry=registry)

        def histogram(name: str, doc: str, labels: tuple[str, ...] = ()) -> Histogram:
            return Histogram(name, doc, labels, registry=registry, buckets=DURATION_BUCKETS_S)

        self.requests = counter(
            "tokenwire_requests_total", "Requests finished, by outcome.",
            ("api", "model", "outcome"))
        self.failures = counter(
            "tokenwire_request_failures_total",
            "Requests failed, by failure class (client disconnects are not failures).",
            ("api", "model", "failure_class"))
        self.rejected = counter(
            "tokenwire_requests_rejected_total",
            "Requests refused before admission (queue full, auth, origin, size...).",
            ("api", "reason"))
        self.attempts = counter(
            "tokenwire_upstream_attempts_total", "Upstream attempts started.", ("upstream",))
        self.retries = counter(
            "tokenwire_retries_total", "Retries scheduled, by retry budget.",
            ("upstream", "budget"))
        self.retry_wait = counter(
            "tokenwire_retry_wait_seconds_total", "Backoff scheduled before retries.",
            ("budget",))
        self.fallbacks = counter(
            "tokenwire_fallbacks_total",
            "Requests moved to a fallback model before any output, by the failure class "
            "that moved them.", ("from_model", "to_model", "reason"))
        self.heartbeats = counter(
            "tokenwire_heartbeats_total", "Keep-alive events sent to clients.", ("api",))
        self.completion_tokens = counter(
            "tokenwire_completion_tokens_total",
            "Completion tokens: streamed, or the upstream's usage when it reports more.",
            ("api", "model"))
        self.prompt_tokens = counter(
            "tokenwire_prompt_tokens_total",
            "Prompt tokens, as the response's usage reports them.", ("model",))
        self.wire_bytes = counter(
            "tokenwire_wire_bytes_total",
            "Response bytes written to clients after content-coding.", ("api", "encoding"))
        self.not_stored = counter(
            "tokenwire_responses_not_stored_total",
            "Responses served but not stored for previous_response_id, by reason "
            "(store_unavailable, too_large, store_error).", ("reason",))
        self.upstream_sockets = counter(
            "tokenwire_upstream_websockets_total",
            "Upstream Responses WebSockets held for client sockets, by outcome: opened, "
            "refused (the upgrade was refused: that client socket uses HTTP), lost (closed "
            "by the upstream or the network during a response).", ("upstream", "outcome"))
        self.errors = counter(
            "tokenwire_observability_errors_total",
            "Internal errors of the metrics and logging code (dropped, never raised).")
        self.ttft = histogram(
            "tokenwire_time_to_first_token_seconds",
            "From request start (including the queue) to the first output.", ("api", "model"))
        self.queue_wait = histogram(
            "tokenwire_queue_wait_seconds", "Time spent in the capacity queue.")
        self.duration = histogram(
            "tokenwire_request_duration_seconds", "Request duration, by outcome.",
            ("api", "outcome"))


class WithoutCreated(Collector):
    """A view of a registry without the ``*_created`` samples prometheus_client adds to
    every counter and histogram child: in the classic text format they are separate gauge
    series that double the scrape for a timestamp nobody graphs."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for metric in self._registry.collect():
            samples = [s for s in metric.samples if not s.name.endswith("_created")]
            if len(samples) != len(metric.samples):
                metric = copy.copy(metric)
                metric.samples = samples
            yield metric
