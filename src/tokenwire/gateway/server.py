"""Assembly: settings (+ config) -> maps, safety policy, upstreams -> app state; running it.

Two ways in: :func:`build_embedded_state` (no config: the embedded engine alone, as
``tokenwire serve`` always did) and :func:`build_gateway` (a
:class:`~tokenwire.gateway.config.GatewayConfig`: every upstream built by its adapter,
probed, and its models routed). Probing happens here, at start-up, so an unreachable
upstream or a model it does not serve is a :class:`~tokenwire.errors.ConfigError` before
the port opens, not a 502 at the first request.

Adapters own ``httpx.AsyncClient`` pools, which belong to the event loop that opened their
connections: :func:`run_gateway` builds, probes and serves in one loop for that reason.
Kept apart from the app so tests and benchmarks build exactly what ``tokenwire serve``
builds, with their own port and settings.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tokenwire.codec.maps import TokenizerMap, bundled_map_path, load_map_file
from tokenwire.errors import ConfigError, ConfigErrors, ListenError
from tokenwire.gateway.config import GatewayConfig, map_for_model
from tokenwire.gateway.context_window import ContextSource, first_known
from tokenwire.gateway.heap import settle_after_startup
from tokenwire.gateway.http.app import create_app
from tokenwire.gateway.http.connections import ConnectionLimits, guarded_protocol
from tokenwire.gateway.http.http2 import ALPN_PROTOCOLS, H2Limits
from tokenwire.gateway.http.security import harden
from tokenwire.gateway.http.shutdown import graceful_server
from tokenwire.gateway.http.state import GatewayState
from tokenwire.gateway.http.ws_protocol import BackpressuredWSProtocol
from tokenwire.gateway.http.ws_session import BACKSTOP_SLACK_BYTES
from tokenwire.gateway.ir import IdsSource
from tokenwire.gateway.routing.breaker import Breaker
from tokenwire.gateway.routing.config import pool_settings
from tokenwire.gateway.routing.health import (
    DEFAULT_HEALTH_INTERVAL_S,
    PROBE_TIMEOUT_S,
    HealthMonitor,
    probe_by_deadline,
)
from tokenwire.gateway.routing.pool import Replica, ReplicaPool
from tokenwire.gateway.routing.router import Router, ServedModel
from tokenwire.gateway.settings import ServerSettings, build_policy
from tokenwire.gateway.upstreams import adapter_for
from tokenwire.gateway.upstreams.base import (
    ModelRoute,
    UpstreamConfig,
    UpstreamHealth,
    UpstreamState,
)
from tokenwire.gateway.usage import PromptCounter, load_prompt_format

if TYPE_CHECKING:
    from tokenwire.gateway.upstreams.embedded import EmbeddedEngine

__all__ = [
    "SMOLLM2_MAP_ID",
    "UVICORN_LIMITS",
    "UVICORN_WS",
    "Gateway",
    "ServingPlan",
    "build_embedded_state",
    "build_gateway",
    "config_problems",
    "listen_socket",
    "loop_name",
    "offer_alpn",
    "raise_fd_limit",
    "run",
    "run_gateway",
    "serve_gateway",
    "serving_loop_factory",
    "uvicorn_limits",
]

SMOLLM2_MAP_ID = "huggingfacetb/smollm2"

#: uvicorn settings that bound what a peer controls (issue 6 item 4, issue 11 item 1).
UVICORN_LIMITS: dict[str, Any] = {
    # Seconds an idle keep-alive connection may hold a slot. SDKs reuse a connection
    # within a turn; an idle one is cheap to reopen. uvicorn's default, pinned here.
    "timeout_keep_alive": 5,
    # uvicorn's own cap answered a bare 503 once *any* connections (idle ones included)
    # reached it, before auth ran: 520 idle sockets took every route down. The connection
    # guard (gateway/http/connections.py) replaces it: deadlines for heads and bodies,
    # per-client and global caps that evict idle connections first.
    "limit_concurrency": None,
    # uvicorn's access log prints the query string (``GET /health?api_key=...``); queries
    # are never logged (README, docs/security.md), and the request log records requests.
    "access_log": False,
    # No ``server: uvicorn`` on every answer: it tells a peer what to probe for, and each
    # header is parsed by the client on the way to its first token (h11 ~1.7 µs each, warm).
    "server_header": False,
}
#: The WebSocket implementation uvicorn hands upgrades to. Without one, uvicorn logs "No
#: supported WebSocket library detected. Please use pip install 'uvicorn[standard]'" on
#: every upgrade, advice that is wrong for the 426 the gateway means to send. With wsproto
#: the upgrade becomes an ASGI ``websocket`` scope, which ``security.py`` refuses through
#: the denial extension with exactly its own bytes, and uvicorn logs one access line. (Its
#: ``websockets-sansio`` protocol, 0.54, logs "ASGI callable returned without completing
#: handshake" after every such refusal and adds a Content-Type to the empty 426.) It is
#: uvicorn's ``wsproto`` protocol with its reads paused while its writes are
#: (``gateway/http/ws_protocol.py``: a Ping flood from a peer that reads nothing).
UVICORN_WS = BackpressuredWSProtocol
#: File descriptors per allowed connection (its socket, plus one for the upstream request
#: it may make) and a reserve for listening sockets, upstream pools, logs and the model.
_FDS_PER_CONNECTION = 2
_FD_RESERVE = 256


#: WebSocket keep-alive (uvicorn's wsproto protocol): a ping every 20 s, and a socket whose
#: peer answers none within 20 s is closed (1011). Codex answers pings from its reader task.
WS_PING_INTERVAL_S = 20.0
WS_PING_TIMEOUT_S = 20.0


def uvicorn_limits(state: GatewayState) -> dict[str, Any]:
    """:data:`UVICORN_LIMITS`, the guarded protocol (httptools, and HTTP/2 unless turned off) and
    the TLS files for ``state``'s settings; the WebSocket frame buffer stops a little above
    the message limit the Responses socket enforces itself with a typed error
    (``gateway/http/ws_session.py``)."""
    settings = state.settings
    limits = ConnectionLimits.from_settings(settings)
    tls: dict[str, Any] = {}
    if settings.tls_cert is not None:
        tls = {"ssl_certfile": str(settings.tls_cert), "ssl_keyfile": str(settings.tls_key)}
    return {**UVICORN_LIMITS, **tls,
            "http": guarded_protocol(limits, H2Limits() if settings.http2 else None),
            "ws_max_size": settings.max_body_bytes + BACKSTOP_SLACK_BYTES,
            "ws_ping_interval": WS_PING_INTERVAL_S, "ws_ping_timeout": WS_PING_TIMEOUT_S}


def offer_alpn(config: Any, settings: ServerSettings) -> None:
    """On TLS, offer ``h2`` (unless HTTP/2 is off) and ``http/1.1`` by ALPN: uvicorn builds
    its SSL context without any. Call once the app is final (this loads the config)."""
    if settings.tls_cert is None:
        return
    if not config.loaded:
        config.load()
    config.ssl.set_alpn_protocols(list(ALPN_PROTOCOLS) if settings.http2
                                  else ["http/1.1"])


def raise_fd_limit(settings: ServerSettings) -> int:
    """Raise the soft ``RLIMIT_NOFILE`` (never above the hard one) so ``max_connections``
    fit; returns the soft limit now in force."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = settings.max_connections * _FDS_PER_CONNECTION + _FD_RESERVE
    if hard != resource.RLIM_INFINITY:
        want = min(want, hard)
    if want > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        return want
    return soft


