"""``tokenwire check``: load and validate a configuration, probe every upstream, print every
problem, start nothing.

It reads what ``tokenwire serve`` would read (``--config`` / ``TOKENWIRE_CONFIG``,
``--upstream`` / ``TOKENWIRE_UPSTREAM``, the client key variables), so a file that passes
here starts. Every problem is printed, one per line, not only the first: keys and types,
maps, environment variables, then each upstream's probe (reachable, serving the configured
models). Without a configuration it checks what a bare ``serve`` needs: the GGUF loads and
its map matches. Exit status 0 when all is well, 1 when anything is wrong.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from tokenwire.errors import ConfigError

__all__ = ["register", "run_checks"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "check", help="validate a configuration and probe its upstreams; starts nothing")
    p.add_argument("--config", metavar="FILE",
                   help="TOML file to check (env TOKENWIRE_CONFIG)")
    p.add_argument("--upstream", action="append", default=[], metavar="URL",
                   help="an upstream base URL to probe (repeatable; env TOKENWIRE_UPSTREAM)")
    p.add_argument("--upstream-kind", help="kind of the --upstream servers (default openai)")
    p.add_argument("--upstream-api-key-env", metavar="VAR",
                   help="environment variable holding the --upstream API key")
    p.add_argument("--api-keys-env", metavar="VAR",
                   help="environment variable holding the client API keys")
    p.add_argument("--no-probe", action="store_true",
                   help="check the file only; do not contact upstreams")
    p.add_argument("--model", type=Path,
                   help="without a configuration: the GGUF `serve` would load "
                        "(default: the bundled SmolLM2)")
    p.set_defaults(func=cmd_check)


def _errors_of(exc: ConfigError) -> list[str]:
    return list(getattr(exc, "problems", None) or [str(exc)])


def run_checks(args: argparse.Namespace, env: dict[str, str] | None = None
               ) -> tuple[list[str], list[str]]:
    """``(what was checked, problems)`` for the sources ``args`` names."""
    from tokenwire.gateway.config import auth_from_sources, resolve
    from tokenwire.gateway.server import config_problems
    from tokenwire.gateway.settings import ServerSettings

    env = dict(os.environ) if env is None else env
    problems: list[str] = []
    checked: list[str] = []
    cfg = None
    try:
        cfg = resolve(config_path=args.config, upstream_urls=args.upstream,
                      upstream_kind=args.upstream_kind, api_key_env=args.upstream_api_key_env,
                      probe=not args.no_probe, env=env)
    except ConfigError as exc:
        problems += _errors_of(exc)
        cfg = getattr(exc, "config", None)
    try:  # the file's api_keys_env was checked with the file; these are the flag and env
        auth_from_sources(keys_env_flag=args.api_keys_env, file_server={},
                          allow_unauthenticated_localhost=False, env=env)
    except ConfigError as exc:
        problems += _errors_of(exc)
    problems += _check_state(cfg, env)
    if cfg is not None:
        problems += _check_server(cfg, env)
    if cfg is None and not problems:
        checked.append("no configuration: `tokenwire serve` serves the embedded model")
        problems += _check_embedded(args.model)
    elif cfg is not None and cfg.upstreams:
        checked += [f"upstream {u.name} ({u.kind}{' ' + u.base_url if u.base_url else ''})"
                    for u in cfg.upstreams]
        probed = [u for u in cfg.upstreams if cfg.probes(u)]
        if probed and not args.no_probe:
            problems += asyncio.run(config_problems(cfg, ServerSettings()))
    return checked, problems


def _check_state(cfg: object, env: dict[str, str]) -> list[str]:
    """``[state]`` with the environment (``TOKENWIRE_STATE_URL``, ``password_env``), as
    ``serve`` resolves it; Redis itself is not contacted."""
    from tokenwire.gateway.state.config import resolve_state

    try:
        resolve_state(getattr(cfg, "state", None), env=env)
    except ConfigError as exc:
        return _errors_of(exc)
    return []


def _check_server(cfg: Any, env: dict[str, str]) -> list[str]:
    """``[server]``'s values as ``serve`` reads them (its settings_from_args, without the
    flags): times, port and sizes are checked where the settings are built."""
    from tokenwire.cli import serve as serve_cmd

    parser = argparse.ArgumentParser()
    serve_cmd.register(parser.add_subparsers())
    try:
        serve_cmd.settings_from_args(parser.parse_args(["serve"]), dict(cfg.server), env=env,
                                     named_keys=cfg.keys)
    except ConfigError as exc:
        return _errors_of(exc)
    return []


def _check_embedded(model: Path | None) -> list[str]:
    from tokenwire.codec.maps import bundled_map_path, load_map_file
    from tokenwire.gateway.server import SMOLLM2_MAP_ID
    from tokenwire.gateway.upstreams.embedded import EmbeddedEngine

    try:
        tmap = load_map_file(bundled_map_path(SMOLLM2_MAP_ID))
        EmbeddedEngine.load(tmap, model, n_ctx=512, n_threads=1)  # loaded, never started
    except ConfigError as exc:
        return _errors_of(exc)
    return []


def cmd_check(args: argparse.Namespace) -> int:
    checked, problems = run_checks(args)
    for line in checked:
        print(f"checked: {line}")
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    if problems:
        print(f"tokenwire check: {len(problems)} problem(s); nothing was started",
              file=sys.stderr)
        return 1
    print("tokenwire check: ok")
    return 0
