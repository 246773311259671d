"""Which upstream serves a request: client model names -> :class:`ServedModel`.

The gateway serves N models from M upstreams (DESIGN.md: N upstreams + M APIs). A request's
``model`` picks one :class:`ServedModel`; a request without ``model`` goes to the default,
which exists only when it is unambiguous (one model served, or one named in the config).
Unknown names are a 404 in the OpenAI error shape that lists what is served, so a client
with a typo learns the right name from the error instead of from the docs.

Each model knows where the ids of its Codec streams come from (``ids_source``, sent to
clients as ``Codec-Ids-Source``). When its upstream speaks text only and the model has a
map, :meth:`ServedModel.submit` wraps the upstream's stream in a
:class:`~tokenwire.gateway.retokenize.RetokenizingStream`: the one place between
upstreams and renderers where text becomes ids. Upstreams that return ids, and clients
that do not want ids, skip it.

:class:`HealthMonitor` keeps each upstream's last ``probe()`` for ``/health``; it refreshes
in the background at most every ``interval`` seconds, so a scraper polling ``/health`` in a
tight loop does not turn into a probe storm against the upstreams.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tokenwire.codec.maps import TokenizerMap
from tokenwire.errors import ConfigError, RemoteProtocolError, UnknownModel
from tokenwire.gateway.ir import EventStream, GenerationRequest, IdsSource, Upstream
from tokenwire.gateway.upstreams.base import UpstreamHealth, UpstreamState

__all__ = [
    "DEFAULT_HEALTH_INTERVAL_S",
    "HealthMonitor",
    "Router",
    "ServedModel",
    "overall_status",
]

#: Probes run at most this often: /health stays cheap to poll, yet a dead upstream shows
#: within a few seconds.
DEFAULT_HEALTH_INTERVAL_S = 5.0
#: The first /health waits this long for probes that have never run; later ones never wait.
_FIRST_PROBE_WAIT_S = 5.0


@dataclass(frozen=True)
class ServedModel:
    """One model clients may ask for.

    ``tmap`` is the map of its vocabulary (``Codec-Tokenizer-Map``), ``None`` when unknown;
    ``upstream_name`` is the configured upstream's name (``owned_by`` in ``/v1/models``).
    """

    name: str
    upstream: Upstream
    tmap: TokenizerMap | None = None
    max_model_len: int | None = None
    ids_source: IdsSource = IdsSource.NONE
    upstream_name: str = ""

    def __post_init__(self) -> None:
        if self.ids_source is IdsSource.RETOKENIZED and self.tmap is None:
            raise ConfigError(f"model {self.name!r}: retokenized ids need a tokenizer map")

    @property
    def has_ids(self) -> bool:
        """True when Codec binary streams can be served for this model."""
        return self.ids_source is not IdsSource.NONE

    def submit(self, request: GenerationRequest) -> EventStream:
        """Start the generation on the upstream, adding ids from text when needed."""
        stream = self.upstream.submit(request)
        if request.want_ids and self.ids_source is IdsSource.RETOKENIZED:
            from tokenwire.gateway.retokenize import Retokenizer, RetokenizingStream

            assert self.tmap is not None  # checked in __post_init__
            return RetokenizingStream(stream, Retokenizer(self.tmap))
        return stream


class Router:
    """Client model name -> :class:`ServedModel`; see the module docstring."""

    def __init__(self, models: Iterable[ServedModel], *, default: str | None = None) -> None:
        self.models: tuple[ServedModel, ...] = tuple(models)
        if not self.models:
            raise ConfigError("no models to serve")
        self._by_name: dict[str, ServedModel] = {}
        for m in self.models:
            if m.name in self._by_name:
                raise ConfigError(f"model {m.name!r} is served twice; model names must be unique")
            self._by_name[m.name] = m
        if default is not None and default not in self._by_name:
            raise ConfigError(f"default model {default!r} is not served; served: {self._listing}")
        if default is None and len(self.models) == 1:
            default = self.models[0].name
        self.default: ServedModel | None = self._by_name[default] if default else None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.models)

    @property
    def _listing(self) -> str:
        return ", ".join(repr(n) for n in self.names)

    def route(self, model: str | None) -> ServedModel:
        """The model a request names; the default when it names none."""
        if not model:
            if self.default is None:
                raise RemoteProtocolError(
                    f"model is required: this server serves {len(self.models)} models "
                    f"({self._listing})", status_hint=400)
            return self.default
        found = self._by_name.get(model)
        if found is None:
            raise UnknownModel(
                f"the model {model!r} does not exist on this server; served models: "
                f"{self._listing}")
        return found

    @property
    def primary(self) -> ServedModel:
        """The model whose map the server-wide routes use (``/tokenize``): the default, or
        the first one with a map."""
        if self.default is not None and self.default.tmap is not None:
            return self.default
        return next((m for m in self.models if m.tmap is not None), self.models[0])

    def maps(self) -> tuple[TokenizerMap, ...]:
        """Every distinct map served, in model order (published under ``/.well-known``)."""
        seen: dict[str, TokenizerMap] = {}
        for m in self.models:
            if m.tmap is not None:
                seen.setdefault(m.tmap.hash, m.tmap)
        return tuple(seen.values())

    def upstreams(self) -> tuple[tuple[str, Upstream], ...]:
        """Distinct upstream objects, each with its name, in model order."""
        seen: dict[int, tuple[str, Upstream]] = {}
        for m in self.models:
            seen.setdefault(id(m.upstream), (m.upstream_name or m.name, m.upstream))
        return tuple(seen.values())


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
        return UpstreamHealth(name=name, kind=getattr(upstream, "kind", "embedded"),
                              state=UpstreamState.UP, models=(upstream.model_id,))
    try:
        return await probe()
    except Exception as exc:  # a probe must never take /health down with it
        return UpstreamHealth(name=name, kind=getattr(upstream, "kind", "?"),
                              state=UpstreamState.DOWN,
                              detail=f"probe failed: {type(exc).__name__}")


def _unknown(name: str, upstream: Any) -> UpstreamHealth:
    return UpstreamHealth(name=name, kind=getattr(upstream, "kind", "?"),
                          state=UpstreamState.DOWN, detail="not probed yet")