#: What a failed bind means, in words a person can act on.
_BIND_ERRORS = {
    errno.EADDRINUSE: "the address is already in use (another server on this port?); stop "
                      "it or choose another --port",
    errno.EADDRNOTAVAIL: "this machine has no such address; use 127.0.0.1, 0.0.0.0 or one "
                         "of its own addresses as --host",
    errno.EACCES: "permission denied (ports below 1024 need privileges); choose a port "
                  "above 1023",
}
#: Pending connections the kernel holds for uvicorn (uvicorn's own default backlog).
_BACKLOG = 2048


def listen_socket(host: str, port: int) -> socket.socket:
    """Bind and listen on ``host:port`` before anything says it listens (the banner comes
    after this), so a busy port is one clear :class:`ListenError`, not a banner followed by
    uvicorn's ``[Errno 98]``."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ListenError(f"cannot listen on {host}:{port}: unknown host ({exc.strerror})"
                          ) from None
    family, _, proto, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        sock.bind(addr)
        sock.listen(_BACKLOG)
    except OSError as exc:
        sock.close()
        why = _BIND_ERRORS.get(exc.errno, exc.strerror or str(exc))
        raise ListenError(f"cannot listen on {host}:{port}: {why}") from None
    sock.set_inheritable(True)
    return sock


@dataclass(frozen=True)
class ServingPlan:
    """What ``serve`` is about to do, for the start-up banner."""

    state: GatewayState
    engine: EmbeddedEngine
    bundled_map: TokenizerMap


def _advertised(tmap: TokenizerMap, settings: ServerSettings) -> TokenizerMap:
    # The map lists the loaded dictionaries (codec-spec §3.7); that is a new map with a new
    # hash, which is then the one Codec-Tokenizer-Map names (see gateway/http/wellknown.py).
    if not settings.zstd_dicts:
        return tmap
    try:
        from tokenwire.gateway.http.wellknown import advertise_dictionaries
    except ImportError:  # pragma: no cover
        return tmap
    return advertise_dictionaries(tmap, settings.zstd_dicts, base_url=settings.public_base_url)


def build_embedded_state(
    settings: ServerSettings, *, tmap: TokenizerMap | None = None,
    engine: EmbeddedEngine | None = None,
) -> ServingPlan:
    """Load the map and the engine (unless given) and describe the deployment."""
    bundled = tmap or load_map_file(bundled_map_path(SMOLLM2_MAP_ID))
    pair = build_policy(settings, bundled.id)
    policy, descriptor = pair if pair is not None else (None, None)
    if engine is None:
        # Imported here: llama_cpp (and numpy) cost ~1 s of every start, and a gateway in
        # front of upstreams never loads them.
        from tokenwire.gateway.upstreams.embedded import EmbeddedEngine

        engine = EmbeddedEngine.load(
            bundled, settings.model_path, n_ctx=settings.n_ctx, n_threads=settings.n_threads,
            queue_size=settings.queue_size)
    served = _advertised(bundled, settings)
    state = GatewayState(
        settings=settings, upstream=engine, tmap=served, max_model_len=engine.n_ctx,
        policy=policy, descriptor=descriptor,
        extra_maps=(bundled,) if served is not bundled else (),
    )
    return ServingPlan(state=state, engine=engine, bundled_map=bundled)


def run(plan: ServingPlan, *, log_level: str = "info",
        sock: socket.socket | None = None) -> None:
    """Serve until interrupted (uvicorn), then stop the engine.

    The served app is :func:`~tokenwire.gateway.http.security.harden` over ``create_app``: auth,
    Origin and upgrade refusals outermost, so they never reach the engine's queue. ``sock``:
    the socket :func:`listen_socket` bound (bound here when not given)."""
    import uvicorn

    settings = plan.state.settings
    raise_fd_limit(settings)
    sock = sock or listen_socket(settings.host, settings.port)
    plan.engine.start()
    settle_after_startup()
    try:
        config = uvicorn.Config(harden(create_app(plan.state), settings), host=settings.host,
                                port=settings.port, log_level=log_level, ws=UVICORN_WS,
                                timeout_graceful_shutdown=5, **uvicorn_limits(plan.state))
        server = graceful_server(config, plan.state, drain_grace_s=settings.drain_grace_s)
        offer_alpn(config, settings)

        async def serve_then_close_state() -> None:
            try:
                await server.serve(sockets=[sock])
            finally:  # on the serving loop: the limiter's last releases, then Redis
                await plan.state.aclose_state()

        with asyncio.Runner(loop_factory=serving_loop_factory(settings.event_loop)) as runner:
            runner.run(serve_then_close_state())
    finally:
        plan.engine.close()


# -- many upstreams from a config (issue 4 items 3-4) ------------------------------------------


@dataclass
class Gateway:
    """A built deployment: the app state, the adapters to close, the start-up probes."""

    state: GatewayState
    adapters: tuple[Any, ...]
    probes: tuple[UpstreamHealth, ...]

    async def aclose(self) -> None:
        await self.state.health.stop()
        await _close_all(self.adapters)
        await self.state.aclose_state()


async def _close_all(adapters: tuple[Any, ...] | list[Any]) -> None:
    for adapter in adapters:
        close = getattr(adapter, "aclose", None)
        if close is not None:
            await close()


@dataclass
class _Built:
    config: UpstreamConfig
    adapter: Any
    health: UpstreamHealth | None
    maps: dict[str, TokenizerMap]


async def _probe_at_start(adapter: Any, up: UpstreamConfig) -> UpstreamHealth:
    """``adapter.probe()``, DOWN past ``PROBE_TIMEOUT_S``: an upstream that accepts and never
    answers held start-up for its read timeout (120 s by default, and per read: for ever
    from one that drips its answer), as it held the probe loop (``routing/health.py``)."""
    return await probe_by_deadline(up.name, up.kind, adapter.probe, timeout_s=PROBE_TIMEOUT_S)


def _check_probe(up: UpstreamConfig, health: UpstreamHealth) -> None:
    """Start-up checks on a probe: reachable, and serving every configured model."""
    where = f"upstream {up.name!r} ({up.kind}{' at ' + up.base_url if up.base_url else ''})"
    if health.state is UpstreamState.DOWN:
        raise ConfigError(f"{where} is unreachable: {health.detail or 'no answer'}; start it "
                          "first, or set probe = false (--no-probe) if it starts later")
    missing = [r for r in up.models if health.models and r.sent_as not in health.models]
    if missing:
        raise ConfigError(f"{where} does not serve model {missing[0].sent_as!r} (configured "
                          f"as {missing[0].name!r}); it lists: " + ", ".join(health.models))


async def _build_upstream(
    up: UpstreamConfig, cfg: GatewayConfig, cls: type, transport: Any,
) -> _Built:
    adapter = cls.from_config(up, transport=transport, maps=cfg.maps)
    try:
        health = await _probe_at_start(adapter, up) if cfg.probes(up) else None
        if health is not None:
            _check_probe(up, health)
        if up.models:
            return _Built(up, adapter, health, dict(cfg.maps))
        if up.kind == "embedded":  # one model, named by the engine
            routes: tuple[ModelRoute, ...] = (ModelRoute(name=adapter.model_id),)
            return _Built(dataclasses.replace(up, models=routes), adapter, health,
                          {adapter.model_id: adapter.tmap})
        if health is None:
            raise ConfigError(f"upstream {up.name!r} declares no models and is not probed: "
                              "list them under [[upstreams.models]]")
        if not health.models:
            raise ConfigError(f"upstream {up.name!r} lists no models; name them under "
                              "[[upstreams.models]]")
    except BaseException:
        await _close_all([adapter])
        raise
    # Discovered models: rebuild the adapter with them, so it routes every one.
    await _close_all([adapter])
    routes = tuple(ModelRoute(name=m) for m in health.models)
    maps = {**cfg.maps, **{m: t for m in health.models if (t := map_for_model(m)) is not None}}
    up = dataclasses.replace(up, models=routes)
    adapter = cls.from_config(up, transport=transport, maps=maps)
    try:  # probe the new adapter too: it learns the upstream's ids support from it
        health = await _probe_at_start(adapter, up)
    except BaseException:
        await _close_all([adapter])
        raise
    return _Built(up, adapter, health, maps)


async def _build_pool(up: UpstreamConfig, cfg: GatewayConfig, cls: type,
                      transports: Mapping[str, Any]) -> _Built:
    """A pooled upstream: one adapter per replica behind a :class:`ReplicaPool`.

    Models are the configured ones, else those the first replica that answers lists. A
    replica that does not answer at start-up is ejected (its breaker opens; the probes bring
    it back), not a start-up error, unless none answers; a replica that answers without a
    configured model is an error, as for a single upstream."""
    probe = cfg.probes(up)
    configs = [up.replica(i) for i in range(len(up.replicas))]
    routes, maps = up.models, dict(cfg.maps)
    if not routes:
        if not probe:
            raise ConfigError(f"upstream {up.name!r} declares no models and is not probed: "
                              "list them under [[upstreams.models]]")
        routes = await _discover_models(configs, cls, cfg, transports)
        maps.update({r.name: t for r in routes if (t := map_for_model(r.name)) is not None})
    adapters: list[Any] = []
    down, problems = [], []
    try:
        for c in configs:  # one that fails to build closes those built before it
            adapters.append(cls.from_config(dataclasses.replace(c, models=routes),
                                            transport=transports.get(c.name), maps=maps))
        for c, adapter in zip(configs, adapters, strict=True):
            if not probe:
                continue
            health = await _probe_at_start(adapter, c)
            if health.state is UpstreamState.DOWN:
                down.append(c.name)
                continue
            try:
                _check_probe(dataclasses.replace(c, models=routes), health)
            except ConfigError as exc:
                problems.append(str(exc))
        if probe and len(down) == len(configs):
            problems.append(f"upstream {up.name!r}: no replica answered ({', '.join(down)}); "
                            "start one first, or set probe = false")
        if problems:
            raise ConfigErrors(problems)
    except BaseException:
        await _close_all(adapters)
        raise
    pool = _pool_of(up, configs, adapters)
    for replica in pool.replicas:
        if replica.name in down:
            replica.breaker.force_open(time.monotonic())
    return _Built(dataclasses.replace(up, models=routes), pool, None, maps)


async def _discover_models(configs: list[UpstreamConfig], cls: type, cfg: GatewayConfig,
                           transports: Mapping[str, Any]) -> tuple[ModelRoute, ...]:
    for c in configs:
        adapter = cls.from_config(c, transport=transports.get(c.name), maps=cfg.maps)
        try:
            health = await _probe_at_start(adapter, c)
        finally:
            await _close_all([adapter])
        if health.state is not UpstreamState.DOWN and health.models:
            return tuple(ModelRoute(name=m) for m in health.models)
    raise ConfigError(f"no replica of upstream {configs[0].name.rpartition('/')[0]!r} "
                      "listed its models; start one, or name them under [[upstreams.models]]")


def _pool_of(up: UpstreamConfig, configs: list[UpstreamConfig],
             adapters: list[Any]) -> ReplicaPool:
    settings = pool_settings(up.pool)
    replicas = [Replica(name=c.name, adapter=a, weight=spec.weight, limit=c.max_concurrent,
                        url=c.base_url, breaker=Breaker(settings.breaker))
                for c, a, spec in zip(configs, adapters, up.replicas, strict=True)]
    return ReplicaPool(up.name, up.kind, replicas, probe_interval_s=settings.probe_interval_s,
                       prefix_chars=settings.prefix_chars,
                       panic_threshold=settings.panic_threshold,
                       load_factor=settings.load_factor,
                       load_slack=settings.load_slack)


def _served(built: _Built) -> list[ServedModel]:
    adapter, out = built.adapter, []
    for route in built.config.models:
        tmap = built.maps.get(route.name)
        for learnt in ("tokenizer_map", "tmap_for"):  # a map the adapter found or loaded
            if tmap is None and hasattr(adapter, learnt):
                tmap = getattr(adapter, learnt)(route.name)
        source = IdsSource(adapter.ids_source_for(route.name)
                           if hasattr(adapter, "ids_source_for") else adapter.ids_source)
        if source is IdsSource.RETOKENIZED and tmap is None:
            source = IdsSource.NONE  # text only, and nothing to tokenize it with
        window, window_source = _context_length(built.config, route, adapter)
        out.append(ServedModel(
            name=route.name, upstream=adapter, tmap=tmap, ids_source=source,
            max_model_len=window, context_source=window_source.value if window_source else "",
            upstream_name=built.config.name, aliases=tuple(getattr(adapter, "aliases", ())),
            usage=_usage_counter(built.config.kind, route, tmap)))
    return out


def _context_length(up: UpstreamConfig, route: ModelRoute,
                    adapter: Any) -> tuple[int | None, ContextSource | None]:
    """The model's context window, in the order of precedence ``context_window`` documents:
    configuration (the model's, then its upstream's), the upstream's report, the engine."""
    reported = getattr(adapter, "context_length_for", None)
    return first_known(
        (route.context_length, ContextSource.CONFIG), (up.context_length, ContextSource.CONFIG),
        (reported(route.name) if reported is not None else None, ContextSource.UPSTREAM),
        (getattr(adapter, "n_ctx", None), ContextSource.ENGINE))


