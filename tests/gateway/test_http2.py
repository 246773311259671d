"""HTTP/2 in ``tokenwire serve`` (issue 15): h2c with prior knowledge, TLS with ALPN, many
streams on one connection, Codec streams and their compression unchanged, client resets.

The server is what ``serve_gateway`` serves (``test_hardening.serve_stack``), on its own
loopback port; clients are real: ``httpx`` with ``http2=True`` (the ``h2`` library),
``curl --http2-prior-knowledge`` (nghttp2), and a raw ``h2`` client where a test must
control frames (resets, one connection). Every wait is a generous safety net.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import socket
import ssl
import subprocess
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import brotli
import h2.config
import h2.connection
import h2.events
import httpx
import pytest
import zstandard

from tokenwire.codec import frames_msgpack
from tokenwire.codec.compression import ZstdDict, train_dictionary
from tokenwire.codec.frames import StreamFormat
from tokenwire.codec.requests import CodecRequest, encode_request
from tokenwire.gateway.apis.codec_stream import CodecStreamRenderer
from tokenwire.gateway.ir import Finish, FinishKind, TokenDelta, Usage
from tokenwire.gateway.settings import ServerSettings

from .test_hardening import KEY, Scripted, Stack, serve_stack, stop_stacks

WAIT_S = 60
AUTH = {"authorization": f"Bearer {KEY}"}
IDS = list(range(100, 164))
#: 64 tokens with a little pacing, so they span several coalescing windows.
PACED = [(0.002, TokenDelta(ids=(i,), text=f" t{i}")) for i in IDS] + [
    (0.0, Usage(prompt_tokens=3, completion_tokens=len(IDS))), (0.0, Finish(reason=FinishKind.EOS))]
CHAT = {"model": "scripted", "messages": [{"role": "user", "content": "Hi"}], "stream": True}


@pytest.fixture(scope="module")
def served(smollm2_map) -> Iterator[Callable[..., Stack]]:
    running: list[tuple[Any, threading.Thread]] = []
    patch = pytest.MonkeyPatch()

    def start(upstream: Any = None, **kw: Any) -> Stack:
        kw.setdefault("max_concurrent", 64)
        kw.setdefault("queue_size", 64)
        return serve_stack(patch, running, ServerSettings(api_keys=(KEY,), auth="keys", **kw),
                           smollm2_map, upstream=upstream or Scripted(list(PACED)))
    start.running = running  # type: ignore[attr-defined]
    yield start
    stop_stacks(patch, running)


@pytest.fixture(scope="module")
def h2c(served) -> Stack:
    return served()


def _sse_text(body: str) -> str:
    out = []
    for block in body.split("\n\n"):
        if block.startswith("data: {"):
            choices = json.loads(block[6:])["choices"]
            if choices:
                out.append(choices[0]["delta"].get("content") or "")
    return "".join(out)


# -- h2c with prior knowledge, and TLS with ALPN --------------------------------------------


def test_httpx_speaks_h2c_with_prior_knowledge_and_gets_the_same_answers(h2c) -> None:
    with httpx.Client(http1=False, http2=True, base_url=h2c.url, headers=AUTH,
                      timeout=WAIT_S) as two, \
            httpx.Client(base_url=h2c.url, headers=AUTH, timeout=WAIT_S) as one:
        models2, models1 = two.get("/v1/models"), one.get("/v1/models")
        assert (models2.http_version, models1.http_version) == ("HTTP/2", "HTTP/1.1")
        assert models2.json()["data"][0]["id"] == models1.json()["data"][0]["id"] == "scripted"
        chat2, chat1 = two.post("/v1/chat/completions", json=CHAT), \
            one.post("/v1/chat/completions", json=CHAT)
        assert chat2.status_code == chat1.status_code == 200
        want = "".join(f" t{i}" for i in IDS)
        assert _sse_text(chat2.text) == _sse_text(chat1.text) == want
        assert chat2.text.rstrip().endswith("data: [DONE]")
        # Refusals keep their API shape over HTTP/2.
        denied = two.post("/v1/chat/completions", json=CHAT, headers={"authorization": "x"})
        assert denied.status_code == 401 and denied.json()["error"]["type"]


def _tls_files(tmp_path) -> tuple[Any, Any, Any]:
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(cert_path)
    cert.private_key_pem.write_to_path(key_path)
    return ca, cert_path, key_path


@pytest.mark.parametrize("http2_on", [True, False])
def test_tls_offers_h2_by_alpn_and_http11_beside_it(served, tmp_path, http2_on) -> None:
    ca, cert, key = _tls_files(tmp_path)
    stack = served(tls_cert=cert, tls_key=key, http2=http2_on)
    url = stack.url.replace("http://", "https://")
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    with httpx.Client(http2=True, verify=ctx, base_url=url, headers=AUTH,
                      timeout=WAIT_S) as client:
        resp = client.post("/v1/chat/completions", json=CHAT)
    assert resp.http_version == ("HTTP/2" if http2_on else "HTTP/1.1")
    assert _sse_text(resp.text) == "".join(f" t{i}" for i in IDS)
    with httpx.Client(verify=ctx, base_url=url, headers=AUTH, timeout=WAIT_S) as client:
        assert client.get("/v1/models").http_version == "HTTP/1.1"  # no ALPN h2 offered


def test_over_tls_a_refused_h2_client_gets_its_429_in_http2(served, tmp_path) -> None:
    ca, cert, key = _tls_files(tmp_path)
    stack = served(tls_cert=cert, tls_key=key, max_connections_per_client=1)
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", stack.port)) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as held:
        assert held.selected_alpn_protocol() == "h2"  # holds the address's one slot
        with httpx.Client(http2=True, verify=ctx, timeout=WAIT_S) as client:
            resp = client.get(f"https://127.0.0.1:{stack.port}/v1/models", headers=AUTH)
    assert resp.http_version == "HTTP/2" and resp.status_code == 429
    assert resp.headers["retry-after"] == "1"
    assert resp.json()["error"]["code"] == "too_many_connections"


def test_no_http2_serves_http11_only(served) -> None:
    stack = served(http2=False)
    with httpx.Client(http1=False, http2=True, base_url=stack.url, headers=AUTH,
                      timeout=WAIT_S) as client, pytest.raises(httpx.HTTPError):
        client.get("/v1/models")
    assert httpx.get(stack.url + "/v1/models", headers=AUTH).status_code == 200


@pytest.mark.parametrize(("argv", "server", "want"), [
    ([], None, (True, None, None)),
    (["--no-http2"], None, (False, None, None)),
    (["--tls-cert", "c.pem", "--tls-key", "k.pem"], None, (True, "c.pem", "k.pem")),
    ([], {"http2": False, "tls_cert": "fc.pem", "tls_key": "fk.pem"},
     (False, "fc.pem", "fk.pem")),
    (["--tls-cert", "c.pem", "--tls-key", "k.pem"], {"tls_cert": "fc.pem",
                                                     "tls_key": "fk.pem"},
     (True, "c.pem", "k.pem")),  # flags beat the file
])
def test_http2_and_tls_settings_from_flags_and_file(argv, server, want) -> None:
    from pathlib import Path

    from .test_hardening import _settings

    got = _settings(argv, {}, server)
    assert (got.http2, got.tls_cert, got.tls_key) == (
        want[0], *(Path(p) if p else None for p in want[1:]))


def test_settings_need_both_tls_files(tmp_path) -> None:
    from tokenwire.errors import ConfigError

    with pytest.raises(ConfigError, match="tls-key"):
        ServerSettings(tls_cert=tmp_path / "cert.pem")


# -- Codec streams and their compression, unchanged --------------------------------------------


@pytest.fixture(scope="module")
def zdict() -> ZstdDict:
    rng = random.Random(5)

    def sample() -> bytes:
        r = CodecStreamRenderer(StreamFormat("msgpack"))
        out = [c for _ in range(rng.randint(20, 120))
               for c in r.on_event(TokenDelta(ids=(rng.randint(0, 49151),)))]
        return b"".join(out + r.on_event(Finish(reason=FinishKind.EOS)))
    return ZstdDict.from_bytes(train_dictionary([sample() for _ in range(200)], size=4096))


def _stock(encoding: str, zdict: ZstdDict) -> Callable[[bytes], bytes]:
    if encoding == "gzip":
        return zlib.decompressobj(wbits=31).decompress
    if encoding == "br":
        return brotli.Decompressor().process
    if encoding == "zstd":
        zd = zstandard.ZstdCompressionDict(zdict.raw)
        return zstandard.ZstdDecompressor(dict_data=zd).decompressobj().decompress
    return lambda b: b


CODEC_BODY = encode_request(CodecRequest(prompt_ids=(1, 2, 3), max_tokens=64,
                                         stream_format="msgpack"), "msgpack")
CODEC_HEADERS = {"content-type": "application/x-msgpack", "Codec-Client-Version": "0.5", **AUTH}


def _codec_frames(client: httpx.Client, encoding: str, zdict: ZstdDict
                  ) -> tuple[str, list[list[int]]]:
    """One Codec stream, decoded frame by frame as its chunks arrive (stock decoders)."""
    dec = frames_msgpack.FrameDecoder()
    decompress = _stock(encoding, zdict)
    frames: list[list[int]] = []
    with client.stream("POST", "/v1/completions/codec", content=CODEC_BODY,
                       headers={**CODEC_HEADERS, "accept-encoding": encoding}) as resp:
        assert resp.status_code == 200
        got = resp.headers.get("content-encoding", "identity")
        for chunk in resp.iter_raw():
            frames += [list(f.ids) for f in dec.feed(decompress(chunk))]
    dec.feed_eof()
    return got, frames


@pytest.mark.parametrize("encoding", ["identity", "gzip", "br", "zstd"])
def test_a_codec_stream_and_its_compression_are_the_same_over_http2(served, zdict,
                                                                    encoding) -> None:
    stack = served(zstd_dicts={"msgpack": zdict}, window_s=0.005)
    with httpx.Client(http1=False, http2=True, base_url=stack.url, timeout=WAIT_S) as two, \
            httpx.Client(base_url=stack.url, timeout=WAIT_S) as one:
        enc2, frames2 = _codec_frames(two, encoding, zdict)
        enc1, frames1 = _codec_frames(one, encoding, zdict)
    assert enc2 == enc1 == encoding
    assert [i for f in frames2 for i in f] == [i for f in frames1 for i in f] == IDS


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_http2_prior_knowledge_drives_a_codec_stream(served, zdict) -> None:
    stack = served(zstd_dicts={"msgpack": zdict})
    out = subprocess.run(
        ["curl", "--silent", "--show-error", "--http2-prior-knowledge", "--max-time", "60",
         "--write-out", "\n%{http_version} %{response_code}", "--output", "-",
         "-H", "content-type: application/x-msgpack", "-H", f"authorization: Bearer {KEY}",
         "-H", "accept-encoding: gzip", "--data-binary", "@-",
         stack.url + "/v1/completions/codec"],
        input=CODEC_BODY, capture_output=True, timeout=WAIT_S, check=True).stdout
    body, _, status = out.rpartition(b"\n")
    assert status == b"2 200"
    dec = frames_msgpack.FrameDecoder()
    frames = dec.feed(zlib.decompress(body, wbits=31))
    dec.feed_eof()
    assert [i for f in frames for i in f.ids] == IDS and frames[-1].done


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_http2_over_http_gets_http11_its_upgrade_ignored(h2c) -> None:
    """``curl --http2`` on an http:// URL asks for ``Upgrade: h2c`` (RFC 7540 §3.2, which
    RFC 9113 §3.1 deprecated); the gateway does not upgrade (README "HTTP/2"), so curl goes
    on in HTTP/1.1: a whole stream, then a second request on the same connection."""
    url = h2c.url + "/v1/chat/completions"
    result = subprocess.run(
        ["curl", "--silent", "--show-error", "--verbose", "--http2", "--max-time", "60",
         "-H", "content-type: application/json", "-H", f"authorization: Bearer {KEY}",
         "--data", json.dumps(CHAT), url, "--next", "--http2",
         "-H", f"authorization: Bearer {KEY}", h2c.url + "/v1/models"],
        capture_output=True, timeout=WAIT_S, check=True, text=True)
    assert "> Upgrade: h2c" in result.stderr  # curl did ask
    assert "< HTTP/1.1 200" in result.stderr and "< HTTP/2" not in result.stderr
    assert "Re-using existing connection" in result.stderr  # the answer kept it usable
    chat, _, models = result.stdout.partition("data: [DONE]")
    assert _sse_text(chat) == "".join(f" t{i}" for i in IDS)
    assert json.loads(models)["data"][0]["id"] == "scripted"


# -- many streams on one connection, and a reset ----------------------------------------------


class RawH2:
    """A raw HTTP/2 client on one socket (h2's client state machine): exact frames."""

    def __init__(self, port: int, source: str = "127.0.0.1") -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind((source, 0))
        self.sock.connect(("127.0.0.1", port))
        self.sock.settimeout(WAIT_S)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=True, header_encoding=None))
        self.conn.initiate_connection()
        self.conn.increment_flow_control_window(1 << 24)
        self.flush()
        self.closed = False
        self.data: dict[int, bytearray] = {}
        self.ended: set[int] = set()
        self.reset: dict[int, int] = {}
        self.heads: dict[int, dict[bytes, bytes]] = {}
        self.goaway: h2.events.ConnectionTerminated | None = None

    def flush(self) -> None:
        if data := self.conn.data_to_send():
            self.sock.sendall(data)

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None, end: bool = True) -> int:
        sid = self.conn.get_next_available_stream_id()
        head = [(b":method", method.encode()), (b":path", path.encode()),
                (b":scheme", b"http"), (b":authority", b"127.0.0.1"),
                (b"authorization", f"Bearer {KEY}".encode())]
        head += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
        self.conn.send_headers(sid, head, end_stream=body is None and end)
        if body is not None:
            self.conn.send_data(sid, body, end_stream=end)
        self.flush()
        return sid

    def pump(self, until: Callable[[], bool], wait: float = WAIT_S) -> None:
        """Read and handle frames until ``until()`` or the server closes; fail at ``wait``."""
        deadline = time.monotonic() + wait
        while not until():
            if self.closed:
                return
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                pytest.fail("the server neither answered nor closed in time")
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                self.closed = True
                return
            for ev in self.conn.receive_data(chunk):
                self._on(ev)
            self.flush()

    def _on(self, ev: Any) -> None:
        if isinstance(ev, h2.events.ResponseReceived):
            self.heads[ev.stream_id] = dict(ev.headers)
        elif isinstance(ev, h2.events.DataReceived):
            self.data.setdefault(ev.stream_id, bytearray()).extend(ev.data)
            self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
        elif isinstance(ev, h2.events.StreamEnded):
            self.ended.add(ev.stream_id)
        elif isinstance(ev, h2.events.StreamReset):
            self.reset[ev.stream_id] = ev.error_code
        elif isinstance(ev, h2.events.ConnectionTerminated):
            self.goaway = ev

    def close(self) -> None:
        self.sock.close()


