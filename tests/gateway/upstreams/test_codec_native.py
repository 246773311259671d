"""The Codec-native upstream adapter against real loopback peers.

Two kinds of peer: another tokenwire (the real gateway app over a ``ScriptedUpstream``, so
its Codec frames, headers and discovery documents are the real ones), and small scripted
ASGI servers for what a healthy peer never does (malformed or truncated frames, a foreign
map, 404 on Path C, 426, error bodies, a client that goes away).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.requests import Request

from tests.gateway.conftest import ScriptedUpstream, make_state, start_server
from tests.gateway.upstreams.streams import collect
from tokenwire.client._base import TokenChunk
from tokenwire.client.discovery import DiscoveryCache
from tokenwire.codec import frames_msgpack
from tokenwire.codec.detokenizer import Detokenizer
from tokenwire.codec.frames import Frame, ToolCall
from tokenwire.codec.maps import TokenizerMap
from tokenwire.codec.tokenizer import Tokenizer
from tokenwire.errors import ConfigError
from tokenwire.gateway.ir import (
    ChatMessage,
    ChatPrompt,
    Event,
    Failure,
    FailureClass,
    Finish,
    FinishKind,
    GenerationRequest,
    PromptIds,
    PromptText,
    TokenDelta,
    ToolCallDelta,
    ToolSpec,
    Usage,
    UsageSource,
)
from tokenwire.gateway.settings import ServerSettings
from tokenwire.gateway.upstreams import codec_native
from tokenwire.gateway.upstreams.base import ModelRoute, UpstreamConfig, UpstreamState
from tokenwire.gateway.upstreams.codec_native import CodecNativeUpstream
from tokenwire.gateway.upstreams.codec_native_wire import (
    CodecOptions,
    FrameTranslator,
    ModelWire,
    classify_http,
    terminal_for,
)

MAP_ID = "huggingfacetb/smollm2"
IDS = (504, 3458, 282, 260, 1345, 28, 216, 7224, 30)  # arbitrary SmolLM2 ids, some multi-byte


# -- helpers ---------------------------------------------------------------------------------


class CountingDetokenizer(Detokenizer):
    """Counts the streams the adapter opens: any text it produces goes through one."""

    streams = 0

    def stream(self, render_special: bool = False):  # type: ignore[override]
        CountingDetokenizer.streams += 1
        return super().stream(render_special)


@pytest.fixture
def counted(monkeypatch):
    CountingDetokenizer.streams = 0
    monkeypatch.setattr(codec_native, "Detokenizer", CountingDetokenizer)
    calls = {"encode": 0}
    real = Tokenizer.encode

    def encode(self, *a, **kw):
        calls["encode"] += 1
        return real(self, *a, **kw)

    monkeypatch.setattr(Tokenizer, "encode", encode)
    return calls


def adapter(url: str, *, model: str = "scripted", map_id: str | None = MAP_ID,
            **options: Any) -> CodecNativeUpstream:
    route = ModelRoute(name="smol", upstream_model=model, map_id=map_id)
    cfg = UpstreamConfig(name="peer", kind="codec", base_url=url, models=(route,),
                         read_timeout_s=10, options=options)
    return CodecNativeUpstream.from_config(cfg)


async def collect_from(up: CodecNativeUpstream, req: GenerationRequest) -> list[Event]:
    return await collect(up.submit(req))


def run(up: CodecNativeUpstream, req: GenerationRequest) -> list[Event]:
    async def main() -> list[Event]:
        try:
            return await collect_from(up, req)
        finally:
            await up.aclose()
    return asyncio.run(main())


def ids_of(events: list[Event]) -> tuple[int, ...]:
    return tuple(i for e in events if isinstance(e, TokenDelta) for i in e.ids)


def text_of(events: list[Event]) -> str:
    return "".join(e.text for e in events if isinstance(e, TokenDelta))


def ids_request(**kw: Any) -> GenerationRequest:
    kw.setdefault("want_ids", True)
    kw.setdefault("want_text", False)
    return GenerationRequest(prompt=PromptIds(ids=(1, 2, 3)), model="smol", max_tokens=16,
                             request_id="r1", **kw)


@pytest.fixture
def tokenwire_peer(smollm2_map):
    """``peer(script) -> (url, scripted upstream)``: a real tokenwire app over a script."""
    started = []

    def factory(events: list[Event]) -> tuple[str, ScriptedUpstream]:
        up = ScriptedUpstream([(0.0, e) for e in events])
        served = start_server(make_state(ServerSettings(), up, smollm2_map))
        started.append(served)
        return served.url, up

    yield factory
    for s in started:
        s.stop()


# -- scripted raw ASGI servers -----------------------------------------------------------------


@dataclass
class Reply:
    status: int = 200
    headers: list[tuple[str, str]] = field(default_factory=list)
    chunks: list[bytes] = field(default_factory=list)
    delay: float = 0.0  # between chunks


@dataclass
class RawServer:
    """Answers ``routes[path]`` for every POST/GET; records paths, bodies and disconnects."""

    routes: dict[str, Reply]
    seen: list[tuple[str, dict[str, str], bytes]] = field(default_factory=list)
    disconnected: threading.Event = field(default_factory=threading.Event)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        body = await Request(scope, receive).body()
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.seen.append((scope["path"], headers, body))
        reply = self.routes.get(scope["path"], Reply(404, chunks=[b'{"error":"no route"}']))
        raw = [(k.encode(), v.encode()) for k, v in reply.headers]
        await send({"type": "http.response.start", "status": reply.status, "headers": raw})
        watch = asyncio.create_task(self._watch(receive))
        try:
            for chunk in reply.chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await asyncio.sleep(reply.delay)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            self.disconnected.set()
        finally:
            watch.cancel()

    async def _watch(self, receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.disconnected.set()


@pytest.fixture
def raw_server():
    servers: list[uvicorn.Server] = []

    def factory(routes: dict[str, Reply]) -> tuple[str, RawServer]:
        app = RawServer(routes)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
        deadline = time.monotonic() + 20
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        servers.append(server)
        return f"http://127.0.0.1:{sock.getsockname()[1]}", app

    yield factory
    for s in servers:
        s.should_exit = True


def msgpack_body(*frames: Frame) -> bytes:
    enc = frames_msgpack.FrameEncoder()
    return b"".join(enc.encode(f) for f in frames)


def frames_reply(body: bytes | list[bytes], *, tmap: TokenizerMap | None = None,
                 delay: float = 0.0, ctype: str = "application/x-msgpack") -> Reply:
    headers = [("content-type", ctype)]
    if tmap is not None:
        headers.append(("codec-tokenizer-map", tmap.hash))
    return Reply(200, headers, body if isinstance(body, list) else [body], delay)


# -- ids pass through, text only on demand -------------------------------------------------------


def test_ids_pass_through_untouched_without_detokenizing(tokenwire_peer, counted):
    url, _ = tokenwire_peer([TokenDelta(ids=IDS[:4]), TokenDelta(ids=IDS[4:]),
                             Finish(reason=FinishKind.EOS)])
    events = run(adapter(url), ids_request())
    assert ids_of(events) == IDS
    assert text_of(events) == ""
    assert events[-1] == Finish(reason=FinishKind.EOS)
    assert CountingDetokenizer.streams == 0 and counted["encode"] == 0


@pytest.mark.parametrize("fmt", ["msgpack", "protobuf"])
def test_text_client_gets_the_maps_detokenization_once(tokenwire_peer, counted, smollm2_map, fmt):
    url, _ = tokenwire_peer([TokenDelta(ids=(i,)) for i in IDS] + [Finish(reason=FinishKind.EOS)])
    req = ids_request(want_ids=False, want_text=True)
    events = run(adapter(url, stream_format=fmt), req)
    assert ids_of(events) == IDS
    assert text_of(events) == Detokenizer(smollm2_map).decode(IDS)
    assert CountingDetokenizer.streams == 1 and counted["encode"] == 0


def test_prompt_ids_go_upstream_as_ids_and_usage_counts_them(tokenwire_peer):
    url, scripted = tokenwire_peer([TokenDelta(ids=IDS[:2]), Finish(reason=FinishKind.LENGTH)])
    events = run(adapter(url), ids_request(seed=5, top_p=0.5))
    assert scripted.requests[0].prompt == PromptIds(ids=(1, 2, 3))
    assert scripted.requests[0].seed == 5 and scripted.requests[0].top_p == 0.5
    assert Usage(prompt_tokens=3, completion_tokens=2, source=UsageSource.GATEWAY) in events
    assert events[-1] == Finish(reason=FinishKind.LENGTH)


def test_text_prompt_goes_upstream_as_text(tokenwire_peer):
    url, scripted = tokenwire_peer([Finish(reason=FinishKind.EOS)])
    req = GenerationRequest(prompt=PromptText(text="Hello <|im_end|>"), model="smol")
    run(adapter(url), req)
    assert scripted.requests[0].prompt == PromptText(text="Hello <|im_end|>")


def _chat_request(**kw: Any) -> GenerationRequest:
    msgs = (ChatMessage(role="system", content="be brief"), ChatMessage(role="user", content="hi"))
    return GenerationRequest(prompt=ChatPrompt(messages=msgs), model="smol", want_ids=True, **kw)


def test_chat_goes_to_chat_completions_and_returns_tool_calls(tokenwire_peer):
    url, scripted = tokenwire_peer([
        ToolCallDelta(index=0, id="call_1", name="get_weather", arguments='{"city":'),
        ToolCallDelta(index=0, arguments='"Paris"}'), Finish(reason=FinishKind.TOOL_CALLS)])
    events = run(adapter(url), _chat_request())
    sent = scripted.requests[0]
    assert isinstance(sent.prompt, ChatPrompt)
    assert [(m.role, m.text) for m in sent.prompt.messages] == [("system", "be brief"),
                                                                ("user", "hi")]
    calls = [e for e in events if isinstance(e, ToolCallDelta)]
    assert [(c.index, c.id, c.name, c.arguments) for c in calls] == [
        (0, "call_1", "get_weather", '{"city":"Paris"}')]
    assert events[-1] == Finish(reason=FinishKind.TOOL_CALLS)


def test_chat_passes_tools_through_with_the_binary_stream_format(raw_server):
    body = msgpack_body(Frame(ids=(), done=True, finish_reason="stop"))
    url, server = raw_server({"/v1/chat/completions": frames_reply(body)})
    tool = ToolSpec(name="get_weather", description="now", parameters={"type": "object"})
    run(adapter(url, stream_format="protobuf"),
        _chat_request(tools=(tool,), tool_choice="auto", parallel_tool_calls=True))
    sent = json.loads(server.seen[0][2])
    assert sent["stream_format"] == "protobuf" and sent["stream"] is True
    assert sent["model"] == "scripted"
    assert sent["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "description": "now", "parameters": {"type": "object"}}}]
    assert sent["tool_choice"] == "auto" and sent["parallel_tool_calls"] is True


def test_upstream_stop_sequence_and_policy_finishes_are_kept(tokenwire_peer):
    url, _ = tokenwire_peer([TokenDelta(ids=IDS[:1]),
                             Finish(reason=FinishKind.STOP_SEQUENCE, matched_stop="x")])
    assert run(adapter(url), ids_request())[-1] == Finish(reason=FinishKind.STOP_SEQUENCE)
    url, _ = tokenwire_peer([Finish(reason=FinishKind.POLICY_VIOLATION)])
    assert run(adapter(url), ids_request())[-1] == Finish(reason=FinishKind.POLICY_VIOLATION)


def test_upstream_failure_before_frames_keeps_its_class(tokenwire_peer):
    url, _ = tokenwire_peer([Failure(failure_class=FailureClass.CONTEXT_LENGTH, status=400,
                                     message="the prompt is 5000 tokens; the context window "
                                             "is 4096")])
    failure = run(adapter(url), ids_request())[-1]
    assert isinstance(failure, Failure)
    assert failure.failure_class is FailureClass.CONTEXT_LENGTH and failure.status == 400
    assert (failure.prompt_tokens, failure.context_tokens) == (5000, 4096)


def test_mid_stream_error_frame_is_an_upstream_failure_after_the_ids(tokenwire_peer):
    url, _ = tokenwire_peer([TokenDelta(ids=IDS[:3]),
                             Failure(failure_class=FailureClass.UPSTREAM, message="engine died")])
    events = run(adapter(url), ids_request())
    assert ids_of(events) == IDS[:3]
    assert isinstance(events[-1], Failure) and events[-1].failure_class is FailureClass.UPSTREAM


def test_unreachable_upstream_is_a_connection_failure():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    failure = run(adapter(f"http://127.0.0.1:{port}"), ids_request())[-1]
    assert isinstance(failure, Failure) and failure.failure_class is FailureClass.CONNECTION


def test_banned_id_ends_with_policy_violation_before_it_is_sent(tokenwire_peer):
    url, _ = tokenwire_peer([TokenDelta(ids=IDS), Finish(reason=FinishKind.EOS)])
    events = run(adapter(url), ids_request(banned_ids=frozenset({IDS[3]})))
    assert ids_of(events) == IDS[:3]
    assert events[-1] == Finish(reason=FinishKind.POLICY_VIOLATION)


def test_unknown_model_is_a_404_failure(tokenwire_peer):
    url, _ = tokenwire_peer([Finish(reason=FinishKind.EOS)])
    req = GenerationRequest(prompt=PromptText(text="x"), model="nope")
    failure = run(adapter(url), req)[-1]
    assert isinstance(failure, Failure) and failure.status == 404


# -- the map -------------------------------------------------------------------------------------


def test_probe_finds_models_and_fetches_the_map_by_discovery(tokenwire_peer, smollm2_map):
    url, _ = tokenwire_peer([Finish(reason=FinishKind.EOS)])
    up = adapter(url, map_id=None)
    assert up.tokenizer_map("smol") is None

    async def main():
        try:
            return await up.probe()
        finally:
            await up.aclose()
    health = asyncio.run(main())
    assert health.state is UpstreamState.UP, health.detail
    assert health.models == ("scripted",)
    assert up.tokenizer_map("smol").hash == smollm2_map.hash


def test_without_configured_models_probe_serves_the_upstreams_models(tokenwire_peer, smollm2_map):
    url, _ = tokenwire_peer([TokenDelta(ids=IDS[:2]), Finish(reason=FinishKind.EOS)])
    up = CodecNativeUpstream.from_config(UpstreamConfig(name="peer", kind="codec", base_url=url))

    async def main():
        try:
            health = await up.probe()
            req = GenerationRequest(prompt=PromptText(text="x"), model="scripted")
            return health, await collect_from(up, req)
        finally:
            await up.aclose()
    health, events = asyncio.run(main())
    assert health.state is UpstreamState.UP and up.models == ("scripted",)
    assert up.tokenizer_map("scripted").hash == smollm2_map.hash
    assert text_of(events) == Detokenizer(smollm2_map).decode(IDS[:2])


def test_probe_reports_a_model_the_upstream_does_not_serve(tokenwire_peer):
    url, _ = tokenwire_peer([Finish(reason=FinishKind.EOS)])
    up = adapter(url, model="other")
    health = asyncio.run(_probe(up))
    assert health.state is UpstreamState.DEGRADED and "'other'" in health.detail


def test_probe_of_an_unreachable_upstream_is_down():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    health = asyncio.run(_probe(adapter(f"http://127.0.0.1:{port}")))
    assert health.state is UpstreamState.DOWN


async def _probe(up: CodecNativeUpstream):
    try:
        return await up.probe()
    finally:
        await up.aclose()


def test_probe_map_mismatch_fails_every_request(raw_server, smollm2_map):
    other = "sha256:" + "ab" * 32
    models = {"data": [{"id": "scripted", "codec_tokenizer_map": {"id": "x/y", "hash": other}}]}
    url, server = raw_server({"/v1/models": Reply(200, [("content-type", "application/json")],
                                                  [json.dumps(models).encode()])})
    up = adapter(url)

    async def main():
        try:
            health = await up.probe()
            return health, await collect_from(up, ids_request())
        finally:
            await up.aclose()
    health, events = asyncio.run(main())
    assert health.state is UpstreamState.DEGRADED and other in health.detail
    assert isinstance(events[-1], Failure) and events[-1].code == "tokenizer_map_mismatch"
    assert [p for p, _, _ in server.seen] == ["/v1/models"]  # nothing generated


def test_response_naming_another_map_is_a_failure(raw_server, smollm2_map):
    foreign = msgpack_body(Frame(ids=IDS, done=False), Frame(ids=(), done=True,
                                                              finish_reason="length"))
    reply = frames_reply(foreign)
    reply.headers.append(("codec-tokenizer-map", "sha256:" + "cd" * 32))
    url, _ = raw_server({"/v1/completions": reply})
    events = run(adapter(url), ids_request())
    assert ids_of(events) == ()
    assert isinstance(events[-1], Failure) and events[-1].code == "tokenizer_map_mismatch"


# -- faults --------------------------------------------------------------------------------------


def test_malformed_frames_are_a_failure(raw_server, smollm2_map):
    good = msgpack_body(Frame(ids=IDS[:2], done=False))
    url, _ = raw_server({"/v1/completions": frames_reply([good, b"\xc1\xc1\xc1"])})
    events = run(adapter(url), ids_request())
    assert ids_of(events) == IDS[:2]
    assert isinstance(events[-1], Failure) and events[-1].failure_class is FailureClass.UPSTREAM


@pytest.mark.parametrize("tail", [b"", b"\x82\xa3ids"], ids=["no-done", "inside-a-frame"])
def test_truncated_stream_is_a_failure_never_a_finish(raw_server, tail):
    body = msgpack_body(Frame(ids=IDS[:2], done=False)) + tail
    url, _ = raw_server({"/v1/completions": frames_reply(body)})
    events = run(adapter(url), ids_request())
    assert isinstance(events[-1], Failure) and events[-1].failure_class is FailureClass.UPSTREAM


def test_json_sse_fallback_is_named_as_not_codec(raw_server):
    url, _ = raw_server({"/v1/completions": frames_reply(b"data: {}\n\n",
                                                         ctype="text/event-stream")})
    failure = run(adapter(url), ids_request())[-1]
    assert isinstance(failure, Failure) and failure.code == "content_type_mismatch"
    assert "kind = 'openai'" in failure.message


def test_path_c_404_falls_back_to_path_b(raw_server, smollm2_map):
    body = msgpack_body(Frame(ids=IDS[:3], done=False),
                        Frame(ids=(), done=True, finish_reason="stop"))
    url, server = raw_server({"/v1/completions": frames_reply(body, tmap=smollm2_map)})
    events = run(adapter(url, path="c"), ids_request())
    assert [p for p, _, _ in server.seen] == ["/v1/completions/codec", "/v1/completions"]
    assert json.loads(server.seen[1][2])["prompt"] == [1, 2, 3]
    assert ids_of(events) == IDS[:3] and events[-1] == Finish(reason=FinishKind.EOS)


def test_path_c_sends_a_binary_codec_request(tokenwire_peer):
    url, scripted = tokenwire_peer([TokenDelta(ids=IDS[:1]), Finish(reason=FinishKind.EOS)])
    events = run(adapter(url, path="c", stream_format="protobuf"), ids_request())
    assert scripted.requests[0].prompt == PromptIds(ids=(1, 2, 3))
    assert ids_of(events) == IDS[:1]


def test_request_headers_declare_the_client_version_and_offer(raw_server):
    body = msgpack_body(Frame(ids=(), done=True, finish_reason="eos_token"))
    url, server = raw_server({"/v1/completions": frames_reply(body)})
    run(adapter(url), ids_request())
    _, headers, sent = server.seen[0]
    assert headers["codec-client-version"] == "0.5"
    assert headers["accept"] == "application/x-msgpack"
    assert "zstd" not in headers["accept-encoding"]  # no dictionary held, none offered
    assert json.loads(sent)["stream_format"] == "msgpack"
    assert "authorization" not in headers


def test_426_names_the_version_the_upstream_requires(raw_server):
    body = {"error": "codec_version_required", "minimum_version": "0.7",
            "required_features": ["sessions"], "client_version": "0.5"}
    url, _ = raw_server({"/v1/completions": Reply(426, [("content-type", "application/json"),
                                                        ("codec-min-version", "0.7")],
                                                  [json.dumps(body).encode()])})
    failure = run(adapter(url), ids_request())[-1]
    assert isinstance(failure, Failure) and failure.code == "codec_version_required"
    assert "0.7" in failure.message and "sessions" in failure.message


def test_cancel_closes_the_upstream_response(raw_server):
    frames = [msgpack_body(Frame(ids=(i,), done=False)) for i in IDS] * 50
    url, server = raw_server({"/v1/completions": frames_reply(frames, delay=0.05)})
    up = adapter(url)

    async def main() -> tuple[Event, bool]:
        try:
            stream = up.submit(ids_request())
            first = await stream.next_event()
            assert isinstance(first, TokenDelta)
            stream.cancel()
            last = await stream.next_event()
            for _ in range(600):  # the server notices the closed connection (a safety limit)
                if server.disconnected.is_set():
                    break
                await asyncio.sleep(0.05)
            return last, server.disconnected.is_set()  # before aclose() closes everything
        finally:
            await up.aclose()
    assert asyncio.run(main()) == (Finish(reason=FinishKind.ABORT), True)


def test_api_key_goes_to_the_upstream_only_and_never_into_repr(raw_server, monkeypatch):
    monkeypatch.setenv("CODEC_TEST_KEY", "sk-secret-123")
    body = msgpack_body(Frame(ids=(), done=True, finish_reason="length"))
    url, server = raw_server({"/v1/completions": frames_reply(body)})
    cfg = UpstreamConfig(name="peer", kind="codec", base_url=url + "/v1",
                         api_key_env="CODEC_TEST_KEY", models=(ModelRoute(name="smol"),))
    up = CodecNativeUpstream.from_config(cfg)
    assert "sk-secret" not in repr(up) and "sk-secret" not in repr(vars(up))
    run(up, ids_request())
    assert server.seen[0][1]["authorization"] == "Bearer sk-secret-123"


# -- sans-IO pieces ------------------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "expected"), [
    ("eos_token", Finish(reason=FinishKind.EOS)), ("stop", Finish(reason=FinishKind.EOS)),
    ("stop_sequence", Finish(reason=FinishKind.STOP_SEQUENCE)),
    ("length", Finish(reason=FinishKind.LENGTH)),
    ("policy_violation", Finish(reason=FinishKind.POLICY_VIOLATION)),
    ("tool_calls", Finish(reason=FinishKind.TOOL_CALLS)),
])
def test_finish_reasons_in_spec_and_engine_words_end_normally(raw, expected):
    assert terminal_for(raw) == expected


def test_natural_stop_after_tool_calls_is_tool_calls():
    assert terminal_for("stop", tools=True) == Finish(reason=FinishKind.TOOL_CALLS)


@given(st.text(max_size=20).filter(lambda s: s not in {
    "eos_token", "stop", "stop_sequence", "length", "policy_violation", "tool_calls",
    "content_filter"}) | st.none())
@settings(max_examples=200)
def test_error_abort_and_unknown_finish_reasons_are_upstream_failures(raw):
    out = terminal_for(raw)
    assert isinstance(out, Failure) and out.failure_class is FailureClass.UPSTREAM


@given(st.lists(st.lists(st.integers(0, 49151), max_size=5), max_size=8))
@settings(max_examples=100)
def test_ids_only_translation_never_decodes_and_keeps_every_id(chunks):
    req = ids_request()
    tr = FrameTranslator(req, None)
    events = [e for c in chunks for e in tr.on_chunk(TokenChunk(tuple(c), ""))]
    events += tr.on_chunk(TokenChunk((), "", True, "length"))
    assert ids_of(events) == tuple(i for c in chunks for i in c)
    assert text_of(events) == "" and events[-1] == Finish(reason=FinishKind.LENGTH)


def test_frame_tool_calls_become_indexed_tool_call_deltas():
    tr = FrameTranslator(ids_request(), None)
    calls = (ToolCall(name="a", arguments_json="{}", id="tc_1"),
             ToolCall(name="b", arguments_json='{"x":1}'))
    events = tr.on_chunk(TokenChunk((), "", True, "stop", calls))
    deltas = [e for e in events if isinstance(e, ToolCallDelta)]
    assert [(d.index, d.name, d.arguments) for d in deltas] == [(0, "a", "{}"), (1, "b", '{"x":1}')]
    assert deltas[0].id == "tc_1" and deltas[1].id  # a missing id is minted
    assert events[-1] == Finish(reason=FinishKind.TOOL_CALLS)


def test_text_stop_string_ends_text_before_it(smollm2_map):
    detok = Detokenizer(smollm2_map)
    text = detok.decode(IDS)
    stop = text[len(text) // 2: len(text) // 2 + 3]
    req = ids_request(stop=(stop,), want_text=True)
    tr = FrameTranslator(req, detok.stream())
    events = [e for i in IDS for e in tr.on_chunk(TokenChunk((i,), ""))]
    assert text_of(events) == text[:text.index(stop)]
    assert events[-1] == Finish(reason=FinishKind.STOP_SEQUENCE, matched_stop=stop)


_LLAMA_CTX = {"error": {"code": 400, "type": "exceed_context_size_error", "n_prompt_tokens": 9000,
                        "n_ctx": 4096, "message": "request (9000 tokens) exceeds the available "
                                                  "context size (4096 tokens)"}}
_VLLM_CTX = {"error": {"code": 400, "type": "BadRequestError", "message":
                       "This model's maximum context length is 2048 tokens. However, your "
                       "request has 3000 input tokens. Please reduce the length."}}


@pytest.mark.parametrize(("status", "headers", "body", "cls", "counts"), [
    (400, {}, _LLAMA_CTX, FailureClass.CONTEXT_LENGTH, (9000, 4096)),
    (400, {}, _VLLM_CTX, FailureClass.CONTEXT_LENGTH, (3000, 2048)),
    (400, {}, {"error": {"message": "bad", "code": "invalid_request"}},
     FailureClass.INVALID_REQUEST, (None, None)),
    (401, {}, {"error": {"message": "no"}}, FailureClass.AUTHENTICATION, (None, None)),
    (429, {"retry-after": "7"}, {"error": {"message": "slow down"}}, FailureClass.RATE_LIMITED,
     (None, None)),
    (429, {}, {"error": {"message": "pay", "code": "insufficient_quota"}}, FailureClass.QUOTA,
     (None, None)),
    (503, {"retry-after": "1"}, {"error": {"message": "full", "code": "queue_full"}},
     FailureClass.CAPACITY, (None, None)),
    (500, {}, {"detail": "boom"}, FailureClass.UPSTREAM, (None, None)),
])
def test_http_errors_are_classified_from_structured_fields(status, headers, body, cls, counts):
    failure = classify_http(status, headers, json.dumps(body).encode(), "peer")
    assert failure.failure_class is cls
    assert (failure.prompt_tokens, failure.context_tokens) == counts
    if "retry-after" in headers:
        assert failure.retry_after == float(headers["retry-after"])


@pytest.mark.parametrize("options", [
    {"stream_format": "json"}, {"path": "a"}, {"zstd": "yes"}, {"frobnicate": 1}])
def test_bad_options_are_config_errors_at_start_up(options):
    with pytest.raises(ConfigError):
        CodecOptions.parse("peer", options)


def test_path_c_is_skipped_when_the_request_has_fields_it_cannot_carry():
    opts = CodecOptions.parse("peer", {"path": "c"})
    wire = ModelWire("http://127.0.0.1:1", opts, name="m", sent_as="m", tmap=None,
                     map_id=None, cache=DiscoveryCache())
    assert [a[0] for a in wire.attempts(ids_request())] == ["c", "b"]
    assert [a[0] for a in wire.attempts(ids_request(seed=1))] == ["b"]