def _usage_counter(kind: str, route: ModelRoute, tmap: TokenizerMap | None
                   ) -> PromptCounter | None:
    """What counts the usage an upstream leaves out; the embedded engine counts its own."""
    if kind == "embedded" or tmap is None:
        return None
    fmt = load_prompt_format(route.chat_template) if route.chat_template else None
    return PromptCounter(tmap, fmt)


async def build_gateway(
    cfg: GatewayConfig, settings: ServerSettings, *,
    adapters: Mapping[str, type] | None = None,
    transports: Mapping[str, Any] | None = None,
    clock: Callable[[], float] | None = None,
) -> Gateway:
    """Build, probe and route every configured upstream (call in the serving event loop).

    ``adapters`` replaces the kind -> class registry (tests); ``transports`` gives an
    upstream (by name) an httpx transport.
    """
    built: list[_Built] = []
    problems: list[str] = []
    try:
        for up in cfg.upstreams:  # every upstream is probed: one report names every problem
            try:
                cls = adapter_for(up.kind, adapters)
                if up.replicas:
                    built.append(await _build_pool(up, cfg, cls, transports or {}))
                else:
                    built.append(await _build_upstream(up, cfg, cls,
                                                       (transports or {}).get(up.name)))
            except ConfigError as exc:
                problems.extend(getattr(exc, "problems", None) or [str(exc)])
        if problems:
            raise ConfigErrors(problems)
        router = Router([m for b in built for m in _served(b)], default=cfg.default_model)
        cfg.fallbacks.validate(router.names)  # now that probing found every model
        probes = tuple(b.health for b in built if b.health is not None)
        pooled = [b for b in built if isinstance(b.adapter, ReplicaPool)]
        health = HealthMonitor(tuple((b.config.name, b.adapter) for b in built),
                               interval=float(cfg.server.get("health_interval_s",
                                                             DEFAULT_HEALTH_INTERVAL_S)))
        if len(probes) + len(pooled) == len(built):
            health.seed(probes)
        primary = router.primary
        pair = build_policy(settings, primary.tmap.id) if primary.tmap is not None else None
        if pair is None and settings.version_policy.safety_policy_id is not None:
            raise ConfigError("a safety policy needs a model with a tokenizer map")
        policy, descriptor = pair if pair is not None else (None, None)
        extra: dict[str, Any] = {"clock": clock} if clock is not None else {}
        state = GatewayState(settings=settings, router=router, health=health, policy=policy,
                             descriptor=descriptor, fallbacks=cfg.fallbacks, **extra)
    except BaseException:  # the adapters built so far (and their clients) close
        await _close_all([b.adapter for b in built])
        raise
    if pooled:  # after the last check: an error above leaves no loop behind
        health.start()  # the one active-probe loop: it feeds the replicas' breakers
    return Gateway(state=state, adapters=tuple(b.adapter for b in built), probes=probes)


