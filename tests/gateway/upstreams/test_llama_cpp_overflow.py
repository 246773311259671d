"""Context overflow behind the real ``python -m llama_cpp.server`` (issue 12, second section).

llama_cpp.server answers a *streamed* request whose prompt does not fit its ``--n_ctx`` with
``200`` and an empty SSE body (the ``ValueError`` is raised inside its event publisher, after
the head went out; nothing on the wire says why), and a non-streamed one with a proper 400
``context_length_exceeded``. tokenwire used to take the empty stream for a transient break:
a retry, then ``response.failed`` ``server_error``, and the Codex CLI reconnected five times
(6 Codex requests, 12 upstream attempts, 13 s).

Here the gateway is what ``tokenwire serve --config`` runs (:func:`serve_gateway` builds,
probes and routes it in its own loop), in front of a real llama_cpp.server with a small
context, driven by the real Codex CLI and the ``openai`` and ``anthropic`` SDKs. Two
deployments:

* ``configured``: the model's ``context_length`` is in the config file. A prompt that
  certainly does not fit is refused before anything is sent: zero upstream requests.
* ``unconfigured``: llama_cpp.server reports no context length anywhere, so the prompt
  goes out; its empty stream is confirmed with one non-streamed request (``max_tokens: 1``),
  whose 400 is the overflow, final: one attempt, two upstream requests.

What reached the upstream is counted from llama_cpp.server's own access log; Codex's
requests and the gateway's attempts from the gateway's ``/metrics``.
"""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tokenwire.gateway import server as server_mod
from tokenwire.gateway.config import parse_config
from tokenwire.gateway.settings import ServerSettings
from tokenwire.gateway.upstreams.openai_compat import CONFIRM_TRIES

from .llama_cpp_peer import LlamaServer, llama_server, require_peer

pytestmark = pytest.mark.slow
require_peer()

#: Small, so an overflowing prompt is short and quick to tokenize.
N_CTX = 512
MODEL = "smollm2"
#: ~800 SmolLM2 tokens of message text alone: over 512 whatever the chat template adds.
LONG = "word " * 800
SDK_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def peer(tmp_path_factory) -> Iterator[LlamaServer]:
    with llama_server(tmp_path_factory.mktemp("llama_overflow"), n_ctx=N_CTX) as srv:
        yield srv


@dataclass
class Stack:
    url: str
    peer: LlamaServer
    server: Any
    thread: threading.Thread

    def metric(self, name: str, **labels: str) -> float:
        text = httpx.get(self.url + "/metrics", timeout=30).text
        return sum(s.value for fam in text_string_to_metric_families(text)
                   for s in fam.samples if s.name == name
                   and all(s.labels.get(k) == v for k, v in labels.items()))


def _serve(peer: LlamaServer, context_length: int | None) -> Stack:
    model: dict[str, Any] = {"name": MODEL, "upstream_model": peer.model,
                             "map": "huggingfacetb/smollm2"}
    if context_length is not None:
        model["context_length"] = context_length
    cfg = parse_config({"upstreams": [{"name": "llama", "kind": "openai",
                                       "base_url": peer.url, "models": [model]}]})
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    ready: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: asyncio.run(server_mod.serve_gateway(
        cfg, ServerSettings(), log_level="warning", sockets=[sock],
        on_ready=lambda gw, srv: ready.update(server=srv))), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not (ready.get("server") and ready["server"].started):
        assert thread.is_alive() and time.monotonic() < deadline, "gateway did not start"
        time.sleep(0.05)
    return Stack(f"http://127.0.0.1:{sock.getsockname()[1]}", peer, ready["server"], thread)


@pytest.fixture(scope="module", params=["configured", "unconfigured"])
def stack(request, peer) -> Iterator[Stack]:
    s = _serve(peer, N_CTX if request.param == "configured" else None)
    yield s
    s.server.should_exit = True
    s.thread.join(15)


def _upstream_posts(stack: Stack, run: Callable[[], Any]) -> tuple[list[tuple[str, int]], Any]:
    """``run()``'s outcome (its result or the exception it raised) and the POSTs it caused."""
    before = len(stack.peer.posts())
    try:
        out: Any = run()
    except Exception as exc:  # the error the client saw is what the test checks
        out = exc
    return stack.peer.posts()[before:], out


def _expected_posts(stack: Stack, path: str) -> list[list[tuple[str, int]]]:
    """The POSTs the upstream may log. Configured: nothing is sent. Unconfigured: the
    stream (200, empty) and its confirmation (400). A confirmation whose connection fails
    is sent once more (``CONFIRM_TRIES``): with both cores busy the peer logged 200, 400,
    400, a first confirmation it answered whose answer never came back on that connection
    (llama_cpp.server closes the connection of the stream that failed)."""
    if _is_configured(stack):
        return [[]]
    return [[(path, 200)] + [(path, 400)] * tries for tries in range(1, CONFIRM_TRIES + 1)]


