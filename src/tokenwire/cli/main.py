"""The `tokenwire` command. Each command group lives in its own module and registers itself
through ``register(subparsers)``; this module only wires them together and maps tokenwire's
typed errors to a one-line message.

Exit statuses (documented in the README): 0 success, 1 a problem the message names (a
configuration, a model file, a server's error, an unreadable file), 2 a usage error
(argparse's), 3 the address to serve on cannot be bound (``serve``), 130
interrupted (Ctrl-C), 141 the reader of stdout went away (``| head``: SIGPIPE's 128 + 13,
what a shell reports for ``cat`` there), without a traceback."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from tokenwire import __version__
from tokenwire.errors import TokenwireError

from . import chat as chat_cmd
from . import check as check_cmd
from . import client_cmds
from . import cluster as cluster_cmd
from . import maps as maps_cmd
from . import models as models_cmd
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
    chat_cmd.register(sub)
    check_cmd.register(sub)
    models_cmd.register(sub)
    cluster_cmd.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        try:
            return _dispatch(argv)
        finally:  # inside the try: a buffered write to a closed pipe fails here, not at exit
            sys.stdout.flush()
    except BrokenPipeError:
        return _stdout_gone()


def _dispatch(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except TokenwireError as exc:
        print(f"tokenwire: error: {exc}", file=sys.stderr)
        return int(getattr(exc, "exit_status", 1))
    except KeyboardInterrupt:
        return 130


#: 128 + SIGPIPE: the status a shell shows for a program whose reader closed the pipe.
EXIT_BROKEN_PIPE = 141


def _stdout_gone() -> int:
    """The reader of stdout closed it (``tokenwire maps inspect ... | head``). Point stdout
    at /dev/null so the interpreter's own flush at exit cannot raise a second
    BrokenPipeError (Python's documented recipe, library/signal.html#note-on-sigpipe)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a real file (captured): nothing to flush
        pass
    return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
