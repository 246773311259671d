"""A hostile Codec engine behind a real gateway: what the gateway's clients get.

The engine is a scripted loopback server (``raw_server`` of :mod:`.test_codec_native`)
answering with bytes no honest engine sends; the gateway is the real app with the Codec-native
adapter as its only upstream. Each test checks what a client of the gateway receives: the
right error code, a bounded message, and the gateway's memory left alone.
"""

from __future__ import annotations

import json
import zlib

import httpx
import pytest

from tests.gateway.conftest import start_server
from tokenwire.client._base import ResponseHead, TokenChunk
from tokenwire.client.discovery import DiscoveryCache
from tokenwire.codec import frames_msgpack
from tokenwire.codec.compression import PIECE_BYTES
from tokenwire.codec.frames import Frame
from tokenwire.gateway.http.state import GatewayState
from tokenwire.gateway.ir import GATEWAY_FAILURE_CODES, Failure, IdsSource, TokenDelta
from tokenwire.gateway.routing.router import Router, ServedModel
from tokenwire.gateway.settings import ServerSettings
from tokenwire.gateway.upstreams.codec_native_wire import (
    CodecOptions,
    FrameTranslator,
    ModelWire,
)

from .test_codec_native import IDS, Reply, adapter, frames_reply, ids_request, msgpack_body
from .test_codec_native import raw_server as raw_server  # the fixture


@pytest.fixture
def gateway(smollm2_map):
    """``gateway(url) -> base URL`` of a real gateway whose one model ``smol`` is served by
    the Codec engine at ``url``."""
    started = []

    def factory(url: str) -> str:
        up = adapter(url)
        router = Router([ServedModel(name="smol", upstream=up, tmap=smollm2_map,
                                     ids_source=IdsSource.UPSTREAM, upstream_name="peer")])
        served = start_server(GatewayState(settings=ServerSettings(), router=router))
        started.append((served, up))
        return served.url

    yield factory
    for served, up in started:
        served.stop(up)


def _sse_error(resp: httpx.Response) -> dict:
    events = [json.loads(line[6:]) for line in resp.text.split("\n")
              if line.startswith("data: {")]
    errors = [e["error"] for e in events if "error" in e]
    assert len(errors) == 1, resp.text[:2000]
    return errors[0]


