"""The real Codex CLI (0.171.0) in front of a pool of two scripted Responses replicas: every
request of a multi-request turn lands on one replica, held there by the gateway's signed
``x-codex-turn-state`` token (``gateway/affinity.py``, ``routing/pool.py``).

Codex (``codex-rs/core/src/client.rs``, ``ModelClientSession.turn_state``) keeps the first
``x-codex-turn-state`` a turn's response gives it (the HTTP response header, or the
WebSocket upgrade's) and sends it back on every later request of that turn. The set-up
makes the token the only thing that keeps the turn in place: replica ``b`` has 1000 times
``a``'s weight, so rendezvous hashing of Codex's ``prompt_cache_key`` prefers ``b`` for
virtually any key; ``b`` starts ejected, so the turn's first request goes to ``a``; as soon
as ``a`` has finished it, the pool's clock (injected, a function of ``a``'s completed count,
so no timing is involved) moves past ``b``'s cool-down. Without the token the tool call's
follow-up would go to ``b``; with it, to ``a``. Both replicas are scripted with the same
answers, so a wrong route shows as a request on ``b``, not as a hang.
"""

from __future__ import annotations

import json

from tests.gateway.test_codex_cli_ws import (
    UPSTREAM_KEY_ENV,
    pytestmark,  # noqa: F401  (slow; skipped without the Codex CLI)
    run_codex,
    serve,  # noqa: F401  (fixture)
)
from tests.gateway.upstreams.fakes_responses import ResponsesStream, Script, ScriptedServer
from tokenwire.gateway.affinity import TURN_STATE_HEADER, read_turn_state
from tokenwire.gateway.ir import IdsSource
from tokenwire.gateway.routing.breaker import Breaker
from tokenwire.gateway.routing.pool import Replica, ReplicaPool
from tokenwire.gateway.routing.router import Router, ServedModel
from tokenwire.gateway.upstreams.base import ModelRoute, UpstreamConfig
from tokenwire.gateway.upstreams.responses_upstream import ResponsesUpstream

MODEL = "m"
#: The built-in provider's run uses a model slug Codex knows, as test_codex_cli_ws.py does.
WS_MODEL = "gpt-5.5"
#: Loopback clients need no key: the key Codex sends is not under test here.
OPEN = {"api_keys": (), "auth": ""}
#: Well past the first cool-down (10 s): the clock's jump once replica a has answered.
_JUMP_S = 1000.0


def _script(srv: ScriptedServer) -> None:
    args = json.dumps({"cmd": "echo hello"})
    srv.push(Script(chunks=ResponsesStream("resp_up1").function_call(
                 "call_ts1", "exec_command", [args[:7], args[7:]]).completed().chunks()),
             Script(chunks=ResponsesStream("resp_up2").message(
                 ["The command ", "printed hello."]).completed().chunks()))


def _pool(a: ScriptedServer, b: ScriptedServer, model: str = MODEL
          ) -> tuple[Router, ReplicaPool]:
    replicas = []
    for name, srv, weight in (("oai/a", a, 1.0), ("oai/b", b, 1000.0)):
        cfg = UpstreamConfig(name=name, kind="responses", base_url=srv.url + "/v1",
                             api_key_env=UPSTREAM_KEY_ENV,
                             models=(ModelRoute(name=model, upstream_model="gpt-test"),))
        replicas.append(Replica(name=name, adapter=ResponsesUpstream.from_config(cfg),
                                weight=weight, limit=4, url=srv.url, breaker=Breaker()))
    holder: dict[str, ReplicaPool] = {}

    def clock() -> float:  # b's cool-down is over once a has answered once
        pool = holder.get("pool")
        return _JUMP_S if pool is not None and pool.replicas[0].completed else 0.0

    pool = ReplicaPool("oai", "responses", replicas, clock=clock, probe_interval_s=3600)
    holder["pool"] = pool
    pool.replicas[1].breaker.force_open(0.0)
    router = Router([ServedModel(name=model, upstream=pool, ids_source=IdsSource.NONE,
                                 upstream_name="oai")], default=model)
    return router, pool


def _streams(srv: ScriptedServer) -> list:
    return [r for r in srv.requests if r.path.endswith("/responses")]


def _scripted_pair(monkeypatch):
    monkeypatch.setenv(UPSTREAM_KEY_ENV, "sk-upstream")
    pair = [ScriptedServer(stream_path="/v1/responses", models_path="/v1/models",
                           models=("gpt-test",)) for _ in range(2)]
    for srv in pair:
        _script(srv)
    return pair


def _check_run(run) -> None:
    assert run.returncode == 0, run.stdout + run.stderr
    [cmd] = run.items("command_execution")
    assert cmd["aggregated_output"].strip() == "hello"
    assert [m["text"] for m in run.items("agent_message")] == ["The command printed hello."]


def test_codex_over_http_keeps_every_request_of_a_turn_on_its_replica(
        serve, monkeypatch, tmp_path) -> None:  # noqa: F811
    a, b = _scripted_pair(monkeypatch)
    try:
        router, pool = _pool(a, b)
        # HTTP only: the WebSocket is off (a custom provider then falls back at once).
        gw = serve(router, **OPEN, responses_websocket=False)
        run = run_codex(gw.url, MODEL, "run echo hello", tmp_path, builtin=False)
        _check_run(run)
        assert len(_streams(a)) == 2 and _streams(b) == []
        posts = gw.recording.posts
        assert len(posts) == 2
        # The first request had no token; the follow-up sent back the one the first
        # response's head gave, naming replica a, signed by this gateway.
        sent = [p["headers"].get(TURN_STATE_HEADER.encode()) for p in posts]
        assert sent[0] is None and sent[1] is not None
        assert read_turn_state(sent[1].decode()) == ("oai/a", None)
        # b was admitted again by then: only the token kept the turn on a.
        assert pool.replicas[1].breaker.admits(pool._clock())
    finally:
        a.stop()
        b.stop()


def test_codex_over_websocket_gets_the_replica_token_on_the_upgrade(
        serve, monkeypatch, tmp_path) -> None:  # noqa: F811
    a, b = _scripted_pair(monkeypatch)
    try:
        router, _ = _pool(a, b, WS_MODEL)
        gw = serve(router, **OPEN)
        # The built-in provider, which always opens the WebSocket first.
        run = run_codex(gw.url, WS_MODEL, "run echo hello", tmp_path, builtin=True)
        _check_run(run)
        assert run.websocket_errors() == [], run.stderr
        assert len(gw.recording.sockets) == 1 and gw.recording.posts == []
        sock = gw.recording.sockets[0]
        token = sock["accept"].get(TURN_STATE_HEADER)
        assert token is not None and read_turn_state(token) == ("oai/a", None)
        assert len(_streams(a)) == 2 and _streams(b) == []
    finally:
        a.stop()
        b.stop()
