"""``rediss://``: the connection verifies the server's certificate against ``tls_ca_file``.

A real ``redis-server`` listening with TLS only (``--port 0 --tls-port``), its certificate
issued by a throwaway CA (``trustme``). With the CA the connection is up; without it the
handshake fails verification and the connection is degraded, never unverified."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import pytest

from tests.redis_server import START_TIMEOUT_S, free_port, redis_binary
from tokenwire.gateway.state.config import resolve_state
from tokenwire.gateway.state.redis_conn import RedisConn

trustme = pytest.importorskip("trustme")


@pytest.fixture
def tls_redis(tmp_path: Path):
    binary = redis_binary()
    if binary is None:
        pytest.skip("redis-server is not installed (scripts/system-packages.sh)")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_path, key_path, ca_path = (tmp_path / n for n in ("cert.pem", "key.pem", "ca.pem"))
    cert.cert_chain_pems[0].write_to_path(cert_path)
    cert.private_key_pem.write_to_path(key_path)
    ca.cert_pem.write_to_path(ca_path)
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(cert_path), "--tls-key-file", str(key_path),
         "--tls-ca-cert-file", str(ca_path), "--tls-auth-clients", "no", "--save", "",
         "--appendonly", "no", "--dir", str(tmp_path), "--protected-mode", "no",
         "--logfile", str(tmp_path / "redis.log")],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        cwd=tmp_path)
    try:
        yield port, ca_path, proc, tmp_path / "redis.log"
    finally:
        proc.kill()
        proc.wait(30)


def _up(url: str, ca: Path | None, proc: subprocess.Popen) -> bool:
    table = {"url": url, "timeout_ms": 5000, **({"tls_ca_file": str(ca)} if ca else {})}
    config = resolve_state(table, env={})

    async def main() -> bool:
        conn = RedisConn(config)
        try:
            return await conn.check()
        finally:
            await conn.aclose()
    return asyncio.run(main())


def test_rediss_with_the_ca_is_up_and_without_it_is_refused(tls_redis) -> None:
    port, ca, proc, log = tls_redis
    url = f"rediss://127.0.0.1:{port}/0"
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _up(url, ca, proc):  # the server is starting (a safety net, not a measure)
        assert proc.poll() is None, log.read_text(errors="replace")[-2000:]
        assert time.monotonic() < deadline, "the TLS redis-server did not answer"
        time.sleep(0.1)
    assert not _up(url, None, proc)  # the system's CAs do not know the throwaway one
    assert not _up(f"redis://127.0.0.1:{port}/0", None, proc)  # plaintext to a TLS port
