"""Every documented request field of every API, against every upstream kind (issue 12).

The rule: a field the upstream cannot honour is passed unchanged to an upstream that takes
it, or refused with a 400 naming it; nothing is dropped silently. ``request_fields.py`` holds
the table; this test walks each row through a real gateway app, once per upstream kind, and
checks what the upstream received:

* ``openai``, ``responses``, ``anthropic``: the real adapters over a scripted HTTP upstream
  (``httpx.MockTransport``) that records each JSON body and answers a minimal valid stream;
  an honoured field must be in the body at its ``wire`` key, a passed one unchanged.
* ``codec``: the real Codec adapter in front of a second tokenwire app (a real Codec peer,
  in process) whose own upstream records the request it parsed: the field crossed the Codec
  wire when the peer's request has it.
* ``embedded``: a recording upstream of kind ``embedded`` (the request the engine would get;
  ``test_embedded_fields.py`` shows each one changes the real engine's output or sampler).

Refused fields must answer 400 in the API's own error shape, with ``param`` (OpenAI) or the
message (Anthropic) naming the field.
"""

from __future__ import annotations

import asyncio
import json
import typing
from pathlib import Path
from typing import Any

import httpx
import pytest

from tokenwire.gateway.http.app import create_app
from tokenwire.gateway.http.state import GatewayState
from tokenwire.gateway.ir import (
    Event,
    Finish,
    FinishKind,
    GenerationRequest,
    IdsSource,
    TokenDelta,
    Usage,
)
from tokenwire.gateway.request_fields import (
    API_FIELDS,
    SAME_WIRE,
    UPSTREAM_KINDS,
    ApiField,
    Cell,
    Handling,
    Support,
    cell_for,
    ir_value_set,
    render_markdown,
)
from tokenwire.gateway.routing.router import Router, ServedModel
from tokenwire.gateway.settings import ServerSettings
from tokenwire.gateway.upstreams.anthropic_upstream import AnthropicUpstream
from tokenwire.gateway.upstreams.base import ModelRoute, UpstreamConfig
from tokenwire.gateway.upstreams.codec_native import CodecNativeUpstream
from tokenwire.gateway.upstreams.openai_compat import OpenAICompatUpstream
from tokenwire.gateway.upstreams.responses_upstream import ResponsesUpstream

from .upstreams.fakes_anthropic import MessagesStream
from .upstreams.fakes_responses import ResponsesStream

DOCS = Path(__file__).resolve().parents[2] / "docs" / "request-fields.md"
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions",
         "responses": "/v1/responses", "messages": "/v1/messages"}
#: The smallest valid body of each API, to which one field at a time is added.
BASE: dict[str, dict[str, Any]] = {
    "chat": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    "completions": {"model": "m", "prompt": "hi"},
    "responses": {"model": "m", "input": "hi", "stream": True},
    "messages": {"model": "m", "max_tokens": 8, "messages": [{"role": "user",
                                                              "content": "hi"}]},
}
#: Fields that mean something only beside another one.
COMPANIONS: dict[tuple[str, str], dict[str, Any]] = {
    ("chat", "top_logprobs"): {"logprobs": True},
    ("chat", "tool_choice"): {"tools": API_FIELDS["chat"][
        [f.name for f in API_FIELDS["chat"]].index("tools")].example},
    ("chat", "parallel_tool_calls"): {"tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object"}}}]},
    ("responses", "tool_choice"): {"tools": [{"type": "function", "name": "f",
                                              "parameters": {"type": "object"}}]},
    ("responses", "parallel_tool_calls"): {"tools": [{"type": "function", "name": "f",
                                                      "parameters": {"type": "object"}}]},
    ("messages", "tool_choice"): {"tools": [{"name": "f", "input_schema": {"type": "object"}}]},
    ("responses", "background_options"): {},
}


# -- the upstreams -----------------------------------------------------------------------------


