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
grow the registry. Every method swallows its own errors: metrics never fail a request.
"""

from __future__ import annotations

import contextlib
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge

from tokenwire.gateway.observability.children import Children

__all__ = ["KeyMetrics"]

_LIMITS: Final = frozenset({"requests", "tokens", "concurrent"})


class KeyMetrics:
    """The per-key families on one app's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter("tokenwire_key_requests", "Requests admitted, per API key "
                                "name.", ["key"], registry=registry)
        self.tokens = Counter("tokenwire_key_tokens", "Tokens charged (prompt + completion), "
                              "per API key name.", ["key"], registry=registry)
        self.limited = Counter("tokenwire_key_rate_limited", "Requests refused with 429 by "
                               "the key's own limits, per API key name and limit.",
                               ["key", "limit"], registry=registry)
        self.in_flight = Gauge("tokenwire_key_requests_in_flight", "Requests of the key "
                               "running on this instance.", ["key"], registry=registry)
        self.local_only = Gauge("tokenwire_key_limits_local_only", "1 while Redis is "
                                "unreachable and each instance enforces per-key limits on "
                                "its own (N instances admit up to N x the limit).",
                                registry=registry)
        self._child = Children()

    def admitted(self, name: str) -> None:
        with contextlib.suppress(Exception):
            self._child(self.requests, name).inc()
            self._child(self.in_flight, name).inc()

    def ended(self, name: str, tokens: int) -> None:
        with contextlib.suppress(Exception):
            self._child(self.in_flight, name).dec()
            if tokens > 0:
                self._child(self.tokens, name).inc(tokens)

    def refused(self, name: str, limit: str) -> None:
        with contextlib.suppress(Exception):
            self.limited.labels(name, limit if limit in _LIMITS else "other").inc()

    def set_local_only(self, value: bool) -> None:
        with contextlib.suppress(Exception):
            self.local_only.set(1 if value else 0)
