"""The gateway's state: settings, served models, capacity, metrics, the response store.

One :class:`GatewayState` per served app (``request.app.state.gateway``). It is built by
:mod:`tokenwire.gateway.server` from the configuration and read by every route; it also
starts each generation under the supervisor (:meth:`GatewayState.supervise`).
"""

from __future__ import annotations

import functools
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import msgspec
from starlette.requests import Request

from tokenwire.codec.compression import ZstdDict
from tokenwire.codec.maps import TokenizerMap
from tokenwire.codec.safety_policy import BannedTokenPolicy, SafetyPolicyDescriptor, hash_policy
from tokenwire.errors import ConfigError
from tokenwire.gateway.affinity import HINT_HEADER_NAMES, affinity_hints
from tokenwire.gateway.context_window import ContextSource
from tokenwire.gateway.http.admission import ticket_of
from tokenwire.gateway.http.limits import LEASE_SCOPE_KEY
from tokenwire.gateway.http.ws_session import MemoryBudget, SocketTable
from tokenwire.gateway.ir import Failure, GenerationRequest, IdsSource, Upstream
from tokenwire.gateway.observability.key_metrics import KeyMetrics
from tokenwire.gateway.observability.records import Observability
from tokenwire.gateway.routing.breaker_sync import BreakerSync
from tokenwire.gateway.routing.fallbacks import FallbackTable, plan_for
from tokenwire.gateway.routing.health import HealthMonitor
from tokenwire.gateway.routing.pool import ReplicaPool
from tokenwire.gateway.routing.router import Router, ServedModel
from tokenwire.gateway.settings import ServerSettings
from tokenwire.gateway.state.key_limiter import KeyLimiter, Lease
from tokenwire.gateway.state.redis_conn import RedisConn
from tokenwire.gateway.state.response_store import ResponseStore, SQLiteResponseStore
from tokenwire.gateway.supervision.admission import Admission, Ticket, limits_of
from tokenwire.gateway.supervision.retry import RetryPolicy
from tokenwire.gateway.supervision.supervisor import SupervisedStream, Timing

__all__ = ["GatewayState"]


def _with_header_hints(gen: GenerationRequest, request: Request | None) -> GenerationRequest:
    """The request's affinity hints plus those its headers carry (session ids, the explicit
    affinity key): every API's requests pick replicas by them (``routing/pool.py``). A
    WebSocket ``response.create`` (no ``request``) already carries its upgrade's headers'
    hints (``http/responses_ws.py`` parses it with them)."""
    if request is None or HINT_HEADER_NAMES.isdisjoint(map(itemgetter(0),
                                                            request.scope["headers"])):
        return gen  # most requests carry none: Starlette's lookups scan every header per name
    given = dict(gen.affinity)
    extra = tuple((k, v) for k, v in affinity_hints({}, request.headers) if k not in given)
    return msgspec.structs.replace(gen, affinity=gen.affinity + extra) if extra else gen


