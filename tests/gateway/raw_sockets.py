"""Raw client sockets against a served gateway, for the connection-hardening tests
(``test_connection_limits.py`` over HTTP/1.1, ``test_http2_hardening.py`` over HTTP/2).

A raw socket can do what no well-behaved client does (stay silent, drip a head, hold a
connection open); the server is ``serve_gateway`` (``test_hardening.serve_stack``) with keys
and a deep listen backlog, so a flood is not refused by the kernel first.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tokenwire.gateway.settings import ServerSettings

from .test_hardening import KEY, Stack, serve_stack, stop_stacks

#: Safety net for "the server closes it" (each test configures a deadline of a few seconds).
CLOSE_WAIT_S = 60


#: The event loops the hardening tests run on: each `tokenwire serve --loop` serves (uvloop,
#: the default where installed, and asyncio's own, the fallback).
EVENT_LOOPS = ("uvloop", "asyncio")


def keyed_stacks(smollm2_map: Any, *, backlog: int, event_loop: str = "auto",
                 ) -> Iterator[Callable[..., Stack]]:
    """For a module fixture: ``guarded(**settings) -> Stack``, ``serve_gateway`` with
    ``KEY`` required, on a socket with a ``backlog``-deep queue, on ``event_loop``; all
    stop at the end. ``"uvloop"`` skips where uvloop is not installed."""
    if event_loop == "uvloop":
        pytest.importorskip("uvloop")
    running: list[tuple[Any, threading.Thread]] = []
    patch = pytest.MonkeyPatch()
    yield lambda **kw: serve_stack(patch, running,
                                   ServerSettings(api_keys=(KEY,), auth="keys",
                                                  event_loop=event_loop, **kw),
                                   smollm2_map, backlog=backlog)
    stop_stacks(patch, running)


def connect_from(port: int, source: str = "127.0.0.1") -> socket.socket:
    """A TCP connection to the gateway from loopback address ``source`` (the per-address
    caps count by it: 127.0.0.2, .3, ... are other clients)."""
    conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    conn.bind((source, 0))
    conn.connect(("127.0.0.1", port))
    return conn


def read_until_closed(conn: socket.socket, wait: float = CLOSE_WAIT_S) -> bytes:
    """Everything the server sends until it closes; fails if it keeps the socket open."""
    conn.settimeout(wait)
    data = b""
    try:
        while chunk := conn.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        pytest.fail(f"the server kept the connection open for {wait} s; got {data!r}")
    return data


def read_all_until_closed(conns: list[socket.socket], wait: float = CLOSE_WAIT_S
                          ) -> tuple[dict[socket.socket, bytes], set[socket.socket]]:
    """Read every socket (at once, with a selector) until the server closes it, for up to
    ``wait`` seconds: what each received, and the ones still open."""
    sel = selectors.DefaultSelector()
    data: dict[socket.socket, bytes] = {}
    for conn in conns:
        conn.setblocking(False)
        sel.register(conn, selectors.EVENT_READ)
        data[conn] = b""
    deadline = time.monotonic() + wait
    open_ = set(conns)
    while open_ and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=1.0):
            conn = key.fileobj
            try:
                chunk = conn.recv(65536)  # type: ignore[union-attr]
            except ConnectionResetError:
                chunk = b""
            if chunk:
                data[conn] += chunk  # type: ignore[index]
                continue
            sel.unregister(conn)
            open_.discard(conn)  # type: ignore[arg-type]
    sel.close()
    return data, open_


def wait_busy(stack: Stack, count: int, wait: float = CLOSE_WAIT_S) -> None:
    """Wait until ``count`` of the server's connections have a request in flight (its
    connection table: none evictable). A sleep would be a guess: on a loaded machine the
    server can accept the next connection before it has read the earlier heads, and then
    it evicts one of them instead of refusing the newcomer."""
    table = stack.server.config.http.keywords["table"]  # guarded_protocol's partial
    deadline = time.monotonic() + wait
    while not (len(table) == count and not table._waiting):
        assert time.monotonic() < deadline, f"{len(table)} connections, not {count} busy"
        time.sleep(0.01)