@pytest.mark.parametrize("reason", [*sorted(GATEWAY_FAILURE_CODES), "x" * 100_000])
def test_an_engines_finish_reason_never_becomes_the_clients_error_code(
        raw_server, gateway, reason):
    # A finish_reason outside the spec's words is the engine's failure, code `upstream`;
    # it was passed on as the failure's code, so an engine could say `idle_timeout` or
    # `server_shutting_down` (the gateway's own codes) and a client believed it, and a
    # 100,000-character word came back whole in the message.
    body = msgpack_body(Frame(ids=IDS[:2], done=False),
                        Frame(ids=(), done=True, finish_reason=reason))
    url, _ = raw_server({"/v1/chat/completions": frames_reply(body)})
    resp = httpx.post(gateway(url) + "/v1/chat/completions", timeout=30, json={
        "model": "smol", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    assert resp.status_code == 200
    err = _sse_error(resp)
    assert err["code"] == "upstream" and err["type"] == "server_error"
    assert len(err["message"]) < 1000


def test_a_426_with_a_hostile_body_is_a_bounded_502(raw_server, gateway):
    # §5.4's body names the version the engine wants; a body of 60,000-character strings
    # came back whole in the client's error message.
    body = {"error": "codec_version_required", "minimum_version": "9" * 60_000,
            "required_features": ["f" * 100] * 500, "client_version": "0.5"}
    url, _ = raw_server({"/v1/chat/completions": Reply(
        426, [("content-type", "application/json")], [json.dumps(body).encode()])})
    resp = httpx.post(gateway(url) + "/v1/chat/completions", timeout=30, json={
        "model": "smol", "messages": [{"role": "user", "content": "hi"}]})
    assert resp.status_code == 502, resp.text[:500]
    err = resp.json()["error"]
    assert err["code"] == "upstream" and "requires Codec" in err["message"]
    assert len(err["message"]) <= 1000


def test_a_gzip_bomb_of_frames_is_decoded_a_piece_at_a_time():
    # A few KB of gzip inflate to megabytes of one-id frames. Decoded whole, one network
    # read became every frame at once (a 30 KB read of 15 MiB: 1.2 million frame objects,
    # 260 MB for one stream); the adapter's decoder now makes a piece's frames only after
    # the last piece's were taken, as its pump takes them (into its bounded queue).
    one = msgpack_body(Frame(ids=(7,), done=False))
    frames = 8 * PIECE_BYTES // len(one)
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    bomb = z.compress(one * frames) + z.flush()
    assert len(bomb) < 4 * 1024  # one network read
    wire = ModelWire("http://peer", CodecOptions(), name="smol", sent_as="smol", tmap=None,
                     map_id=None, cache=DiscoveryCache())
    decoder = wire.decoder("b", ResponseHead("application/x-msgpack", "gzip", None, None),
                           None)
    chunks = decoder.feed(bomb)
    assert next(chunks).ids == (7,)
    assert decoder.body_bytes <= PIECE_BYTES  # one piece decoded, not the whole read
    assert 1 + sum(1 for _ in chunks) == frames and decoder.body_bytes == frames * len(one)


def _frames_of(resp: httpx.Response) -> list[Frame]:
    dec = frames_msgpack.FrameDecoder()
    frames = dec.feed(resp.content)
    dec.feed_eof()
    return frames


def test_an_id_outside_the_map_ends_the_stream_as_an_upstream_error(raw_server, gateway,
                                                                    smollm2_map):
    # The gateway names its map in Codec-Tokenizer-Map; an engine's id past that map's
    # vocabulary went to a Codec client as if it were one of the map's, and to a text
    # client as U+FFFD (the detokenizer has no piece for it), ending `stop`.
    outside = smollm2_map.max_id + 1
    body = msgpack_body(Frame(ids=IDS[:2], done=False), Frame(ids=(IDS[2], outside), done=False),
                        Frame(ids=IDS[3:4], done=False),
                        Frame(ids=(), done=True, finish_reason="stop"))
    url, _ = raw_server({"/v1/completions": frames_reply(body)})
    base = gateway(url)
    resp = httpx.post(base + "/v1/completions", timeout=30, headers={
        "Codec-Client-Version": "0.5", "Accept-Encoding": "identity"}, json={
        "model": "smol", "prompt": [1, 2], "stream": True, "stream_format": "msgpack"})
    frames = _frames_of(resp)
    assert [i for f in frames for i in f.ids] == list(IDS[:3])
    assert frames[-1].done and frames[-1].finish_reason == "error"
    text = httpx.post(base + "/v1/completions", timeout=30, json={
        "model": "smol", "prompt": [1, 2], "max_tokens": 8})
    assert text.status_code == 502 and text.json()["error"]["code"] == "upstream"
    assert str(outside) in text.json()["error"]["message"]


@pytest.mark.parametrize(("banned", "ending"), [((), "protocol_error"),
                                                ((5,), "policy_violation")])
def test_the_first_of_an_outside_id_and_a_banned_one_decides_the_ending(banned, ending):
    tr = FrameTranslator(ids_request(banned_ids=frozenset(banned)), None, max_id=10)
    events = tr.on_chunk(TokenChunk((1, 5, 11, 2), ""))
    kept = (1,) if banned else (1, 5)
    assert [e.ids for e in events if isinstance(e, TokenDelta)] == [kept]
    last = events[-1]
    assert (last.code if isinstance(last, Failure) else last.reason.value) == ending
    assert tr.on_chunk(TokenChunk((3,), "", True, "stop")) == []  # nothing after the end
