"""A hostile Codec engine behind a real gateway: what the gateway's clients get.

The engine is a scripted loopback server (``raw_server`` of :mod:`.test_codec_native`)
answering with bytes no honest engine sends; the gateway is the real app with the Codec-native
adapter as its only upstream. Each test checks what a client of the gateway receives: the
right error code, a bounded message, and the gateway's memory left alone.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.gateway.conftest import start_server
from tokenwire.codec.frames import Frame
from tokenwire.gateway.http.state import GatewayState
from tokenwire.gateway.ir import GATEWAY_FAILURE_CODES, IdsSource
from tokenwire.gateway.routing.router import Router, ServedModel
from tokenwire.gateway.settings import ServerSettings

from .test_codec_native import IDS, adapter, frames_reply, msgpack_body
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