class Gated(Scripted):
    """Streams PACED, but none emits a token before ``n`` requests have arrived: served one
    at a time, they would never finish (the test's safety net fails instead)."""

    def __init__(self, n: int) -> None:
        super().__init__(list(PACED))
        self.n = n
        self.gate = asyncio.Event()

    def submit(self, request: Any) -> Any:
        stream = super().submit(request)
        if len(self.requests) >= self.n:
            self.gate.set()
        gate, inner = self.gate, stream.next_event

        async def next_event() -> Any:
            await gate.wait()
            return await inner()
        stream.next_event = next_event
        return stream


def test_32_concurrent_streams_share_one_connection(served) -> None:
    upstream = Gated(32)
    stack = served(upstream)
    client = RawH2(stack.port)
    try:
        body = json.dumps(CHAT).encode()
        sids = [client.request("POST", "/v1/chat/completions", body,
                               {"content-type": "application/json"}) for _ in range(32)]
        client.pump(lambda: client.ended >= set(sids))
        assert not client.closed and client.goaway is None
        want = "".join(f" t{i}" for i in IDS)
        for sid in sids:
            assert client.heads[sid][b":status"] == b"200"
            assert _sse_text(client.data[sid].decode()) == want
    finally:
        client.close()
    assert len(upstream.requests) == 32 and upstream.cancelled == []


