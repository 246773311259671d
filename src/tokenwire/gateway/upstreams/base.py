"""What every upstream adapter shares: its configuration value and its health report.

An adapter is a module of its own under ``gateway/upstreams/`` with a class that implements
:class:`~tokenwire.gateway.ir.Upstream` for one configured upstream (which may serve several
models), built by ``from_config(config, *, transport=None)``. It turns the engine's wire
format into IR events and classifies failures from structured fields at this boundary
(HTTP status, error ``type``/``code``, counts), never downstream from message text.

Kinds (``UpstreamConfig.kind``):

* ``embedded``: the llama.cpp engine in this process (``upstreams/embedded.py``).
* ``openai``: OpenAI-compatible Chat Completions / Completions servers: vLLM, llama.cpp
  ``llama-server`` and ``python -m llama_cpp.server``, Ollama, LM Studio, hosted APIs.
* ``codec``: Codec-native engines (the Codec forks of sglang, vLLM, llama.cpp; another
  tokenwire): binary frames upstream, ids passed through.
* ``responses``: OpenAI Responses API upstreams.
* ``anthropic``: Anthropic Messages API upstreams.
"""

from __future__ import annotations

import dataclasses
import enum
import secrets
from collections.abc import Collection
from dataclasses import dataclass, field

from tokenwire.errors import ConfigError

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT_S",
    "DEFAULT_READ_TIMEOUT_S",
    "UPSTREAM_KINDS",
    "ModelRoute",
    "ReplicaConfig",
    "UpstreamConfig",
    "UpstreamHealth",
    "UpstreamState",
    "new_call_id",
    "unknown_option",
]

UPSTREAM_KINDS = ("embedded", "openai", "codec", "responses", "anthropic")


def new_call_id() -> str:
    """A tool call's id, for a call whose upstream gave it none: every API then shows the
    same one, and a client can answer the call by it."""
    return f"call_{secrets.token_hex(12)}"


def unknown_option(kind: str, upstream: str, key: str, known: Collection[str]) -> ConfigError:
    """The error for an ``[upstreams.options]`` key a kind does not read, in the one wording
    every kind uses (a typo would otherwise fall back to a default in silence)."""
    return ConfigError(f"upstream {upstream!r}: unknown {kind} option {key!r} "
                       f"in [upstreams.options]; known: {sorted(known)}")

#: Connecting to an upstream on the same network takes milliseconds; 10 s covers a cold
#: hosted endpoint and still fails fast when a host is down.
DEFAULT_CONNECT_TIMEOUT_S = 10.0
#: Silence allowed between two bytes of an upstream response. Local engines can take
#: minutes on a long prompt before the first token; the request deadline bounds the total.
DEFAULT_READ_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class ModelRoute:
    """One model clients may ask for, and how it maps onto its upstream.

    ``name`` is what clients send as ``model``; ``upstream_model`` what the upstream is sent
    (defaults to ``name``). ``map_id`` / ``map_path`` name the tokenizer map of the model's
    vocabulary (a bundled id, or a file); without one, Codec stream formats are refused for
    the model unless the upstream itself returns ids.
    """

    name: str
    upstream_model: str = ""
    map_id: str | None = None
    map_path: str | None = None
    #: The model's context window in tokens, when configured (``gateway/context_window.py``
    #: says how it is used and what the upstream's own report gives otherwise).
    context_length: int | None = None
    #: The model's chat template for counting usage the upstream does not report: a GGUF
    #: file, a Hugging Face ``tokenizer_config.json`` or a Jinja file (``gateway/usage.py``).
    chat_template: str | None = None

    @property
    def sent_as(self) -> str:
        return self.upstream_model or self.name


@dataclass(frozen=True)
class ReplicaConfig:
    """One replica of a pooled upstream (README "Replica pools"): where it is, its key, its
    share of the traffic and its own concurrency limit; ``None`` takes the upstream's."""

    base_url: str
    name: str = ""
    api_key_env: str | None = None
    weight: float = 1.0
    max_concurrent: int | None = None


@dataclass(frozen=True)
class UpstreamConfig:
    """One configured upstream. Secrets are never stored here: ``api_key_env`` names the
    environment variable that holds the key, read when the adapter is built."""

    name: str
    kind: str
    base_url: str = ""
    api_key_env: str | None = None
    models: tuple[ModelRoute, ...] = ()
    #: Requests in flight to this upstream at once (its own limit; the gateway has one too).
    max_concurrent: int = 4
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    #: Extra request headers (e.g. ``anthropic-version``); values may not hold secrets.
    headers: tuple[tuple[str, str], ...] = ()
    #: Kind-specific options (e.g. ``{"api": "completions"}`` for an ``openai`` upstream).
    options: dict[str, object] = field(default_factory=dict)
    #: The context window of every model of this upstream that does not set its own.
    context_length: int | None = None
    #: Replicas serving the same models (a pool, ``routing/pool.py``); empty: one server at
    #: ``base_url``.
    replicas: tuple[ReplicaConfig, ...] = ()
    #: Pool settings: ``breaker`` (a table of BreakerPolicy fields), ``probe_interval_s``,
    #: ``affinity_prefix_chars``; checked by the config, read when the pool is built.
    pool: dict[str, object] = field(default_factory=dict)

    def replica(self, i: int) -> UpstreamConfig:
        """The configuration of replica ``i`` as an upstream of its own (one adapter)."""
        spec = self.replicas[i]
        return dataclasses.replace(
            self, name=f"{self.name}/{spec.name or i + 1}", base_url=spec.base_url,
            api_key_env=spec.api_key_env or self.api_key_env,
            max_concurrent=spec.max_concurrent or self.max_concurrent, replicas=(), pool={})


class UpstreamState(enum.StrEnum):
    UP = "up"
    DEGRADED = "degraded"  # reachable, but something is off (e.g. a model is missing)
    DOWN = "down"


@dataclass(frozen=True)
class UpstreamHealth:
    """What ``probe()`` found; shown in ``/health`` and checked at start-up."""

    name: str
    kind: str
    state: UpstreamState
    models: tuple[str, ...] = ()
    detail: str = ""
