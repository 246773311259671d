"""Per-key usage in ``/metrics``, labelled by key **name**, never by the key (issue 16).

* ``tokenwire_key_requests_total{key}``: requests admitted past the key's limits;
* ``tokenwire_key_tokens_total{key}``: tokens charged (prompt + completion of the usage the
  client was shown; the streamed count when an upstream reported none);
* ``tokenwire_key_rate_limited_total{key,limit}``: 429s of the key's own limits (``limit``:
  ``requests``, ``tokens``, ``concurrent``);
* ``tokenwire_key_requests_in_flight{key}``: this instance's running requests of the key;
* ``tokenwire_key_limits_local_only``: 1 while Redis is unreachable and each instance
  enforces the limits alone (``state/key_limiter.py``).

Label values are the names of configured keys plus ``unnamed`` (the flat key list) and
``anonymous`` (loopback without a key): a closed set the operator chose, so no client can
grow the registry. Metrics never fail a request: the counts a request updates are plain
dict updates, and the calls into prometheus_client swallow their errors.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["KeyMetrics"]

_LIMITS: Final = frozenset({"requests", "tokens", "concurrent"})
_REQUESTS_HELP: Final = "Requests admitted, per API key name."
_TOKENS_HELP: Final = "Tokens charged (prompt + completion), per API key name."
_IN_FLIGHT_HELP: Final = "Requests of the key running on this instance."


class KeyMetrics(Collector):
    """The per-key families on one app's registry.

    The three a request updates (requests, in flight, tokens) are plain counts per key name,
    read by the registry when ``/metrics`` is scraped (:meth:`collect`): through
    prometheus_client's children, an admission was two ``inc()`` calls, each a few frames
    and a lock, ~28 µs with the caches cold on the way to every first token (BENCHMARKS.md,
    "Session of 2026-12-05 (8)"). The two that change only on a refusal or a Redis outage
    stay prometheus_client's own. The collector has the shape of ``metrics.py``'s
    (``CapacityCollector``: names from the same ``_families`` with nothing to count)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._requests: dict[str, int] = {}
        self._tokens: dict[str, int] = {}
        self._in_flight: dict[str, int] = {}
        registry.register(self)
        self.limited = Counter("tokenwire_key_rate_limited", "Requests refused with 429 by "
                               "the key's own limits, per API key name and limit.",
                               ["key", "limit"], registry=registry)
        self.local_only = Gauge("tokenwire_key_limits_local_only", "1 while Redis is "
                                "unreachable and each instance enforces per-key limits on "
                                "its own (N instances admit up to N x the limit).",
                                registry=registry)

    def admitted(self, name: str) -> None:
        self._requests[name] = self._requests.get(name, 0) + 1
        self._in_flight[name] = self._in_flight.get(name, 0) + 1

    def ended(self, name: str, tokens: int) -> None:
        self._in_flight[name] = self._in_flight.get(name, 0) - 1
        if tokens > 0:
            self._tokens[name] = self._tokens.get(name, 0) + tokens

    def refused(self, name: str, limit: str) -> None:
        with contextlib.suppress(Exception):
            self.limited.labels(name, limit if limit in _LIMITS else "other").inc()

    def set_local_only(self, value: bool) -> None:
        with contextlib.suppress(Exception):
            self.local_only.set(1 if value else 0)

    # -- the registry's side (a custom collector) ----------------------------------------

    def describe(self) -> Iterator[Metric]:
        """The families' names, without samples: the registry refuses a second family of
        the same name at registration, as it does for its own."""
        return self._families({}, {}, {})

    def collect(self) -> Iterator[Metric]:
        # Copies: a scrape from another thread never iterates a dict the loop is growing.
        return self._families(dict(self._requests), dict(self._tokens),
                              dict(self._in_flight))

    @staticmethod
    def _families(requests: dict[str, int], tokens: dict[str, int],
                  in_flight: dict[str, int]) -> Iterator[Metric]:
        for family, counts in (
                (CounterMetricFamily("tokenwire_key_requests", _REQUESTS_HELP, labels=["key"]),
                 requests),
                (CounterMetricFamily("tokenwire_key_tokens", _TOKENS_HELP, labels=["key"]),
                 tokens),
                (GaugeMetricFamily("tokenwire_key_requests_in_flight", _IN_FLIGHT_HELP,
                                   labels=["key"]), in_flight)):
            for name, value in counts.items():
                family.add_metric([name], value)
            yield family
