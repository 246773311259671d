"""The HTTP surface over a scripted upstream on a real loopback socket (fault injection).

Everything here is about the gateway, not the model: error shapes and statuses, the 426,
header floors, coalescing-window flushes, in-stream errors, disconnects. Interop with real
peers over the real engine is in ``test_e2e_embedded.py``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import zlib

import brotli
import httpx
import pytest

from tokenwire.codec import frames_msgpack, frames_protobuf
from tokenwire.codec.requests import CodecRequest, encode_request
from tokenwire.codec.versioning import VersionPolicy, VersionPolicyMode
from tokenwire.gateway.http.schema import PROTO_SCHEMA
from tokenwire.gateway.ir import (
    Failure,
    FailureClass,
    Finish,
    FinishKind,
    TokenDelta,
    Usage,
)

from .conftest import ScriptedUpstream

SIMPLE = [(0.0, TokenDelta(ids=(10,), text="a")), (0.0, TokenDelta(ids=(11,), text="b")),
          (0.0, Usage(prompt_tokens=1, completion_tokens=2)),
          (0.0, Finish(reason=FinishKind.EOS))]


@pytest.fixture(scope="module")
def simple(serve):
    return serve(ScriptedUpstream(SIMPLE))


def _post(url: str, path: str, body: dict, **headers: str) -> httpx.Response:
    return httpx.post(url + path, json=body, headers=headers, timeout=10)


def _frames(resp: httpx.Response, decoder=frames_msgpack.FrameDecoder):
    dec = decoder()
    frames = dec.feed(resp.content)
    dec.feed_eof()
    return frames


def _assert_json_error(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["code"] and err["code"][0].islower()  # a documented code, never a class name
    return err


# -- 4xx shapes ------------------------------------------------------------------------------


def test_every_4xx_has_the_json_error_body(simple) -> None:
    _assert_json_error(httpx.get(simple.url + "/nope"), 404)
    _assert_json_error(httpx.get(simple.url + "/v1/completions"), 405)
    bad = httpx.post(simple.url + "/v1/completions", content=b"{not json",
                     headers={"content-type": "application/json"})
    _assert_json_error(bad, 400)
    _assert_json_error(_post(simple.url, "/v1/completions", {"prompt": "x", "model": "gpt-9"}),
                       404)


def test_unknown_stream_format_is_400_listing_supported(simple) -> None:
    err = _assert_json_error(
        _post(simple.url, "/v1/completions", {"prompt": "x", "stream_format": "cbor"}), 400)
    assert all(f in err["message"] for f in ("json", "msgpack", "protobuf", "msgpack-delta"))


def test_n_above_one_with_binary_format_is_400(simple) -> None:
    _assert_json_error(_post(simple.url, "/v1/completions",
                             {"prompt": "x", "stream_format": "protobuf", "n": 2}), 400)


def test_body_size_limit_is_413(serve) -> None:
    small = serve(ScriptedUpstream(SIMPLE), max_body_bytes=1000)
    _assert_json_error(_post(small.url, "/v1/completions", {"prompt": "x" * 5000}), 413)


def test_gzip_request_bodies_are_accepted(simple) -> None:
    gz = zlib.compressobj(6, zlib.DEFLATED, 31)
    body = gz.compress(json.dumps({"prompt": "x", "stream_format": "msgpack"}).encode())
    body += gz.flush()
    resp = httpx.post(simple.url + "/v1/completions", content=body,
                      headers={"content-type": "application/json", "content-encoding": "gzip"})
    assert [f.ids for f in _frames(resp)] == [(10,), (11,), ()]


def test_an_upstream_that_stays_busy_is_a_503_after_its_one_retry(serve) -> None:
    """The upstream's own bound (its ServerBusy) is a capacity failure: one retry, then the
    503 (the gateway's own full queue is a 429: tests/gateway/faults)."""
    busy = ScriptedUpstream(SIMPLE, capacity=0)
    resp = _post(serve(busy).url, "/v1/completions", {"prompt": "x"})
    assert _assert_json_error(resp, 503)["code"] == "capacity"


def test_failure_before_headers_keeps_its_status(serve) -> None:
    up = serve(ScriptedUpstream([(0.0, Failure(failure_class=FailureClass.INVALID_REQUEST,
                                                message="prompt too long", status=400))]))
    err = _assert_json_error(_post(up.url, "/v1/completions",
                                   {"prompt": "x", "stream_format": "msgpack"}), 400)
    assert err["message"] == "prompt too long" and err["code"] == "invalid_request"


@pytest.mark.parametrize(("fmt", "decoder"), [("msgpack", frames_msgpack.FrameDecoder),
                                              ("protobuf", frames_protobuf.FrameDecoder)])
def test_failure_after_headers_is_a_terminal_error_frame_not_a_500(serve, fmt, decoder) -> None:
    up = serve(ScriptedUpstream([(0.0, TokenDelta(ids=(1,))),
                                 (0.0, Failure(failure_class=FailureClass.UPSTREAM,
                                               message="engine died"))]))
    resp = _post(up.url, "/v1/completions", {"prompt": "x", "stream_format": fmt})
    assert resp.status_code == 200
    frames = _frames(resp, decoder)
    assert frames[-1].done and frames[-1].finish_reason == "error"


# -- Path C ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("fmt", "ctype", "decoder"), [
    ("msgpack", "application/x-msgpack", frames_msgpack.FrameDecoder),
    ("protobuf", "application/x-protobuf", frames_protobuf.FrameDecoder)])