class HoldFirst(Scripted):
    """The first request emits one token, then holds until cancelled; the others stream
    PACED."""

    def submit(self, request: Any) -> Any:
        stream = super().submit(request)
        if len(self.requests) == 1:
            inner = stream.next_event
            calls = {"n": 0}

            async def next_event() -> Any:
                calls["n"] += 1
                if calls["n"] > 1:
                    await asyncio.Event().wait()  # until the gateway cancels it
                return await inner()
            stream.next_event = next_event
        return stream


def test_a_reset_stream_stops_its_generation_and_frees_its_slot_while_others_go_on(
        served) -> None:
    upstream = HoldFirst(list(PACED))
    stack = served(upstream)
    client = RawH2(stack.port)
    body = json.dumps(CHAT).encode()
    try:
        held = client.request("POST", "/v1/chat/completions", body,
                              {"content-type": "application/json"})
        client.pump(lambda: b"t100" in client.data.get(held, b""))
        other = client.request("POST", "/v1/chat/completions", body,
                               {"content-type": "application/json"})
        client.pump(lambda: b"data:" in client.data.get(other, b""))
        assert stack.state.admission.running == 2
        client.conn.reset_stream(held)
        client.flush()
        client.pump(lambda: other in client.ended)
        assert _sse_text(client.data[other].decode()) == "".join(f" t{i}" for i in IDS)
        deadline = time.monotonic() + WAIT_S
        while upstream.cancelled != [upstream.requests[0].request_id] \
                or stack.state.admission.running:
            assert time.monotonic() < deadline, "the reset stream was never cancelled"
            time.sleep(0.01)
        again = client.request("GET", "/v1/models")  # the connection lives on
        client.pump(lambda: again in client.ended)
        assert client.heads[again][b":status"] == b"200"
    finally:
        client.close()


