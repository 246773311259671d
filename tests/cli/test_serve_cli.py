"""``tokenwire serve``: flags -> settings, and the no-argument start-up on a real port."""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time

import httpx
import pytest

from tokenwire.cli import serve as serve_cmd
from tokenwire.codec.versioning import VersionPolicyMode
from tokenwire.errors import ConfigError


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve_cmd.register(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


def test_defaults_serve_loopback_8080_with_the_default_window(monkeypatch) -> None:
    for var in ("CODEC_SAFETY_POLICY", "CODEC_SAFETY_POLICY_REQUIRED", "CODEC_VERSION_POLICY"):
        monkeypatch.delenv(var, raising=False)
    s = serve_cmd.settings_from_args(_args())
    assert (s.host, s.port, s.zstd_dicts) == ("127.0.0.1", 8080, {})
    assert not s.version_policy.any_enabled


def test_flags_override_the_environment(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("CODEC_VERSION_POLICY", "advisory")
    d = tmp_path / "m.zstd"
    d.write_bytes(b"\x37\xa4\x30\xec" + bytes(200))
    s = serve_cmd.settings_from_args(_args(
        "--version-policy", "strict", "--safety-policy", "p1", "--banned-ids", "5, 7",
        "--safety-policy-required", "--coalesce-ms", "20", f"--zstd-dict=msgpack={d}"))
    assert s.version_policy.version_policy is VersionPolicyMode.STRICT
    assert s.version_policy.safety_policy_required and s.banned_ids == {5, 7}
    assert s.window_s == pytest.approx(0.02) and s.zstd_dicts["msgpack"].raw == d.read_bytes()


@pytest.mark.parametrize("argv", [["--banned-ids", "1,x", "--safety-policy", "p"],
                                  ["--banned-ids", "1"], ["--zstd-dict", "msgpack"],
                                  ["--zstd-dict", "cbor=/dev/null"]])
def test_bad_settings_are_config_errors(argv) -> None:
    with pytest.raises(ConfigError):
        serve_cmd.settings_from_args(_args(*argv))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_serve_starts_and_says_where_what_and_which_map() -> None:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokenwire.cli.main", "serve", "--port", str(port),
         "--threads", "1"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
            time.sleep(0.5)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert f"listening on http://127.0.0.1:{port}" in out
    assert "SmolLM2-135M-Instruct" in out
    assert "huggingfacetb/smollm2 sha256:" in out