class Recording:
    """An upstream of ``kind`` that records what it is asked and answers "ok"."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.model_id = "m"
        self.requests: list[GenerationRequest] = []

    def submit(self, request: GenerationRequest) -> _Replay:
        self.requests.append(request)
        return _Replay([TokenDelta(ids=(19,), text="ok"), Usage(prompt_tokens=1,
                        completion_tokens=1), Finish(reason=FinishKind.EOS)])


class _Replay:
    def __init__(self, events: list[Event]) -> None:
        self._events = events

    async def next_event(self) -> Event:
        return self._events.pop(0)

    def cancel(self) -> None:
        pass


def _sse(items: list[dict]) -> bytes:
    return b"".join(b"data: " + json.dumps(i).encode() + b"\n\n" for i in items) + \
        b"data: [DONE]\n\n"


def _openai_reply(path: str) -> bytes:
    usage = {"prompt_tokens": 1, "completion_tokens": 1}
    if path.endswith("chat/completions"):
        return _sse([{"choices": [{"index": 0, "delta": {"content": "ok"}}]},
                     {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                     {"choices": [], "usage": usage}])
    return _sse([{"choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}]},
                 {"choices": [], "usage": usage}])


class HttpRecorder:
    """A scripted HTTP upstream: records JSON bodies, answers each kind's minimal stream."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.bodies: list[dict[str, Any]] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(json.loads(request.content))
        if self.kind == "openai":
            body = _openai_reply(request.url.path)
        elif self.kind == "responses":
            body = b"".join(ResponsesStream().message(["ok"]).completed().chunks())
        else:
            body = b"".join(MessagesStream().text(["ok"]).end().chunks())
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})


class Gateway:
    """A gateway app serving model ``m`` from one upstream of ``kind``."""

    def __init__(self, kind: str, smollm2_map) -> None:
        self.kind = kind
        self.recorder: Recording | HttpRecorder
        route = ModelRoute(name="m")
        if kind == "embedded":
            self.recorder = up = Recording("embedded")
        elif kind == "codec":
            # A second tokenwire in process is the Codec peer; its upstream records.
            self.recorder = Recording("openai")  # a peer that takes every field
            peer = create_app(GatewayState(settings=ServerSettings(), router=Router([
                ServedModel(name="m", upstream=self.recorder, tmap=smollm2_map,
                            ids_source=IdsSource.ENGINE)])))
            cfg = UpstreamConfig(name="peer", kind="codec", base_url="http://peer",
                                 models=(ModelRoute(name="m", map_id=smollm2_map.id),))
            up = CodecNativeUpstream.from_config(cfg, transport=httpx.ASGITransport(peer),
                                                 maps={smollm2_map.id: smollm2_map})
        else:
            self.recorder = rec = HttpRecorder(kind)
            cls = {"openai": OpenAICompatUpstream, "responses": ResponsesUpstream,
                   "anthropic": AnthropicUpstream}[kind]
            cfg = UpstreamConfig(name="up", kind=kind, base_url="http://up/v1",
                                 models=(route,))
            up = cls.from_config(cfg, transport=httpx.MockTransport(rec.handler))
        self.app = create_app(GatewayState(settings=ServerSettings(), router=Router([
            ServedModel(name="m", upstream=up, tmap=smollm2_map,
                        ids_source=IdsSource.ENGINE if kind in ("embedded", "codec")
                        else IdsSource.NONE)])))

    def last(self) -> dict[str, Any] | GenerationRequest:
        rec = self.recorder
        return rec.bodies[-1] if isinstance(rec, HttpRecorder) else rec.requests[-1]


@pytest.fixture(scope="module")
def gateways(smollm2_map) -> dict[str, Gateway]:
    return {kind: Gateway(kind, smollm2_map) for kind in UPSTREAM_KINDS}


def _post(gw: Gateway, path: str, body: dict[str, Any]) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(gw.app),
                                     base_url="http://gw") as client:
            return await client.post(path, json=body, timeout=30)
    return asyncio.run(go())


def _with_field(api: str, f: ApiField) -> dict[str, Any]:
    body = {**BASE[api], **COMPANIONS.get((api, f.name), {})}
    head, _, rest = f.name.partition(".")
    body[head] = {rest: f.example} if rest else f.example
    return body


def _at(body: dict[str, Any], wire: str) -> bool:
    """True when the dotted ``wire`` path (or one of ``a / b``) is in ``body``."""
    for path in wire.split(" / "):
        node: Any = body
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                break
            node = node[part]
        else:
            return True
    return False


def _refused(api: str, resp: httpx.Response, names: set[str]) -> None:
    """A 400 naming one of ``names`` (the field, or the companion it needs)."""
    assert resp.status_code == 400, resp.text
    err = resp.json()
    if api == "messages":  # Anthropic's shape: no param; the message names the field
        assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
        assert any(err["error"]["message"].startswith(n.partition(".")[0]) for n in names), err
    else:
        assert err["error"]["param"] in names, err
        assert err["error"]["code"] in ("unsupported_parameter", "unsupported_value"), err


def _rows() -> list[tuple[str, ApiField, str]]:
    return [(api, f, kind) for api in PATHS for f in API_FIELDS[api]
            if f.example is not None for kind in UPSTREAM_KINDS]


@pytest.mark.parametrize(("api", "f", "kind"), _rows(),
                         ids=[f"{a}-{f.name}-{k}" for a, f, k in _rows()])
