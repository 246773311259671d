"""The playground's HTTP side without a browser (issue 17): which requests the security
layer lets a page make, and how a page script chooses a coding and sees the bytes.

The browser tests (test_playground_browser.py) drive the page itself; these pin the rules
underneath, fast: the page's files are public (they hold no data), a same-origin ``POST``
(browsers send ``Origin`` on every one) passes only on a loopback ``Host`` or with a valid
key (a DNS-rebinding page is same-origin with itself), and ``Tokenwire-Accept-Encoding`` /
``Tokenwire-Raw-Body`` pick the coding and keep it out of ``Content-Encoding``.
"""

from __future__ import annotations

import asyncio
import gzip

import httpx
import pytest

from tokenwire.codec.frames_msgpack import FrameDecoder
from tokenwire.gateway.http.security import SecurityMiddleware
from tokenwire.gateway.ir import Finish, FinishKind, TokenDelta

from .conftest import ScriptedUpstream

KEY = "page-key"


async def _ok(scope, receive, send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _status(method: str, path: str, headers: dict[str, str], *, keys: tuple[str, ...] = (),
            client: str = "127.0.0.1") -> int:
    app = SecurityMiddleware(_ok, bearer_tokens=keys, allow_unauthenticated_localhost=not keys)
    transport = httpx.ASGITransport(app=app, client=(client, 5000))

    async def go() -> int:
        async with httpx.AsyncClient(transport=transport, base_url="http://unused") as c:
            return (await c.request(method, path, headers=headers)).status_code

    return asyncio.run(go())


@pytest.mark.parametrize(("host", "origin", "keys", "auth", "status"), [
    # the page on a localhost-open gateway: its own origin on a loopback Host
    ("127.0.0.1:8000", "http://127.0.0.1:8000", (), None, 200),
    ("localhost:8000", "http://localhost:8000", (), None, 200),
    ("[::1]:8000", "http://[::1]:8000", (), None, 200),
    # DNS rebinding: the attacker's name is both Origin and Host, the peer is loopback
    ("evil.example:8000", "http://evil.example:8000", (), None, 403),
    # another port is another origin
    ("127.0.0.1:8000", "http://127.0.0.1:9000", (), None, 403),
    # a remote gateway: its own origin counts only with a valid key
    ("gw.example", "http://gw.example", (KEY,), KEY, 200),
    ("gw.example", "http://gw.example", (KEY,), "wrong", 403),
    ("gw.example", "http://gw.example", (KEY,), None, 403),
    # a loopback Host still needs the key when keys are configured
    ("127.0.0.1:8000", "http://127.0.0.1:8000", (KEY,), None, 401),
])
def test_a_same_origin_post_passes_on_a_loopback_host_or_with_a_valid_key(
        host, origin, keys, auth, status) -> None:
    headers = {"host": host, "origin": origin}
    if auth:
        headers["authorization"] = f"Bearer {auth}"
    client = "203.0.113.9" if keys else "127.0.0.1"
    assert _status("POST", "/v1/chat/completions", headers, keys=keys, client=client) == status


@pytest.mark.parametrize(("method", "path", "status"), [
    ("GET", "/", 200), ("HEAD", "/", 200), ("GET", "/playground/playground.js", 200),
    ("GET", "/playground/playground.css", 200),
    ("POST", "/", 401),  # only reads are public
    ("GET", "/playground/other.js", 401),  # only the page's own files
    ("GET", "/v1/models", 401), ("GET", "/health", 401), ("GET", "/metrics", 401),
])
def test_the_pages_files_are_public_and_everything_else_needs_the_key(
        method, path, status) -> None:
    assert _status(method, path, {}, keys=(KEY,), client="203.0.113.9") == status


SCRIPT = [(0.0, TokenDelta(ids=(i,), text="x")) for i in (9707, 28, 2**16)] + [
    (0.0, Finish(reason=FinishKind.EOS))]


@pytest.mark.parametrize(("headers", "content_encoding", "raw_coding"), [
    ({"Tokenwire-Accept-Encoding": "gzip", "Tokenwire-Raw-Body": "1"}, None, "gzip"),
    ({"Tokenwire-Accept-Encoding": "gzip"}, "gzip", None),
    ({"Tokenwire-Accept-Encoding": "identity"}, None, None),  # beats Accept-Encoding: gzip
    ({"Tokenwire-Accept-Encoding": "identity", "Tokenwire-Raw-Body": "1"}, None, "identity"),
    ({}, "gzip", None),  # the ordinary negotiation is unchanged
])
def test_a_page_chooses_the_coding_and_can_keep_it_out_of_content_encoding(
        serve, headers, content_encoding, raw_coding) -> None:
    up = serve(ScriptedUpstream(SCRIPT))
    with httpx.Client(base_url=up.url, timeout=30) as client:
        # the raw body must reach us as sent: httpx would inflate a Content-Encoding one
        with client.stream("POST", "/v1/chat/completions", headers={
                "Accept-Encoding": "gzip", **headers}, json={
                "messages": [{"role": "user", "content": "x"}], "stream_format": "msgpack",
                "stream": True}) as resp:
            assert resp.status_code == 200
            assert resp.headers.get("content-encoding") == content_encoding
            assert resp.headers.get("tokenwire-content-encoding") == raw_coding
            body = resp.read()
    if raw_coding == "gzip":
        body = gzip.decompress(body)
    frames = list(FrameDecoder().feed(body))
    assert [i for f in frames for i in f.ids] == [9707, 28, 2**16] and frames[-1].done


@pytest.mark.parametrize(("scheme", "origin", "reached"), [
    ("ws", "http://127.0.0.1:8000", True),  # a same-origin browser WebSocket
    ("wss", "https://127.0.0.1:8000", True),
    ("ws", "http://127.0.0.1:9000", False),  # another port is another origin
])
def test_a_websocket_scope_compares_its_origin_as_the_browser_writes_it(
        scheme, origin, reached) -> None:
    seen: list[str] = []

    async def app(scope, receive, send) -> None:
        seen.append(scope["type"])
        await send({"type": "websocket.close", "code": 1000})

    scope = {"type": "websocket", "scheme": scheme, "path": "/v1/responses",
             "raw_path": b"/v1/responses", "query_string": b"", "client": ("127.0.0.1", 5000),
             "headers": [(b"host", b"127.0.0.1:8000"), (b"origin", origin.encode())]}
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "websocket.connect"}

    async def send(message: dict) -> None:
        sent.append(message)

    middleware = SecurityMiddleware(app, bearer_tokens=(), allow_unauthenticated_localhost=True,
                                    responses_websocket=True)
    asyncio.run(middleware(scope, receive, send))
    assert (seen == ["websocket"]) is reached, sent
