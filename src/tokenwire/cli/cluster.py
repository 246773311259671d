"""``tokenwire cluster``: N ``tokenwire serve`` instances and a round-robin balancer in front.

The worked example of README "Deployment: several instances"::

    tokenwire cluster --instances 3 --port 8080 --state-url redis://127.0.0.1:6379/0 \\
        -- --upstream http://127.0.0.1:8000/v1

Everything after ``--`` is given to every instance's ``tokenwire serve`` (the launcher sets
``--host 127.0.0.1`` and ``--port`` itself). Instances listen on the ports after the
balancer's (8081, 8082, 8083 above) unless ``--instance-ports`` names them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import os
import signal
import sys
from pathlib import Path

from tokenwire.cluster.launcher import MAX_INSTANCES, STATE_URL_ENV, Cluster
from tokenwire.errors import ConfigError, ListenError

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "cluster", help="run several serve instances behind a local round-robin balancer",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--instances", type=int, default=3, metavar="N",
                   help=f"gateway instances to start (default 3, at most {MAX_INSTANCES})")
    p.add_argument("--host", default="127.0.0.1",
                   help="address the balancer binds (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="balancer port (default 8080)")
    p.add_argument("--instance-ports", metavar="P,P,...",
                   help="the instances' ports (default: the N ports after --port)")
    p.add_argument("--state-url", metavar="URL",
                   help=f"the Redis every instance shares (sets {STATE_URL_ENV} for each; "
                        "default: that variable, if set)")
    p.add_argument("--log-dir", type=Path, metavar="DIR",
                   help="write each instance's output to DIR/instance-N.log (default: this "
                        "terminal)")
    p.add_argument("serve_args", nargs=argparse.REMAINDER, metavar="-- SERVE-ARGS",
                   help="arguments for every instance's `tokenwire serve`")
    p.set_defaults(func=_run)


def _ports(args: argparse.Namespace) -> list[int]:
    if args.instance_ports:
        try:
            ports = [int(p) for p in args.instance_ports.split(",")]
        except ValueError:
            raise ConfigError("--instance-ports: a comma-separated list of ports") from None
        if len(ports) != args.instances:
            raise ConfigError(f"--instance-ports names {len(ports)} ports for "
                              f"{args.instances} instances")
        return ports
    return [args.port + 1 + i for i in range(args.instances)]


def _check_exposure(host: str, serve_args: list[str]) -> None:
    """The instances see every request as coming from the balancer (loopback), and admit
    loopback clients without a key when no keys are configured: a balancer reachable from
    other hosts must front instances that have keys."""
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(host).is_loopback:
            return
    if host == "localhost":
        return
    if any(a.startswith("--allow-unauthenticated-localhost") for a in serve_args):
        raise ConfigError(f"cluster: a balancer on {host} with "
                          "--allow-unauthenticated-localhost would let every remote client "
                          "in without a key (the instances see the balancer's loopback "
                          "address)")
    if os.environ.get("TOKENWIRE_API_KEYS") \
            or any(a.startswith("--api-keys-env") for a in serve_args):
        return
    raise ConfigError(f"cluster: a balancer on {host} would let remote clients in without a "
                      "key (the instances see the balancer's loopback address): set "
                      "TOKENWIRE_API_KEYS (or --api-keys-env) for the instances")


def _run(args: argparse.Namespace) -> int:
    serve_args = list(args.serve_args)
    if serve_args[:1] == ["--"]:
        serve_args = serve_args[1:]
    _check_exposure(args.host, serve_args)
    cluster = Cluster(ports=_ports(args), serve_args=serve_args, host=args.host,
                      port=args.port, state_url=args.state_url or os.environ.get(STATE_URL_ENV),
                      log_dir=args.log_dir)
    return asyncio.run(_serve(cluster))


async def _serve(cluster: Cluster) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # The handlers are in place from here, so a Ctrl-C or SIGTERM while the instances start
    # (up to READY_TIMEOUT_S: an engine loading, or one that never answers) only set the
    # event, and the launcher kept waiting for readiness before it stopped: start is raced
    # against it instead (cancelled, it stops what it started).
    starting = asyncio.create_task(cluster.start())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if not starting.done():
        starting.cancel()
        print("tokenwire cluster: interrupted while starting; stopping the instances",
              file=sys.stderr, flush=True)
        with contextlib.suppress(asyncio.CancelledError):
            await starting
        return 130
    try:
        starting.result()
    except OSError as exc:
        raise ListenError(f"cluster: cannot listen on {cluster.host}:{cluster.port}: "
                          f"{exc.strerror or exc}") from None
    print(cluster.banner(), flush=True)
    watcher = asyncio.create_task(cluster.watch())
    try:
        await stop.wait()
    finally:
        print("tokenwire cluster: stopping (instances drain their streams)", file=sys.stderr,
              flush=True)
        watcher.cancel()
        await cluster.stop()
    return 0
