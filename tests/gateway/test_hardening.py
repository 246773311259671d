"""The served stack of ``tokenwire serve`` (issue 6 item 4): auth, Origin, upgrade, limits.

The app under test is what :func:`~tokenwire.gateway.server.serve_gateway` serves (its
``build_gateway`` replaced by one returning a scripted upstream), on a real uvicorn on a
free loopback port, so the wrapping, the uvicorn limits and the socket behaviour are the
production ones. Settings tables cover the three sources: the config file, the
environment and the flags.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tokenwire.cli import serve as serve_cmd
from tokenwire.codec.requests import CodecRequest, encode_request
from tokenwire.errors import ConfigError
from tokenwire.gateway import server as server_mod
from tokenwire.gateway.config import parse_config
from tokenwire.gateway.http.app import create_app
from tokenwire.gateway.http.connections import MAX_HEAD_BYTES
from tokenwire.gateway.http.security import CrashBarrier, SecurityMiddleware
from tokenwire.gateway.http.state import GatewayState
from tokenwire.gateway.ir import (
    Finish,
    FinishKind,
    IdsSource,
    TokenDelta,
    Usage,
)
from tokenwire.gateway.routing.router import Router, ServedModel
from tokenwire.gateway.settings import ServerSettings

from .conftest import ScriptedUpstream

KEY = "tw-hardening-key-0123456789"
KEY2 = "tw-second-key-abcdef"
ORIGIN = "https://app.example"
SIMPLE = [(0.0, TokenDelta(ids=(10,), text="a")), (0.0, TokenDelta(ids=(11,), text="b")),
          (0.0, Usage(prompt_tokens=1, completion_tokens=2)),
          (0.0, Finish(reason=FinishKind.EOS))]
SECRET_DETAIL = "secret-detail-in-the-exception-message"


class Scripted(ScriptedUpstream):
    """Hashable by identity: admission keys its per-upstream limits by the upstream object."""

    __hash__ = object.__hash__


async def crashing_route(request: Any) -> Any:
    """A route with a bug: it raises something no exception handler expects."""
    raise RuntimeError(SECRET_DETAIL)


def _crashing_when_asked(endpoint: Any) -> Any:
    """``endpoint``, with a bug that shows when the request carries ``x-test-crash``."""

    async def route(request: Any) -> Any:
        if "x-test-crash" in request.headers:
            raise RuntimeError(SECRET_DETAIL)
        return await endpoint(request)

    return route


def _create_app_with_a_crashing_route(state: GatewayState) -> Any:
    from starlette.routing import Route

    from tokenwire.gateway.http import app as app_mod

    with pytest.MonkeyPatch.context() as patch:  # two inference routes, as create_app finds them
        for name in ("chat_completions", "messages_endpoint"):
            patch.setattr(app_mod, name, _crashing_when_asked(getattr(app_mod, name)))
        app = create_app(state)
    app.router.routes.append(Route("/test/crash", crashing_route, methods=["POST"]))
    return app


@dataclass
class Stack:
    url: str
    port: int
    upstream: Any
    state: GatewayState
    server: Any = None  # the running uvicorn server (``graceful_server``)
    app: Any = None  # what ``wrap`` returned (e.g. a recording middleware), else None
    loop: str = ""  # the package of the loop it runs on: "uvloop" or "asyncio"


def _state(settings: ServerSettings, smollm2_map: Any, upstream: ScriptedUpstream
           ) -> GatewayState:
    router = Router([
        ServedModel(name="scripted", upstream=upstream, tmap=smollm2_map, max_model_len=1024,
                    ids_source=IdsSource.ENGINE, upstream_name="scripted"),
    ], default="scripted")
    return GatewayState(settings=settings, router=router)


def serve_stack(patch: pytest.MonkeyPatch, running: list[tuple[Any, threading.Thread]],
                settings: ServerSettings, smollm2_map: Any = None, *, backlog: int = 64,
                app_factory: Any = None, upstream: Any = None, router: Router | None = None,
                wrap: Callable[[Any], Any] | None = None) -> Stack:
    """``serve_gateway`` (what ``tokenwire serve --upstream`` runs) in a thread on its own
    loopback socket, over ``router``, else one scripted model (``upstream``, by default
    :data:`SIMPLE` replayed); ``running`` collects it for the fixture to stop.

    ``app_factory(state)`` replaces ``create_app``; ``wrap(app)`` wraps the app inside the
    hardening (a recorder sees what passed the security layer) and is ``Stack.app``."""
    if router is not None:
        state = GatewayState(settings=settings, router=router)
    else:
        upstream = upstream if upstream is not None else Scripted(SIMPLE)
        state = _state(settings, smollm2_map, upstream)
    wrapped: dict[str, Any] = {}

    def make_app(st: GatewayState) -> Any:
        app = (app_factory or create_app)(st)
        if wrap is not None:
            wrapped["app"] = app = wrap(app)
        return app

    async def fake_build(cfg: Any, settings: ServerSettings) -> server_mod.Gateway:
        return server_mod.Gateway(state=state, adapters=(), probes=())

    patch.setattr(server_mod, "build_gateway", fake_build)
    patch.setattr(server_mod, "create_app", make_app)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(backlog)
    ready: dict[str, Any] = {}

    def on_ready(gw: Any, srv: Any) -> None:
        ready.update(server=srv, loop=type(asyncio.get_running_loop()).__module__)

    def serve() -> None:  # on the loop `tokenwire serve` picks (settings.event_loop)
        loop_factory = server_mod.serving_loop_factory(settings.event_loop)
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(server_mod.serve_gateway(
                None, settings, log_level="warning", sockets=[sock],  # type: ignore[arg-type]
                on_ready=on_ready))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not (ready.get("server") and ready["server"].started):
        assert thread.is_alive() and time.monotonic() < deadline, "gateway did not start"
        time.sleep(0.02)
    running.append((ready["server"], thread))
    port = sock.getsockname()[1]
    return Stack(f"http://127.0.0.1:{port}", port, upstream, state, ready["server"],
                 wrapped.get("app"), ready["loop"].partition(".")[0])


def stop_stacks(patch: pytest.MonkeyPatch, running: list[tuple[Any, threading.Thread]]) -> None:
    patch.undo()
    for srv, thread in running:
        srv.should_exit = True
        thread.join(10)


@pytest.fixture(scope="module")
def stacks(smollm2_map) -> Iterator[Callable[..., Stack]]:
    """``stacks(**settings) -> Stack``: ``serve_gateway`` over a scripted upstream."""
    running: list[tuple[Any, threading.Thread]] = []
    patch = pytest.MonkeyPatch()
    yield lambda **kw: serve_stack(patch, running, ServerSettings(**kw), smollm2_map,
                                   app_factory=_create_app_with_a_crashing_route)
    stop_stacks(patch, running)


@pytest.fixture(scope="module")
def keyed(stacks) -> Stack:
    return stacks(api_keys=(KEY, KEY2), allowed_origins=(ORIGIN,), auth="keys")


def _codec_body() -> bytes:
    return encode_request(CodecRequest(prompt_ids=(1, 2, 3), max_tokens=4,
                                       stream_format="msgpack"), "msgpack")


USER = [{"role": "user", "content": "Hi"}]
# path -> (content, content-type) of a request the scripted upstream serves.
APIS: dict[str, tuple[bytes, str]] = {
    "/v1/chat/completions": (json.dumps({"model": "scripted", "messages": USER}).encode(),
                             "application/json"),
    "/v1/completions": (json.dumps({"model": "scripted", "prompt": "x"}).encode(),
                        "application/json"),
    "/v1/responses": (json.dumps({"model": "scripted", "input": "Hi"}).encode(),
                      "application/json"),
    "/v1/messages": (json.dumps({"model": "scripted", "max_tokens": 5,
                                 "messages": USER}).encode(), "application/json"),
    "/v1/completions/codec": (_codec_body(), "application/x-msgpack"),
}


#: Both protocols ``tokenwire serve`` speaks on one port: HTTP/1.1 and h2c (issue 15).
PROTOCOLS = ["http/1.1", "h2c"]


def _post(stack: Stack, path: str, protocol: str = "http/1.1", **headers: str
          ) -> httpx.Response:
    content, ctype = APIS[path]
    h2c = protocol == "h2c"
    with httpx.Client(http1=not h2c, http2=h2c, timeout=10) as client:
        resp = client.post(stack.url + path, content=content,
                           headers={"content-type": ctype, **headers})
    assert resp.http_version == ("HTTP/2" if h2c else "HTTP/1.1")
    return resp


def _error(resp: httpx.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    return resp.json()["error"]


# -- auth and Origin on every POST API ---------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("path", list(APIS))
def test_every_api_refuses_a_missing_or_wrong_key_before_the_upstream(keyed, path,
                                                                      protocol) -> None:
    before = len(keyed.upstream.requests)
    err = _error(_post(keyed, path, protocol), 401)
    if path == "/v1/messages":  # Anthropic's shape on its route
        assert err["type"] == "authentication_error" and "message" in err
    else:
        assert err["code"] == "invalid_api_key"
    assert _error(_post(keyed, path, protocol, authorization="Bearer nope"), 401)
    assert _error(_post(keyed, path, protocol, **{"x-api-key": KEY[:-1]}), 401)
    assert len(keyed.upstream.requests) == before  # refusals never reach the upstream


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("path", list(APIS))
def test_every_api_serves_a_bearer(keyed, path, protocol) -> None:
    resp = _post(keyed, path, protocol, authorization=f"Bearer {KEY2}")
    assert resp.status_code == 200, resp.text


def test_messages_serves_x_api_key_like_anthropic_clients_send(keyed) -> None:
    resp = _post(keyed, "/v1/messages", **{"x-api-key": KEY, "anthropic-version": "2023-06-01"})
    assert resp.status_code == 200 and resp.json()["type"] == "message"


@pytest.mark.parametrize("path", list(APIS))
def test_a_foreign_origin_is_403_even_with_a_key_and_an_allowed_one_is_served(keyed,
                                                                            path) -> None:
    before = len(keyed.upstream.requests)
    err = _error(_post(keyed, path, authorization=f"Bearer {KEY}",
                       origin="https://evil.example"), 403)
    if path == "/v1/messages":
        assert err["type"] == "permission_error"
    else:
        assert err["code"] == "origin_not_allowed"
    assert _error(_post(keyed, path, origin="https://evil.example"), 403)  # before the 401
    assert len(keyed.upstream.requests) == before
    assert _post(keyed, path, authorization=f"Bearer {KEY}", origin=ORIGIN).status_code == 200


def test_keys_mode_refuses_loopback_without_a_key(keyed) -> None:
    assert httpx.get(keyed.url + "/v1/models").status_code == 401
    assert httpx.get(keyed.url + "/v1/models",
                     headers={"authorization": f"bearer {KEY}"}).status_code == 200


def test_localhost_open_serves_a_loopback_client_without_a_key(stacks) -> None:
    open_stack = stacks()  # ServerSettings' default: what a bare `tokenwire serve` runs
    for path in APIS:
        assert _post(open_stack, path).status_code == 200, path
    assert _error(_post(open_stack, "/v1/completions", origin="https://evil.example"), 403)


# -- raw sockets: the request target, the upgrade refusal --------------------------------------


def _raw(port: int, head: bytes) -> bytes:
    """Send a request head; read until the server closes. What is waited for is the close
    itself; ``read_until_closed``'s generous net only fails a server that never closes."""
    from .raw_sockets import CLOSE_WAIT_S, read_until_closed  # it imports this module

    with socket.create_connection(("127.0.0.1", port), timeout=CLOSE_WAIT_S) as conn:
        conn.sendall(head)
        return read_until_closed(conn)


