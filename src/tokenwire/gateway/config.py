"""The gateway's configuration: one TOML file, environment variables, flags (issue 4 item 3).

Sources, strongest first: command-line flags, then the environment (``TOKENWIRE_CONFIG`` =
a file, ``TOKENWIRE_UPSTREAM`` = comma-separated upstream URLs, ``TOKENWIRE_API_KEYS`` =
comma-separated client API keys), then the file. With none of them, ``tokenwire serve``
serves the embedded engine as before (:func:`resolve` returns ``None``). The file::

    [server]
    host = "127.0.0.1"          # port, coalesce_ms, max_body_bytes, max_concurrent,
                                # queue_size, idle_timeout_s, request_cap_s, heartbeat_s,
                                # retries, drain_grace_s, api_keys_env, allowed_origins,
                                # head_timeout_s, body_timeout_s, max_connections,
                                # max_connections_per_client, http2, tls_cert, tls_key,
                                # responses_websocket, ws_max_sockets,
                                # ws_max_sockets_per_client, ws_idle_timeout_s,
                                # ws_session_cap_s, event_loop,
    default_model = "qwen"      # legacy_finish_reason, public_url, probe, health_interval_s,
                                # compress_event_streams
    api_keys_env = "GW_KEYS"    # the variable holding the client keys (comma-separated)
    allowed_origins = ["https://app.example"]   # browser origins allowed to call

    [[keys]]                    # named client keys with limits (gateway/state/api_keys.py)
    name = "ci-bot"
    key_env = "CI_BOT_KEY"      # or key_sha256 = "<hex>"; rpm, tpm, max_concurrent

    [[upstreams]]
    name = "local-vllm"
    kind = "openai"             # embedded | openai | codec | responses | anthropic
    base_url = "http://10.0.0.5:8000/v1"
    api_key_env = "VLLM_API_KEY"    # the key itself never appears in the file
    max_concurrent = 8
    connect_timeout_s = 5
    read_timeout_s = 120
    probe = true                # false: the upstream may start after the gateway
    [upstreams.headers]         # extra request headers (no secrets: they are logged)
    [upstreams.options]         # kind-specific (README "The configuration file")
    [[upstreams.models]]
    name = "qwen"               # what clients send as ``model``
    upstream_model = "Qwen/Qwen2.5-7B-Instruct"
    map = "qwen/qwen2"          # a bundled map id or HF alias; or map_path = "file.json"
    context_length = 32768      # its context window (else the upstream's report; also
                                # settable per [[upstreams]] for all its models)
    chat_template = "tokenizer_config.json"  # or a GGUF / Jinja file: counts usage the
                                # upstream does not report (README "Usage")

An upstream without ``[[upstreams.models]]`` serves whatever its ``/v1/models`` lists
(found by probing at start-up), with the map its HF alias names when one is bundled.

This module reads the file and assembles :class:`GatewayConfig`; each layer checks its own
tables: ``gateway/routing/config.py`` the pools (``replicas``, ``[upstreams.breaker]``,
probes, affinity) and ``[fallbacks]``, ``gateway/state/api_keys.py`` the ``[[keys]]`` and the
flat key list, ``gateway/state/config.py`` the ``[state]`` section.

Everything that can be checked without the network is checked at start-up, with a
:class:`~tokenwire.errors.ConfigError` naming the file, the table and the key: unknown keys
(a typo must not silently fall back to a default), wrong types, unknown kinds, bad URLs,
duplicate names, a missing key variable, unknown maps. Reachability and model lists are
checked by :func:`tokenwire.gateway.server.build_gateway` with the adapters' ``probe()``.
API keys are never read into this module's values: only the variable's name is kept. The
gateway's own client keys are read once, by :func:`auth_from_sources`, straight into
``ServerSettings.api_keys`` (kept out of its repr).
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tokenwire.codec.maps import TokenizerMap, bundled_map_path, load_map_file, resolve_alias
from tokenwire.config_tables import NUM, Problems, check_http_url, check_keys, check_seconds
from tokenwire.errors import ConfigError, ConfigErrors, MapError
from tokenwire.gateway.context_window import MAX_CONTEXT_LENGTH
from tokenwire.gateway.routing.config import POOL_KEYS, parse_fallbacks, parse_pool
from tokenwire.gateway.routing.fallbacks import FallbackTable
from tokenwire.gateway.state.api_keys import ApiKey, parse_keys, read_api_keys
from tokenwire.gateway.state.config import parse_state_table
from tokenwire.gateway.upstreams import check_options
from tokenwire.gateway.upstreams.base import (
    UPSTREAM_KINDS,
    ModelRoute,
    UpstreamConfig,
)

__all__ = [
    "ENV_API_KEYS",
    "ENV_CONFIG",
    "ENV_UPSTREAM",
    "SERVER_KEYS",
    "GatewayConfig",
    "auth_from_sources",
    "config_from_replicas",
    "config_from_urls",
    "load_config_file",
    "load_map",
    "map_for_model",
    "parse_config",
    "parse_replica_flag",
    "resolve",
    "with_fallback_flags",
]

ENV_CONFIG = "TOKENWIRE_CONFIG"
ENV_UPSTREAM = "TOKENWIRE_UPSTREAM"
#: Comma-separated API keys clients must present (when no ``api_keys_env`` names another).
ENV_API_KEYS = "TOKENWIRE_API_KEYS"

#: [server] keys and their types; values feed ``ServerSettings`` (flags override them).
SERVER_KEYS: dict[str, tuple[type, ...]] = {
    "host": (str,), "port": (int,), "coalesce_ms": NUM, "queue_size": (int,),
    "max_body_bytes": (int,), "legacy_finish_reason": (bool,), "public_url": (str,),
    "compress_event_streams": (bool,),
    "default_model": (str,), "probe": (bool,), "health_interval_s": NUM,
    "api_keys_env": (str,), "allowed_origins": (list,),
    "max_concurrent": (int,), "idle_timeout_s": NUM, "request_cap_s": NUM,
    "heartbeat_s": NUM, "retries": (bool,), "drain_grace_s": NUM,
    "head_timeout_s": NUM, "body_timeout_s": NUM, "max_connections": (int,),
    "max_connections_per_client": (int,), "http2": (bool,), "tls_cert": (str,),
    "tls_key": (str,), "responses_websocket": (bool,),
    "ws_max_sockets": (int,), "ws_max_sockets_per_client": (int,),
    "ws_idle_timeout_s": NUM, "ws_session_cap_s": NUM, "event_loop": (str,),
}
_UPSTREAM_KEYS: dict[str, tuple[type, ...]] = {
    "name": (str,), "kind": (str,), "base_url": (str,), "api_key_env": (str,),
    "max_concurrent": (int,), "connect_timeout_s": NUM, "read_timeout_s": NUM,
    "probe": (bool,), "headers": (dict,), "options": (dict,), "models": (list,),
    "context_length": (int,), **POOL_KEYS,
}
_MODEL_KEYS: dict[str, tuple[type, ...]] = {
    "name": (str,), "upstream_model": (str,), "map": (str,), "map_path": (str,),
    "context_length": (int,),
    "chat_template": (str,),
}
_TOP_KEYS: dict[str, tuple[type, ...]] = {"server": (dict,), "upstreams": (list,),
                                           "fallbacks": (dict,), "context_fallbacks": (dict,),
                                           "keys": (list,), "state": (dict,)}


@dataclass(frozen=True)
class GatewayConfig:
    """A validated configuration. ``server`` holds the [server] values given (flags are
    merged over them by the CLI); ``maps`` the loaded map of every configured model;
    ``no_probe`` the upstreams not to probe at start-up."""

    upstreams: tuple[UpstreamConfig, ...]
    server: Mapping[str, Any] = field(default_factory=dict)
    maps: Mapping[str, TokenizerMap] = field(default_factory=dict)
    no_probe: frozenset[str] = frozenset()
    source: str = "flags"
    #: ``[fallbacks]`` and ``[context_fallbacks]`` (README "Fallbacks"); names are checked
    #: against the served models once probing has found them all (``GatewayState``).
    fallbacks: FallbackTable = field(default_factory=FallbackTable)
    #: ``[[keys]]``: named API keys with optional limits (``gateway/state/api_keys.py``).
    keys: tuple[ApiKey, ...] = ()
    #: ``[state]`` as given (checked; ``gateway/state/config.py``): ``resolve_state`` merges
    #: it with ``--state-url`` and ``TOKENWIRE_STATE_URL``.
    state: Mapping[str, Any] = field(default_factory=dict)

    @property
    def default_model(self) -> str | None:
        return self.server.get("default_model")

    def probes(self, upstream: UpstreamConfig) -> bool:
        return upstream.name not in self.no_probe


def load_map(ref: str, *, path: bool, where: str) -> TokenizerMap:
    """A map by bundled id / HF alias, or by file path, as a ConfigError on failure."""
    try:
        if path:
            return load_map_file(ref)
        return load_map_file(bundled_map_path(resolve_alias(ref)))
    except MapError as exc:
        kind = "map file" if path else "map id"
        raise ConfigError(f"{where}: unknown {kind} {ref!r} ({exc})") from None
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read map file {ref!r}: {exc.strerror}") from None


def map_for_model(upstream_model: str) -> TokenizerMap | None:
    """The bundled map an upstream's model id names through the HF alias table, if any."""
    try:
        return load_map_file(bundled_map_path(resolve_alias(upstream_model)))
    except MapError:
        return None