def test_path_c_binary_in_binary_out(simple, fmt, ctype, decoder) -> None:
    body = encode_request(CodecRequest(prompt_ids=(1, 2, 3), max_tokens=4, stream_format=fmt),
                          fmt)
    resp = httpx.post(simple.url + "/v1/completions/codec", content=body,
                      headers={"content-type": ctype})
    assert resp.status_code == 200 and resp.headers["content-type"] == ctype
    assert [f.ids for f in _frames(resp, decoder)] == [(10,), (11,), ()]


def test_path_c_content_type_mismatch_is_415(simple) -> None:
    body = encode_request(CodecRequest(prompt_ids=(1,), stream_format="protobuf"), "msgpack")
    resp = httpx.post(simple.url + "/v1/completions/codec", content=body,
                      headers={"content-type": "application/x-msgpack"})
    _assert_json_error(resp, 415)
    resp = httpx.post(simple.url + "/v1/completions/codec", content=b"{}",
                      headers={"content-type": "application/json"})
    _assert_json_error(resp, 415)


@pytest.mark.parametrize("body", [b"\x0a\x05\x01", b"\x10\xff\xff\xff\xff\xff\xff\x01", b"\xff"])
def test_path_c_malformed_protobuf_is_a_typed_400(simple, body) -> None:
    resp = httpx.post(simple.url + "/v1/completions/codec", content=body,
                      headers={"content-type": "application/x-protobuf"})
    err = _assert_json_error(resp, 400)
    assert err["code"] in {"codec_malformed_frame", "codec_varint_overflow", "codec_truncated"}


# -- small routes ----------------------------------------------------------------------------


def test_schema_models_health(simple) -> None:
    schema = httpx.get(simple.url + "/codec/schema")
    assert schema.status_code == 200 and schema.text == PROTO_SCHEMA
    assert schema.headers["content-type"].startswith("text/plain")
    assert httpx.get(simple.url + "/v1/models").json()["data"][0]["id"] == "scripted"
    assert httpx.get(simple.url + "/health").json()["status"] == "ok"


# -- versions: the 426 matrix and header floors ----------------------------------------------

POLICIES = {
    "off": VersionPolicy(),
    "advisory": VersionPolicy(version_policy=VersionPolicyMode.ADVISORY),
    "strict": VersionPolicy(version_policy=VersionPolicyMode.STRICT),
    "safety-enabled": VersionPolicy(safety_policy_id="tw-banned"),
    "safety-required": VersionPolicy(safety_policy_id="tw-banned", safety_policy_required=True),
}
MANDATORY = {"strict", "safety-required"}