async def serve_gateway(
    cfg: GatewayConfig, settings: ServerSettings, *, log_level: str = "info",
    sockets: list[Any] | None = None, on_ready: Callable[[Gateway, Any], None] | None = None,
    settle_heap: bool = False,
) -> None:
    """Build the gateway and serve it in the running loop until the server exits.

    ``on_ready(gateway, uvicorn_server)`` runs once the gateway is built and its socket is
    bound (the banner; tests keep the server to stop it). ``sockets``: pre-bound sockets
    (else :func:`listen_socket` binds ``settings.host:port``). ``settle_heap``: the process
    serves only this gateway (``tokenwire serve``): :func:`~.heap.settle_after_startup`.
    """
    import uvicorn

    gw = await build_gateway(cfg, settings)
    if settle_heap:
        settle_after_startup()
    raise_fd_limit(settings)
    try:
        sockets = sockets or [listen_socket(settings.host, settings.port)]
        config = uvicorn.Config(harden(create_app(gw.state), settings), host=settings.host,
                                port=settings.port, log_level=log_level, ws=UVICORN_WS,
                                timeout_graceful_shutdown=5, lifespan="off",
                                **uvicorn_limits(gw.state))
        server = graceful_server(config, gw.state, drain_grace_s=settings.drain_grace_s)
        offer_alpn(config, settings)
        if on_ready is not None:
            on_ready(gw, server)
        await server.serve(sockets=sockets)
    finally:
        await gw.aclose()