def _parse_model(doc: Mapping[str, Any], where: str) -> tuple[ModelRoute, TokenizerMap | None]:
    problems = Problems()
    problems.check(check_keys, doc, _MODEL_KEYS, where)
    if "name" not in doc or not doc["name"] or not isinstance(doc["name"], str):
        raise ConfigErrors([*problems.messages, f"{where}: name is required"])
    where = f"{where} ({doc['name']!r})"
    tmap = None
    if "map" in doc and "map_path" in doc:
        problems.add(ConfigError(f"{where}: give map or map_path, not both"))
    elif isinstance(doc.get("map"), str):
        tmap = problems.check(load_map, doc["map"], path=False, where=where)
    elif isinstance(doc.get("map_path"), str):
        tmap = problems.check(load_map, doc["map_path"], path=True, where=where)
    template = doc.get("chat_template")
    if isinstance(template, str) and not Path(template).is_file():
        problems.add(ConfigError(f"{where}: chat_template {template!r} is not a file"))
    if problems.messages:
        raise ConfigErrors(problems.messages)
    problems.check(_check_context_length, doc, where)
    if problems.messages:
        raise ConfigErrors(problems.messages)
    route = ModelRoute(name=doc["name"], upstream_model=doc.get("upstream_model", ""),
                       map_id=tmap.id if tmap and "map" in doc else None,
                       map_path=doc.get("map_path"), context_length=doc.get("context_length"),
                       chat_template=doc.get("chat_template"))
    return route, tmap