def test_every_field_is_honoured_passed_or_refused(gateways, api: str, f: ApiField,
                                                   kind: str) -> None:
    gw = gateways[kind]
    cell = cell_for(f, kind)
    before = len(getattr(gw.recorder, "bodies", getattr(gw.recorder, "requests", [])))
    resp = _post(gw, PATHS[api], _with_field(api, f))
    same_wire = SAME_WIRE[api] == kind
    if cell is Handling.REFUSED or (cell is Handling.PASSED and not same_wire) or (
            isinstance(cell, Cell) and cell.support is Support.REFUSED):
        name = f.name.partition(".")[0] if cell is Handling.PASSED else _param(api, f)
        _refused(api, resp, {name, *COMPANIONS.get((api, f.name), {})})
        return
    assert resp.status_code == 200, resp.text
    seen = gw.last()
    assert len(getattr(gw.recorder, "bodies", getattr(gw.recorder, "requests", []))) > before
    if cell in (Handling.PASSED, Handling.HINT) and same_wire:
        top = f.name.partition(".")[0]
        sent = _with_field(api, f)[top]
        got = seen[top] if isinstance(seen, dict) else dict(seen.extensions)[top]
        assert got == sent or (isinstance(got, dict) and sent.items() <= got.items())
    elif isinstance(cell, Cell) and cell.support is Support.HONOURED:
        if isinstance(seen, GenerationRequest):  # the engine's request / the Codec peer's
            assert ir_value_set(seen, f.ir), (f.ir, seen)
        elif api == "messages" and same_wire:  # the client's own body, as sent
            top = f.name.partition(".")[0]
            assert seen[top] == _with_field(api, f)[top], (f.name, seen)
        elif not cell.wire.startswith("~"):
            assert _at(seen, cell.wire), (cell.wire, seen)


def _param(api: str, f: ApiField) -> str:
    from tokenwire.gateway.request_fields import _api_field

    return _api_field(api, f.ir) if f.handling is Handling.HONOURED else f.name


# -- the table is complete and the docs are current --------------------------------------------


def _sdk_fields() -> dict[str, set[str]]:
    from anthropic.types import message_create_params as m
    from openai.types import completion_create_params as k
    from openai.types.chat import completion_create_params as c
    from openai.types.responses import response_create_params as r

    return {"chat": set(typing.get_type_hints(c.CompletionCreateParamsStreaming)),
            "completions": set(typing.get_type_hints(k.CompletionCreateParamsStreaming)),
            "responses": set(typing.get_type_hints(r.ResponseCreateParamsStreaming)),
            "messages": set(typing.get_type_hints(m.MessageCreateParamsStreaming))}


@pytest.mark.parametrize("api", ["chat", "completions", "responses", "messages"])
def test_table_lists_every_field_the_sdk_documents(api: str) -> None:
    # The SDKs' CreateParams types are generated from the APIs' references: every field
    # they name has a row (nested rows such as text.format stand for their parent).
    listed = {f.name.partition(".")[0] for f in API_FIELDS[api]}
    assert _sdk_fields()[api] - listed == set()


def test_codec_rows_are_the_codec_request_fields() -> None:
    from tokenwire.codec.requests import CodecRequest

    assert {f.name for f in API_FIELDS["codec"]} == set(CodecRequest.__struct_fields__)


def test_every_honoured_row_has_a_cell_for_every_upstream_kind() -> None:
    from tokenwire.gateway.request_fields import IR_SUPPORT

    for api, rows in API_FIELDS.items():
        for f in rows:
            if f.handling is Handling.HONOURED:
                assert f.ir in IR_SUPPORT, (api, f.name)
                assert f.ir == "prompt" or hasattr(GenerationRequest, f.ir), f.ir
                assert set(IR_SUPPORT[f.ir]) == set(UPSTREAM_KINDS)


def test_docs_page_is_generated_from_the_table() -> None:
    assert DOCS.read_text("utf-8") == render_markdown() + "\n", (
        "regenerate: PYTHONPATH=src python -m tokenwire.gateway.request_fields "
        "> docs/request-fields.md")


@pytest.mark.parametrize(("api", "extra"), [("chat", {"logprobs": True}),
                                            ("completions", {"logprobs": 1})])
def test_logprobs_with_a_binary_stream_format_are_refused(gateways, api, extra) -> None:
    # Codec frames carry ids only: the logprobs would be lost, so the pair is a 400.
    resp = _post(gateways["embedded"], PATHS[api],
                 {**BASE[api], **extra, "stream_format": "msgpack"})
    _refused(api, resp, {"logprobs"})
