"""The `tokenwire` command. Each command group lives in its own module and registers itself
through ``register(subparsers)``; this module only wires them together and maps tokenwire's
typed errors to a one-line message and exit status 1 (2 is argparse's usage error)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tokenwire import __version__
from tokenwire.errors import TokenwireError

from . import client_cmds
from . import maps as maps_cmd
from . import serve as serve_cmd


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tokenwire",
        description="Codec binary token streaming: maps, tokenizers, frames, and a gateway.",
    )
    parser.add_argument("--version", action="version", version=f"tokenwire {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    maps_cmd.register(sub)
    serve_cmd.register(sub)
    client_cmds.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except TokenwireError as exc:
        print(f"tokenwire: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