def _check_context_length(doc: Mapping[str, Any], where: str) -> None:
    value = doc.get("context_length")
    # The bound an upstream's report is believed within: clients are told this number
    # (max_model_len), and 64-bit or JavaScript integers cannot hold any number.
    if isinstance(value, int) and not isinstance(value, bool) \
            and not 1 <= value <= MAX_CONTEXT_LENGTH:
        raise ConfigError(f"{where}: context_length must be a number of tokens from 1 to "
                          f"{MAX_CONTEXT_LENGTH}, got {value}")


def _check_numbers(doc: Mapping[str, Any], where: str) -> None:
    _check_context_length(doc, where)
    # A value of another type is check_keys's to report: comparing it would raise.
    if isinstance(doc.get("max_concurrent"), int) and doc["max_concurrent"] < 1:
        raise ConfigError(f"{where}: max_concurrent must be at least 1")
    for key in ("connect_timeout_s", "read_timeout_s"):
        if isinstance(doc.get(key), NUM):
            check_seconds(doc[key], key, where)


def _parse_upstream(
    doc: Any, i: int, env: Mapping[str, str], source: str,
    adapters: Mapping[str, type] | None = None,
) -> tuple[UpstreamConfig, dict[str, TokenizerMap]]:
    where = f"{source}: [[upstreams]] #{i + 1}"
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: must be a table")
    problems = Problems()
    problems.check(check_keys, doc, _UPSTREAM_KEYS, where)
    for key in ("name", "kind"):
        if not doc.get(key) or not isinstance(doc[key], str):
            problems.add(ConfigError(f"{where}: {key} is required"))
    if problems.messages and not isinstance(doc.get("name"), str):
        raise ConfigErrors(problems.messages)
    where = f"{source}: upstream {doc['name']!r}"
    kind = doc.get("kind")
    if kind and kind not in UPSTREAM_KINDS:
        problems.add(ConfigError(f"{where}: unknown kind {kind!r}; expected one of "
                                 + ", ".join(UPSTREAM_KINDS)))
    base_url = doc.get("base_url", "")
    replicas = problems.check(parse_pool, doc, env, where) if "replicas" in doc else ()
    if kind == "embedded":
        if base_url:
            problems.add(ConfigError(f"{where}: an embedded upstream has no base_url"))
        if "replicas" in doc:
            problems.add(ConfigError(f"{where}: an embedded upstream has no replicas"))
    elif "replicas" in doc:
        if base_url:
            problems.add(ConfigError(f"{where}: give base_url or replicas, not both"))
    elif kind in UPSTREAM_KINDS and isinstance(base_url, str):  # unknown kind: needs unknown
        base_url = problems.check(check_http_url, base_url, where) or ""
    key_env = doc.get("api_key_env")
    if isinstance(key_env, str) and key_env not in env:
        # Name the variable, never a value: the message is printed and logged.
        problems.add(ConfigError(f"{where}: api_key_env names {key_env}, which is not set"))
    problems.check(_check_numbers, doc, where)
    if kind in UPSTREAM_KINDS and isinstance(doc.get("options", {}), dict):
        problems.check(_check_options, kind, doc, source, adapters)
    headers = doc.get("headers", {})
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        problems.add(ConfigError(f"{where}: header values must be strings"))
        headers = {}
    routes, maps = [], {}
    for j, mdoc in enumerate(doc.get("models", []) if isinstance(doc.get("models"), list)
                             else []):
        if not isinstance(mdoc, dict):
            problems.add(ConfigError(f"{where} model #{j + 1}: must be a table"))
            continue
        parsed = problems.check(_parse_model, mdoc, f"{where} model #{j + 1}")
        if parsed is None:
            continue
        route, tmap = parsed
        routes.append(route)
        if tmap is not None:
            maps[route.name] = tmap
    if problems.messages:
        raise ConfigErrors(problems.messages)
    config = UpstreamConfig(
        name=doc["name"], kind=kind, base_url=base_url, api_key_env=key_env,
        models=tuple(routes), max_concurrent=doc.get("max_concurrent", 4),
        **{k: float(doc[k]) for k in ("connect_timeout_s", "read_timeout_s") if k in doc},
        headers=tuple(headers.items()), options=dict(doc.get("options", {})),
        context_length=doc.get("context_length"), replicas=replicas or (),
        pool={k: doc[k] for k in POOL_KEYS if k in doc and k != "replicas"})
    return config, maps


