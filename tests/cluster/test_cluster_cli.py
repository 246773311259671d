"""``tokenwire cluster`` as a user runs it: the command, its banner, a request, Ctrl-C."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.cluster.harness import SAFETY_S, SRC
from tests.gateway.upstreams.fakes import Reply, chat_stream, start_fake
from tests.redis_server import free_port, free_ports
from tokenwire.cli.main import main
from tokenwire.cluster.balancer import INSTANCE_HEADER
from tokenwire.gateway.server import loop_name, serving_loop_factory

DEFAULT_LOOP = loop_name(serving_loop_factory("auto"))


def test_a_balancer_on_a_public_address_needs_instance_keys(monkeypatch, capsys) -> None:
    monkeypatch.delenv("TOKENWIRE_API_KEYS", raising=False)
    assert main(["cluster", "--host", "0.0.0.0", "--", "--upstream", "http://x/v1"]) == 1
    assert "without a key" in capsys.readouterr().err


def test_a_public_balancer_refuses_instances_open_on_loopback(monkeypatch, capsys) -> None:
    # Keys are set, but instances that admit loopback without one would admit everybody:
    # every request reaches them from the balancer's loopback address.
    monkeypatch.setenv("TOKENWIRE_API_KEYS", "k-0123456789abcdef")
    assert main(["cluster", "--host", "0.0.0.0", "--", "--upstream", "http://x/v1",
                 "--allow-unauthenticated-localhost"]) == 1
    assert "without a key" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "message"), [
    (["--instances", "0"], "1 to 16 instances"),
    (["--", "--port", "9000"], "--port is set by the launcher"),
    (["--instances", "2", "--instance-ports", "9001"], "names 1 ports for 2 instances"),
    # Past 65535: bind() raised OverflowError (a traceback) for an instance port, and the
    # balancer's 70000 was bound as 70000 % 65536 = 4464 under a banner naming 70000.
    (["--port", "65535", "--", "--upstream", "http://x/v1"],
     "cluster: instance 0's port must be a port number from 1 to 65535, got 65536"),
    (["--port", "70000", "--instance-ports", "9001,9002,9003", "--", "--upstream",
      "http://x/v1"], "cluster: the balancer's port must be a port number from 0 to 65535, "
     "got 70000"),
])
def test_bad_cluster_arguments_are_refused_before_anything_starts(args, message,
                                                                   capsys) -> None:
    assert main(["cluster", *args]) == 1
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_tokenwire_cluster_serves_round_robin_and_stops_on_sigint(redis_server) -> None:
    fake = start_fake(lambda path, body: Reply(chunks=chat_stream("vllm", ["ok"])))
    port, *instances = free_ports(3)
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokenwire.cli.main", "cluster", "--instances", "2",
         "--port", str(port), "--instance-ports", ",".join(map(str, instances)),
         "--state-url", redis_server.url, "--", "--upstream", fake.url],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        start_new_session=True)  # its own group: a failed test kills the instances too
    try:
        # The instances share the terminal: their own banners come first.
        lines = iter(proc.stdout.readline, "")  # type: ignore[union-attr]
        banners = []
        for head in lines:
            if head.startswith("tokenwire cluster:"):
                break
            banners.append(head)
        # Each instance is a `tokenwire serve --upstream` on the default loop (uvloop here).
        assert sum(line.strip() == f"event loop: {DEFAULT_LOOP}" for line in banners) == 2
        assert "round-robin over 2 instances sharing state on Redis" in head, head
        listed = [next(lines) for _ in range(2)]
        assert all(line.startswith("  instance ") and "pid" in line for line in listed)
        url = f"http://127.0.0.1:{port}"
        seen = set()
        for _ in range(4):
            r = httpx.post(url + "/v1/chat/completions", timeout=SAFETY_S, json={
                "model": "m", "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "ok"
            seen.add(r.headers[INSTANCE_HEADER])
        assert len(seen) == 2
        proc.send_signal(signal.SIGINT)
        assert proc.wait(SAFETY_S) == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        proc.stdout.close()  # type: ignore[union-attr]
        fake.stop()


def test_an_instance_port_another_process_listens_on_is_refused_before_anything_starts(
        capsys) -> None:
    """Readiness was any answer on the port: another server's 404 passed for the instance,
    which exited unable to bind, and the balancer forwarded to the stranger (reproduced with
    ``python -m http.server`` on the instance's port: ``GET /v1/models`` through the
    balancer answered its ``404 File not found``)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["cluster", "--instances", "1", "--port", str(free_port()),
                     "--instance-ports", str(port), "--", "--upstream", "http://x/v1"]) == 3
    err = capsys.readouterr().err
    assert f"127.0.0.1:{port} is not free" in err and "instance 0" in err


@pytest.mark.slow
def test_ctrl_c_while_the_instances_start_stops_them_at_once() -> None:
    """The signal handlers were installed before the start, so SIGINT while an instance was
    not ready yet (here: its upstream accepts and never answers the start-up probe) only set
    the stop event: the launcher kept waiting for readiness (up to 300 s), then exited 1 on
    the instance's start-up failure, never 130."""
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen()
        upstream = f"http://127.0.0.1:{hung.getsockname()[1]}/v1"
        env = {**os.environ, "PYTHONPATH": str(SRC)}
        ports = free_ports(2)
        proc = subprocess.Popen(
            [sys.executable, "-m", "tokenwire.cli.main", "cluster", "--instances", "1",
             "--port", str(ports[0]), "--instance-ports", str(ports[1]), "--",
             "--upstream", upstream],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            start_new_session=True)
        try:
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
            deadline = time.monotonic() + SAFETY_S
            while not children.read_text().split():  # the instance is spawned: start() runs
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.05)
            child = int(children.read_text().split()[0])
            proc.send_signal(signal.SIGINT)
            assert proc.wait(SAFETY_S) == 130
            assert "interrupted while starting" in proc.stderr.read()  # type: ignore[union-attr]
            assert not Path(f"/proc/{child}").exists()  # stopped and reaped
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            proc.stderr.close()  # type: ignore[union-attr]
