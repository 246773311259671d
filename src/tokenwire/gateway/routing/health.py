"""Each upstream's health for ``/health``: the last ``probe()``, refreshed in the background.

:class:`HealthMonitor` refreshes at most every ``interval`` seconds, so a scraper polling
``/health`` in a tight loop does not turn into a probe storm against the upstreams.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tokenwire.gateway.ir import kind_of
from tokenwire.gateway.upstreams.base import UpstreamHealth, UpstreamState

__all__ = ["DEFAULT_HEALTH_INTERVAL_S", "HealthMonitor", "overall_status"]

#: Probes run at most this often: /health stays cheap to poll, yet a dead upstream shows
#: within a few seconds.
DEFAULT_HEALTH_INTERVAL_S = 5.0
#: The first /health waits this long for probes that have never run; later ones never wait.
_FIRST_PROBE_WAIT_S = 5.0


def overall_status(states: Iterable[UpstreamState]) -> str:
    """``ok`` when every upstream is up, ``down`` when none is, else ``degraded``."""
    states = list(states)
    if states and all(s is UpstreamState.UP for s in states):
        return "ok"
    if not states or all(s is UpstreamState.DOWN for s in states):
        return "down"
    return "degraded"


@dataclass
class HealthMonitor:
    """The last ``probe()`` of every upstream, refreshed in the background (see module)."""

    upstreams: tuple[tuple[str, Any], ...]
    interval: float = DEFAULT_HEALTH_INTERVAL_S
    clock: Callable[[], float] = time.monotonic
    _last: dict[str, UpstreamHealth] = field(default_factory=dict)
    _checked_at: float | None = None
    _refresh: asyncio.Task[None] | None = None

    def seed(self, results: Iterable[UpstreamHealth]) -> None:
        """Record probes already made (at start-up), so the first /health needs none."""
        for h in results:
            self._last[h.name] = h
        self._checked_at = self.clock()

    async def snapshot(self) -> tuple[UpstreamHealth, ...]:
        """Current health; starts a background refresh when the cache is stale."""
        stale = self._checked_at is None or self.clock() - self._checked_at >= self.interval
        if stale and (self._refresh is None or self._refresh.done()):
            self._refresh = asyncio.create_task(self.refresh())
        if self._checked_at is None:  # nothing known yet: wait a little for the first probe
            await asyncio.wait({self._refresh}, timeout=_FIRST_PROBE_WAIT_S)  # type: ignore[arg-type]
        return tuple(self._last.get(name) or _unknown(name, up) for name, up in self.upstreams)

    async def refresh(self) -> None:
        results = await asyncio.gather(*(_probe(name, up) for name, up in self.upstreams))
        for h in results:
            self._last[h.name] = h
        self._checked_at = self.clock()


async def _probe(name: str, upstream: Any) -> UpstreamHealth:
    probe = getattr(upstream, "probe", None)
    if probe is None:  # an in-process upstream without probe(): alive while we are
        return UpstreamHealth(name=name, kind=kind_of(upstream),
                              state=UpstreamState.UP, models=(upstream.model_id,))
    try:
        return await probe()
    except Exception as exc:  # a probe must never take /health down with it
        return UpstreamHealth(name=name, kind=kind_of(upstream),
                              state=UpstreamState.DOWN,
                              detail=f"probe failed: {type(exc).__name__}")


def _unknown(name: str, upstream: Any) -> UpstreamHealth:
    return UpstreamHealth(name=name, kind=kind_of(upstream),
                          state=UpstreamState.DOWN, detail="not probed yet")