def _check_options(kind: str, doc: Mapping[str, Any], source: str,
                   adapters: Mapping[str, type] | None) -> None:
    """``[upstreams.options]`` by the kind's adapter, now rather than when it is built."""
    try:
        check_options(kind, doc["name"], doc.get("options", {}), adapters)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def parse_config(doc: Mapping[str, Any], *, source: str = "config",
                 env: Mapping[str, str] | None = None,
                 adapters: Mapping[str, type] | None = None) -> GatewayConfig:
    """Validate a decoded config document (see the module docstring). ``adapters``
    replaces the kind -> class registry whose ``parse_options`` check each upstream's
    options (tests: the table they give ``build_gateway``, so the options are checked by
    the adapter that will be built from them)."""
    env = os.environ if env is None else env
    problems = Problems()
    problems.check(check_keys, doc, _TOP_KEYS, source)
    server = dict(doc.get("server", {})) if isinstance(doc.get("server", {}), dict) else {}
    problems.check(check_keys, server, SERVER_KEYS, f"{source}: [server]")
    problems.check(_check_server_auth, server, env, f"{source}: [server]")
    if isinstance(server.get("health_interval_s"), NUM):
        # How stale /health's passive checks may be (0: checked at every /health), not a
        # loop's period: nothing repeats on it while nobody asks.
        problems.check(check_seconds, server["health_interval_s"], "health_interval_s",
                       f"{source}: [server]", zero=True)
    ups = doc.get("upstreams", [])
    if not ups:
        problems.add(ConfigError(f"{source}: no [[upstreams]]; declare at least one"))
    upstreams, maps, no_probe = [], {}, set()
    for i, udoc in enumerate(ups if isinstance(ups, list) else []):
        parsed = problems.check(_parse_upstream, udoc, i, env, source, adapters)
        if parsed is None:
            continue
        config, umaps = parsed
        upstreams.append(config)
        maps.update(umaps)
        if not udoc.get("probe", server.get("probe", True)):
            no_probe.add(config.name)
    problems.check(_check_unique, upstreams, source)
    default = server.get("default_model")
    names = [m.name for u in upstreams for m in u.models]
    declared = [m.get("name") for u in (ups if isinstance(ups, list) else [])
                if isinstance(u, dict) for m in u.get("models") or [] if isinstance(m, dict)]
    # Against every declared name: a model whose upstream had a problem is not "unknown".
    if default is not None and names and default not in declared:
        problems.add(ConfigError(f"{source}: [server] default_model {default!r} is not a "
                                 "configured model; configured: " + ", ".join(names)))
    state = doc.get("state", {}) if isinstance(doc.get("state", {}), dict) else {}
    state = problems.check(parse_state_table, state, f"{source}: [state]") or {}
    table = problems.check(parse_fallbacks, doc, source, declared=declared
                           if all(u.models for u in upstreams) else None)
    keys = problems.check(parse_keys, doc.get("keys", []), env, source=source)
    config = GatewayConfig(upstreams=tuple(upstreams), server=server, maps=maps,
                           no_probe=frozenset(no_probe), source=source,
                           fallbacks=table or FallbackTable(), keys=keys or (),
                           state=state)
    if problems.messages:
        exc = ConfigErrors(problems.messages)
        # The upstreams that did parse, so callers can still probe them (without a
        # default_model that may name a model of an upstream that did not).
        exc.config = dataclasses.replace(
            config, server={k: v for k, v in server.items() if k != "default_model"})
        raise exc
    return config


