"""Start N ``tokenwire serve`` instances on N ports, sharing one Redis, behind a balancer.

``tokenwire cluster`` (cli/cluster.py) is this module with flags: each instance is a child
process running ``tokenwire serve --host 127.0.0.1 --port P <the serve arguments>``, with
``TOKENWIRE_STATE_URL`` set to the shared Redis URL when one is given (every instance then
shares the response store, pins, breakers and limits: README "Deployment: several
instances"); the balancer (``balancer.py``) listens in front, round-robin per request.

It is the worked example of a deployment, not a process supervisor: an instance that exits
is reported and skipped by the balancer, not restarted (systemd, Kubernetes or a container
runtime does that in production). Stopping the launcher (SIGINT, SIGTERM) stops the
balancer, then sends each instance SIGTERM (so its streams drain, ``--drain-grace``), and
SIGKILL to any still running after :data:`STOP_TIMEOUT_S`. A launcher that is itself
SIGKILLed cannot do that: its instances keep running (they share its process group, so a
terminal's Ctrl-C reaches them all, and ``kill -- -PGID`` stops the lot).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tokenwire.config_tables import check_port
from tokenwire.errors import ConfigError, ListenError

from .balancer import Backend, Balancer

__all__ = [
    "MAX_INSTANCES",
    "READY_TIMEOUT_S",
    "STATE_URL_ENV",
    "STOP_TIMEOUT_S",
    "Cluster",
    "Instance",
]

log = logging.getLogger(__name__)

#: The environment variable ``tokenwire serve`` reads the ``[state]`` Redis URL from.
STATE_URL_ENV = "TOKENWIRE_STATE_URL"
#: An instance loading the embedded engine on a busy 2-core machine takes tens of seconds;
#: one that has not answered ``GET /health`` after this is reported as failed.
READY_TIMEOUT_S = 300.0
#: SIGTERM drains an instance's streams for its ``--drain-grace`` (30 s by default); past
#: this the launcher kills it.
STOP_TIMEOUT_S = 45.0
#: Sixteen processes on one machine is already past what the demo is for.
MAX_INSTANCES = 16
#: Serve flags the launcher sets itself for each instance.
_OWN_FLAGS = ("--host", "--port")


@dataclass
class Instance:
    """One ``tokenwire serve`` child."""

    index: int
    port: int
    process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid


@dataclass
class Cluster:
    """``instances`` gateway processes on ``ports`` and a :class:`Balancer` on ``port``."""

    ports: Sequence[int]
    serve_args: Sequence[str] = ()
    host: str = "127.0.0.1"
    port: int = 8080
    state_url: str | None = None
    log_dir: Path | None = None
    env: Mapping[str, str] | None = None
    instances: list[Instance] = field(default_factory=list)
    balancer: Balancer | None = None

    def __post_init__(self) -> None:
        if not 1 <= len(self.ports) <= MAX_INSTANCES:
            raise ConfigError(f"cluster: 1 to {MAX_INSTANCES} instances")
        check_port(self.port, "cluster: the balancer's port")  # 0: any free one
        for i, port in enumerate(self.ports):
            check_port(port, f"cluster: instance {i}'s port", lowest=1)
        if len(set(self.ports)) != len(self.ports) or self.port in self.ports:
            raise ConfigError("cluster: every instance and the balancer need their own port")
        for flag in _OWN_FLAGS:
            if any(a == flag or a.startswith(flag + "=") for a in self.serve_args):
                raise ConfigError(f"cluster: {flag} is set by the launcher for each instance")

    async def start(self) -> None:
        """Start every instance, wait until each answers ``/health``, then the balancer."""
        env = dict(os.environ if self.env is None else self.env)
        if self.state_url:
            env[STATE_URL_ENV] = self.state_url
        for i, port in enumerate(self.ports):
            _check_free(i, port)
        try:
            for i, port in enumerate(self.ports):
                self.instances.append(await self._spawn(i, port, env))
            waits = [asyncio.ensure_future(_wait_ready(inst)) for inst in self.instances]
            try:
                await asyncio.gather(*waits)
            finally:  # one that failed ends the others' waits (up to READY_TIMEOUT_S each)
                for wait in waits:
                    wait.cancel()
            self.balancer = Balancer([Backend("127.0.0.1", p) for p in self.ports],
                                     host=self.host, port=self.port)
            self.port = await self.balancer.start()
        except BaseException:
            await self.stop()
            raise

    async def _spawn(self, index: int, port: int, env: dict[str, str]) -> Instance:
        cmd = [sys.executable, "-m", "tokenwire.cli.main", "serve", "--host", "127.0.0.1",
               "--port", str(port), *self.serve_args]
        out: int | None = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            out = os.open(self.log_dir / f"instance-{index}.log",
                          os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            proc = await asyncio.create_subprocess_exec(
                *cmd, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=out,
                stderr=asyncio.subprocess.STDOUT if out is not None else None)
        finally:
            if out is not None:
                os.close(out)
        return Instance(index, port, proc)

    async def stop(self) -> None:
        """Stop the balancer, then drain and stop every instance still running."""
        if self.balancer is not None:
            await self.balancer.aclose()
        running = [i for i in self.instances
                   if i.process is not None and i.process.returncode is None]
        for inst in running:
            with contextlib.suppress(ProcessLookupError):
                inst.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        for inst in running:
            assert inst.process is not None
            try:
                await asyncio.wait_for(inst.process.wait(), STOP_TIMEOUT_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    inst.process.kill()
                await inst.process.wait()

    async def watch(self) -> None:
        """Report each instance that exits (the balancer skips it from then on)."""
        async def one(inst: Instance) -> None:
            assert inst.process is not None
            code = await inst.process.wait()
            print(f"tokenwire cluster: instance {inst.index} ({inst.url}) exited with "
                  f"status {code}; the balancer skips it", file=sys.stderr, flush=True)

        await asyncio.gather(*(one(i) for i in self.instances))

    def banner(self) -> str:
        lines = [f"tokenwire cluster: balancer on http://{self.host}:{self.port}, "
                 f"round-robin over {len(self.instances)} instances"
                 + (" sharing state on Redis" if self.state_url else
                    " (no shared state: give --state-url for Redis)")]
        lines += [f"  instance {i.index}: {i.url} (pid {i.pid})" for i in self.instances]
        return "\n".join(lines)


def _check_free(index: int, port: int) -> None:
    """Refuse an instance port another process listens on. Readiness is any answer on the
    port, so the other server's (a 404 from whatever it is) passed for the instance's, which
    meanwhile exited unable to bind: the banner named it and the balancer sent every request
    of that turn to the stranger."""
    with socket.socket() as probe:
        # As uvicorn binds: a port in TIME_WAIT is free, one with a listener is not.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            raise ListenError(f"cluster: instance {index}'s port 127.0.0.1:{port} is not "
                              f"free ({exc.strerror or exc}); choose others with "
                              "--instance-ports or --port") from None


async def _wait_ready(inst: Instance) -> None:
    assert inst.process is not None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + READY_TIMEOUT_S
    async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
        while True:
            if inst.process.returncode is not None:
                raise ConfigError(f"cluster: instance {inst.index} (port {inst.port}) exited "
                                  f"with status {inst.process.returncode} while starting")
            with contextlib.suppress(httpx.HTTPError):
                await client.get(inst.url + "/health")
                return
            if loop.time() > deadline:
                raise ConfigError(f"cluster: instance {inst.index} did not answer /health "
                                  f"within {READY_TIMEOUT_S:g} s")
            await asyncio.sleep(0.2)
