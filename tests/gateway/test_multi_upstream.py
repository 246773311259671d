"""Many models on many upstreams: listing, routing by ``model``, ids, health (issue 4 items 3-4).

Most tests use adapter fakes in the style of ``ScriptedUpstream`` behind a real loopback
gateway. One runs the real OpenAI-compatible adapter against a scripted SSE server (models
discovered from its ``/v1/models``, as ``tokenwire serve --upstream URL`` does), and one
(slow) serves the real embedded engine next to a fake.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from typing import ClassVar

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from tokenwire.codec.frames_msgpack import FrameDecoder
from tokenwire.codec.tokenizer import Tokenizer
from tokenwire.gateway.config import config_from_urls, parse_config
from tokenwire.gateway.http.state import GatewayState
from tokenwire.gateway.ir import Finish, FinishKind, IdsSource, TokenDelta, Usage
from tokenwire.gateway.routing.router import Router, ServedModel
from tokenwire.gateway.server import build_gateway, serve_gateway
from tokenwire.gateway.settings import ServerSettings
from tokenwire.gateway.upstreams.base import UpstreamHealth, UpstreamState

from .conftest import ScriptedUpstream, start_server

V05 = {"Codec-Client-Version": "0.5"}


class FakeUpstream:
    """An adapter fake: answers ``from <name>`` as text; state and ids from ``options``."""

    kind = "openai"
    instances: ClassVar[dict[str, FakeUpstream]] = {}

    def __init__(self, config) -> None:
        self.config, self.name = config, config.name
        self.model_id = config.models[0].name
        self.state = UpstreamState(config.options.get("state", "up"))
        self.ids_source = IdsSource(config.options.get("ids", "retokenized"))
        self.requests: list = []

    @classmethod
    def from_config(cls, config, *, transport=None, maps=None) -> FakeUpstream:
        cls.instances[config.name] = inst = cls(config)
        return inst

    def submit(self, request):
        self.requests.append(request)
        text = f"from {self.name}, a fine answer"
        script = [(0.0, TokenDelta(text=text[:9])), (0.0, TokenDelta(text=text[9:])),
                  (0.0, Usage(prompt_tokens=3, completion_tokens=6)),
                  (0.0, Finish(reason=FinishKind.EOS))]
        return ScriptedUpstream(script=script).submit(request)

    async def probe(self) -> UpstreamHealth:
        return UpstreamHealth(name=self.name, kind=self.kind, state=self.state,
                              models=tuple(r.sent_as for r in self.config.models),
                              detail="" if self.state is UpstreamState.UP else "refused")

    async def aclose(self) -> None:
        pass


CONFIG = {
    "server": {"health_interval_s": 0},
    "upstreams": [
        {"name": "alpha", "kind": "openai", "base_url": "http://alpha:1/v1",
         "models": [{"name": "a", "upstream_model": "alpha-7b", "map": "huggingfacetb/smollm2"}]},
        {"name": "beta", "kind": "openai", "base_url": "http://beta:1/v1", "probe": False,
         "options": {"ids": "none"}, "models": [{"name": "b"}]},
    ],
}


@pytest.fixture(scope="module")
def two():
    FakeUpstream.instances.clear()
    cfg = parse_config(CONFIG, env={})
    gw = asyncio.run(build_gateway(cfg, ServerSettings(), adapters={"openai": FakeUpstream}))
    served = start_server(gw.state)
    yield served
    served.stop()


def test_models_lists_every_upstreams_models_with_owner_and_map(two, smollm2_map) -> None:
    data = httpx.get(two.url + "/v1/models").json()["data"]
    assert [(m["id"], m["owned_by"]) for m in data] == [("a", "alpha"), ("b", "beta")]
    assert data[0]["codec_tokenizer_map"] == {"id": smollm2_map.id, "hash": smollm2_map.hash}
    assert "codec_tokenizer_map" not in data[1]
    assert [m["codec_ids_source"] for m in data] == ["retokenized", "none"]


def test_requests_route_by_model_to_their_upstream(two) -> None:
    for model, upstream in (("a", "alpha"), ("b", "beta")):
        r = httpx.post(two.url + "/v1/chat/completions", json={
            "model": model, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["model"] == model
        assert body["choices"][0]["message"]["content"] == f"from {upstream}, a fine answer"
        assert FakeUpstream.instances[upstream].requests[-1].model == model


def test_request_without_model_is_400_naming_the_models(two) -> None:
    r = httpx.post(two.url + "/v1/completions", json={"prompt": "hi"})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "model is required: this server serves 2 models " \
                                           "('a', 'b')"


def test_unknown_model_is_404_model_not_found_listing_models(two) -> None:
    r = httpx.post(two.url + "/v1/completions", json={"model": "c", "prompt": "hi"})
    assert r.status_code == 404
    err = r.json()["error"]
    # OpenAI's own shape for it: a 404 typed invalid_request_error, code model_not_found.
    assert err["code"] == "model_not_found" and err["type"] == "invalid_request_error"
    assert err["param"] == "model"
    assert err["message"] == "the model 'c' does not exist on this server; served models: " \
                             "'a', 'b'"


def test_codec_format_for_text_only_model_without_map_is_400_saying_why(two) -> None:
    for extra in ({"stream_format": "msgpack"}, {"return_token_ids": True}):
        r = httpx.post(two.url + "/v1/completions", json={"model": "b", "prompt": "hi", **extra})
        assert r.status_code == 400
        assert "model 'b' has no tokenizer map and its upstream returns text only" in \
            r.json()["error"]["message"]


def test_codec_ids_of_a_text_upstream_are_the_maps_tokenization(two, smollm2_map) -> None:
    r = httpx.post(two.url + "/v1/completions", headers=V05,
                   json={"model": "a", "prompt": "hi", "stream_format": "msgpack"})
    assert r.status_code == 200
    assert r.headers["codec-ids-source"] == "retokenized"
    assert r.headers["codec-tokenizer-map"] == smollm2_map.hash
    ids = [i for f in FrameDecoder().feed(r.content) for i in f.ids]
    assert ids == list(Tokenizer.from_map(smollm2_map).encode("from alpha, a fine answer"))
    assert FakeUpstream.instances["alpha"].requests[-1].want_ids


def test_codec_ids_source_is_not_sent_to_clients_below_0_5(two) -> None:
    r = httpx.post(two.url + "/v1/completions", headers={"Codec-Client-Version": "0.4"},
                   json={"model": "a", "prompt": "hi", "stream_format": "msgpack"})
    assert r.status_code == 200 and "codec-ids-source" not in r.headers


def test_json_clients_are_not_sent_ids(two) -> None:
    httpx.post(two.url + "/v1/completions", json={"model": "a", "prompt": "hi"})
    assert not FakeUpstream.instances["alpha"].requests[-1].want_ids


def test_health_shows_each_upstream_and_the_overall_status(two) -> None:
    def health() -> httpx.Response:
        return httpx.get(two.url + "/health")

    body = health().json()
    assert body["status"] == "ok"
    assert [(u["name"], u["state"]) for u in body["upstreams"]] == [("alpha", "up"),
                                                                     ("beta", "up")]
    FakeUpstream.instances["beta"].state = UpstreamState.DOWN
    try:
        deadline = time.monotonic() + 10  # refreshed in the background: poll, no timing claim
        while (r := health()).json()["status"] == "ok" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert r.status_code == 200 and r.json()["status"] == "degraded"
        beta = r.json()["upstreams"][1]
        assert (beta["state"], beta["detail"], beta["models"]) == ("down", "refused", ["b"])
    finally:
        FakeUpstream.instances["beta"].state = UpstreamState.UP


# -- the real OpenAI-compatible adapter against a scripted SSE server ------------------------


def _scripted_openai_app(words: list[str]) -> Starlette:
    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [
            {"id": "HuggingFaceTB/SmolLM2-135M", "object": "model",
             "owned_by": "scripted"}]})

    async def chat(request: Request) -> StreamingResponse:
        body = await request.json()

        async def events():
            base = {"id": "c1", "object": "chat.completion.chunk", "model": body["model"]}
            for w in words:
                yield "data: " + json.dumps({**base, "choices": [
                    {"index": 0, "delta": {"content": w}, "finish_reason": None}]}) + "\n\n"
            yield "data: " + json.dumps({**base, "choices": [
                {"index": 0, "delta": {}, "finish_reason": "stop"}]}) + "\n\n"
            yield "data: " + json.dumps({**base, "choices": [], "usage": {
                "prompt_tokens": 2, "completion_tokens": len(words), "total_tokens": 9}}) + "\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/models", models), Route("/v1/chat/completions", chat,
                                                                methods=["POST"])])


def _listen() -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock


def _thread(target) -> threading.Thread:
    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t


def test_serve_upstream_url_discovers_models_and_streams_through_the_real_adapter(
        smollm2_map) -> None:
    words = ["Hello", " there", ",", " friend", "!"]
    up_sock = _listen()
    upstream = uvicorn.Server(uvicorn.Config(_scripted_openai_app(words), log_level="warning",
                                             lifespan="off"))
    _thread(lambda: upstream.run(sockets=[up_sock]))
    gw_sock, ready = _listen(), {}
    url = f"http://127.0.0.1:{up_sock.getsockname()[1]}/v1"
    cfg = config_from_urls([url], env={})
    while not upstream.started:
        time.sleep(0.02)
    t = _thread(lambda: asyncio.run(serve_gateway(
        cfg, ServerSettings(), log_level="warning", sockets=[gw_sock],
        on_ready=lambda gw, server: ready.update(gw=gw, server=server))))
    try:
        deadline = time.monotonic() + 20
        while not (ready.get("server") and ready["server"].started):
            assert t.is_alive() and time.monotonic() < deadline, "gateway did not start"
            time.sleep(0.02)
        base = f"http://127.0.0.1:{gw_sock.getsockname()[1]}"
        (m,) = httpx.get(base + "/v1/models").json()["data"]
        assert m["id"] == "HuggingFaceTB/SmolLM2-135M"
        assert m["owned_by"] == f"127.0.0.1:{up_sock.getsockname()[1]}"
        assert m["codec_tokenizer_map"]["id"] == smollm2_map.id  # found by the HF alias
        r = httpx.post(base + "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}]})
        assert r.json()["choices"][0]["message"]["content"] == "".join(words)
        r = httpx.post(base + "/v1/chat/completions", headers=V05, json={
            "messages": [{"role": "user", "content": "hi"}], "stream_format": "msgpack"})
        assert r.headers["codec-ids-source"] == "retokenized"
        ids = [i for f in FrameDecoder().feed(r.content) for i in f.ids]
        assert ids == list(Tokenizer.from_map(smollm2_map).encode("".join(words)))
        health = httpx.get(base + "/health").json()
        assert health["status"] == "ok" and health["upstreams"][0]["kind"] == "openai"
    finally:
        if ready.get("server"):
            ready["server"].should_exit = True
        upstream.should_exit = True
        t.join(10)


# -- the real engine next to a fake ---------------------------------------------------------


@pytest.mark.slow
def test_embedded_engine_and_a_remote_upstream_side_by_side(engine, smollm2_map) -> None:
    fake = FakeUpstream.from_config(parse_config(CONFIG, env={}).upstreams[1])
    router = Router([
        ServedModel(name=engine.model_id, upstream=engine, tmap=smollm2_map,
                    max_model_len=engine.n_ctx, ids_source=IdsSource.ENGINE,
                    upstream_name="embedded"),
        ServedModel(name="b", upstream=fake, ids_source=IdsSource.NONE, upstream_name="beta"),
    ])
    served = start_server(GatewayState(settings=ServerSettings(), router=router))
    try:
        data = httpx.get(served.url + "/v1/models").json()["data"]
        assert [(m["id"], m["owned_by"]) for m in data] == [(engine.model_id, "embedded"),
                                                           ("b", "beta")]
        assert data[0]["max_model_len"] == engine.n_ctx
        r = httpx.post(served.url + "/v1/completions", headers=V05, timeout=60, json={
            "model": engine.model_id, "prompt": "The capital of France is", "max_tokens": 8,
            "temperature": 0, "stream_format": "msgpack"})
        assert r.headers["codec-ids-source"] == "engine"
        frames = FrameDecoder().feed(r.content)
        rec = engine.wait_for_record(r.headers["x-request-id"])
        assert [i for f in frames for i in f.ids] == list(rec.ids)
        r = httpx.post(served.url + "/v1/completions", json={"model": "b", "prompt": "hi"})
        assert r.json()["choices"][0]["text"] == "from beta, a fine answer"
        ups = httpx.get(served.url + "/health").json()["upstreams"]
        assert [(u["name"], u["state"]) for u in ups] == [("embedded", "up"), ("beta", "up")]
    finally:
        served.stop()
