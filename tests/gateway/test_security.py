"""SecurityMiddleware: the seed's check order (400, 403, 401, 404/426), key handling, loopback.

The check-order table runs against a real uvicorn on loopback with raw sockets, so the
request target, the upgrade headers and the socket close are the server's, not a mock's.
uvicorn without a WebSocket library (this venv) hands upgrade requests to the app as
``http`` scopes; the ``websocket``-scope rows drive the middleware with ASGI messages.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenwire.errors import ConfigError
from tokenwire.gateway.http.connections import ConnectionLimits, guarded_protocol
from tokenwire.gateway.http.security import SecurityMiddleware

GOOD = "tw-test-secret-0123456789"
OTHER = "tw-other-secret-abcdef"
ALLOWED = "https://app.example"
#: How long a raw-socket test waits for the server to close: a safety net for a loaded
#: machine (a server that never closes still fails), never a measured bound.
CLOSE_WAIT_S = 60


async def inner_app(scope, receive, send) -> None:
    assert scope["type"] in ("http", "websocket")
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"3"), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": b"app"})


def make(**kw: Any) -> SecurityMiddleware:
    kw.setdefault("bearer_tokens", [OTHER, GOOD])
    kw.setdefault("allowed_origins", [ALLOWED])
    return SecurityMiddleware(inner_app, **kw)


# --- a real loopback server and a raw-socket client -------------------------------------

@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    # The server's own protocol (the connection guard over httptools), as `serve` runs it.
    config = uvicorn.Config(make(), log_level="error", lifespan="off", ws="none",
                            http=guarded_protocol(ConnectionLimits()))
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not srv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield sock.getsockname()[1]
    srv.should_exit = True
    thread.join(10)


def exchange(port: int, head: str) -> tuple[int, dict[str, str], bytes]:
    """Send one request head; read until the server closes (:data:`CLOSE_WAIT_S`: a safety
    net; 2 s, the seed's bound, was a timing a loaded machine could miss)."""
    with socket.create_connection(("127.0.0.1", port), timeout=CLOSE_WAIT_S) as conn:
        conn.sendall(head.encode("latin-1"))
        data = b""
        try:
            while chunk := conn.recv(4096):
                data += chunk
        except TimeoutError:
            pytest.fail(f"server kept the socket open past {CLOSE_WAIT_S} s; got {data!r}")
    head_bytes, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head_bytes.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines)}
    return int(status_line.split(" ")[1]), headers, body


def request_head(target: str, *, origin: str | None, key: str | None, upgrade: bool) -> str:
    lines = [f"GET {target} HTTP/1.1", "Host: 127.0.0.1"]
    if origin:
        lines.append(f"Origin: {origin}")
    if key:
        lines.append(f"Authorization: Bearer {key}")
    if upgrade:
        lines += ["Connection: Upgrade", "Upgrade: websocket", "Sec-WebSocket-Version: 13",
                  "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="]
    else:
        lines.append("Connection: close")
    return "\r\n".join(lines) + "\r\n\r\n"


BAD_TARGET = "http://["  # the seed's example: GET http://[ HTTP/1.1
FOREIGN = "https://evil.example"

# target, Origin, bearer, upgrade -> status; each row pins one step of the seed's order.
CHECK_ORDER = [
    (BAD_TARGET, FOREIGN, None, True, 400),              # target before everything
    (BAD_TARGET, None, GOOD, False, 400),                # ordinary requests too
    ("http://h:port/v1/responses", None, GOOD, True, 400),  # an unparsable port
    ("/v1/responses", FOREIGN, None, True, 403),         # Origin before bearer
    ("/v1/responses", FOREIGN, GOOD, True, 403),
    ("/v1/models", FOREIGN, GOOD, False, 403),
    ("/v1/responses", ALLOWED, None, True, 401),         # an allowed Origin still needs a key
    ("/v1/responses", None, None, True, 401),            # bearer before the upgrade refusal
    ("/v1/responses", None, OTHER[:-1], True, 401),
    ("/v1/elsewhere", None, None, True, 401),            # bearer before any 404
    ("/v1/models", None, "wrong", False, 401),
    ("/v1/responses", None, GOOD, True, 426),
    ("/v1/responses", ALLOWED, OTHER, True, 426),
    ("http://127.0.0.1/v1/responses", None, GOOD, True, 426),  # absolute-form target
    ("/v1/responses?stream=1", None, GOOD, True, 426),
    ("/v1/models", None, GOOD, True, 200),               # http upgrade elsewhere: ordinary
    ("/v1/responses", None, GOOD, False, 200),
    ("/v1/models", ALLOWED, GOOD, False, 200),
]