def test_an_unparsable_request_target_is_400(keyed) -> None:
    data = _raw(keyed.port, b"GET http://[ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert data.startswith(b"HTTP/1.1 400 ")


def test_with_responses_websocket_off_an_upgrade_to_responses_is_426_with_no_body_and_a_closed_socket(  # noqa: E501
        stacks) -> None:
    # (With the setting on, the default, the upgrade is served: test_responses_ws.py.)
    keyed = stacks(api_keys=(KEY,), auth="keys", responses_websocket=False)
    head = (f"GET /v1/responses HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n").encode()
    before = len(keyed.upstream.requests)
    data = _raw(keyed.port, head)  # returns only once the server closed its side
    assert data.startswith(b"HTTP/1.1 426 ")
    head_part, _, body = data.partition(b"\r\n\r\n")
    assert body == b"" and b"connection: close" in head_part.lower()
    assert len(keyed.upstream.requests) == before  # nothing reached the upstream


def test_a_header_block_that_never_ends_is_refused_past_the_limit(keyed) -> None:
    # The guard bounds what is buffered of an unfinished head: a peer cannot grow it forever.
    head = f"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Pad: {'a' * (MAX_HEAD_BYTES + 10)}"
    assert _raw(keyed.port, head.encode()).startswith(b"HTTP/1.1 431 ")


# -- body limits and crashes -------------------------------------------------------------------


@pytest.mark.parametrize("path", list(APIS))
def test_an_oversized_body_is_413_with_a_json_error_on_every_api(stacks, path) -> None:
    small = stacks(api_keys=(KEY,), auth="keys", max_body_bytes=64)
    _, ctype = APIS[path]
    resp = httpx.post(small.url + path, content=b"x" * 65, timeout=10,
                      headers={"content-type": ctype, "authorization": f"Bearer {KEY}"})
    assert resp.status_code == 413, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    assert resp.json()["error"]
    chunked = httpx.post(small.url + path, content=iter([b"x" * 40, b"x" * 40]), timeout=10,
                         headers={"content-type": ctype, "authorization": f"Bearer {KEY}"})
    assert chunked.status_code == 413  # no Content-Length: counted while reading


def test_an_unexpected_exception_is_a_json_500_and_the_server_keeps_serving(keyed,
                                                                             caplog) -> None:
    caplog.set_level(logging.DEBUG)
    auth = {"authorization": f"Bearer {KEY}"}
    resp = httpx.post(keyed.url + "/test/crash", json={}, headers=auth, timeout=10)
    err = _error(resp, 500)
    assert set(err) == {"message", "type", "code"} and SECRET_DETAIL not in resp.text
    assert _post(keyed, "/v1/completions", **auth).status_code == 200  # still serving
    assert "RuntimeError" in caplog.text
    assert SECRET_DETAIL not in caplog.text and "Traceback" not in caplog.text


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_a_crash_in_an_inference_route_is_one_500_in_its_api_shape(keyed, caplog, path) -> None:
    """The inference routes skip Starlette's stack (http/dispatch.py): the crash barrier
    answers their bugs, in the route's API shape, and the request's ticket goes back."""
    caplog.set_level(logging.INFO)
    auth = {"authorization": f"Bearer {KEY}"}
    resp = _post(keyed, path, **auth, **{"x-test-crash": "1"})
    assert resp.status_code == 500 and SECRET_DETAIL not in resp.text
    if path == "/v1/messages":
        assert resp.json()["type"] == "error" and resp.json()["error"]["type"] == "api_error"
    else:
        assert set(_error(resp, 500)) == {"message", "type", "code"}
    assert caplog.text.count("internal error type=RuntimeError") == 1
    assert "Traceback" not in caplog.text
    assert _post(keyed, path, **auth).status_code == 200  # still serving
    assert keyed.state.admission.counts() == (0, 0)  # the crashed request's ticket released
    assert httpx.get(keyed.url + path, headers=auth).status_code == 405  # Starlette's, as before


# -- the crash barrier alone (ASGI level) ------------------------------------------------------


def _run_barrier(app: Any) -> tuple[list[dict[str, Any]], BaseException | None]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    scope = {"type": "http", "path": "/v1/x", "headers": []}
    try:
        asyncio.run(CrashBarrier(app)(scope, receive, send))
    except BaseException as exc:  # the test reports what escaped
        return sent, exc
    return sent, None


def test_barrier_before_the_head_answers_500_json(caplog) -> None:
    async def app(scope, receive, send) -> None:
        raise KeyError(SECRET_DETAIL)

    caplog.set_level(logging.DEBUG)
    sent, escaped = _run_barrier(app)
    assert escaped is None
    assert sent[0]["status"] == 500
    assert json.loads(sent[1]["body"])["error"]["type"] == "server_error"
    assert "KeyError" in caplog.text and SECRET_DETAIL not in caplog.text


def test_barrier_after_the_head_sends_nothing_more_so_the_server_cuts_the_connection() -> None:
    async def app(scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"part", "more_body": True})
        raise ValueError(SECRET_DETAIL)

    sent, escaped = _run_barrier(app)
    assert escaped is None
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]