def _is_configured(stack: Stack) -> bool:
    models = httpx.get(stack.url + "/v1/models", timeout=30).json()["data"]
    return models[0].get("context_length_source") == "config"


# -- the openai SDK: Chat and Completions, streamed and not -------------------------------------


def _openai(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.url + "/v1", api_key="unused", max_retries=0,
                         timeout=SDK_TIMEOUT_S)


@pytest.mark.parametrize("stream", [True, False])
def test_chat_overflow_is_one_400_context_length_exceeded(stack, stream) -> None:
    def run() -> Any:
        with _openai(stack) as c:
            out = c.chat.completions.create(model=MODEL, max_tokens=8, stream=stream,
                                            messages=[{"role": "user", "content": LONG}])
            return list(out) if stream else out

    attempts = stack.metric("tokenwire_upstream_attempts_total")
    posts, err = _upstream_posts(stack, run)
    assert isinstance(err, openai.BadRequestError), err
    assert err.status_code == 400 and err.code == "context_length_exceeded"
    assert f"{N_CTX} tokens" in err.message
    assert posts in _expected_posts(stack, "/v1/chat/completions")
    assert stack.metric("tokenwire_upstream_attempts_total") - attempts == (
        0 if _is_configured(stack) else 1)


@pytest.mark.parametrize("stream", [True, False])
def test_completions_overflow_is_one_400_context_length_exceeded(stack, stream) -> None:
    def run() -> Any:
        with _openai(stack) as c:
            out = c.completions.create(model=MODEL, prompt=LONG, max_tokens=8, stream=stream)
            return list(out) if stream else out

    posts, err = _upstream_posts(stack, run)
    assert isinstance(err, openai.BadRequestError), err
    assert err.status_code == 400 and err.code == "context_length_exceeded"
    assert posts in _expected_posts(stack, "/v1/completions")


@pytest.mark.parametrize("stream", [True, False])
def test_responses_overflow_is_response_failed_or_a_400(stack, stream) -> None:
    def run() -> Any:
        with _openai(stack) as c:
            if stream:
                return [e for e in c.responses.create(model=MODEL, input=LONG, stream=True)
                        if e.type == "response.failed"]
            return c.responses.create(model=MODEL, input=LONG)

    posts, out = _upstream_posts(stack, run)
    if stream:
        [failed] = out
        assert failed.response.error.code == "context_length_exceeded"
    else:
        assert isinstance(out, openai.BadRequestError), out
        assert out.status_code == 400 and out.code == "context_length_exceeded"
    assert posts in _expected_posts(stack, "/v1/chat/completions")


def test_codec_stream_overflow_is_a_400_before_the_first_frame(stack) -> None:
    posts, resp = _upstream_posts(stack, lambda: httpx.post(
        stack.url + "/v1/completions", timeout=SDK_TIMEOUT_S, json={
            "model": MODEL, "prompt": LONG, "max_tokens": 8, "stream_format": "msgpack"}))
    assert resp.status_code == 400, resp.content
    assert resp.json()["error"]["code"] == "context_length_exceeded"
    assert posts in _expected_posts(stack, "/v1/completions")


# -- the anthropic SDK: Messages, streamed and not ----------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
def test_messages_overflow_is_anthropics_prompt_is_too_long(stack, stream) -> None:
    def run() -> Any:
        with anthropic.Anthropic(base_url=stack.url, api_key="unused", max_retries=0,
                                 timeout=SDK_TIMEOUT_S) as c:
            kw: dict[str, Any] = {"model": MODEL, "max_tokens": 8,
                                  "messages": [{"role": "user", "content": LONG}]}
            if stream:
                with c.messages.stream(**kw) as s:
                    return s.get_final_message()
            return c.messages.create(**kw)

    posts, err = _upstream_posts(stack, run)
    assert isinstance(err, anthropic.BadRequestError), err
    assert err.status_code == 400
    body = err.body["error"]
    assert body["type"] == "invalid_request_error"
    assert body["message"].startswith("prompt is too long: ")
    assert body["message"].endswith(f" tokens > {N_CTX} maximum")
    assert posts in _expected_posts(stack, "/v1/chat/completions")


# -- a prompt that fits is never refused -------------------------------------------------------


def test_a_prompt_that_fits_is_answered(stack) -> None:
    with _openai(stack) as c:
        out = c.chat.completions.create(model=MODEL, max_tokens=4, temperature=0,
                                        messages=[{"role": "user", "content": "Hi"}])
    assert out.choices[0].message.content