def with_fallback_flags(cfg: GatewayConfig | None, general: Sequence[str],
                        context: Sequence[str]) -> GatewayConfig | None:
    """``--fallback MODEL=A,B`` and ``--context-fallback MODEL=C`` (repeatable) over the
    file's lists: a flag replaces that model's list."""
    if not general and not context:
        return cfg
    if cfg is None:
        raise ConfigError("--fallback and --context-fallback need upstreams (--config or "
                          "--upstream): the embedded engine serves one model")
    lists = {"fallbacks": dict(cfg.fallbacks.general),
             "context_fallbacks": dict(cfg.fallbacks.context)}
    for key, flags in (("fallbacks", general), ("context_fallbacks", context)):
        for flag in flags:
            model, sep, targets = flag.partition("=")
            if not sep or not model.strip():
                raise ConfigError(f"--{key.replace('_', '-')[:-1]} expects MODEL=OTHER[,OTHER"
                                  f"...], got {flag!r}")
            lists[key][model.strip()] = [t.strip() for t in targets.split(",") if t.strip()]
    declared = [m.name for u in cfg.upstreams for m in u.models]
    table = parse_fallbacks(lists, "flags", declared=declared
                            if all(u.models for u in cfg.upstreams) else None)
    return dataclasses.replace(cfg, fallbacks=table)


