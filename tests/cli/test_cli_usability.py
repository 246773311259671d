"""The command line as a newcomer meets it (issue 10): help for every option, a closed pipe
is not a traceback, usage mistakes are said instead of ignored."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tokenwire.cli.main import EXIT_BROKEN_PIPE, build_parser, main
from tokenwire.codec.maps import bundled_map_path

SRC = Path(__file__).parents[2] / "src"


def _subparsers(parser: argparse.ArgumentParser, prefix: str = "tokenwire"):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield f"{prefix} {name}", sub
                yield from _subparsers(sub, f"{prefix} {name}")


def test_every_option_and_argument_of_every_command_has_help_text() -> None:
    missing = [f"{cmd}: {a.option_strings or a.dest}"
               for cmd, sub in _subparsers(build_parser()) for a in sub._actions
               if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)
               and not a.help]
    assert missing == []


def test_maps_generate_help_says_when_id_is_required(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["maps", "generate", "--help"])
    assert "required, except with --smollm2" in " ".join(capsys.readouterr().out.split())


def test_maps_verify_refuses_a_corpus_it_would_not_use(capsys) -> None:
    rc = main(["maps", "verify", str(bundled_map_path("huggingfacetb/smollm2")),
               "--corpus", "texts.json"])
    assert rc == 2 and "--against-gguf" in capsys.readouterr().err


def _run_into_closed_pipe(*argv: str) -> subprocess.CompletedProcess:
    """Run ``tokenwire argv`` with a stdout whose reader is already gone: every write fails
    with EPIPE, deterministically (no race with a ``head`` that exits)."""
    read, write = os.pipe()
    os.close(read)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env["PYTHONPATH"] = str(SRC)
    try:
        return subprocess.run([sys.executable, "-m", "tokenwire.cli.main", *argv], stdout=write,
                              stderr=subprocess.PIPE, env=env, timeout=120)
    finally:
        os.close(write)


@pytest.mark.parametrize("argv", [["maps", "inspect", "huggingfacetb/smollm2"],
                                  ["maps", "inspect", "huggingfacetb/smollm2", "--json"],
                                  ["--help"]])
def test_a_closed_stdout_ends_quietly_with_the_sigpipe_status(argv: list[str]) -> None:
    proc = _run_into_closed_pipe(*argv)
    assert b"Traceback" not in proc.stderr and b"BrokenPipe" not in proc.stderr, proc.stderr
    assert proc.returncode == EXIT_BROKEN_PIPE


def test_serve_help_shows_each_apis_max_tokens_default(capsys) -> None:
    from tokenwire.gateway.defaults import (
        COMPLETIONS_MAX_TOKENS,
        DEFAULT_MAX_TOKENS,
        LLAMA_CPP_SAMPLING,
    )

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert f"/v1/completions {COMPLETIONS_MAX_TOKENS}" in out
    assert f"the embedded engine stops at {DEFAULT_MAX_TOKENS}" in out
    assert "(max_output_tokens) set none" in out and LLAMA_CPP_SAMPLING.describe() in out


def test_complete_help_shows_its_max_tokens_default(capsys) -> None:
    from tokenwire.cli.client_cmds import DEFAULT_MAX_TOKENS

    with pytest.raises(SystemExit):
        main(["complete", "--help"])
    assert f"(default {DEFAULT_MAX_TOKENS})" in " ".join(capsys.readouterr().out.split())
