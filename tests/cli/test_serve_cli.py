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
from tokenwire.gateway.server import loop_name, serving_loop_factory


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
    assert f"event loop: {loop_name(serving_loop_factory('auto'))}" in out  # uvloop here


# -- errors a person can act on (issue 10) ----------------------------------------------------


def _serve(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tokenwire.cli.main", "serve", *argv],
                          capture_output=True, text=True, timeout=120)


def test_a_missing_model_file_is_one_line_and_exit_1(tmp_path) -> None:
    proc = _serve("--model", str(tmp_path / "nonexistent.gguf"), "--port", str(_free_port()))
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and "listening" not in proc.stdout
    [line] = [ln for ln in proc.stderr.splitlines() if ln.startswith("tokenwire: error:")]
    assert "nonexistent.gguf does not exist" in line


@pytest.mark.slow
def test_a_file_llama_cpp_cannot_load_says_why(tmp_path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model at all")
    proc = _serve("--model", str(bad), "--port", str(_free_port()))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "could not be loaded by llama.cpp" in proc.stderr and "GGUF" in proc.stderr


def test_a_busy_port_is_one_line_exit_3_and_no_listen_banner() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        proc = _serve("--port", str(taken.getsockname()[1]))
    assert proc.returncode == 3
    assert "listening" not in proc.stdout and "Traceback" not in proc.stderr
    assert "already in use" in proc.stderr and "--port" in proc.stderr


def test_the_capacity_line_says_what_the_embedded_engine_really_does() -> None:
    from tokenwire.cli.serve import capacity_line
    from tokenwire.gateway.supervision.admission import Admission

    one = Admission(max_concurrent=4, queue_size=1, limits={1: 1}, all_limited=True)
    assert capacity_line(one).startswith("1 generation(s) at once")
    assert "up to 1 more wait in line, then 429" in capacity_line(one)


@pytest.mark.slow
def test_llama_cpp_warnings_stay_off_stderr_and_its_errors_do_not(capfd) -> None:
    import ctypes

    import llama_cpp

    from tokenwire.gateway.upstreams.embedded_model import silence_llama_logs
    from tokenwire.gguf_tokenizer import smollm2_gguf_path

    silence_llama_logs()
    llama_cpp.Llama(model_path=str(smollm2_gguf_path()), vocab_only=True, verbose=False)
    assert "n_ctx_seq" not in capfd.readouterr().err  # the warning a newcomer saw
    # An error-level message (ggml level 4) still reaches the log.
    import logging

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("tokenwire.llama_cpp").addHandler(handler)
    try:
        from tokenwire.gateway.upstreams import embedded_model

        embedded_model._log_callback(4, b"something real broke\n", ctypes.c_void_p(0))
    finally:
        logging.getLogger("tokenwire.llama_cpp").removeHandler(handler)
    assert [r.getMessage() for r in records] == ["llama.cpp: something real broke"]
