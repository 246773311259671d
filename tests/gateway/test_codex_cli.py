"""The Codex CLI (``@openai/codex`` 0.171.0, from npm) as a real client of ``POST /v1/responses``.

``scripts/codex-install.sh`` (run by ``./dev``) puts the CLI in ``.codex-cli/``; without it
these tests skip. Each test runs ``codex exec --json`` against tokenwire on a loopback port,
with a throw-away ``CODEX_HOME`` whose ``config.toml`` (``codex_cli.codex_config``) declares one
provider, ``[model_providers.tw]`` with ``wire_api = "responses"``, Codex's default retry
budget (``stream_max_retries = 5``, ``request_max_retries = 4``: a reconnect caused by the
gateway must show), no approvals and no sandbox (the only command is the scripted
``echo hello``, run in a temp dir). Offline: under ``strace`` this CLI ran
``git ls-remote https://github.com/openai/plugins.git`` and resolved ``api.github.com``
until the ``plugins``, ``remote_plugin``, ``plugin_sharing``, ``apps`` and
``in_app_updates`` features were turned off; ``analytics``/``feedback`` are off and
``check_for_update_on_startup = false``. After that its only connection is to the gateway.
``shell_snapshot`` is off and ``HOME`` is a temp dir so no user ``.bashrc`` runs.

What this Codex sends (recorded with a logging server, 2026-11; the gateway must accept it):

* ``POST {base_url}/responses`` only: no ``/models`` call, nothing else. Headers:
  ``authorization: Bearer <env_key value>``, ``accept: text/event-stream``,
  ``accept-encoding: zstd,gzip``, ``originator: codex_exec``, ``session-id``,
  ``thread-id``, ``x-client-request-id``, ``x-codex-window-id``,
  ``x-codex-beta-features: remote_compaction_v2``, ``x-codex-turn-metadata`` (JSON).
* Body keys: ``model``, ``stream: true``, ``store: false``, ``tool_choice: "auto"``,
  ``parallel_tool_calls: true``, ``reasoning: {"summary": "auto"}`` (a model it knows,
  e.g. ``gpt-5.5``, gets ``{"effort": "medium"}`` and ``text: {"verbosity": "low"}``),
  ``include: ["reasoning.encrypted_content"]``, ``prompt_cache_key`` (the thread id),
  ``client_metadata`` (string map), ``input``, ``tools``. No ``instructions``: the
  ~20 kB system prompt is the first ``developer`` message. The body is ~42 kB (~10k
  tokens), more than the embedded engine's 4096-token context.
* ``input``: ``message`` items (``developer`` x2, ``user`` x2: environment context, then
  the prompt) with ``input_text`` parts. On the turn after a tool call it replays the
  ``reasoning`` item (``summary``, ``content: null``, ``encrypted_content``), the
  ``function_call`` item (``id``, ``call_id``, ``name``, ``arguments``, ``status``), and a
  ``function_call_output`` (``id: "fco_..."``, same ``call_id``, ``output`` a string:
  ``"Chunk ID: ..\\nWall time: ..\\nProcess exited with code 0\\n...Output:\\nhello\\n"``).
* ``tools`` (unknown model): functions ``exec_command`` (``{"cmd": str, "workdir"?,
  "yield_time_ms"?, "max_output_tokens"?, "tty"?, "shell"?, "login"?, ...}``, ``strict:
  false``), ``write_stdin``, ``request_user_input``, ``view_image``, ``get_goal``,
  ``create_goal``, ``update_goal``; a ``{"type": "namespace", "name": "multi_agent_v1",
  "tools": [functions...]}``; a hosted ``{"type": "web_search", "external_web_access":
  true}``. A known model (``gpt-5.5``) also gets the custom ``apply_patch`` (``{"type":
  "custom", "format": {"type": "grammar", "syntax": "lark", "definition": ...}}``) and
  ``tool_search``.
* Retries: a stream that ends without ``response.completed`` is retried
  (``"Reconnecting... n/5"`` error events, 6 requests in all); ``response.failed`` with
  ``context_length_exceeded`` ends the turn at once (one request, ``turn.failed``, "ran
  out of room in the model's context window"); an HTTP 400 is not retried either (one
  request, its body shown as the error). Through tokenwire the first request of a turn is
  4587 SmolLM2 tokens with this config (6015 as ``gpt-5.5``), over the 4096 window.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from tests.gateway.upstreams.fakes import Reply, ToolScript, chat_stream, start_fake
from tokenwire.codec.maps import TokenizerMap
from tokenwire.gateway.http.state import GatewayState
from tokenwire.gateway.ir import IdsSource
from tokenwire.gateway.routing.router import Router, ServedModel
from tokenwire.gateway.settings import ServerSettings
from tokenwire.gateway.upstreams.base import ModelRoute, UpstreamConfig
from tokenwire.gateway.upstreams.openai_compat import OpenAICompatUpstream

from .codex_cli import CODEX_MARKS, STREAM_MAX_RETRIES, run_codex
from .conftest import Served, running_engine, start_server

pytestmark = CODEX_MARKS


# -- tokenwire on a loopback port, recording what it was sent --------------------------------


@dataclass
class Recording:
    """An ASGI wrapper that keeps each ``POST /v1/responses`` body and the SSE answer."""

    app: Callable
    bodies: list[dict] = field(default_factory=list)
    answers: list[bytearray] = field(default_factory=list)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/responses":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        answer = bytearray()
        self.answers.append(answer)

        async def spy_receive():
            msg = await receive()
            chunks.append(msg.get("body", b""))
            if msg["type"] == "http.request" and not msg.get("more_body"):
                raw = b"".join(chunks)
                self.bodies.append(json.loads(raw) if raw else {})
            return msg

        async def spy_send(msg) -> None:
            if msg["type"] == "http.response.body":
                answer.extend(msg.get("body", b""))
            await send(msg)

        await self.app(scope, spy_receive, spy_send)

    def events(self, n: int) -> list[dict]:
        """The SSE events of answer ``n``, parsed."""
        return [json.loads(line[5:]) for line in bytes(self.answers[n]).decode().splitlines()
                if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]")]


@dataclass
class Gateway:
    url: str
    recording: Recording
    served: Served

    def stop(self) -> None:
        self.served.stop()


def serve_gateway(state: GatewayState) -> Gateway:
    recorders: list[Recording] = []

    def record(app: Callable) -> Recording:
        recorders.append(Recording(app))
        return recorders[0]

    served = start_server(state, wrap=record)
    return Gateway(served.url, recorders[0], served)


@pytest.fixture
def compat_gateway() -> Iterator[Callable[..., tuple]]:
    """``start(respond, model="m") -> (fake, gateway)``: tokenwire over a scripted Chat
    Completions server (vLLM-shaped) serving ``model``."""
    stops: list[Callable[[], None]] = []

    def start(respond: Callable[[str, dict], Reply], model: str = "m"):
        fake = start_fake(respond, models=(model,))
        stops.append(fake.stop)
        cfg = UpstreamConfig(name="up", kind="openai", base_url=fake.url,
                             models=(ModelRoute(name=model),))
        up = OpenAICompatUpstream.from_config(cfg)
        router = Router([ServedModel(name=model, upstream=up, ids_source=IdsSource.NONE,
                                     upstream_name="up")])
        gw = serve_gateway(GatewayState(settings=ServerSettings(), router=router))
        stops.insert(0, gw.stop)
        return fake, gw

    yield start
    for stop in stops:
        stop()


# -- a plain answer --------------------------------------------------------------------------


def test_codex_exec_completes_a_text_turn_through_the_responses_route(compat_gateway,
                                                                     tmp_path) -> None:
    fake, gw = compat_gateway(lambda path, body: Reply(chunks=chat_stream(
        "vllm", ["Hi ", "from ", "tokenwire."])))
    run = run_codex(gw.url, "m", "say hi", tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert [m["text"] for m in run.items("agent_message")] == ["Hi from tokenwire."]
    assert run.of_type("turn.completed") and not run.of_type("turn.failed")
    assert not run.reconnected, run.stdout
    assert len(gw.recording.bodies) == 1 and len(fake.requests) == 1
    assert gw.recording.bodies[0]["stream"] is True


def test_codex_with_a_model_it_knows_sends_its_full_tool_set_and_completes(
        compat_gateway, tmp_path) -> None:
    """Served as ``gpt-5.5``, Codex adds the custom (grammar) ``apply_patch`` and the
    client-executed ``tool_search`` tool, reasoning effort and text verbosity."""
    fake, gw = compat_gateway(lambda path, body: Reply(chunks=chat_stream(
        "vllm", ["Hi."])), model="gpt-5.5")
    run = run_codex(gw.url, "gpt-5.5", "say hi", tmp_path)
    sent = gw.recording.bodies[0]
    kinds = {(t["type"], t.get("name")) for t in sent["tools"]}
    assert {("custom", "apply_patch"), ("tool_search", None)} <= kinds
    assert run.returncode == 0, run.stdout + run.stderr
    assert [m["text"] for m in run.items("agent_message")] == ["Hi."]
    assert not run.reconnected and len(gw.recording.bodies) == len(fake.requests) == 1


# -- a tool turn -----------------------------------------------------------------------------


def _command_call(tools: list[dict]) -> tuple[str, str]:
    """Codex's command tool as the gateway forwarded it, and ``echo hello`` in its shape."""
    fns = {t["function"]["name"]: t["function"] for t in tools if t.get("type") == "function"}
    name = next(n for n in ("exec_command", "shell", "local_shell") if n in fns)
    props = fns[name].get("parameters", {}).get("properties", {})
    if "cmd" in props:
        return name, json.dumps({"cmd": "echo hello"})
    if props.get("command", {}).get("type") == "array":
        return name, json.dumps({"command": ["bash", "-lc", "echo hello"]})
    return name, json.dumps({"command": "echo hello"})