class HoldUntil(Scripted):
    """Every stream emits one token, then waits for ``release`` (a thread event)."""

    def __init__(self) -> None:
        super().__init__(list(PACED))
        self.release = threading.Event()

    def submit(self, request: Any) -> Any:
        stream = super().submit(request)
        inner, calls, release = stream.next_event, {"n": 0}, self.release

        async def next_event() -> Any:
            calls["n"] += 1
            if calls["n"] == 2:
                await asyncio.to_thread(release.wait, WAIT_S)
            return await inner()
        stream.next_event = next_event
        return stream


def test_a_graceful_shutdown_lets_the_stream_in_flight_finish_then_sends_goaway(served) -> None:
    upstream = HoldUntil()
    stack = served(upstream)
    server = served.running[-1][0]
    client = RawH2(stack.port)
    try:
        sid = client.request("POST", "/v1/chat/completions", json.dumps(CHAT).encode(),
                             {"content-type": "application/json"})
        client.pump(lambda: b"t100" in client.data.get(sid, b""))
        server.begin_shutdown()
        upstream.release.set()
        client.pump(lambda: sid in client.ended)
        assert _sse_text(client.data[sid].decode()) == "".join(f" t{i}" for i in IDS)
        client.pump(lambda: False)  # then GOAWAY, and the server closes the connection
        assert client.closed and client.goaway is not None
        assert client.goaway.error_code == 0 and client.goaway.last_stream_id == sid
    finally:
        upstream.release.set()
        client.close()