@dataclass
class GatewayState:
    """What the routes need: settings, the served models, the policy.

    Build it with ``router=`` (many models), or with one ``upstream`` + ``tmap`` +
    ``max_model_len`` (the embedded engine alone), which becomes a one-model router.
    ``tmap`` / ``max_model_len`` then name the primary model's (``/tokenize``).
    """

    settings: ServerSettings
    upstream: Upstream | None = None
    tmap: TokenizerMap | None = None
    max_model_len: int | None = None
    policy: BannedTokenPolicy | None = None
    descriptor: SafetyPolicyDescriptor | None = None
    #: Other maps to publish (e.g. the bundled bytes when ``tmap`` advertises dictionaries).
    extra_maps: tuple[TokenizerMap, ...] = ()
    created: int = field(default_factory=lambda: int(time.time()))
    clock: Callable[[], float] = time.monotonic
    router: Router = field(default=None)  # type: ignore[assignment]  # set in __post_init__
    health: HealthMonitor = field(default=None)  # type: ignore[assignment]
    #: Stored Responses (``store``, ``previous_response_id``, ``GET /v1/responses/{id}``):
    #: on Redis when ``settings.state`` names one, else in this process (SQLite).
    response_store: ResponseStore = field(default=None)  # type: ignore[assignment]
    #: The process's one Redis connection (``state/redis_conn.py``), built from
    #: ``settings.state``; None without ``[state]`` (nothing is shared).
    redis: RedisConn | None = None
    #: Shares this instance's breaker ejections with the others over ``redis``
    #: (``routing/breaker_sync.py``); None without ``[state]`` or without pools.
    breaker_sync: BreakerSync | None = None
    #: The capacity bound (seed, "Capacity"); built from the settings and upstream limits.
    admission: Admission = field(default=None)  # type: ignore[assignment]
    #: Prometheus metrics and the request log (``gateway/observability/records.py``).
    observability: Observability = field(default_factory=Observability)
    #: Generations in flight, for graceful shutdown (weak: a finished one just disappears).
    live_streams: weakref.WeakSet[SupervisedStream] = field(default_factory=weakref.WeakSet)
    #: Opt-in fallbacks between models (``gateway/routing/fallbacks.py``); empty: none.
    fallbacks: FallbackTable = field(default_factory=FallbackTable)
    #: Open Responses WebSockets, counted per address (``http/ws_session.py``), and their
    #: sessions, which graceful shutdown drains (``http/responses_ws.py``).
    ws_sockets: SocketTable = field(default=None)  # type: ignore[assignment]
    ws_sessions: weakref.WeakSet[Any] = field(default_factory=weakref.WeakSet)
    #: What those sessions' memories of their last response hold together.
    ws_memory: MemoryBudget = field(default_factory=MemoryBudget)
    #: Per-key limits (``state/key_limiter.py``): this process's counts, or Redis's when
    #: the gateway has a ``[state]`` connection; and their per-key-name metrics.
    limiter: KeyLimiter = field(default_factory=KeyLimiter)
    key_metrics: KeyMetrics = field(default=None)  # type: ignore[assignment]
    #: Generations' response heads less the request id, built once per model, client
    #: version and coding (``http/generation.py`` ``generation_headers``).
    heads: dict[tuple[Any, ...], tuple[Any, ...]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._build_shared_state()
        if self.router is None:
            if self.upstream is None:
                raise ConfigError("a gateway needs a router or an upstream")
            self.router = Router([ServedModel(
                name=self.upstream.model_id, upstream=self.upstream, tmap=self.tmap,
                max_model_len=self.max_model_len, ids_source=IdsSource.ENGINE,
                context_source=ContextSource.ENGINE.value if self.max_model_len else "",
                upstream_name=getattr(self.upstream, "name", "embedded"),
                aliases=tuple(getattr(self.upstream, "aliases", ())))])
        self.fallbacks.validate(self.router.names)
        primary = self.router.primary
        if self.tmap is None:
            self.tmap = primary.tmap
        if self.max_model_len is None:
            self.max_model_len = primary.max_model_len
        if self.health is None:
            self.health = HealthMonitor(self.router.upstreams())
        if self.admission is None:
            upstreams = [up for _, up in self.router.upstreams()]
            limits = limits_of(upstreams)
            self.admission = Admission(
                max_concurrent=self.settings.max_concurrent, queue_size=self.settings.queue_size,
                limits=limits, all_limited=len(limits) == len(upstreams))
        self.observability.set_capacity_source(self.admission.counts)
        for pool in self.pools():  # a replica back or a slot freed: waiters may start
            pool.on_capacity = self.admission.regrant
        self.observability.set_pools_source(self.pools)
        if self.redis is not None and self.pools() and self.breaker_sync is None:
            self.breaker_sync = BreakerSync(self.redis, self.pools())
            self.observability.registry.register(self.breaker_sync.collector())
            self.breaker_sync.start()  # in the server's loop; else at the first ejection
        if self.redis is not None and self.limiter.shared is None:
            # Limits shared by every instance on this Redis (``state/limits_redis.py``).
            self.limiter = KeyLimiter(self.redis, clock=self.limiter.clock)
        if self.key_metrics is None:
            self.key_metrics = KeyMetrics(self.observability.registry)
        self.limiter.on_mode = self.key_metrics.set_local_only
        if self.ws_sockets is None:
            self.ws_sockets = SocketTable(
                max_sockets=self.settings.ws_max_sockets,
                max_per_client=self.settings.ws_max_sockets_per_client)

    def _build_shared_state(self) -> None:
        """The Redis connection and the stores on it when ``[state]`` is set; the
        in-process ones otherwise (README "Shared state")."""
        if self.redis is None and self.settings.state is not None:
            self.redis = RedisConn(self.settings.state)
        if self.redis is not None:
            self.observability.registry.register(self.redis.collector())
        if self.response_store is None:
            if self.redis is not None:
                from tokenwire.gateway.state.redis_store import RedisResponseStore
                self.response_store = RedisResponseStore(
                    self.redis, max_bytes=self.redis.config.store_max_bytes)
            else:
                self.response_store = SQLiteResponseStore()

    def replica_of(self, response_id: str) -> tuple[str, str] | None:
        """``(pool, replica)`` that produced ``response_id`` (its pool pinned it when the
        generation finished), to store with the response; None when no pool served it."""
        for pool in self.pools():
            name = pool.pinned(response_id)
            if name is not None:
                return pool.name, name
        return None

    def pin_previous(self, stored: Any) -> None:
        """Tell the pool that produced a stored response which replica it was, so a
        continuation read on another instance prefers it too (``routing/pool.py``)."""
        if stored.pool is None or stored.replica is None:
            return
        for pool in self.pools():
            if pool.name == stored.pool:
                pool.pin(stored.id, stored.replica, age_s=time.time() - stored.created)

    async def aclose_state(self) -> None:
        """Close the Redis connection (server shutdown), after the limiter's last
        releases and its lease renewals."""
        await self.limiter.aclose()
        if self.breaker_sync is not None:
            await self.breaker_sync.aclose()
        if self.redis is not None:
            await self.redis.aclose()

    def timing(self, *, streaming: bool) -> Timing:
        """The request clocks; a non-streaming request has no stream to keep alive."""
        s = self.settings
        return _timing(s.heartbeat_s if streaming else None, s.idle_timeout_s,
                       s.request_cap_s)

    def supervise(self, request: Request | None, served: ServedModel, gen: GenerationRequest,
                  *, streaming: bool, api: str, ticket: Ticket | None = None,
                  lease: Lease | None = None) -> SupervisedStream:
        """The generation as the APIs see it: queued, retried, timed (``supervisor.py``),
        and recorded (``api`` names the surface in metrics and logs). The admission ticket
        is the request's (:func:`ticket_of`), or ``ticket`` when the caller took one itself
        (a WebSocket ``response.create``, ``http/responses_ws.py``); likewise the per-key
        lease (``http/limits.py``), whose tokens are this record's usage.

        The safety policy's banned ids go on here, the one place every API's generation
        passes (Completions, Chat, Path C, Messages, Responses over HTTP and WebSocket):
        applied per route, the Responses routes generated banned ids freely."""
        gen = _with_header_hints(gen, request)
        policy = self.policy_for(served)
        if policy is not None:
            gen = msgspec.structs.replace(gen, banned_ids=policy.banned_ids)
        self.health.start()  # the active probes of replica pools (idempotent)
        record = self.observability.new_request(
            api=api, model=served.name, upstream=served.upstream_name or served.name,
            request_id=gen.request_id, stream=streaming)
        if ticket is None:
            ticket = ticket_of(request)
        if lease is None and request is not None:
            lease = request.scope.get(LEASE_SCOPE_KEY)
        if lease is not None:
            lease.usage = record
        ticket.supervised, ticket.on_release = True, record.close
        plan = plan_for(self.fallbacks, {m.name: m for m in self.router.models}, served,
                        gen) if self.fallbacks else None
        stream = SupervisedStream(served, gen, ticket,
                                  timing=self.timing(streaming=streaming),
                                  policy=_retry_policy(self.settings.retries),
                                  observer=record, fallbacks=plan)
        self.live_streams.add(stream)
        return stream

    def abort_all(self, failure: Failure) -> int:
        """End every running generation with ``failure`` (graceful shutdown's last step:
        each client gets a terminal failure instead of a cut connection); how many."""
        streams = list(self.live_streams)
        for stream in streams:
            stream.abort(failure)
        return len(streams)

    def pools(self) -> tuple[ReplicaPool, ...]:
        """Every pool of replicas served (``/health`` and the metrics show their replicas)."""
        return tuple(up for _, up in self.router.upstreams() if isinstance(up, ReplicaPool))

    def drain_sockets(self) -> int:
        """Graceful shutdown's first step for WebSockets: each session closes once its
        running response (if any) ended, and takes no new one; how many were told."""
        sessions = list(self.ws_sessions)
        for session in sessions:
            session.drain()
        return len(sessions)

    @property
    def dicts(self) -> dict[str, ZstdDict]:
        return dict(self.settings.zstd_dicts)

    def safety_headers(self) -> list[tuple[str, str]]:
        if self.descriptor is None:
            return []
        return [("Codec-Safety-Policy", self.descriptor.id),
                ("Codec-Safety-Policy-Hash", hash_policy(self.descriptor))]

    def policy_for(self, model: ServedModel) -> BannedTokenPolicy | None:
        """The safety policy, for models of the vocabulary it was written for: banned ids
        of one vocabulary mean other tokens in another (§5.5 ``tokenizers``)."""
        if self.policy is None or self.descriptor is None or model.tmap is None:
            return None
        return self.policy if model.tmap.id in self.descriptor.tokenizers else None


# The two frozen values every request is supervised with, made once per setting instead of
# per request: a frozen dataclass's __init__ sets each field through object.__setattr__,
# eleven calls for these two on the way to every first token.
@functools.lru_cache(maxsize=8)
def _timing(heartbeat_s: float | None, idle_timeout_s: float, request_cap_s: float) -> Timing:
    return Timing(heartbeat_s=heartbeat_s, idle_timeout_s=idle_timeout_s,
                  request_cap_s=request_cap_s)


@functools.lru_cache(maxsize=2)
def _retry_policy(enabled: bool) -> RetryPolicy:
    return RetryPolicy(enabled=enabled)