@pytest.mark.parametrize(("target", "origin", "key", "upgrade", "status"), CHECK_ORDER)
def test_seed_check_order_on_a_real_server(server, target, origin, key, upgrade, status):
    got, headers, body = exchange(server, request_head(target, origin=origin, key=key,
                                                       upgrade=upgrade))
    assert got == status
    if status == 426:
        assert body == b"" and headers["connection"].lower() == "close"
        assert headers.get("content-length", "0") == "0"
    elif status == 200:
        assert body == b"app"
    else:
        assert json.loads(body)["error"]["type"]
    if key:
        assert key.encode() not in body and all(key not in v for v in headers.values())


def test_upgrade_refusal_closes_the_socket_even_if_the_client_keeps_its_side_open(server):
    with socket.create_connection(("127.0.0.1", server), timeout=CLOSE_WAIT_S) as conn:
        conn.sendall(request_head("/v1/responses", origin=None, key=GOOD,
                                  upgrade=True).encode())
        data = b""
        while chunk := conn.recv(4096):  # a TimeoutError here fails the test: no close
            data += chunk
    assert data.startswith(b"HTTP/1.1 426 ")
    assert data.endswith(b"\r\n\r\n")  # no body


def test_unauthenticated_is_401_with_openai_error_and_www_authenticate(server):
    status, headers, body = exchange(server, request_head("/v1/models", origin=None,
                                                          key=None, upgrade=False))
    assert status == 401
    assert headers["www-authenticate"] == "Bearer"
    assert headers["content-type"] == "application/json"
    error = json.loads(body)["error"]
    assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key"
    assert set(error) == {"message", "type", "code"}


def test_x_api_key_is_accepted_like_a_bearer(server):
    head = "GET /v1/models HTTP/1.1\r\nHost: x\r\nx-api-key: %s\r\nConnection: close\r\n\r\n"
    assert exchange(server, head % GOOD)[0] == 200
    assert exchange(server, head % "nope")[0] == 401


# --- ASGI-level checks: websocket scopes, constant time, loopback, no leaks ---------------

def call(mw: SecurityMiddleware, scope_type: str = "http", *, path: str = "/v1/models",
         headers: list[tuple[bytes, bytes]] | None = None, client: Any = ("10.1.2.3", 5000),
         extensions: dict | None = None) -> list[dict]:
    scope = {"type": scope_type, "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": headers or [], "client": client, "extensions": extensions or {}}
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "websocket.connect"}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(mw(scope, receive, send))
    return sent


def bearer(key: str) -> list[tuple[bytes, bytes]]:
    return [(b"authorization", f"Bearer {key}".encode())]


DENIAL = {"websocket.http.response": {}}


@pytest.mark.parametrize(("path", "headers", "status"), [
    ("/v1/responses", [(b"origin", FOREIGN.encode()), *bearer(GOOD)], 403),
    ("/v1/responses", [], 401),
    ("/v1/elsewhere", [], 401),
    ("/v1/elsewhere", bearer(GOOD), 404),  # a websocket upgrade to any other path
    ("/v1/responses", bearer(GOOD), 426),
])
def test_websocket_scope_follows_the_same_order_via_the_denial_extension(path, headers, status):
    sent = call(make(), "websocket", path=path, headers=headers, extensions=DENIAL)
    assert sent[0]["type"] == "websocket.http.response.start"
    assert sent[0]["status"] == status
    assert (b"connection", b"close") in sent[0]["headers"]
    assert sent[1]["type"] == "websocket.http.response.body"
    assert (sent[1]["body"] == b"") == (status == 426)


def test_websocket_scope_without_denial_extension_is_closed_before_accept():
    sent = call(make(), "websocket", path="/v1/responses", headers=bearer(GOOD))
    assert [m["type"] for m in sent] == ["websocket.close"]


def test_every_configured_token_is_compared_in_constant_time(monkeypatch):
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def counting(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)
    mw = make(bearer_tokens=[GOOD, OTHER, "third-token"])
    assert call(mw, headers=bearer(GOOD))[0]["status"] == 200
    assert len(calls) == 3  # no early exit on the first match
    calls.clear()
    assert call(mw, headers=[*bearer("nope"), (b"x-api-key", b"nope")])[0]["status"] == 401
    assert len(calls) == 3  # the same key twice is one credential, compared once per token


