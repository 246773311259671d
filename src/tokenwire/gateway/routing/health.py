"""Each upstream's health for ``/health``, and the one active-probe loop of the gateway.

:class:`HealthMonitor` keeps the last ``probe()`` of every upstream. Two kinds of entry:

* **Active**: an upstream with a ``probe_interval_s`` (a replica pool, ``routing/pool.py``,
  whose probes feed its replicas' breakers: a restarted replica is half-opened and closed
  again by them) is probed by the background loop (:meth:`HealthMonitor.start`) that
  often, whether ``/health`` is polled or not.
* **Passive**: any other upstream is probed when ``/health`` is polled, at most every
  ``interval`` seconds, so a scraper polling in a tight loop does not turn into a probe
  storm against the upstreams.

One loop, one probe per upstream: ``/health`` reads what the loop found for active entries
(probing them itself only while no loop runs, in tests without a server).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tokenwire.gateway.ir import kind_of
from tokenwire.gateway.upstreams.base import UpstreamHealth, UpstreamState

__all__ = ["DEFAULT_HEALTH_INTERVAL_S", "PROBE_TIMEOUT_S", "HealthMonitor", "overall_status",
           "probe_by_deadline", "probe_within_deadline"]

#: Probes run at most this often: /health stays cheap to poll, yet a dead upstream shows
#: within a few seconds.
DEFAULT_HEALTH_INTERVAL_S = 5.0
#: The first /health waits this long for probes that have never run; later ones never wait.
_FIRST_PROBE_WAIT_S = 5.0
#: The longest one probe may take: a GET of the model list, milliseconds from a replica that
#: is well. Without it a replica that accepts and never answers held its probe for the
#: upstream's read timeout (120 s by default, and per read: for ever from one that drips
#: its answer), and the loop, which waits for every probe of a round, with it: no replica
#: of any pool was probed meanwhile. Past it the probe is a failure like a refusal.
PROBE_TIMEOUT_S = 10.0
#: The loop's own bound on one entry's probe: longer, because a pool's probe is its
#: replicas' probes at once, each within :data:`PROBE_TIMEOUT_S`, and those must end first
#: to feed the breakers (cancelled at the same moment, they fed nothing).
_ENTRY_PROBE_TIMEOUT_S = PROBE_TIMEOUT_S + 5.0


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
    _loop: asyncio.Task[None] | None = None

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
        """Probe the passive entries (all of them while no loop runs)."""
        looping = self._loop is not None and not self._loop.done()
        chosen = [(n, up) for n, up in self.upstreams if not (looping and _interval(up))]
        results = await asyncio.gather(*(_probe(name, up) for name, up in chosen))
        for (name, _), h in zip(chosen, results, strict=True):
            self._last[name] = h
        self._checked_at = self.clock()

    def start(self) -> None:
        """Start the active-probe loop when an entry is active (idempotent; needs a running
        event loop, else does nothing)."""
        if not any(_interval(up) for _, up in self.upstreams):
            return
        if self._loop is None or self._loop.done():
            try:
                self._loop = asyncio.get_running_loop().create_task(self._run())
            except RuntimeError:
                return

    async def stop(self) -> None:
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
            self._loop = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        active = [(n, up, _interval(up)) for n, up in self.upstreams if _interval(up)]
        due = {n: loop.time() + every for n, _, every in active}
        while True:
            await asyncio.sleep(max(0.0, min(due.values()) - loop.time()))
            ready = [(n, up, every) for n, up, every in active if due[n] <= loop.time()]
            results = await asyncio.gather(*(_probe(n, up) for n, up, _ in ready))
            for (name, _, every), h in zip(ready, results, strict=True):
                self._last[name] = h
                due[name] = loop.time() + every


def _interval(upstream: Any) -> float:
    """The active-probe period of an upstream (0: passive)."""
    return float(getattr(upstream, "probe_interval_s", 0) or 0)


async def _probe(name: str, upstream: Any) -> UpstreamHealth:
    probe = getattr(upstream, "probe", None)
    if probe is None:  # an in-process upstream without probe(): alive while we are
        return UpstreamHealth(name=name, kind=kind_of(upstream),
                              state=UpstreamState.UP, models=(upstream.model_id,))
    return await probe_within_deadline(name, kind_of(upstream), probe,
                                       timeout_s=_ENTRY_PROBE_TIMEOUT_S)


async def probe_by_deadline(name: str, kind: str, probe: Callable[[], Any], *,
                            timeout_s: float = PROBE_TIMEOUT_S) -> UpstreamHealth:
    """``await probe()``, DOWN when it takes longer than ``timeout_s``; what it raises, it
    raises (start-up shows it: ``gateway/server.py``)."""
    try:
        async with asyncio.timeout(timeout_s):
            return await probe()
    except TimeoutError:
        return UpstreamHealth(name=name, kind=kind, state=UpstreamState.DOWN,
                              detail=f"probe timed out after {timeout_s:g} s")


async def probe_within_deadline(name: str, kind: str, probe: Callable[[], Any], *,
                                timeout_s: float = PROBE_TIMEOUT_S) -> UpstreamHealth:
    """:func:`probe_by_deadline`, DOWN when it raises too (a probe must never take
    ``/health`` or the probe loop down with it)."""
    try:
        return await probe_by_deadline(name, kind, probe, timeout_s=timeout_s)
    except Exception as exc:
        return UpstreamHealth(name=name, kind=kind, state=UpstreamState.DOWN,
                              detail=f"probe failed: {type(exc).__name__}")


def _unknown(name: str, upstream: Any) -> UpstreamHealth:
    return UpstreamHealth(name=name, kind=kind_of(upstream),
                          state=UpstreamState.DOWN, detail="not probed yet")
