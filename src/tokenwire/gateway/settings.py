"""Deployment settings of ``tokenwire serve``, and the safety policy they describe.

One frozen value built by the CLI (or a test) and read by the app; nothing reads the
environment after start-up. The two-stage switches of codec-spec §5.2 live in
:class:`~tokenwire.codec.versioning.VersionPolicy`; the banned ids that make the safety
policy real live here, and never leave the server (§5.5: descriptors publish counts only).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from tokenwire.codec.coalescer import DEFAULT_WINDOW_S
from tokenwire.codec.compression import ZstdDict
from tokenwire.codec.safety_policy import (
    BannedTokenPolicy,
    Category,
    Classifier,
    SafetyPolicyDescriptor,
    canonical_bytes,
    parse_policy,
)
from tokenwire.codec.versioning import VersionPolicy
from tokenwire.config_tables import check_port, check_seconds
from tokenwire.errors import ConfigError
from tokenwire.gateway.apis.params import SUPPORTED_STREAM_FORMATS
from tokenwire.gateway.state.api_keys import ApiKey, check_api_key
from tokenwire.gateway.state.config import StateConfig
from tokenwire.gateway.supervision.admission import DEFAULT_MAX_CONCURRENT, DEFAULT_QUEUE_SIZE
from tokenwire.gateway.supervision.supervisor import (
    DEFAULT_HEARTBEAT_S,
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_REQUEST_CAP_S,
)

__all__ = [
    "AUTH_KEYS",
    "AUTH_LOCALHOST_OPEN",
    "AUTH_MODES",
    "DEFAULT_HOST",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_PORT",
    "EVENT_LOOPS",
    "ServerSettings",
    "build_policy",
    "check_api_key",
    "check_origin",
    "load_zstd_dict_arg",
]

#: Connection-limit defaults; the reasons are in ``gateway/http/connections.py``.
DEFAULT_HEAD_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 60.0
DEFAULT_MAX_CONNECTIONS = 4096
DEFAULT_MAX_CONNECTIONS_PER_CLIENT = 256
#: Responses WebSocket defaults; the reasons are in ``gateway/http/ws_session.py``.
DEFAULT_WS_MAX_SOCKETS = 1024
DEFAULT_WS_MAX_SOCKETS_PER_CLIENT = 64
DEFAULT_WS_IDLE_TIMEOUT_S = 900.0
DEFAULT_WS_SESSION_CAP_S = 3600.0
DEFAULT_HOST = "127.0.0.1"  # loopback: exposing a model to a network is a decision to make
DEFAULT_PORT = 8080
#: Largest request body accepted (after Content-Encoding). A 100K-token prompt as a JSON int
#: array is ~700 KB (codec-spec §2.1); 8 MiB leaves room for long chat histories.
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
#: Every client needs an API key, loopback included.
AUTH_KEYS = "keys"
#: Loopback peers need no key; remote peers need one (all are refused when none is set).
#: The default, so that a bare ``tokenwire serve`` keeps working for local clients.
AUTH_LOCALHOST_OPEN = "localhost-open"
AUTH_MODES = (AUTH_KEYS, AUTH_LOCALHOST_OPEN)
#: The event loops ``tokenwire serve`` runs on (``gateway/server.py`` ``serving_loop_factory``):
#: ``auto`` is uvloop where it is installed (less CPU per streamed token, BENCHMARKS.md "uvloop
#: as the event loop"), else asyncio's own; ``uvloop`` requires it; ``asyncio`` never uses it.
EVENT_LOOPS = ("auto", "uvloop", "asyncio")


@dataclass(frozen=True)
class ServerSettings:
    """Everything ``tokenwire serve`` can be told. Defaults serve the embedded SmolLM2."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    #: Coalescing window: frames produced within it share one compressor flush (§10 item 1).
    window_s: float = DEFAULT_WINDOW_S
    #: stream_format -> trained dictionary; zstd is offered only for formats listed (§4.1).
    zstd_dicts: Mapping[str, ZstdDict] = field(default_factory=dict)
    version_policy: VersionPolicy = field(default_factory=VersionPolicy)
    #: Ids the safety policy bans; used only when ``version_policy.safety_policy_id`` is set.
    banned_ids: frozenset[int] = frozenset()
    #: Seed, "Capacity": upstream requests running at once (each upstream may have its own,
    #: smaller limit: the embedded engine runs one), and the FIFO queue of requests waiting
    #: for one; beyond both, a 429 with ``Retry-After: 1`` before the body is read.
    max_concurrent: int = DEFAULT_MAX_CONCURRENT
    queue_size: int = DEFAULT_QUEUE_SIZE
    #: Seed ``timeoutMs``: the longest silence (upload, queue wait, then between upstream
    #: events) before a request fails; and the cap on every request's whole life.
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    request_cap_s: float = DEFAULT_REQUEST_CAP_S
    #: A keep-alive goes to a streaming client after this much silence.
    heartbeat_s: float = DEFAULT_HEARTBEAT_S
    #: The seed's retry budgets for upstream failures before any output (``gateway/retry``);
    #: False sends every failure to the client as it came.
    retries: bool = True
    #: On SIGTERM/SIGINT, streams in flight get this long to finish before each is ended
    #: with a clean ``server_shutting_down`` failure (``gateway/http/shutdown.py``).
    drain_grace_s: float = 30.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    #: Connection limits (``gateway/http/connections.py``, ``docs/security.md``): the time a
    #: request head and a request body may take, open connections in all and per client
    #: IP address.
    head_timeout_s: float = DEFAULT_HEAD_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_connections_per_client: int = DEFAULT_MAX_CONNECTIONS_PER_CLIENT
    #: HTTP/2 beside HTTP/1.1 (``gateway/http/http2.py``): h2c with prior knowledge on
    #: cleartext, ALPN ``h2`` on TLS. False serves HTTP/1.1 only.
    http2: bool = True
    #: TLS: a PEM certificate (chain) and its private key; both or neither.
    tls_cert: Path | None = None
    tls_key: Path | None = None
    #: ``GET /v1/responses`` with a WebSocket upgrade (the Codex CLI's own transport,
    #: ``gateway/http/responses_ws.py``); False answers the upgrade 426, as before.
    responses_websocket: bool = True
    #: Open Responses WebSockets in all and per client IP address, the time one may sit
    #: idle between responses, and its whole life (OpenAI's 60 minutes).
    ws_max_sockets: int = DEFAULT_WS_MAX_SOCKETS
    ws_max_sockets_per_client: int = DEFAULT_WS_MAX_SOCKETS_PER_CLIENT
    ws_idle_timeout_s: float = DEFAULT_WS_IDLE_TIMEOUT_S
    ws_session_cap_s: float = DEFAULT_WS_SESSION_CAP_S
    #: Shared state on Redis (``[state]``, ``--state-url``; README "Shared state"); None:
    #: everything stays in this process, as a single instance always did.
    state: StateConfig | None = None
    #: Write ``stop`` instead of ``eos_token``/``stop_sequence`` like the engine forks (§5.7).
    legacy_finish_reason: bool = False
    #: Compress the APIs' own event streams (OpenAI, Anthropic SSE) for clients that declare
    #: no Codec version, as their ``Accept-Encoding`` allows. Off: those go uncompressed
    #: (``http/generation.py`` says why); Codec streams and whole bodies are always picked.
    compress_event_streams: bool = False
    model_path: Path | None = None
    n_ctx: int = 4096
    n_threads: int | None = None
    #: Public origin for URLs in published documents (``https://host``); empty = relative.
    public_base_url: str = ""
    #: Accepted API keys (``Authorization: Bearer`` or ``x-api-key``). Never in repr: a
    #: settings object is printed in tracebacks and logs.
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    #: Named keys with optional limits (``[[keys]]``, ``gateway/state/api_keys.py``); they
    #: are accepted beside ``api_keys`` (which stay unnamed and unlimited).
    named_keys: tuple[ApiKey, ...] = field(default=(), repr=False)
    #: Browser origins (``scheme://host[:port]``) allowed to call; any other Origin is 403.
    allowed_origins: tuple[str, ...] = ()
    #: ``"keys"`` or ``"localhost-open"`` (see :data:`AUTH_MODES`). Left empty, it follows
    #: the keys: ``"keys"`` when some are given, else ``"localhost-open"``, so giving keys
    #: never silently leaves loopback open.
    auth: str = ""
    #: One of :data:`EVENT_LOOPS` (``--loop``, ``[server] event_loop``).
    event_loop: str = "auto"

    def __post_init__(self) -> None:
        check_port(self.port, "port")
        # 0 flushes every frame (codec/coalescer.py); NaN or infinity never closed it.
        check_seconds(self.window_s, "the coalescing window (coalesce_ms / 1000)", zero=True)
        for fmt in self.zstd_dicts:
            if fmt not in SUPPORTED_STREAM_FORMATS:
                raise ConfigError(
                    f"zstd dictionary for unknown stream_format {fmt!r}; expected one of "
                    + ", ".join(SUPPORTED_STREAM_FORMATS)
                )
        if self.banned_ids and not self.version_policy.safety_policy_id:
            raise ConfigError("banned ids need a safety policy id (--safety-policy ID)")
        if self.queue_size < 0:
            raise ConfigError("the request queue size must be >= 0")
        if self.max_concurrent < 1:
            raise ConfigError("max_concurrent must be at least 1")
        for name in ("max_connections", "max_connections_per_client", "ws_max_sockets",
                     "ws_max_sockets_per_client", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)!r}")
        for name in ("idle_timeout_s", "request_cap_s", "head_timeout_s",
                     "body_timeout_s", "ws_idle_timeout_s", "ws_session_cap_s"):
            check_seconds(getattr(self, name), name)
        check_seconds(self.heartbeat_s, "heartbeat_s", interval=True)
        check_seconds(self.drain_grace_s, "drain_grace_s", zero=True)  # 0: end them at once
        for name in ("tls_cert", "tls_key"):  # a config file gives strings
            if isinstance(getattr(self, name), str):
                object.__setattr__(self, name, Path(getattr(self, name)))
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("TLS needs both a certificate and its key (--tls-cert and "
                              "--tls-key)")
        self._check_event_loop()
        self._check_auth()
        self._check_embedded()

    def _check_embedded(self) -> None:
        """The bare ``serve``'s engine flags, in the ranges its [upstreams.options] have."""
        from tokenwire.gateway.upstreams import check_embedded_int

        check_embedded_int("n_ctx", self.n_ctx, "--n-ctx")
        if self.n_threads is not None:
            check_embedded_int("threads", self.n_threads, "--threads")

    def _check_event_loop(self) -> None:
        if self.event_loop not in EVENT_LOOPS:
            raise ConfigError(f"event_loop must be one of {', '.join(EVENT_LOOPS)}, got "
                              f"{self.event_loop!r}")
        if self.event_loop == "uvloop" and importlib.util.find_spec("uvloop") is None:
            raise ConfigError("event_loop 'uvloop' needs the uvloop package (pip install "
                              "uvloop), or use 'auto' / 'asyncio'")

    def _check_auth(self) -> None:
        if not self.auth:
            derived = AUTH_KEYS if self.api_keys or self.named_keys else AUTH_LOCALHOST_OPEN
            object.__setattr__(self, "auth", derived)  # frozen: set once, before any reader
        if self.auth not in AUTH_MODES:
            raise ConfigError(f"auth must be one of {', '.join(AUTH_MODES)}, got {self.auth!r}")
        if self.auth == AUTH_KEYS and not self.api_keys and not self.named_keys:
            # Fail closed: "keys" with no key would refuse everyone, which is never meant.
            raise ConfigError("auth 'keys' needs at least one API key (set TOKENWIRE_API_KEYS)")
        for i, key in enumerate(self.api_keys):
            check_api_key(key, f"API key #{i + 1}")
        for origin in self.allowed_origins:
            check_origin(origin)