def test_barrier_lets_cancellation_through() -> None:
    async def app(scope, receive, send) -> None:
        raise asyncio.CancelledError

    _, escaped = _run_barrier(app)
    assert isinstance(escaped, asyncio.CancelledError)


def test_the_embedded_run_serves_the_same_hardened_app_with_the_limits(monkeypatch,
                                                                       smollm2_map) -> None:
    calls: dict[str, Any] = {}

    class Server:
        def __init__(self, config, state, *, drain_grace_s) -> None:
            calls.update(config=config, state=state, drain_grace_s=drain_grace_s)

        async def serve(self, sockets=None) -> None:
            calls["served"] = True
            calls["sockets"] = sockets

    monkeypatch.setattr(server_mod, "graceful_server", Server)

    class Engine:
        def start(self) -> None:
            calls["started"] = True

        def close(self) -> None:
            calls["closed"] = True

    settings = ServerSettings(api_keys=(KEY,), auth="keys", drain_grace_s=7)
    state = GatewayState(settings=settings, upstream=Scripted(SIMPLE), tmap=smollm2_map,
                         max_model_len=1024)

    async def aclose_state() -> None:  # on the serving loop, after serve() returns
        calls["state_closed"] = calls.get("served", False)

    monkeypatch.setattr(state, "aclose_state", aclose_state)
    sock = server_mod.listen_socket("127.0.0.1", 0)  # bound before run(), as `serve` does
    try:
        server_mod.run(server_mod.ServingPlan(state=state, engine=Engine(),  # type: ignore[arg-type]
                                              bundled_map=smollm2_map), sock=sock)
    finally:
        sock.close()
    assert calls["sockets"] == [sock]
    config = calls["config"]
    assert isinstance(config.app, SecurityMiddleware)
    assert isinstance(config.app.app, CrashBarrier)
    assert config.limit_concurrency == server_mod.UVICORN_LIMITS["limit_concurrency"]
    assert calls["drain_grace_s"] == 7 and calls["state"] is state
    assert calls["served"] and calls["started"] and calls["closed"] and calls["state_closed"]


