"""The playground page (``GET /``) driven in a real headless Chromium (issue 17).

Debian's ``chromium`` and ``chromedriver`` (installed by ``scripts/system-packages.sh``)
through ``selenium``; the browser is started here, once per module. The gateway is the real
served stack (``harden(create_app())`` on a loopback socket) over the real embedded engine.
A recording ASGI wrapper outside the stack counts the body bytes the server wrote for each
response, so the page's counters are compared with what really went on the wire.

What must hold:

* every wire format streams (JSON-SSE, and msgpack / protobuf with identity, gzip, br), and
  the text the page decoded from Codec frames equals the server's own text for the same
  request (temperature 0), and the page's byte counter equals the server's count;
* a map whose bytes do not hash to the served hash is refused in the page;
* without a key, or with a wrong one, the page shows the API's message; with the right one
  it works;
* through a pool of two replicas and with the WebSocket Responses server enabled the page
  keeps working, and the status view lists both replicas.

``TOKENWIRE_SCREENSHOTS=docs`` also writes the two screenshots the README shows
(docs/playground.png, docs/status.png); otherwise they go to the test's tmp directory.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from tests.gateway.conftest import make_state
from tokenwire.codec import frames_msgpack, frames_protobuf
from tokenwire.codec.frames import Frame, ToolCall
from tokenwire.gateway.config import parse_config
from tokenwire.gateway.http.app import create_app
from tokenwire.gateway.http.security import harden
from tokenwire.gateway.server import serve_gateway
from tokenwire.gateway.settings import ServerSettings

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
DOCS = Path(__file__).resolve().parents[2] / "docs"
PROMPT = "Name three colours."
MAX_TOKENS = 24
#: Generous safety nets for a loaded machine, never what is measured.
PAGE_TIMEOUT_S = 180
CHAT = "/v1/chat/completions"
MAP_PATH = "/.well-known/codec/maps/huggingfacetb/smollm2.json"
WIRES = [("json", "identity"), ("json", "gzip"),
         *[(w, c) for w in ("msgpack", "protobuf") for c in ("identity", "gzip", "br")]]


# -- the browser -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Debian Chromium through its own chromedriver (never a downloaded browser)."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if shutil.which(p) is None]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("selenium (the test extra)")
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"missing in CI: {', '.join(missing)} (scripts/system-packages.sh, "
                        "pip install -e .[test])")
        pytest.skip(f"not installed: {', '.join(missing)}")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1000,760", "--hide-scrollbars"):
        options.add_argument(arg)
    # The explicit driver path keeps selenium-manager from looking for (downloading) one.
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_script_timeout(PAGE_TIMEOUT_S)
    yield driver
    driver.quit()


def wait_for(driver: Any, predicate: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + PAGE_TIMEOUT_S
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"the page never showed {what}; error box: {error_text(driver)!r}")


def by_id(driver: Any, element_id: str) -> Any:
    from selenium.webdriver.common.by import By
    return driver.find_element(By.ID, element_id)


def error_text(driver: Any) -> str:
    return by_id(driver, "error").text


def open_page(driver: Any, url: str) -> str:
    driver.get(url + "/")
    return wait_for(driver, lambda: driver.execute_script("return document.body.dataset.ready"),
                    "models")


def use_key(driver: Any, key: str) -> str:
    box = by_id(driver, "key")
    box.clear()
    box.send_keys(key)
    driver.execute_script("document.body.dataset.ready = ''")
    by_id(driver, "key-form").submit()
    return wait_for(driver, lambda: driver.execute_script("return document.body.dataset.ready"),
                    "the models after the key")


@dataclass
class PageRun:
    state: str
    text: str | None
    json_text: str | None
    wire_bytes: int | None
    json_wire_bytes: int | None
    tokens: int
    error: str


def chat(driver: Any, wire: str, coding: str, *, compare: bool = True) -> PageRun:
    from selenium.webdriver.support.ui import Select

    Select(by_id(driver, "wire")).select_by_value(wire)
    Select(by_id(driver, "coding")).select_by_value(coding)
    tokens = by_id(driver, "max-tokens")
    tokens.clear()
    tokens.send_keys(str(MAX_TOKENS))
    prompt = by_id(driver, "prompt")
    prompt.clear()
    prompt.send_keys(PROMPT)
    if by_id(driver, "compare").is_selected() != compare:
        by_id(driver, "compare").click()
    driver.execute_script("document.getElementById('answer').dataset.state = 'idle'")
    by_id(driver, "send").click()
    state = wait_for(driver, lambda: driver.execute_script(
        "const s = document.getElementById('answer').dataset.state;"
        "return s === 'done' || s === 'error' ? s : null"), "the end of the answer")

    def data(element_id: str, name: str) -> str | None:
        return driver.execute_script(
            f"return document.getElementById('{element_id}').dataset['{name}'] ?? null")

    def number(value: str | None) -> int | None:
        return int(value) if value else None

    return PageRun(state=state, text=data("answer", "text"), json_text=data("answer", "jsonText"),
                   wire_bytes=number(data("row-main", "wireBytes")),
                   json_wire_bytes=number(data("row-json", "wireBytes")),
                   tokens=int(data("row-main", "tokens") or 0), error=error_text(driver))


def screenshot(driver: Any, name: str, tmp_path: Path) -> Path:
    target = DOCS if os.environ.get("TOKENWIRE_SCREENSHOTS") == "docs" else tmp_path
    path = target / name
    driver.save_screenshot(str(path))
    return path


# -- the served stack, recorded --------------------------------------------------------------


@dataclass
class Sent:
    method: str
    path: str
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body_bytes: int = 0


class Recorder:
    """Outermost ASGI wrapper: what the server sent for each request (body bytes as written,
    after the gateway's own content coding)."""

    def __init__(self, app: Any) -> None:
        self.app, self.sent = app, []

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = Sent(scope["method"], scope["path"])
        self.sent.append(record)

        async def recording(message: dict) -> None:
            if message["type"] == "http.response.start":
                record.status = message["status"]
                record.headers = {k.decode().lower(): v.decode() for k, v in message["headers"]}
            elif message["type"] == "http.response.body":
                record.body_bytes += len(message.get("body", b""))
            await send(message)

        await self.app(scope, receive, recording)

    def chats(self) -> list[Sent]:
        return [s for s in self.sent if s.method == "POST" and s.path == CHAT]


class TamperedMap:
    """Serves the map with one vocabulary string changed (same length): a map on the way
    that no longer hashes to what ``/v1/models`` and the stream name."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != MAP_PATH:
            await self.app(scope, receive, send)
            return

        async def tampering(message: dict) -> None:
            if message["type"] == "http.response.body" and b'"hello"' in message["body"]:
                message = {**message, "body": message["body"].replace(b'"hello"', b'"jello"', 1)}
            await send(message)

        await self.app(scope, receive, tampering)


@dataclass
class Live:
    url: str
    recorder: Recorder
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def listen() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock


def wait_started(server: uvicorn.Server, thread: threading.Thread) -> None:
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)


def serve_page(engine: Any, smollm2_map: Any, *, wrap: Callable[[Any], Any] | None = None,
               **settings: Any) -> Live:
    server_settings = ServerSettings(**settings)
    app = harden(create_app(make_state(server_settings, engine, smollm2_map)), server_settings)
    recorder = Recorder(wrap(app) if wrap else app)
    sock = listen()
    server = uvicorn.Server(uvicorn.Config(recorder, log_level="warning", lifespan="off",
                                           timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_started(server, thread)
    return Live(f"http://127.0.0.1:{sock.getsockname()[1]}", recorder, server, thread)


@pytest.fixture(scope="module")
def live(engine, smollm2_map) -> Iterator[Live]:
    """The embedded engine, open on loopback, the WebSocket Responses server on."""
    served = serve_page(engine, smollm2_map, responses_websocket=True)
    yield served
    served.stop()


def server_text(url: str, headers: dict[str, str] | None = None) -> str:
    """The server's own answer for the page's request (same fields, not streamed)."""
    resp = httpx.post(url + CHAT, headers=headers or {}, timeout=PAGE_TIMEOUT_S,
                      json={
        "messages": [{"role": "user", "content": PROMPT}], "max_tokens": MAX_TOKENS,
        "temperature": 0, "seed": 0})
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]["message"]["content"]


@functools.cache
def live_text(url: str) -> str:
    """:func:`server_text` of the module's server, asked once: greedy with a fixed seed, the
    server's answer to this request is one text (each wire's test compares with it)."""
    return server_text(url)


# -- tests -----------------------------------------------------------------------------------


def test_the_page_is_served_with_a_strict_policy_and_without_a_key(engine, smollm2_map) -> None:
    keyed = serve_page(engine, smollm2_map, api_keys=("right-key",))
    try:
        page = httpx.get(keyed.url + "/")
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        csp = page.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src 'self'" in csp
        assert "unsafe-inline" not in csp and "<script>" not in page.text  # no inline script
        for asset in ("/playground/playground.js", "/playground/playground.css"):
            assert httpx.get(keyed.url + asset).status_code == 200
        assert httpx.get(keyed.url + "/v1/models").status_code == 401  # the data needs the key
        assert httpx.post(keyed.url + "/").status_code in (401, 405)
    finally:
        keyed.stop()


@pytest.mark.parametrize(("wire", "coding"), WIRES, ids=[f"{w}-{c}" for w, c in WIRES])
def test_every_wire_streams_the_servers_text_and_counts_the_servers_bytes(
        browser, request, wire, coding) -> None:
    live = request.getfixturevalue("live")
    assert open_page(browser, live.url) == "models"
    before = len(live.recorder.chats())
    run = chat(browser, wire, coding, compare=True)
    assert run.state == "done", run.error
    chats = live.recorder.chats()[before:]
    expected = live_text(live.url)
    assert run.text == expected
    assert run.tokens > 0
    main = chats[0]
    assert main.status == 200
    if coding == "gzip":  # the page inflates it: not named as Content-Encoding
        assert main.headers["tokenwire-content-encoding"] == "gzip"
        assert "content-encoding" not in main.headers
    else:  # br is inflated by the browser; identity has none
        assert main.headers.get("content-encoding", "identity") == coding
    assert run.wire_bytes == main.body_bytes  # the page counted what the server wrote
    if wire != "json":  # compare mode fetched the same answer as JSON-SSE, same coding
        assert len(chats) == 2 and run.json_text == expected
        assert run.json_wire_bytes == chats[1].body_bytes
        assert run.wire_bytes < run.json_wire_bytes  # ids are smaller than JSON text


def test_screenshots_of_the_playground_and_the_status_view(browser, live, tmp_path) -> None:
    assert open_page(browser, live.url) == "models"
    run = chat(browser, "msgpack", "gzip", compare=True)
    assert run.state == "done", run.error
    assert by_id(browser, "ratio").text.startswith("JSON-SSE took ")
    tokens = browser.execute_script("return document.querySelectorAll('#answer .tok').length")
    assert tokens == run.tokens  # one shaded span per id
    hover = browser.execute_script("return document.querySelector('#answer .tok').title")
    assert hover.startswith("id ") and "bytes" in hover
    shot = screenshot(browser, "playground.png", tmp_path)
    assert shot.stat().st_size > 0

    by_id(browser, "tab-status").click()
    wait_for(browser, lambda: browser.execute_script(
        "return document.getElementById('status').dataset.state"), "the status view")
    # Traffic while the view polls: an answer (tokens/s) and two refused requests (errors).
    for body in ({"messages": "not a list"}, {"model": "no-such-model", "messages": []}):
        assert httpx.post(live.url + CHAT, json=body, timeout=30).status_code in (400, 404)
    server_text(live.url)
    wait_for(browser, lambda: browser.execute_script(
        "return state.tpsSeries.some((v) => v > 0)"), "a tokens/s reading")
    wait_for(browser, lambda: browser.execute_script(
        "return document.querySelectorAll('#chart-errors rect').length"), "the error bars")
    models = by_id(browser, "models").text
    assert "huggingfacetb/smollm2" in models and "1024" in models
    upstreams = by_id(browser, "upstreams").text
    assert "up" in upstreams
    # The view shows its last poll, which may have caught the answer above still running.
    wait_for(browser, lambda: "running 0" in by_id(browser, "capacity").text,
             "no request running")
    assert browser.execute_script("return document.querySelectorAll('#chart-tps polyline')"
                                  ".length") == 1
    shot = screenshot(browser, "status.png", tmp_path)
    assert shot.stat().st_size > 0
    by_id(browser, "tab-play").click()


def test_the_websocket_responses_server_stays_up_beside_the_page(live) -> None:
    from websockets.sync.client import connect

    with connect(live.url.replace("http://", "ws://") + "/v1/responses") as ws:
        assert ws.protocol is not None  # the upgrade was served on the page's server


def test_a_map_that_does_not_hash_to_the_served_hash_is_refused(
        browser, engine, smollm2_map) -> None:
    tampered = serve_page(engine, smollm2_map, wrap=TamperedMap)
    try:
        served = httpx.get(tampered.url + MAP_PATH).content
        assert b'"jello"' in served  # the test server really serves other bytes
        assert open_page(browser, tampered.url) == "models"
        run = chat(browser, "msgpack", "identity", compare=False)
        assert run.state == "error"
        assert "Refused the tokenizer map huggingfacetb/smollm2" in run.error
        assert smollm2_map.hash in run.error
        assert tampered.recorder.chats() == []  # refused before asking for a stream
        assert browser.execute_script("return document.querySelectorAll('#answer span')"
                                      ".length") == 0
    finally:
        tampered.stop()


def test_no_key_or_a_wrong_key_shows_the_apis_message(browser, engine, smollm2_map) -> None:
    keyed = serve_page(engine, smollm2_map, api_keys=("right-key",))
    try:
        browser.execute_script("sessionStorage.clear()")
        assert open_page(browser, keyed.url) == "error"
        assert "401" in error_text(browser) and "Missing or invalid API key" in error_text(browser)
        assert use_key(browser, "wrong-key") == "error"
        assert "Missing or invalid API key" in error_text(browser)
        assert use_key(browser, "right-key") == "models"
        assert error_text(browser) == ""
        assert "right-key" not in browser.current_url
        run = chat(browser, "protobuf", "gzip", compare=False)
        assert run.state == "done", run.error
        assert run.wire_bytes == keyed.recorder.chats()[-1].body_bytes
        assert run.text == server_text(keyed.url, {"Authorization": "Bearer right-key"})
    finally:
        browser.execute_script("sessionStorage.clear()")
        keyed.stop()


def test_the_page_works_through_a_pool_of_two_replicas(browser, serve, engine) -> None:
    replicas = [serve(engine) for _ in range(2)]
    cfg = parse_config({"upstreams": [{
        "name": "pool", "kind": "openai",
        "replicas": [{"base_url": r.url + "/v1"} for r in replicas],
        "models": [{"name": "smol", "upstream_model": engine.model_id,
                    "map": "huggingfacetb/smollm2"}]}]}, env={})
    sock, ready = listen(), {}

    def run() -> None:
        try:
            asyncio.run(serve_gateway(cfg, ServerSettings(), log_level="warning", sockets=[sock],
                                      on_ready=lambda gw, server: ready.update(server=server)))
        except BaseException as exc:  # shown by the assertion below
            ready["failed"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not (ready.get("server") and ready["server"].started):
        if not thread.is_alive() or time.monotonic() > deadline:
            sock.close()
            raise AssertionError(f"the pool gateway did not start: {ready.get('failed')!r}")
        time.sleep(0.02)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        assert open_page(browser, url) == "models"
        for wire, coding in (("msgpack", "gzip"), ("protobuf", "identity")):
            run = chat(browser, wire, coding, compare=True)
            assert run.state == "done", run.error
            assert run.text == run.json_text == server_text(url)
        by_id(browser, "tab-status").click()
        wait_for(browser, lambda: "pool/2" in by_id(browser, "upstreams").text, "both replicas")
        upstreams = by_id(browser, "upstreams").text
        assert "pool/1: breaker closed" in upstreams and "pool/2: breaker closed" in upstreams
        by_id(browser, "tab-play").click()
    finally:
        ready["server"].should_exit = True
        thread.join(10)
        sock.close()


# -- the page's own decoders, against the Python codec ---------------------------------------

#: Every id width of both encodings (msgpack fixint/uint8/16/32, protobuf 1..5-byte varints),
#: an empty heartbeat frame, a terminal with tool calls, and non-ASCII strings.
FRAMES = [
    Frame(ids=(0, 127, 128, 255, 256, 16383, 16384, 65535, 65536, 2**21, 2**28, 2**32 - 1),
          done=False),
    Frame(ids=(), done=False),
    Frame(ids=tuple(range(300)), done=False),  # array16 in msgpack
    Frame(ids=(9707,), done=False),
    Frame(ids=(), done=True, finish_reason="stop_sequence", tool_calls=(
        ToolCall(id="tc_1", name="get_weather", arguments_json='{"city": "Zürich"}'),
        ToolCall(arguments_json=""))),
]

_DECODE_JS = """
const [kind, bytes, step] = arguments;
const dec = kind === "msgpack" ? new MsgpackFrames() : new ProtobufFrames();
const out = [];
try {
  const buf = Uint8Array.from(bytes);
  for (let i = 0; i < buf.length; i += step) {
    for (const f of dec.feed(buf.slice(i, i + step))) out.push(f.frame);
  }
  dec.finish();
  return {frames: out};
} catch (e) { return {error: String(e.message || e)}; }
"""


def _as_dict(frame: Frame) -> dict[str, Any]:
    return {"ids": list(frame.ids), "done": frame.done, "finish_reason": frame.finish_reason,
            "tool_calls": [{"name": t.name, "arguments_json": t.arguments_json, "id": t.id}
                           for t in frame.tool_calls]}


def _page_decode(driver: Any, kind: str, data: bytes, step: int) -> dict[str, Any]:
    return driver.execute_script(_DECODE_JS, kind, list(data), step)


@pytest.mark.parametrize("kind", ["msgpack", "msgpack-prefixed", "protobuf",
                                  "protobuf-legacy"])
def test_the_pages_frame_decoders_equal_the_python_codec(browser, live, kind) -> None:
    """Whole, and one byte at a time (a frame boundary is never a chunk boundary)."""
    if kind.startswith("msgpack"):
        enc = frames_msgpack.FrameEncoder()
        frames = [enc.encode(f) for f in FRAMES]
        if kind == "msgpack-prefixed":  # the overview's 4-byte-prefixed form (DESIGN.md)
            frames = [len(b).to_bytes(4, "big") + b for b in frames]
        decoded = [f for f in frames_msgpack.FrameDecoder().feed(frames[0])]  # sanity
        assert decoded[0].ids == FRAMES[0].ids
    else:
        enc = frames_protobuf.FrameEncoder(legacy_done_false=kind == "protobuf-legacy")
        frames = [enc.encode(f) for f in FRAMES]
    data = b"".join(frames)
    assert open_page(browser, live.url) == "models"
    want = [_as_dict(f) for f in FRAMES]
    for step in (len(data), 1, 7):
        got = _page_decode(browser, kind.split("-")[0], data, step)
        assert got == {"frames": want}, step


@pytest.mark.parametrize(("kind", "data", "message"), [
    ("msgpack", bytes.fromhex("82a3696473"), "ended inside a frame"),  # cut short
    ("msgpack", bytes.fromhex("920102"), "must be a map"),  # a whole array, not a map
    ("msgpack", bytes.fromhex("81a369647391d3000000000000000a"), "0xd3"),  # int64 not allowed
    ("msgpack", bytes.fromhex("81a369647391d0ff"), "unsigned 32-bit"),  # a negative id
    ("protobuf", bytes.fromhex("000000080a06808080808010"), "longer than 5 bytes"),
    ("protobuf", bytes.fromhex("000000030a0281"), "past its frame"),
    ("protobuf", bytes.fromhex("ffffffff"), "over the limit"),
    ("protobuf", bytes.fromhex("0000000a0a"), "ended inside a frame"),
])
def test_the_pages_decoders_refuse_broken_frames(browser, live, kind, data, message) -> None:
    assert open_page(browser, live.url) == "models"
    got = _page_decode(browser, kind, data, len(data))
    assert message in got.get("error", ""), got


def test_the_pages_detokenizer_equals_the_python_one(browser, live, smollm2_map) -> None:
    """Characters split over several byte-level tokens, special ids skipped, one token at a
    time as frames bring them."""
    from tokenwire.codec.detokenizer import Detokenizer
    from tokenwire.codec.tokenizer import Tokenizer

    text = "Zürich 🌊 naïve café — 東京\n\tdone."
    ids = [1, *Tokenizer.from_map(smollm2_map).encode(text), 2]  # <|im_start|> ... <|im_end|>
    assert open_page(browser, live.url) == "models"
    got = browser.execute_async_script("""
        const [ids, done] = arguments;
        loadMap(state.models[0]).then((map) => {
          const d = new Detokenizer(map);
          let out = "";
          for (const id of ids) out += d.push(id).text;
          done(out + d.end());
        }, (e) => done("failed: " + e.message));
    """, ids)
    assert got == Detokenizer(smollm2_map).decode(ids) == text


def test_an_error_from_the_server_is_shown_in_its_own_words(browser, live) -> None:
    """A prompt past the context window: the API's 400 message, in the page."""
    assert open_page(browser, live.url) == "models"
    long_prompt = "word " * 2000  # ~2000 tokens; the window is 1024
    expected = httpx.post(live.url + CHAT, timeout=PAGE_TIMEOUT_S, json={
        "messages": [{"role": "user", "content": long_prompt}], "max_tokens": MAX_TOKENS,
        "stream": True, "stream_format": "msgpack"})
    assert expected.status_code == 400
    message = expected.json()["error"]["message"]
    browser.execute_script("arguments[0].value = arguments[1]", by_id(browser, "prompt"),
                           long_prompt)
    from selenium.webdriver.support.ui import Select

    Select(by_id(browser, "wire")).select_by_value("msgpack")
    browser.execute_script("document.getElementById('answer').dataset.state = 'idle'")
    by_id(browser, "send").click()
    wait_for(browser, lambda: browser.execute_script(
        "return document.getElementById('answer').dataset.state === 'error'"), "the error")
    assert error_text(browser) == f"The server answered 400: {message}"
