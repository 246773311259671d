"""Labelled metric children, looked up once.

prometheus_client's ``labels()`` checks its arguments, converts them to ``str`` and takes the
metric's lock on every call, and a request made about a dozen such calls (2-5 % of a short
request's CPU in a profile, BENCHMARKS.md "The hot path"). A child is a fixed object for the
registry's life, and every label value the gateway passes is already bounded (closed sets
and ``LabelGuard``, ``bounds.py``; configured key names), so this cache holds no more
entries than the registry holds series.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Children"]


class Children:
    """``children(metric, *values)`` is ``metric.labels(*values)``, cached."""

    __slots__ = ("_cache",)

    def __init__(self) -> None:
        self._cache: dict[tuple[Any, tuple[str, ...]], Any] = {}

    def __call__(self, metric: Any, *values: str) -> Any:
        key = (metric, values)
        child = self._cache.get(key)
        if child is None:
            child = self._cache[key] = metric.labels(*values)
        return child
