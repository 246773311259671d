"""Graceful shutdown of ``tokenwire serve``: drain, then fail cleanly, then exit.

A gateway stopped with a plain uvicorn ``SIGTERM`` waits ``timeout_graceful_shutdown`` and
then cancels whatever is still streaming: those clients see a connection cut mid-answer,
with no terminal event, which is exactly the "broken stream presented as success" issue 6
forbids (a Chat client that stops reading at a cut may well keep the partial text). So on
the first SIGTERM or SIGINT, :class:`GracefulServer`:

1. **Refuses new work**: :class:`DrainGate` answers any inference request that still
   arrives with ``503`` and ``Retry-After`` before its body is read (another instance, or
   this one restarted, can take it); uvicorn stops accepting connections and closes idle
   keep-alive ones; a connection with a request in flight is closed after its response.
2. **Drains**: in-flight streams get ``drain_grace_s`` (30 s) to finish on their own,
   queued ones included (they keep receiving heartbeats and are admitted as slots free).
3. **Fails the rest cleanly**: :meth:`GatewayState.abort_all
   <tokenwire.gateway.http.app.GatewayState.abort_all>` ends every remaining generation with a
   ``capacity`` failure (503, ``server_shutting_down``), which each API renders as its own
   terminal (``response.failed``, an SSE ``error`` event then ``[DONE]``, a Codec frame with
   ``finish_reason: "error"``; a 503 body when no byte was sent yet). It is repeated every
   :data:`_ABORT_POLL_S` until the server exits, because a request that was still uploading
   or validating at step 3 creates its stream afterwards.
4. **Exits**: uvicorn's own ``timeout_graceful_shutdown`` bounds the time those terminals
   get to reach the client (a reader that stopped reading holds its socket), then uvicorn
   cancels what is left.

A second signal during step 2 skips the rest of the grace period (an operator who presses
Ctrl+C twice wants out, but still wants clients told); uvicorn's own rule that a second
SIGINT forces exit still holds for the waits after it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING

import uvicorn
from uvicorn.protocols.websockets.wsproto_impl import WSProtocol

from tokenwire.gateway.http.admission import is_inference, send_refusal
from tokenwire.gateway.http.asgi import ASGIApp, Receive, Scope, Send
from tokenwire.gateway.ir import Failure, FailureClass

if TYPE_CHECKING:
    import socket

    from tokenwire.gateway.http.state import GatewayState

__all__ = [
    "DEFAULT_DRAIN_GRACE_S",
    "DEFAULT_FLUSH_S",
    "SHUTDOWN_RETRY_AFTER_S",
    "DrainGate",
    "GracefulServer",
    "graceful_server",
    "serve_with_graceful_shutdown",
    "shutdown_failure",
]

log = logging.getLogger(__name__)


#: Time in-flight streams get to finish on their own. Long enough for most answers of a
#: local model to complete, short enough for a process manager's stop timeout (systemd's
#: default is 90 s, Kubernetes' terminationGracePeriodSeconds 30 s: set it above
#: ``drain_grace_s`` + the flush time there).
DEFAULT_DRAIN_GRACE_S = 30.0
#: Time the terminal failures get to reach their clients when the server config leaves
#: uvicorn's ``timeout_graceful_shutdown`` unset (``None`` would wait forever on a client
#: that stopped reading).
DEFAULT_FLUSH_S = 5.0
#: ``Retry-After`` of the 503 sent while draining: a restart or another replica is seconds
#: away, the same short hint as the admission 429.
SHUTDOWN_RETRY_AFTER_S = 1
#: How often streams created after the abort (late uploads) are aborted in turn.
_ABORT_POLL_S = 0.1
_DRAIN_MESSAGE = "The gateway is shutting down; retry shortly."


def shutdown_failure() -> Failure:
    """The terminal every stream still running after the grace period receives: a capacity
    failure, which every client treats as retryable."""
    return Failure(failure_class=FailureClass.CAPACITY, status=503, code="server_shutting_down",
                   retry_after=SHUTDOWN_RETRY_AFTER_S,
                   message="the gateway is shutting down; the request was not completed, "
                           "retry it")


class DrainGate:
    """Pure ASGI middleware: while :attr:`draining`, inference requests get a 503 with
    ``Retry-After`` and ``Connection: close`` before their body is read; everything else
    (``/health``, discovery documents, requests already past the gate) is untouched."""

    def __init__(self, app: ASGIApp, *, retry_after_s: int = SHUTDOWN_RETRY_AFTER_S) -> None:
        self.app = app
        self.retry_after_s = retry_after_s
        self.draining = False
        #: Requests refused while draining (for logs and tests).
        self.refused = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.draining or not is_inference(scope):
            await self.app(scope, receive, send)
            return
        self.refused += 1
        await send_refusal(send, scope["path"], status=503, retry_after_s=self.retry_after_s,
                           message=_DRAIN_MESSAGE,
                           openai=("server_error", "server_shutting_down"),
                           anthropic_type="overloaded_error", close=True)


class GracefulServer(uvicorn.Server):
    """``uvicorn.Server`` whose shutdown drains, then fails, the gateway's streams (see the
    module docstring). Build it with :func:`graceful_server`."""

    def __init__(self, config: uvicorn.Config, state: GatewayState, gate: DrainGate, *,
                 drain_grace_s: float = DEFAULT_DRAIN_GRACE_S) -> None:
        super().__init__(config)
        self.state = state
        self.gate = gate
        self.drain_grace_s = drain_grace_s
        #: Set once the grace period ended with streams left, or a second signal cut it.
        self.aborted = False
        self._cut_short = False

    def begin_shutdown(self) -> None:
        """What a first signal does, for embedding code and tests (any thread: it only sets
        flags, which the server's main loop reads every 0.1 s). Unlike a signal it is not
        re-raised when the server has stopped, so the process lives on."""
        self._stop_requested()
        self.should_exit = True

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Runs in a signal handler: set flags only; the main loop notices within 0.1 s.
        self._stop_requested()
        super().handle_exit(sig, frame)

    def _stop_requested(self) -> None:
        if self.gate.draining:  # a second request: stop waiting for streams to finish
            self._cut_short = True
        self.gate.draining = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.gate.draining = True
        # uvicorn's first steps, taken before the grace period instead of after it: no new
        # connections, idle keep-alive ones closed, busy ones closed after their response.
        for server in getattr(self, "servers", []):
            server.close()
        for sock in sockets or []:
            sock.close()
        # WebSockets drain like HTTP streams (uvicorn's own shutdown() would close them at
        # once with 1012, mid-response): each session closes after its running response.
        self.state.drain_sockets()
        for connection in list(self.server_state.connections):
            if not isinstance(connection, WSProtocol):
                connection.shutdown()
        if self._busy():
            log.warning("shutting down: %d connection(s) in flight get %g s to finish",
                        len(self.server_state.connections), self.drain_grace_s)
            await self._wait_quiet(self.drain_grace_s)
        aborter: asyncio.Task[None] | None = None
        if self._busy() and not self.force_exit:
            log.warning("shutting down: failing %d connection(s) still in flight with "
                        "server_shutting_down", len(self.server_state.connections))
            self.aborted = True
            aborter = asyncio.get_running_loop().create_task(self._abort_until_exit())
        try:
            await super().shutdown(sockets=sockets)  # waits timeout_graceful_shutdown
        finally:
            if aborter is not None:
                aborter.cancel()

    def _busy(self) -> bool:
        return bool(self.server_state.connections or self.server_state.tasks)

    async def _wait_quiet(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._busy() and not (self.force_exit or self._cut_short) \
                and loop.time() < deadline:
            await asyncio.sleep(min(0.1, max(0.0, deadline - loop.time())))

    async def _abort_until_exit(self) -> None:
        failure = shutdown_failure()
        while True:  # abort() is idempotent; repeating catches streams created since
            self.state.abort_all(failure)
            await asyncio.sleep(_ABORT_POLL_S)


def graceful_server(config: uvicorn.Config, state: GatewayState, *,
                    drain_grace_s: float = DEFAULT_DRAIN_GRACE_S) -> GracefulServer:
    """A :class:`GracefulServer` for ``config``, whose app is wrapped in a :class:`DrainGate`
    (outermost: during a drain even an unauthenticated caller learns only "come back later").

    Call before the server starts (uvicorn reads ``config.app`` when it loads)."""
    if config.loaded:
        raise RuntimeError("graceful_server() needs a uvicorn.Config that is not loaded yet")
    gate = DrainGate(config.app)
    config.app = gate
    if config.timeout_graceful_shutdown is None:
        config.timeout_graceful_shutdown = int(DEFAULT_FLUSH_S)
    return GracefulServer(config, state, gate, drain_grace_s=drain_grace_s)


async def serve_with_graceful_shutdown(
    config: uvicorn.Config, state: GatewayState, *,
    drain_grace_s: float = DEFAULT_DRAIN_GRACE_S, sockets: list[socket.socket] | None = None,
    on_server: Callable[[GracefulServer], None] | None = None,
) -> None:
    """Serve ``config`` in the running loop until a signal (or
    :meth:`GracefulServer.begin_shutdown`) and a graceful shutdown have run."""
    server = graceful_server(config, state, drain_grace_s=drain_grace_s)
    if on_server is not None:
        on_server(server)
    await server.serve(sockets=sockets)