def _check_server_auth(server: Mapping[str, Any], env: Mapping[str, str], where: str) -> None:
    from tokenwire.gateway.settings import check_origin

    origins = server.get("allowed_origins", [])
    if not all(isinstance(o, str) for o in origins):
        raise ConfigError(f"{where}: allowed_origins must be an array of strings")
    for origin in origins:
        try:
            check_origin(origin)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    var = server.get("api_keys_env")
    if var is not None:
        read_api_keys(var, env, where=f"{where} api_keys_env")


def auth_from_sources(
    *, keys_env_flag: str | None, file_server: Mapping[str, Any],
    allow_unauthenticated_localhost: bool, env: Mapping[str, str],
) -> tuple[tuple[str, ...], str]:
    """``(api_keys, auth)`` from ``--api-keys-env`` > ``[server] api_keys_env`` >
    ``TOKENWIRE_API_KEYS``. No key at all: ``localhost-open`` (the lead's decision: a bare
    ``tokenwire serve`` keeps serving local clients, and refuses remote ones). Keys: every
    client needs one, loopback included, unless the localhost exemption is asked for."""
    from tokenwire.gateway.settings import AUTH_KEYS, AUTH_LOCALHOST_OPEN

    if keys_env_flag is not None:
        keys = read_api_keys(keys_env_flag, env, where="--api-keys-env")
    elif file_server.get("api_keys_env") is not None:
        keys = read_api_keys(file_server["api_keys_env"], env, where="[server] api_keys_env")
    elif ENV_API_KEYS in env:
        keys = read_api_keys(ENV_API_KEYS, env, where="environment")
    else:
        keys = ()
    auth = AUTH_LOCALHOST_OPEN if not keys or allow_unauthenticated_localhost else AUTH_KEYS
    return keys, auth


def _check_unique(upstreams: Sequence[UpstreamConfig], source: str) -> None:
    seen: dict[str, str] = {}
    for u in upstreams:
        if u.name in seen:
            raise ConfigError(f"{source}: two upstreams are named {u.name!r}")
        seen[u.name] = ""
    models: dict[str, str] = {}
    for u in upstreams:
        for m in u.models:
            if m.name in models:
                raise ConfigError(f"{source}: model {m.name!r} is declared by upstreams "
                                  f"{models[m.name]!r} and {u.name!r}; model names must be "
                                  "unique")
            models[m.name] = u.name


