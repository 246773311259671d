"""A real ``redis-server`` for the shared-state tests, started on a free port in a temp dir.

Debian's package (``scripts/system-packages.sh`` installs it). Each server is its own
process with its own data directory, so tests can kill it (``kill``), bring it back with the
data it had persisted (``start`` again after ``stop``), or restart it empty (``flush``).
Tests that need it use the ``redis_server`` fixture (tests/conftest.py); without the binary
they skip outside CI and fail in CI (``CI=true``), where ``./dev`` must have installed it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

#: How long a starting server may take to answer PING. A safety net for a loaded machine,
#: not a measurement: the server usually answers within a few milliseconds.
START_TIMEOUT_S = 30.0


def redis_binary() -> str | None:
    return shutil.which("redis-server")


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports: each is held until all are chosen (picked one by
    one and released, the kernel may hand the same port out twice: a cluster test once got
    instance ports [38655, 58777, 38655])."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class RedisServer:
    """One ``redis-server`` process on 127.0.0.1:``port``, data in ``directory``.

    Persistence is the append-only file with ``appendfsync always``, so ``stop`` + ``start``
    keeps every acknowledged write (the "restart Redis with its data" fault) and ``kill``
    (SIGKILL) loses nothing acknowledged either.
    """

    def __init__(self, directory: Path, *, password: str | None = None) -> None:
        self.directory = directory
        self.password = password
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = redis_binary()
        if binary is None:
            raise RuntimeError("redis-server is not installed (scripts/system-packages.sh)")
        self.directory.mkdir(parents=True, exist_ok=True)
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.directory), "--appendonly", "yes",
                "--appendfsync", "always", "--save", "", "--daemonize", "no",
                "--protected-mode", "no", "--logfile", str(self.directory / "redis.log")]
        if self.password:
            args += ["--requirepass", self.password]
        self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                log = (self.directory / "redis.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"redis-server exited with {self.process.returncode}: {log}")
            if self._ping():
                return
            time.sleep(0.02)
        raise RuntimeError(f"redis-server did not answer PING within {START_TIMEOUT_S} s")

    def _ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as s:
                if self.password:
                    s.sendall(f"AUTH {self.password}\r\n".encode())
                    s.recv(64)
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        """A clean shutdown (SIGTERM): the server flushes its append-only file and exits."""
        self._end(signal.SIGTERM)

    def kill(self) -> None:
        """The fault: SIGKILL, as a crashed or partitioned Redis."""
        self._end(signal.SIGKILL)

    def _end(self, sig: int) -> None:
        if self.process is None or self.process.poll() is not None:
            self.process = None
            return
        os.kill(self.process.pid, sig)
        self.process.wait(timeout=START_TIMEOUT_S)
        self.process = None

    def restart(self) -> None:
        """Stop and start on the same port and data directory (data survives)."""
        self.stop()
        self.start()

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