# -- the Codex CLI -----------------------------------------------------------------------------


def test_codex_gets_one_request_its_ran_out_of_room_message_and_no_reconnect(
        stack, tmp_path) -> None:
    from tests.gateway.codex_cli import CODEX, run_codex

    if not CODEX.exists():
        pytest.skip("the Codex CLI is not installed: run scripts/codex-install.sh")
    codex_requests = stack.metric("tokenwire_requests_total", api="responses")
    attempts = stack.metric("tokenwire_upstream_attempts_total")
    started = time.monotonic()
    posts, run = _upstream_posts(stack, lambda: run_codex(stack.url, MODEL, "say hi",
                                                          tmp_path))
    elapsed = time.monotonic() - started
    assert run.returncode != 0
    [turn] = run.of_type("turn.failed")
    assert "ran out of room" in turn["error"]["message"], run.stdout  # Codex's own words
    # Its one ``error`` event is that message, never a "Reconnecting... n/5".
    assert "Reconnecting" not in run.stdout
    assert [e["message"] for e in run.of_type("error")] == [turn["error"]["message"]]
    assert stack.metric("tokenwire_requests_total", api="responses") - codex_requests == 1
    configured = _is_configured(stack)
    assert stack.metric("tokenwire_upstream_attempts_total") - attempts == (
        0 if configured else 1)
    assert posts in _expected_posts(stack, "/v1/chat/completions")
    print(f"codex overflow ({'configured' if configured else 'unconfigured'}): 1 request, "
          f"{len(posts)} upstream requests, {elapsed:.1f} s")


# -- the rule against the real peer: never refuse what it would take ---------------------------


def _upstream_prompt_tokens(peer: LlamaServer, kind: str, words: int) -> int | None:
    """llama_cpp.server's own count of a prompt of ``words`` words when it refuses it
    (its 400 says "P in the messages" / "P in your prompt"), None when it serves it
    (non-streamed, one token)."""
    text = "word " * words
    body: dict[str, Any] = {"model": peer.model, "max_tokens": 1, "temperature": 0}
    if kind == "chat":
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    resp = httpx.post(f"{peer.url}/{kind.replace('chat', 'chat/completions')}", json=body,
                      timeout=SDK_TIMEOUT_S)
    assert resp.status_code in (200, 400), resp.text
    if resp.status_code == 200:
        return None
    m = re.search(r"\((\d+) in (?:the messages|your prompt)", resp.json()["error"]["message"])
    assert m, resp.text
    return int(m[1])


def _we_refuse(served: Any, kind: str, words: int) -> bool:
    from tokenwire.gateway.ir import ChatMessage, ChatPrompt, GenerationRequest, PromptText

    text = "word " * words
    prompt = (ChatPrompt(messages=(ChatMessage(role="user", content=text),))
              if kind == "chat" else PromptText(text=text))
    return served.preflight(GenerationRequest(prompt=prompt, max_tokens=8)) is not None


#: Chat: SmolLM2's template adds its default system prompt and markers (~30 tokens) that
#: the gateway does not count, plus the rule's boundary slack; text: the rule's text slack.
MAX_MARGIN_TOKENS = {"chat": 40, "completions": 4}


@pytest.mark.parametrize("kind", ["chat", "completions"])
def test_the_refusal_threshold_is_at_or_past_the_upstreams_own(peer, kind, smollm2_map) -> None:
    """The longest prompt llama_cpp.server serves must be sent, and the gateway must refuse
    soon after, not never. Each "word " is one more token, so two refusals (cheap: the
    server stops at tokenizing) give its count as a line, hence its exact limit, which one
    served request and one more refusal then confirm."""
    from tokenwire.gateway.routing.router import ServedModel

    served = ServedModel(name=MODEL, upstream=object(), tmap=smollm2_map, max_model_len=N_CTX)
    p700, p800 = (_upstream_prompt_tokens(peer, kind, w) for w in (700, 800))
    assert p700 is not None and p800 is not None
    per_word = (p800 - p700) // 100
    assert per_word == 1, (p700, p800)
    limit = 700 - (p700 - N_CTX)  # the first length the server refuses (P >= n_ctx)
    assert _upstream_prompt_tokens(peer, kind, limit) == N_CTX
    assert _upstream_prompt_tokens(peer, kind, limit - 1) is None  # served
    assert not _we_refuse(served, kind, limit - 1), f"refused {limit - 1} words, which it serves"
    ours = next(w for w in range(limit, 800) if _we_refuse(served, kind, w))
    print(f"{kind}: llama_cpp.server refuses from {limit} words, tokenwire before sending "
          f"from {ours}")
    assert ours - limit <= MAX_MARGIN_TOKENS[kind]