def load_config_file(path: str | Path, *, env: Mapping[str, str] | None = None) -> GatewayConfig:
    """Read and validate a TOML config file."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {p}: {exc.strerror}") from None
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    return parse_config(doc, source=str(p), env=env)


def config_from_urls(
    urls: Sequence[str], *, kind: str = "openai", api_key_env: str | None = None,
    env: Mapping[str, str] | None = None, probe: bool = True, source: str = "--upstream",
    max_concurrent: int | None = None, context_length: int | None = None,
) -> GatewayConfig:
    """``--upstream URL`` without a file: models are discovered by probing each upstream."""
    extra: dict[str, Any] = {"api_key_env": api_key_env} if api_key_env else {}
    if max_concurrent is not None:
        extra["max_concurrent"] = max_concurrent
    if context_length is not None:
        extra["context_length"] = context_length
    ups = [{"name": _name_for(url, i, len(urls)), "kind": kind, "base_url": url, **extra}
           for i, url in enumerate(urls)]
    return parse_config({"server": {"probe": probe}, "upstreams": ups}, source=source, env=env)


#: ``--replica`` options after the URL, and how each is read.
_REPLICA_FLAG_OPTIONS: dict[str, Any] = {"weight": float, "max_concurrent": int,
                                         "api_key_env": str, "name": str}


def parse_replica_flag(value: str) -> dict[str, Any]:
    """``URL[,weight=W][,max_concurrent=N][,api_key_env=VAR][,name=NAME]`` -> a replica
    table (checked like the file's by :func:`parse_config`)."""
    url, *options = [p.strip() for p in value.split(",")]
    out: dict[str, Any] = {"base_url": url}
    for option in options:
        key, sep, raw = option.partition("=")
        if not sep or key not in _REPLICA_FLAG_OPTIONS:
            raise ConfigError(f"--replica {value!r}: unknown option {option!r}; expected "
                              + ", ".join(f"{k}=..." for k in _REPLICA_FLAG_OPTIONS))
        try:
            out[key] = _REPLICA_FLAG_OPTIONS[key](raw)
        except ValueError:
            raise ConfigError(f"--replica {value!r}: {key} must be a number") from None
    return out


def config_from_replicas(
    specs: Sequence[str], *, kind: str = "openai", api_key_env: str | None = None,
    env: Mapping[str, str] | None = None, probe: bool = True,
    max_concurrent: int | None = None, context_length: int | None = None,
) -> GatewayConfig:
    """``--replica URL`` (repeated) without a file: one pool named ``pool`` whose replicas
    serve the same models, discovered by probing."""
    doc: dict[str, Any] = {"name": "pool", "kind": kind,
                           "replicas": [parse_replica_flag(v) for v in specs]}
    for key, value in (("api_key_env", api_key_env), ("max_concurrent", max_concurrent),
                       ("context_length", context_length)):
        if value is not None:
            doc[key] = value
    return parse_config({"server": {"probe": probe}, "upstreams": [doc]}, source="--replica",
                        env=env)


def _name_for(url: str, i: int, n: int) -> str:
    host = urlsplit(url).netloc or "upstream"
    return host if n == 1 else f"{host}#{i + 1}"


def resolve(
    *, config_path: str | None = None, upstream_urls: Sequence[str] = (),
    upstream_kind: str | None = None, api_key_env: str | None = None, probe: bool = True,
    env: Mapping[str, str] | None = None, max_concurrent: int | None = None,
    context_length: int | None = None, replicas: Sequence[str] = (),
) -> GatewayConfig | None:
    """Flags over environment over nothing; ``None`` means "serve the embedded engine"."""
    env = os.environ if env is None else env
    if config_path and upstream_urls:
        raise ConfigError("--config and --upstream cannot be combined; declare the upstream "
                          "in the config file")
    if replicas:
        if config_path or upstream_urls:
            raise ConfigError("--replica cannot be combined with --config or --upstream; "
                              "declare pools in the config file (replicas = [...])")
        return config_from_replicas(replicas, kind=upstream_kind or "openai",
                                    api_key_env=api_key_env, env=env, probe=probe,
                                    max_concurrent=max_concurrent,
                                    context_length=context_length)
    if not config_path and not upstream_urls:
        config_path = env.get(ENV_CONFIG) or None
        if not config_path:
            upstream_urls = [u.strip() for u in env.get(ENV_UPSTREAM, "").split(",") if u.strip()]
    if config_path:
        if upstream_kind or api_key_env or max_concurrent is not None \
                or context_length is not None:
            raise ConfigError("--upstream-kind, --upstream-api-key-env, "
                              "--upstream-max-concurrent and --upstream-context-length apply "
                              "to --upstream; set them in the config file")
        cfg = load_config_file(config_path, env=env)
        if not probe:
            # replace(), not a new GatewayConfig: every other field (fallbacks) is kept.
            cfg = dataclasses.replace(cfg, no_probe=frozenset(u.name for u in cfg.upstreams))
        return cfg
    if upstream_urls:
        return config_from_urls(upstream_urls, kind=upstream_kind or "openai",
                                api_key_env=api_key_env, env=env, probe=probe,
                                max_concurrent=max_concurrent, context_length=context_length)
    if upstream_kind or api_key_env or max_concurrent is not None \
            or context_length is not None:
        raise ConfigError("--upstream-kind, --upstream-api-key-env, "
                          "--upstream-max-concurrent and --upstream-context-length need "
                          "--upstream URL")
    return None