@pytest.fixture(scope="module")
def policy_servers(serve):
    return {name: serve(ScriptedUpstream(SIMPLE), version_policy=pol)
            for name, pol in POLICIES.items()}


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("client", [None, "0.2", "0.3", "0.4", "v0.5", "garbage"])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_426_matrix(policy_servers, policy, client, path) -> None:
    headers = {} if client is None else {"Codec-Client-Version": client}
    body = {"prompt": "x"} if path == "/v1/completions" else {
        "messages": [{"role": "user", "content": "x"}]}
    resp = _post(policy_servers[policy].url, path, body, **headers)
    old = client not in ("0.4", "v0.5")
    if policy in MANDATORY and old:
        assert resp.status_code == 426
        doc = json.loads(resp.content)
        assert list(doc)[:4] == ["error", "minimum_version", "required_features",
                                 "client_version"]
        assert doc["error"] == "codec_version_required" and doc["minimum_version"] == "0.4"
        assert doc["client_version"] == (client or "0.2")
        assert resp.headers["codec-min-version"] == "0.4"
        feats = doc["required_features"]
        assert feats == (["safety-policy-enforcement"] if policy == "safety-required" else [])
        assert ("codec-required-features" in resp.headers) == bool(feats)
        assert b'", "' in resp.content or b'": "' in resp.content  # json.dumps defaults
    else:
        assert resp.status_code == 200, resp.text


V04_HEADERS = {"codec-safety-policy", "codec-safety-policy-hash"}


@pytest.mark.parametrize("client", [None, "0.2", "0.3", "0.4", "0.5"])
def test_a_client_never_receives_a_header_newer_than_its_version(policy_servers, client) -> None:
    headers = {} if client is None else {"Codec-Client-Version": client}
    # Twice: the second head comes from the gateway's memo of it (http/generation.py), the
    # same but for its own request id.
    first, resp = (_post(policy_servers["safety-enabled"].url, "/v1/completions",
                         {"prompt": "x", "stream_format": "msgpack"}, **headers)
                   for _ in range(2))
    assert first.status_code == resp.status_code == 200
    assert first.headers["x-request-id"] != resp.headers["x-request-id"]
    assert [(k, v) for k, v in first.headers.items() if k not in ("date", "x-request-id")] \
        == [(k, v) for k, v in resp.headers.items() if k not in ("date", "x-request-id")]
    got = {k.lower() for k in resp.headers}
    if client in (None, "0.2", "0.3"):
        assert not got & V04_HEADERS
        assert "codec-pick" not in got
    else:
        assert V04_HEADERS <= got
        assert resp.headers["codec-safety-policy"] == "tw-banned"
        assert resp.headers["codec-safety-policy-hash"].startswith("sha256:")
    assert resp.headers["vary"] == "Accept-Encoding, Codec-Client-Version"
    assert resp.headers["codec-tokenizer-map"].startswith("sha256:")


def test_gzip_keeps_one_block_open_for_codec_streams_only(serve, monkeypatch) -> None:
    # The gzip flush rule (codec/compression.py GzipCompressor): Codec token streams keep one
    # deflate block open, the text APIs' SSE flushes with Z_BLOCK; both decode with zlib.
    from tokenwire.gateway.http import generation

    made: list[tuple[str, bool]] = []
    real = generation.new_compressor

    def spy(encoding: str, **kw):
        made.append((encoding, kw["open_block"]))
        return real(encoding, **kw)

    monkeypatch.setattr(generation, "new_compressor", spy)
    up = serve(ScriptedUpstream(SIMPLE), compress_event_streams=True)
    for path, body in [("/v1/completions", {"prompt": "x", "stream_format": "msgpack"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                 "stream": True})]:
        with httpx.stream("POST", up.url + path, json=body, timeout=60,
                          headers={"Accept-Encoding": "gzip"}) as resp:
            assert resp.headers["content-encoding"] == "gzip"
            raw = b"".join(resp.iter_raw())
        assert zlib.decompress(raw, 31)
    assert made == [("gzip", True), ("gzip", False)]


# -- streaming: the window timer and disconnects ---------------------------------------------