def check_origin(origin: str) -> None:
    """An Origin as browsers send it: ``http(s)://host[:port]``, no path, query or wildcard."""
    bad = ConfigError(f"allowed origin {origin!r} is not an http:// or https:// origin "
                      "(scheme://host[:port], no path)")
    try:
        parts = urlsplit(origin)
        port_ok = parts.port is None or parts.port > 0
    except ValueError:
        raise bad from None
    if (not port_ok or parts.scheme not in ("http", "https") or not parts.hostname
            or parts.path not in ("", "/") or parts.query or parts.fragment
            or parts.username is not None or "*" in origin):
        raise bad


def load_zstd_dict_arg(arg: str) -> tuple[str, ZstdDict]:
    """Parse ``FORMAT=PATH`` (``--zstd-dict``) and load the raw dictionary bytes."""
    fmt, sep, path = arg.partition("=")
    if not sep or not fmt or not path:
        raise ConfigError(f"--zstd-dict expects FORMAT=PATH, got {arg!r}")
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read zstd dictionary {path}: {exc}") from exc
    if not raw:
        raise ConfigError(f"zstd dictionary {path} is empty")
    return fmt.strip(), ZstdDict.from_bytes(raw)


def build_policy(
    settings: ServerSettings, tokenizer_id: str
) -> tuple[BannedTokenPolicy, SafetyPolicyDescriptor] | None:
    """The enforcement object and its publishable descriptor, when a policy is enabled.

    The descriptor says what the policy does (one ``stop`` category, a server-side
    classifier working on sampled ids) and how many ids it bans, never which (§5.5).
    """
    policy_id = settings.version_policy.safety_policy_id
    if policy_id is None:
        return None
    banned = BannedTokenPolicy(policy_id, settings.banned_ids)
    desc = SafetyPolicyDescriptor(
        id=policy_id,
        version="1",
        tokenizers=(tokenizer_id,),
        categories=(Category(name="banned_tokens", action="stop",
                             description="generation stops before a banned token id"),),
        classifier=Classifier(family="tokenwire-banned-ids", host="server",
                              requires_engine_features=("sampling_chain",)),
        rules_summary=banned.summary(),
    )
    parse_policy(canonical_bytes(desc))  # validate what we will publish (§5.5 schema)
    return banned, desc