def test_codex_runs_a_tool_call_and_returns_its_output_with_the_same_call_id(
        compat_gateway, tmp_path) -> None:
    def respond(path: str, body: dict) -> Reply:
        if body["messages"][-1]["role"] == "tool":
            return Reply(chunks=chat_stream("vllm", ["The command printed hello."]))
        name, args = _command_call(body.get("tools") or [])
        return Reply(chunks=chat_stream("vllm", tools=[ToolScript(
            0, "call_tw1", name, (args[:6], args[6:]))], finish="tool_calls"))

    fake, gw = compat_gateway(respond)
    run = run_codex(gw.url, "m", "run echo hello", tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    [cmd] = run.items("command_execution")
    assert "echo hello" in cmd["command"] and cmd["exit_code"] == 0
    assert cmd["aggregated_output"].strip() == "hello"
    assert [m["text"] for m in run.items("agent_message")] == ["The command printed hello."]
    assert not run.reconnected, run.stdout
    assert len(gw.recording.bodies) == 2 and len(fake.requests) == 2
    # Codex replays the call and answers it under the id the upstream chose...
    second = gw.recording.bodies[1]["input"]
    [call] = [i for i in second if i.get("type") == "function_call"]
    [output] = [i for i in second if i.get("type") == "function_call_output"]
    assert call["call_id"] == output["call_id"] == "call_tw1"
    assert "hello" in output["output"]
    # ...and the gateway hands both back to the Chat Completions upstream under that id.
    msgs = fake.requests[1][1]["messages"]
    [asked] = [m for m in msgs if m["role"] == "assistant" and m.get("tool_calls")]
    [answered] = [m for m in msgs if m["role"] == "tool"]
    assert asked["tool_calls"][0]["id"] == answered["tool_call_id"] == "call_tw1"
    assert "hello" in json.dumps(answered["content"])


# -- the embedded engine: Codex's prompt does not fit ----------------------------------------


@pytest.fixture(scope="module")
def engine_4096(smollm2_map: TokenizerMap):
    """The real embedded SmolLM2 at its default context (4096), once for this module."""
    with running_engine(smollm2_map, n_ctx=4096) as eng:
        yield eng


def serve_embedded(engine, tmap: TokenizerMap, **settings) -> Gateway:
    """A gateway serving ``engine`` (an embedded engine) as its one model, with
    ``settings`` (``ServerSettings`` fields)."""
    router = Router([ServedModel(name=engine.model_id, upstream=engine, tmap=tmap,
                                 max_model_len=engine.n_ctx, ids_source=IdsSource.ENGINE,
                                 upstream_name="embedded")])
    return serve_gateway(GatewayState(settings=ServerSettings(**settings), router=router))


@pytest.fixture
def embedded_gateway(engine_4096, smollm2_map) -> Iterator[Gateway]:
    gw = serve_embedded(engine_4096, smollm2_map)
    yield gw
    gw.stop()


def test_context_overflow_is_final_for_codex_not_retried_six_times(
        engine_4096, embedded_gateway, tmp_path) -> None:
    run = run_codex(embedded_gateway.url, engine_4096.model_id, "say hi", tmp_path)
    assert run.returncode != 0
    assert len(run.of_type("turn.failed")) == 1, run.stdout
    # One request; a few if Codex compacted and gave up; never 1 + STREAM_MAX_RETRIES.
    n = len(embedded_gateway.recording.bodies)
    assert 1 <= n <= 3 and n != 1 + STREAM_MAX_RETRIES, (n, run.stdout)
    assert "Reconnecting" not in run.stdout
    failed = [e for e in embedded_gateway.recording.events(0) if e["type"] == "response.failed"]
    assert len(failed) == 1 and failed[0]["response"]["status"] == "failed"


def test_context_overflow_reaches_codex_as_context_length_exceeded(
        engine_4096, embedded_gateway, tmp_path) -> None:
    run = run_codex(embedded_gateway.url, engine_4096.model_id, "say hi", tmp_path)
    [failed] = [e for e in embedded_gateway.recording.events(0)
                if e["type"] == "response.failed"]
    assert failed["response"]["error"]["code"] == "context_length_exceeded"
    # Codex words this code itself ("Codex ran out of room in the model's context window").
    [turn] = run.of_type("turn.failed")
    assert "ran out of room" in turn["error"]["message"], run.stdout


# -- upstream failures as Codex lives them (issue 6) -------------------------------------------


def _error(status: int, code: str, type_: str = "server_error") -> Reply:
    body = json.dumps({"error": {"message": "scripted", "type": type_, "code": code}})
    # Connection: close, so no keep-alive socket outlives the test in the adapter's pool
    # (this fixture never closes the adapter's client, which belongs to uvicorn's thread).
    return Reply(chunks=(body.encode(),), status=status,
                 headers=(("content-type", "application/json"), ("connection", "close")))


def test_a_500_before_output_is_retried_by_the_gateway_and_codex_never_reconnects(
        compat_gateway, tmp_path) -> None:
    calls: list[int] = []

    def respond(path: str, body: dict) -> Reply:
        calls.append(1)
        if len(calls) == 1:
            return _error(500, "server_error")
        return Reply(chunks=chat_stream("vllm", ["Hi ", "again."]))

    fake, gw = compat_gateway(respond)
    run = run_codex(gw.url, "m", "say hi", tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert [m["text"] for m in run.items("agent_message")] == ["Hi again."]
    assert not run.reconnected, run.stdout
    # One request from Codex, two upstream attempts (the seed's single retry after 1 s).
    assert len(gw.recording.bodies) == 1 and len(fake.requests) == 2


def test_a_quota_429_stops_codex_after_one_request(compat_gateway, tmp_path) -> None:
    fake, gw = compat_gateway(
        lambda path, body: _error(429, "insufficient_quota", "insufficient_quota"))
    run = run_codex(gw.url, "m", "say hi", tmp_path)
    assert run.returncode != 0
    [turn] = run.of_type("turn.failed")
    assert "Quota exceeded" in turn["error"]["message"], run.stdout  # Codex's own words
    assert "Reconnecting" not in run.stdout
    assert len(gw.recording.bodies) == 1 and len(fake.requests) == 1  # final: no retries
    [failed] = [e for e in gw.recording.events(0) if e["type"] == "response.failed"]
    assert failed["response"]["error"]["code"] == "insufficient_quota"


def test_a_throttle_is_waited_out_by_the_gateway_not_by_codex(compat_gateway, tmp_path) -> None:
    calls: list[int] = []

    def respond(path: str, body: dict) -> Reply:
        calls.append(1)
        if len(calls) <= 2:
            throttled = _error(429, "rate_limit_exceeded", "rate_limit_error")
            return Reply(chunks=throttled.chunks, status=429,
                         headers=(*throttled.headers, ("retry-after", "1")))
        return Reply(chunks=chat_stream("vllm", ["Hi ", "after ", "waiting."]))

    fake, gw = compat_gateway(respond)
    run = run_codex(gw.url, "m", "say hi", tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert [m["text"] for m in run.items("agent_message")] == ["Hi after waiting."]
    assert "Reconnecting" not in run.stdout
    assert len(gw.recording.bodies) == 1 and len(fake.requests) == 3