#: How long the held upstream waits for the client before it sends frame 3 anyway: a
#: safety net that turns a buffering server into a failed test, not a measurement.
HOLD_LIMIT_S = 20.0


class _HeldUpstream:
    """Sends ids 1 and 2, then holds id 3 until the test has decoded id 2 (or the safety
    limit passed: ``released_by_client`` says which)."""

    model_id = "held"

    def __init__(self) -> None:
        self.decoded_2 = threading.Event()
        self.released_by_client: bool | None = None

    def submit(self, request):
        return _HeldStream(self)


class _HeldStream:
    def __init__(self, up: _HeldUpstream) -> None:
        self._up = up
        self._events = [TokenDelta(ids=(1,)), TokenDelta(ids=(2,)), None,
                        TokenDelta(ids=(3,)), Finish(reason=FinishKind.LENGTH)]

    async def next_event(self):
        event = self._events.pop(0)
        if event is None:  # the model "pauses" until the client has frame 2
            released = await asyncio.to_thread(self._up.decoded_2.wait, HOLD_LIMIT_S)
            self._up.released_by_client = released
            event = self._events.pop(0)
        return event

    def cancel(self) -> None:
        pass


_CHAT = {"messages": [{"role": "user", "content": "x"}], "stream": True}


@pytest.mark.parametrize(("settings", "headers", "coding"), [
    ({}, {}, "identity"),  # a generic client's library offers gzip: not asked for
    ({}, {"Codec-Client-Version": "0.5"}, "gzip"),  # a Codec client: the §4.3 pick
    ({}, {"Tokenwire-Accept-Encoding": "gzip"}, "gzip"),  # the playground's explicit choice
    ({"compress_event_streams": True}, {}, "gzip"),  # the deployment asks for it
])
def test_an_apis_event_stream_is_compressed_only_when_asked(serve, settings, headers,
                                                            coding) -> None:
    """OpenAI's SSE to a client that declares no Codec version goes uncompressed unless the
    deployment sets ``compress_event_streams`` (http/generation.py ``_UNCOMPRESSED``); the
    content is the same either way, and whole bodies and Codec streams keep the pick."""
    up = serve(ScriptedUpstream(SIMPLE), **settings)
    with httpx.stream("POST", up.url + "/v1/chat/completions", json=_CHAT, timeout=60,
                      headers={"Accept-Encoding": "gzip", **headers}) as resp:
        assert resp.status_code == 200
        assert resp.headers.get("content-encoding", "identity") == coding
        text = b"".join(resp.iter_bytes()).decode()
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert "".join(json.loads(e)["choices"][0]["delta"].get("content") or ""
                   for e in events[:-1] if json.loads(e)["choices"]) == "ab"
    whole = httpx.post(up.url + "/v1/chat/completions", json={**_CHAT, "stream": False},
                       headers={"Accept-Encoding": "gzip"}, timeout=60)
    assert whole.headers["content-encoding"] == "gzip"
    codec = httpx.post(up.url + "/v1/completions", json={"prompt": "x", "stream_format":
                                                         "msgpack"},
                       headers={"Accept-Encoding": "gzip"}, timeout=60)
    assert codec.headers["content-encoding"] == "gzip"


def _stock_decompressor(encoding: str):
    if encoding == "gzip":
        d = zlib.decompressobj(wbits=31)
        return d.decompress
    if encoding == "br":
        return brotli.Decompressor().process
    return lambda b: b


@pytest.mark.parametrize("encoding", ["identity", "gzip", "br"])
def test_window_closes_on_its_timer_when_the_model_pauses(serve, encoding) -> None:
    """Frames 1 and 2 come at once, then the model pauses until the client has decoded
    frame 2: only the window's own timer can flush it, since no later frame comes. A server
    that flushes on the next frame (or at the end) makes the upstream wait its whole safety
    limit, and the test fails."""
    held = _HeldUpstream()
    up = serve(held, window_s=0.2)
    decompress = _stock_decompressor(encoding)
    dec = frames_msgpack.FrameDecoder()
    seen: list[int] = []
    with httpx.stream("POST", up.url + "/v1/completions",
                      json={"prompt": "x", "stream_format": "msgpack"},
                      headers={"Accept-Encoding": encoding}, timeout=60) as resp:
        assert resp.headers.get("content-encoding", "identity") == encoding
        for chunk in resp.iter_raw():
            for frame in dec.feed(decompress(chunk)):
                seen += frame.ids
                if 2 in frame.ids:
                    held.decoded_2.set()
    assert seen == [1, 2, 3]
    assert held.released_by_client, "frame 2 was not decodable until frame 3 was sent"