@pytest.mark.parametrize("headers", [
    [(b"x-api-key", b"nope")] * 4999 + [(b"x-api-key", GOOD.encode())],  # 5,000 keys at once
    [(b"x-api-key", GOOD.encode()), (b"x-api-key", GOOD.encode())],
    [*bearer("nope"), (b"x-api-key", GOOD.encode())],  # two credentials that differ
    [*bearer(GOOD), (b"x-api-key", b"nope")],
    [*bearer(GOOD), *bearer(GOOD)],
    [(b"authorization", b"Basic Zm9vOmJhcg=="), (b"x-api-key", GOOD.encode())],
])
def test_exactly_one_credential_is_accepted_and_none_is_tried_one_by_one(monkeypatch,
                                                                        headers) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: calls.append((a, b)) or real(a, b))
    mw = make(bearer_tokens=[GOOD, OTHER])
    assert call(mw, headers=headers)[0]["status"] == 401
    assert calls == []  # refused as a whole, before any key is compared


def test_one_key_in_both_headers_is_one_credential() -> None:
    mw = make(bearer_tokens=[GOOD])
    assert call(mw, headers=[*bearer(GOOD), (b"x-api-key", GOOD.encode())])[0]["status"] == 200


def test_no_token_without_explicit_localhost_opt_in_is_a_config_error():
    with pytest.raises(ConfigError):
        SecurityMiddleware(inner_app, bearer_tokens=None)
    with pytest.raises(ConfigError):
        SecurityMiddleware(inner_app, bearer_tokens=[""])


@pytest.mark.parametrize(("client", "status"), [
    (("127.0.0.1", 1), 200), (("127.9.8.7", 1), 200), (("::1", 1), 200),
    (("::ffff:127.0.0.1", 1), 200), (("10.0.0.1", 1), 401), (("::2", 1), 401),
    (("192.168.1.5", 1), 401), (None, 401), (("localhost", 1), 401),
])
def test_localhost_exemption_only_for_loopback_clients(client, status):
    mw = SecurityMiddleware(inner_app, bearer_tokens=None, allow_unauthenticated_localhost=True)
    assert call(mw, client=client)[0]["status"] == status


def test_localhost_is_not_exempt_unless_explicitly_allowed():
    assert call(make(), client=("127.0.0.1", 1))[0]["status"] == 401
    mw = make(allow_unauthenticated_localhost=True)
    assert call(mw, client=("127.0.0.1", 1))[0]["status"] == 200
    assert call(mw, client=("10.0.0.1", 1))[0]["status"] == 401
    assert call(mw, client=("10.0.0.1", 1), headers=bearer(GOOD))[0]["status"] == 200


def test_tokens_never_reach_logs_or_responses(caplog):
    caplog.set_level(logging.DEBUG)
    mw = make()
    leaked = []
    for headers in (bearer(GOOD + "x"), bearer(GOOD), [(b"x-api-key", OTHER.encode())],
                    [(b"origin", FOREIGN.encode()), *bearer(GOOD)]):
        for scope_type in ("http", "websocket"):
            leaked += call(mw, scope_type, path="/v1/responses", headers=headers,
                           extensions=DENIAL)
    dump = repr(leaked) + caplog.text
    assert GOOD not in dump and OTHER not in dump
    assert "status=401" in caplog.text  # refusals are logged, without credentials


def test_other_scopes_pass_through():
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["type"])

    async def noop(*_):
        return {}

    asyncio.run(SecurityMiddleware(app, bearer_tokens=[GOOD])({"type": "lifespan"}, noop, noop))
    assert seen == ["lifespan"]


@settings(max_examples=200, deadline=None)
@given(target=st.binary(min_size=1, max_size=40),
       values=st.lists(st.tuples(st.sampled_from([b"authorization", b"origin", b"x-api-key",
                                                  b"connection", b"upgrade"]),
                                 st.binary(max_size=40)), max_size=5),
       scope_type=st.sampled_from(["http", "websocket"]))
def test_arbitrary_targets_and_headers_get_an_answer_never_an_exception(target, values,
                                                                        scope_type):
    mw = make()
    scope = {"type": scope_type, "path": target.decode("latin-1"), "raw_path": target,
             "headers": values, "client": ("10.0.0.1", 1), "extensions": DENIAL}
    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {}

    asyncio.run(mw(scope, receive, send))
    assert sent[0]["status"] in (200, 400, 401, 403, 404, 426)
