"""End to end: tokenwire B in front of tokenwire A (the real embedded engine), Codec between.

A is the embedded SmolLM2 engine behind the real gateway app; B is a gateway whose only
upstream is the Codec-native adapter pointed at A. Generation is greedy (temperature 0, a
fixed seed), so A's own job record and a direct request to A are the ground truth: a Codec
client of B must receive exactly A's ids, with B neither tokenizing nor detokenizing; a
JSON client of B must get A's text, detokenized once, by B.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.gateway.conftest import start_server
from tokenwire.codec import frames_msgpack, frames_protobuf
from tokenwire.codec.detokenizer import Detokenizer
from tokenwire.codec.frames import StreamFormat
from tokenwire.codec.requests import CodecRequest, encode_request
from tokenwire.codec.tokenizer import Tokenizer
from tokenwire.gateway.http.state import GatewayState
from tokenwire.gateway.ir import IdsSource
from tokenwire.gateway.routing.router import Router, ServedModel
from tokenwire.gateway.settings import ServerSettings
from tokenwire.gateway.upstreams import codec_native
from tokenwire.gateway.upstreams.base import ModelRoute, UpstreamConfig, UpstreamState
from tokenwire.gateway.upstreams.codec_native import CodecNativeUpstream

pytestmark = pytest.mark.slow

MAP_ID = "huggingfacetb/smollm2"
PROMPT = "The three most useful kitchen tools are"
GREEDY = {"temperature": 0, "seed": 7, "max_tokens": 20}
DECODERS = {"msgpack": frames_msgpack.FrameDecoder, "protobuf": frames_protobuf.FrameDecoder}
CLIENT = {"Codec-Client-Version": "0.5", "Accept-Encoding": "identity"}


class CountingDetokenizer(Detokenizer):
    streams = 0

    def stream(self, render_special: bool = False):  # type: ignore[override]
        CountingDetokenizer.streams += 1
        return super().stream(render_special)


@pytest.fixture
def counted(monkeypatch):
    """Counts the adapter's detokenizer streams, every Tokenizer.encode in the process, and
    the requests the adapter was given."""
    CountingDetokenizer.streams = 0
    monkeypatch.setattr(codec_native, "Detokenizer", CountingDetokenizer)
    calls = {"encode": 0, "requests": []}
    real_encode, real_submit = Tokenizer.encode, CodecNativeUpstream.submit

    def encode(self, *a, **kw):
        calls["encode"] += 1
        return real_encode(self, *a, **kw)

    def submit(self, request):
        calls["requests"].append(request)
        return real_submit(self, request)

    monkeypatch.setattr(Tokenizer, "encode", encode)
    monkeypatch.setattr(CodecNativeUpstream, "submit", submit)
    return calls


def _adapter(url: str, model: str, map_id: str | None = MAP_ID, **options) -> CodecNativeUpstream:
    cfg = UpstreamConfig(name="a", kind="codec", base_url=url, read_timeout_s=120,
                         models=(ModelRoute(name="smol-via-a", upstream_model=model,
                                            map_id=map_id),), options=options)
    return CodecNativeUpstream.from_config(cfg)


@pytest.fixture(scope="module")
def a(engine, serve):
    return serve(engine)


@pytest.fixture(scope="module")
def b(a, engine, smollm2_map):
    up = _adapter(a.url, engine.model_id)
    router = Router([ServedModel(name="smol-via-a", upstream=up, tmap=smollm2_map,
                                 ids_source=IdsSource.UPSTREAM, upstream_name="a")])
    served = start_server(GatewayState(settings=ServerSettings(), router=router))
    yield served
    served.stop()


def _frames(url: str, path: str, fmt: str, headers: dict[str, str] = CLIENT,
            **kw) -> tuple[list[int], str | None, httpx.Headers]:
    resp = httpx.post(url + path, headers=headers, timeout=120, **kw)
    assert resp.status_code == 200, resp.text
    dec = DECODERS[fmt]()
    frames = dec.feed(resp.content)
    dec.feed_eof()
    return [i for f in frames for i in f.ids], frames[-1].finish_reason, resp.headers


def _completion(url: str, fmt: str) -> tuple[list[int], str | None, httpx.Headers]:
    return _frames(url, "/v1/completions", fmt,
                   json={"prompt": PROMPT, "stream": True, "stream_format": fmt, **GREEDY})


@pytest.mark.parametrize("fmt", ["msgpack", "protobuf"])
def test_codec_client_of_b_receives_exactly_the_ids_a_generated(a, b, engine, counted, fmt):
    direct, direct_reason, _ = _completion(a.url, fmt)
    via_b, reason, headers = _completion(b.url, fmt)
    assert via_b == direct and reason == direct_reason
    assert list(engine.records()[-1].ids) == via_b  # A's own record of what it sampled
    assert headers["codec-ids-source"] == "upstream"
    assert counted["encode"] == 0  # nobody in this process tokenized anything
    assert not counted["requests"][-1].want_text
    assert CountingDetokenizer.streams == 0  # ids passed through: nothing detokenized


def test_path_c_client_of_b_gets_a_ids_through_untouched(a, b, counted):
    body = encode_request(CodecRequest(prompt_ids=(504, 3458, 282, 260), max_tokens=12,
                                       temperature=0.0), StreamFormat.MSGPACK)
    kw = {"content": body, "headers": {**CLIENT, "Content-Type": "application/x-msgpack"}}
    direct, _, _ = _frames(a.url, "/v1/completions/codec", "msgpack", **kw)
    via_b, _, _ = _frames(b.url, "/v1/completions/codec", "msgpack", **kw)
    assert via_b == direct and via_b
    assert counted["encode"] == 0


def test_json_client_of_b_gets_a_text_detokenized_once(a, b, counted, smollm2_map):
    body = {"prompt": PROMPT, "return_token_ids": True, **GREEDY}
    direct = httpx.post(a.url + "/v1/completions", json=body, timeout=120).json()["choices"][0]
    via_b = httpx.post(b.url + "/v1/completions", json=body, timeout=120).json()["choices"][0]
    assert via_b["text"] == direct["text"] and via_b["token_ids"] == direct["token_ids"]
    assert via_b["finish_reason"] == direct["finish_reason"]
    assert CountingDetokenizer.streams == 1 and counted["encode"] == 0


def test_chat_through_b_matches_a(a, b, counted):
    body = {"messages": [{"role": "user", "content": "Name a fruit."}], **GREEDY}
    direct = httpx.post(a.url + "/v1/chat/completions", json=body, timeout=120).json()
    via_b = httpx.post(b.url + "/v1/chat/completions", json=body, timeout=120).json()
    assert via_b["choices"][0]["message"]["content"] == direct["choices"][0]["message"]["content"]
    assert via_b["choices"][0]["finish_reason"] == direct["choices"][0]["finish_reason"]


def test_stream_through_b_is_json_sse_with_a_text(a, b):
    body = {"prompt": PROMPT, "stream": True, **GREEDY}
    direct = httpx.post(a.url + "/v1/completions", json=body, timeout=120)
    via_b = httpx.post(b.url + "/v1/completions", json=body, timeout=120)

    def text(resp: httpx.Response) -> str:
        return "".join(json.loads(line[6:])["choices"][0]["text"]
                       for line in resp.text.split("\n\n")
                       if line.startswith("data: {") and json.loads(line[6:])["choices"])
    assert text(via_b) == text(direct) and text(direct)


def test_probe_of_a_finds_the_model_and_discovers_its_map(a, engine, smollm2_map):
    up = _adapter(a.url, engine.model_id, map_id=None)

    async def main():
        try:
            return await up.probe()
        finally:
            await up.aclose()
    health = asyncio.run(main())
    assert health.state is UpstreamState.UP, health.detail
    assert engine.model_id in health.models
    assert up.tokenizer_map("smol-via-a").hash == smollm2_map.hash