# -- the embedded engine over HTTP/2 --------------------------------------------------------------


@pytest.mark.slow
def test_the_embedded_engine_streams_the_same_codec_ids_over_h2c_and_http11(served,
                                                                             engine) -> None:
    """The real SmolLM2 behind ``serve_gateway``: a greedy Codec stream over h2c (httpx and
    curl) carries exactly the ids the engine recorded, and the ids HTTP/1.1 carries."""
    stack = served(engine)
    body = {"model": "scripted", "prompt": "The capital of France is", "max_tokens": 12,
            "temperature": 0, "seed": 7, "stream_format": "msgpack"}

    def ids_over(client: httpx.Client) -> tuple[list[int], str]:
        dec = frames_msgpack.FrameDecoder()
        with client.stream("POST", "/v1/completions", json=body,
                           headers={"accept-encoding": "gzip", **AUTH}) as resp:
            assert resp.status_code == 200
            decompress = _stock(resp.headers.get("content-encoding", "identity"), None)
            got = [i for chunk in resp.iter_raw() for f in dec.feed(decompress(chunk))
                   for i in f.ids]
        return got, resp.headers["x-request-id"]

    with httpx.Client(http1=False, http2=True, base_url=stack.url, timeout=120) as two, \
            httpx.Client(base_url=stack.url, timeout=120) as one:
        ids2, rid = ids_over(two)
        ids1, _ = ids_over(one)
    assert ids2 == ids1 and ids2 == list(engine.wait_for_record(rid).ids) and ids2
    if shutil.which("curl") is not None:
        out = subprocess.run(
            ["curl", "--silent", "--show-error", "--http2-prior-knowledge", "--max-time", "120",
             "-H", "content-type: application/json", "-H", f"authorization: Bearer {KEY}",
             "--data-binary", json.dumps(body), "--output", "-",
             stack.url + "/v1/completions"], capture_output=True, timeout=180,
            check=True).stdout
        dec = frames_msgpack.FrameDecoder()
        assert [i for f in dec.feed(out) for i in f.ids] == ids2
