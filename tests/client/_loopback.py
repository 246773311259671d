"""Real loopback servers for client tests: uvicorn on a free 127.0.0.1 port, optionally TLS.

Real peers over mocks (STYLE §6 item 12-13): ASGITransport buffers whole bodies and hides
transport behaviour, so the client tests talk to a uvicorn server over a socket.
"""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn

# How long a test waits for uvicorn to come up before failing (a loaded CI box is slow).
_STARTUP_TIMEOUT_S = 20.0


@contextmanager
def serve(app: object, *, certfile: Path | None = None,
          keyfile: Path | None = None) -> Iterator[str]:
    """Run ``app`` on 127.0.0.1:<free port>; yields the origin (``http(s)://127.0.0.1:N``)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, log_level="warning", lifespan="off",
        ssl_certfile=str(certfile) if certfile else None,
        ssl_keyfile=str(keyfile) if keyfile else None,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + _STARTUP_TIMEOUT_S
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("loopback server did not start")
        time.sleep(0.01)
    scheme = "https" if certfile else "http"
    try:
        yield f"{scheme}://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def have_openssl() -> bool:
    return shutil.which("openssl") is not None


def self_signed_cert(directory: Path) -> tuple[Path, Path]:
    """A throwaway EC certificate for 127.0.0.1 made with the openssl CLI."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )
    return cert, key


def trust(cert: Path) -> ssl.SSLContext:
    """An SSL context that trusts exactly ``cert`` (for httpx ``verify=``)."""
    return ssl.create_default_context(cafile=str(cert))