async def config_problems(cfg: GatewayConfig, settings: ServerSettings) -> list[str]:
    """Everything wrong with ``cfg`` that building it finds (every upstream probed, every
    model routed), without serving: ``tokenwire check``, and a start-up that failed on the
    file and still names unreachable upstreams in the same report. Empty when all is well."""
    try:
        gw = await build_gateway(cfg, settings)
    except ConfigError as exc:
        return list(getattr(exc, "problems", None) or [str(exc)])
    await gw.aclose()
    return []


def run_gateway(
    cfg: GatewayConfig, settings: ServerSettings, *, log_level: str = "info",
    on_ready: Callable[[Gateway, Any], None] | None = None,
) -> None:
    """Build the gateway and serve it in one event loop until interrupted (the loop
    ``settings.event_loop`` names: :func:`serving_loop_factory`)."""
    with asyncio.Runner(loop_factory=serving_loop_factory(settings.event_loop)) as runner:
        runner.run(serve_gateway(cfg, settings, log_level=log_level, on_ready=on_ready,
                                 settle_heap=True))


def serving_loop_factory(choice: str = "auto") -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop ``tokenwire serve`` runs on, for ``asyncio.Runner(loop_factory=...)``:
    uvloop's for ``"uvloop"``, and for ``"auto"`` where it can be imported; None (asyncio's
    default loop) for ``"asyncio"`` or when uvloop is missing. uvloop costs less CPU per
    streamed token, mostly at one stream (BENCHMARKS.md, "uvloop as the event loop"); the
    asyncio API, and so every guarantee, is the same on both, and the hardening tests run on
    both (``tests/gateway/test_connection_limits.py``)."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":  # ServerSettings checked it is installed; it did not import
            raise
        return None
    return uvloop.new_event_loop


def loop_name(factory: Callable[[], asyncio.AbstractEventLoop] | None) -> str:
    """What :func:`serving_loop_factory` chose, for the start-up banner."""
    if factory is None:
        return "asyncio"
    import uvloop

    return f"uvloop {uvloop.__version__}"