def test_client_disconnect_cancels_the_upstream(serve) -> None:
    script = [(0.0, TokenDelta(ids=(1,)))] + [(0.05, TokenDelta(ids=(2,)))] * 200 + [
        (0.0, Finish(reason=FinishKind.LENGTH))]
    scripted = ScriptedUpstream(script)
    up = serve(scripted, window_s=0.0)
    with httpx.stream("POST", up.url + "/v1/completions",
                      json={"prompt": "x", "stream_format": "msgpack"}) as resp:
        next(resp.iter_raw())
        rid = resp.headers["x-request-id"]
    deadline = time.monotonic() + 10
    while rid not in scripted.cancelled and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rid in scripted.cancelled


def test_discovery_is_mounted_and_serves_the_map_named_in_responses(simple) -> None:
    import hashlib

    resp = _post(simple.url, "/v1/completions", {"prompt": "x", "stream_format": "msgpack"})
    raw = httpx.get(simple.url + "/.well-known/codec/maps/huggingfacetb/smollm2.json")
    assert raw.status_code == 200
    assert "sha256:" + hashlib.sha256(raw.content).hexdigest() == \
        resp.headers["codec-tokenizer-map"]
    assert httpx.get(simple.url + "/.well-known/codec/version-policy.json").status_code == 404


# -- the safety policy on every generation route ---------------------------------------------

BANNED = frozenset({30, 378})
ROUTE_BODIES = {
    "/v1/completions": {"prompt": "x"},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "x"}]},
    "/v1/messages": {"model": "scripted", "max_tokens": 8,
                     "messages": [{"role": "user", "content": "x"}]},
    "/v1/responses": {"model": "scripted", "input": "x", "store": False},
}


@pytest.fixture(scope="module")
def banning(serve):
    return serve(ScriptedUpstream(SIMPLE), banned_ids=BANNED,
                 version_policy=VersionPolicy(safety_policy_id="tw-banned"))


@pytest.mark.parametrize("path", [*ROUTE_BODIES, "/v1/completions/codec"])
def test_every_generation_route_hands_the_policys_banned_ids_to_the_upstream(banning,
                                                                             path) -> None:
    # /v1/responses generated banned ids freely: only the routes through start_generation
    # applied the policy (against tokenwire serve, a banned "." ended Chat with
    # content_filter and Messages with refusal; Responses wrote it and went on).
    before = len(banning.state.router.default.upstream.requests)
    if path == "/v1/completions/codec":
        resp = httpx.post(banning.url + path, timeout=10,
                          content=encode_request(CodecRequest(prompt_ids=(1, 2)), "msgpack"),
                          headers={"content-type": "application/x-msgpack"})
    else:
        resp = _post(banning.url, path, ROUTE_BODIES[path])
    assert resp.status_code == 200, resp.text
    requests = banning.state.router.default.upstream.requests
    assert len(requests) == before + 1 and requests[-1].banned_ids == BANNED


def test_a_responses_websocket_turn_hands_the_policys_banned_ids_to_the_upstream(
        banning) -> None:
    from websockets.sync.client import connect

    upstream = banning.state.router.default.upstream
    before = len(upstream.requests)
    with connect(banning.url.replace("http", "ws", 1) + "/v1/responses", proxy=None,
                 open_timeout=10) as ws:
        ws.send(json.dumps({"type": "response.create", **ROUTE_BODIES["/v1/responses"]}))
        while json.loads(ws.recv(timeout=10))["type"] not in (
                "response.completed", "response.incomplete", "response.failed", "error"):
            pass
    assert len(upstream.requests) == before + 1 and upstream.requests[-1].banned_ids == BANNED
