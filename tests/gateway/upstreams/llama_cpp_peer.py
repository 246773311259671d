"""``python -m llama_cpp.server`` (the real peer in ``.venv-peers``) on a free loopback port.

The session's shared server is the ``llama_server`` fixture (conftest.py); suites that need
their own server call :func:`llama_server` (``test_llama_cpp_overflow.py`` runs one with a
small ``--n_ctx``). Its output goes to a file, not a pipe (llama.cpp logs a lot at load, and a full
pipe would block it); uvicorn's access log (stdout) is in it, one line per request, which is
how a test counts what reached the upstream (:meth:`LlamaServer.posts`).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tokenwire.gguf_tokenizer import smollm2_gguf_path

__all__ = ["PEERS_PY", "SHARED_N_CTX", "LlamaServer", "free_port", "llama_server",
           "require_peer"]

PEERS_PY = Path(__file__).resolve().parents[3] / ".venv-peers" / "bin" / "python"
#: Loading the GGUF takes a few seconds idle; the machine is shared, so be generous.
START_TIMEOUT_S = 180
#: The context of the session's shared server (the ``llama_server`` fixture in conftest.py).
SHARED_N_CTX = 2048
_ACCESS = re.compile(rb'"POST (\S+) HTTP/1\.1" (\d{3})')


def require_peer() -> None:
    """Skip the calling module when the peer is absent (fail in CI, where it must be)."""
    if PEERS_PY.exists():
        return
    if os.environ.get("CI") == "true":
        raise RuntimeError(f"{PEERS_PY} is absent in CI: scripts/peers-venv.sh failed")
    pytest.skip(f"{PEERS_PY} is absent: run scripts/peers-venv.sh (./dev does) to get "
                "llama_cpp.server", allow_module_level=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LlamaServer:
    url: str  # ends in /v1
    model: str  # the id its /v1/models lists
    n_ctx: int
    log_path: Path

    def posts(self) -> list[tuple[str, int]]:
        """Every POST the server logged so far, as (path, status), in order."""
        return [(m[1].decode(), int(m[2])) for m in _ACCESS.finditer(self.log_path.read_bytes())]


@contextmanager
def llama_server(tmp: Path, *, n_ctx: int) -> Iterator[LlamaServer]:
    port = free_port()
    log_path = tmp / "stderr.log"
    with log_path.open("w+b") as log:
        proc = subprocess.Popen(
            [str(PEERS_PY), "-m", "llama_cpp.server", "--host", "127.0.0.1", "--port",
             str(port), "--model", str(smollm2_gguf_path()), "--n_ctx", str(n_ctx),
             "--n_threads", "1"], stdout=log, stderr=log)
        url = f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    pytest.fail(f"llama_cpp.server exited: {log.read()[-2000:]!r}")
                try:
                    models = httpx.get(url + "/models", timeout=2).json()["data"]
                    break
                except httpx.HTTPError:
                    if time.monotonic() > deadline:
                        pytest.fail("llama_cpp.server did not answer /v1/models in time")
                    time.sleep(0.5)
            yield LlamaServer(url, models[0]["id"], n_ctx, log_path)
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
