"""``tokenwire check`` and the one-report start-up (issue 10): every problem of a
configuration (keys, maps, variables, probes) in one go, nothing started."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tokenwire.cli.main import main

BAD = """\
[server]
colour = "blue"

[[upstreams]]
name = "v"
kind = "openai"
base_url = "http://127.0.0.1:{port}/v1"
api_key_env = "TW_TEST_UNSET_VAR"
[[upstreams.models]]
name = "q"
map = "acme/no-such-map"

[[upstreams]]
name = "down"
kind = "openai"
base_url = "http://127.0.0.1:{port}/v1"
[[upstreams.models]]
name = "x"
"""


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def bad_file(tmp_path: Path) -> Path:
    f = tmp_path / "gateway.toml"
    f.write_text(BAD.format(port=_closed_port()))
    return f


def _assert_all_four(text: str) -> None:
    assert "unknown key 'colour'" in text
    assert "TW_TEST_UNSET_VAR, which is not set" in text
    assert "unknown map id 'acme/no-such-map'" in text
    assert "upstream 'down'" in text and "unreachable" in text


def test_check_prints_every_problem_and_exits_1(bad_file, capsys, monkeypatch) -> None:
    monkeypatch.delenv("TW_TEST_UNSET_VAR", raising=False)
    assert main(["check", "--config", str(bad_file)]) == 1
    err = capsys.readouterr().err
    _assert_all_four(err)
    assert "4 problem(s); nothing was started" in err


def test_check_of_a_good_file_is_ok(tmp_path, capsys) -> None:
    f = tmp_path / "ok.toml"
    f.write_text('[[upstreams]]\nname = "later"\nkind = "openai"\n'
                 'base_url = "http://127.0.0.1:9/v1"\nprobe = false\n'
                 '[[upstreams.models]]\nname = "m"\nmap = "huggingfacetb/smollm2"\n')
    assert main(["check", "--config", str(f)]) == 0
    assert "tokenwire check: ok" in capsys.readouterr().out


def test_serve_reports_every_problem_in_one_start(bad_file) -> None:
    env = {k: v for k, v in __import__("os").environ.items() if k != "TW_TEST_UNSET_VAR"}
    proc = subprocess.run([sys.executable, "-m", "tokenwire.cli.main", "serve", "--config",
                           str(bad_file), "--port", str(_closed_port())],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "4 problems in the configuration" in proc.stderr
    _assert_all_four(proc.stderr)
    assert "listening" not in proc.stdout


def test_check_no_probe_checks_the_file_only(bad_file, capsys, monkeypatch) -> None:
    monkeypatch.delenv("TW_TEST_UNSET_VAR", raising=False)
    assert main(["check", "--no-probe", "--config", str(bad_file)]) == 1
    err = capsys.readouterr().err
    assert "3 problem(s)" in err and "unreachable" not in err


def test_check_refuses_the_server_values_serve_refuses(tmp_path, capsys) -> None:
    """[server]'s times, port and sizes are checked where serve builds its settings:
    `tokenwire check` said ok to idle_timeout_s = inf and port = 70000, which serve
    refuses at start-up."""
    f = tmp_path / "gateway.toml"
    f.write_text("[server]\nidle_timeout_s = inf\nport = 70000\n[[upstreams]]\nname = \"v\"\n"
                 "kind = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\nprobe = false\n")
    assert main(["check", "--config", str(f), "--no-probe"]) == 1
    err = capsys.readouterr().err
    assert "problem: port must be a port number from 0 to 65535, got 70000" in err
