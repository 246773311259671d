"""The launcher's start-up, with its children and their readiness replaced (sans processes)."""

from __future__ import annotations

import asyncio

import pytest

from tests.redis_server import free_ports
from tokenwire.cluster import launcher
from tokenwire.errors import ConfigError


def test_an_instance_that_fails_to_start_ends_the_other_instances_waits(monkeypatch) -> None:
    """``gather`` left the other instances' readiness waits running after the first failed
    (each up to READY_TIMEOUT_S, then an exception nobody read)."""
    cancelled: list[int] = []

    async def spawn(self, index: int, port: int, env) -> launcher.Instance:
        return launcher.Instance(index, port)  # no process: stop() has nothing to signal

    async def wait_ready(inst: launcher.Instance) -> None:
        if inst.index == 0:
            raise ConfigError("cluster: instance 0 exited with status 1 while starting")
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(inst.index)
            raise

    monkeypatch.setattr(launcher.Cluster, "_spawn", spawn)
    monkeypatch.setattr(launcher, "_wait_ready", wait_ready)
    *ports, port = free_ports(4)

    async def main() -> None:
        cluster = launcher.Cluster(ports=ports, port=port)
        with pytest.raises(ConfigError, match="instance 0 exited"):
            await cluster.start()
        await asyncio.sleep(0)  # a cancelled wait runs its except clause
        assert sorted(cancelled) == [1, 2]

    asyncio.run(main())