def test_uvicorn_has_no_bare_503_cap_the_connection_guard_replaces_it(smollm2_map) -> None:
    """uvicorn's own cap counted idle sockets and answered a bare 503 before auth (issue 11
    item 1); the guarded protocol (gateway/http/connections.py) takes its place."""
    from tokenwire.gateway.http.connections import GuardedHttpToolsProtocol

    state = GatewayState(settings=ServerSettings(max_concurrent=64, queue_size=512),
                         upstream=Scripted(SIMPLE), tmap=smollm2_map, max_model_len=1024)
    limits = server_mod.uvicorn_limits(state)
    assert limits["limit_concurrency"] is None
    assert limits["http"].func is GuardedHttpToolsProtocol
    assert state.settings.max_connections > 2 * state.admission.capacity


def test_create_app_alone_stays_unwrapped(smollm2_map) -> None:
    state = GatewayState(settings=ServerSettings(), upstream=Scripted(SIMPLE),
                         tmap=smollm2_map, max_model_len=1024)
    assert not isinstance(create_app(state), SecurityMiddleware)


# -- settings from the file, the environment and the flags -------------------------------------


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve_cmd.register(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


_UP = {"name": "u", "kind": "openai", "base_url": "http://h:1/v1"}


def _settings(argv: list[str], env: dict[str, str], server: dict[str, Any] | None = None
              ) -> ServerSettings:
    file_server: dict[str, Any] = {}
    if server is not None:
        file_server = dict(parse_config({"server": server, "upstreams": [_UP]},
                                        source="t.toml", env=env).server)
    return serve_cmd.settings_from_args(_args(*argv), file_server, env=env)


# argv, env, [server], -> (keys, auth, origins)
GOOD_SOURCES = [
    ([], {}, None, ((), "localhost-open", ())),
    ([], {"TOKENWIRE_API_KEYS": f"{KEY}, {KEY2} ,"}, None, ((KEY, KEY2), "keys", ())),
    (["--allow-unauthenticated-localhost"], {"TOKENWIRE_API_KEYS": KEY}, None,
     ((KEY,), "localhost-open", ())),
    (["--api-keys-env", "GW"], {"GW": KEY, "TOKENWIRE_API_KEYS": KEY2}, None,
     ((KEY,), "keys", ())),
    ([], {"FILEKEYS": KEY2, "TOKENWIRE_API_KEYS": KEY}, {"api_keys_env": "FILEKEYS"},
     ((KEY2,), "keys", ())),
    (["--api-keys-env", "GW"], {"GW": KEY, "FILEKEYS": KEY2}, {"api_keys_env": "FILEKEYS"},
     ((KEY,), "keys", ())),  # the flag beats the file
    ([], {}, {"allowed_origins": [ORIGIN, "http://localhost:3000"]},
     ((), "localhost-open", (ORIGIN, "http://localhost:3000"))),
    (["--allow-origin", "https://b.example", "--allow-origin", "http://[::1]:8000"], {},
     {"allowed_origins": [ORIGIN]},
     ((), "localhost-open", ("https://b.example", "http://[::1]:8000"))),  # flags replace
]


@pytest.mark.parametrize(("argv", "env", "server", "want"), GOOD_SOURCES)
def test_auth_settings_from_flags_env_and_file(argv, env, server, want) -> None:
    s = _settings(argv, env, server)
    assert (s.api_keys, s.auth, s.allowed_origins) == want
    assert KEY not in repr(s) and KEY2 not in str(s)


# argv, env, [server], words the ConfigError must contain
BAD_SOURCES = [
    (["--api-keys-env", "MISSING_VAR"], {}, None, ["MISSING_VAR", "not set"]),
    ([], {}, {"api_keys_env": "FILE_VAR"}, ["t.toml", "[server]", "FILE_VAR", "not set"]),
    ([], {"TOKENWIRE_API_KEYS": " , "}, None, ["TOKENWIRE_API_KEYS", "no API key"]),
    (["--api-keys-env", "GW"], {"GW": "has space"}, None, ["GW", "whitespace"]),
    (["--allow-origin", "app.example"], {}, None, ["'app.example'", "origin"]),
    (["--allow-origin", "https://app.example/path"], {}, None, ["origin"]),
    (["--allow-origin", "*"], {}, None, ["origin"]),
    (["--allow-origin", "http://["], {}, None, ["origin"]),
    ([], {}, {"allowed_origins": ["ftp://x"]}, ["t.toml", "[server]", "ftp://x"]),
    ([], {}, {"allowed_origins": [1]}, ["t.toml", "allowed_origins", "strings"]),
    ([], {}, {"allowed_origins": "https://a.example"}, ["allowed_origins", "an array"]),
]


@pytest.mark.parametrize(("argv", "env", "server", "words"), BAD_SOURCES)
def test_bad_auth_settings_are_config_errors_naming_the_source(argv, env, server,
                                                              words) -> None:
    with pytest.raises(ConfigError) as info:
        _settings(argv, env, server)
    for word in words:
        assert word in str(info.value)
    assert "has space" not in str(info.value)  # a key's value is never echoed


@pytest.mark.parametrize("kw", [{"auth": "keys"}, {"auth": "open"},
                                {"api_keys": ("",)}, {"api_keys": ("a\nb",)}])
def test_server_settings_validate_auth(kw) -> None:
    with pytest.raises(ConfigError):
        ServerSettings(**kw)


@pytest.mark.parametrize(("kw", "auth"), [
    ({}, "localhost-open"), ({"api_keys": (KEY,)}, "keys"),
    ({"api_keys": (KEY,), "auth": "localhost-open"}, "localhost-open"),
])
def test_auth_left_empty_follows_the_keys(kw, auth) -> None:
    assert ServerSettings(**kw).auth == auth  # giving keys never leaves loopback open


def test_keys_never_appear_in_repr_str_or_errors() -> None:
    s = ServerSettings(api_keys=(KEY,), auth="keys")
    assert KEY not in repr(s) and KEY not in str(s)
    with pytest.raises(ConfigError) as info:
        ServerSettings(api_keys=(KEY, KEY + " x"), auth="keys")
    assert KEY not in str(info.value)


@pytest.mark.parametrize(("settings", "line"), [
    (ServerSettings(), "auth: loopback clients need no key; remote clients are refused: no "
                       "API key configured (set TOKENWIRE_API_KEYS)"),
    (ServerSettings(api_keys=(KEY,), auth="keys"), "auth: 1 API key(s) required from every"),
    (ServerSettings(api_keys=(KEY,), auth="localhost-open"), "loopback clients need no key"),
])
def test_the_banner_says_who_may_call(settings, line) -> None:
    banner = serve_cmd.auth_banner(settings)
    assert line in banner and KEY not in banner


@pytest.mark.parametrize(("argv", "server", "want"), [
    ([], None, True),                                    # served by default
    (["--no-responses-websocket"], None, False),
    ([], {"responses_websocket": False}, False),
    ([], {"responses_websocket": True, "ws_max_sockets_per_client": 3}, True),
])
def test_the_responses_websocket_setting_from_the_flag_and_the_file(argv, server, want) -> None:
    settings = _settings(argv, {}, server)
    assert settings.responses_websocket is want
    if server and "ws_max_sockets_per_client" in server:
        assert settings.ws_max_sockets_per_client == 3
