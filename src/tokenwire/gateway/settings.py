"""Deployment settings of ``tokenwire serve``, and the safety policy they describe.

One frozen value built by the CLI (or a test) and read by the app; nothing reads the
environment after start-up. The two-stage switches of codec-spec §5.2 live in
:class:`~tokenwire.codec.versioning.VersionPolicy`; the banned ids that make the safety
policy real live here, and never leave the server (§5.5: descriptors publish counts only).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tokenwire.codec.compression import DEFAULT_WINDOW_S, ZstdDict
from tokenwire.codec.safety_policy import (
    BannedTokenPolicy,
    Category,
    Classifier,
    SafetyPolicyDescriptor,
    canonical_bytes,
    parse_policy,
)
from tokenwire.codec.versioning import VersionPolicy
from tokenwire.errors import ConfigError
from tokenwire.gateway.apis.params import SUPPORTED_STREAM_FORMATS

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_PORT",
    "ServerSettings",
    "build_policy",
    "load_zstd_dict_arg",
]

DEFAULT_HOST = "127.0.0.1"  # loopback: exposing a model to a network is a decision to make
DEFAULT_PORT = 8080
#: Largest request body accepted (after Content-Encoding). A 100K-token prompt as a JSON int
#: array is ~700 KB (codec-spec §2.1); 8 MiB leaves room for long chat histories.
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024


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
    queue_size: int = 16
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    #: Write ``stop`` instead of ``eos_token``/``stop_sequence`` like the engine forks (§5.7).
    legacy_finish_reason: bool = False
    model_path: Path | None = None
    n_ctx: int = 4096
    n_threads: int | None = None
    #: Public origin for URLs in published documents (``https://host``); empty = relative.
    public_base_url: str = ""

    def __post_init__(self) -> None:
        if self.window_s < 0:
            raise ConfigError("the coalescing window must be >= 0 seconds")
        for fmt in self.zstd_dicts:
            if fmt not in SUPPORTED_STREAM_FORMATS:
                raise ConfigError(
                    f"zstd dictionary for unknown stream_format {fmt!r}; expected one of "
                    + ", ".join(SUPPORTED_STREAM_FORMATS)
                )
        if self.banned_ids and not self.version_policy.safety_policy_id:
            raise ConfigError("banned ids need a safety policy id (--safety-policy ID)")
        if self.queue_size < 1:
            raise ConfigError("the request queue must hold at least one request")


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
