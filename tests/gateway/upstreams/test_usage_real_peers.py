"""Usage against real peers: every API, streamed and not, carries the upstream's own counts.

Three deployments, each driven by the real ``openai`` and ``anthropic`` SDKs (and httpx for
the stored Responses object), every figure compared with the peer's own numbers:

* ``python -m llama_cpp.server`` (``.venv-peers``): it reports usage on a non-streamed
  answer only, never on a stream (``stream_options.include_usage`` is ignored), and the
  gateway always streams from it; so tokenwire counts with the SmolLM2 map and the GGUF's
  chat template (``source = gateway``). The reference is the same request sent straight to
  the server, non-streamed: prompt and completion counts must be equal, and so must the
  text (greedy, temperature 0, an empty KV cache before each: see
  ``test_llama_cpp_server.py``).
* a second tokenwire as a Codec upstream (frames carry no usage, codec-spec §1.1): the
  reference is the embedded engine behind it, answering the same request directly.
* the embedded engine: the reference is its own job record (the ids it evaluated and
  sampled) and, for the prompt, llama.cpp's tokenization of the rendered chat.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import anthropic
import httpx
import openai
import pytest

from tests.gateway.conftest import start_server
from tests.gateway.upstreams.test_llama_cpp_server import _evict
from tokenwire.gateway.config import parse_config
from tokenwire.gateway.server import build_gateway
from tokenwire.gateway.settings import ServerSettings
from tokenwire.gguf_tokenizer import SMOLLM2_MAP_ID, smollm2_gguf_path

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "Name three fruits."}]
PROMPT = "The three most useful kitchen tools are"
MAX_TOKENS = 24


@dataclass(frozen=True)
class Counts:
    prompt: int | None
    completion: int | None
    text: str
    source: str | None = None


def _served(doc: dict) -> tuple[str, Callable[[], None]]:
    """Serve a one-upstream config (no start-up probe: the adapter's connections must
    belong to the server's own loop)."""
    cfg = parse_config({"upstreams": [doc]}, env={})
    gw = asyncio.run(build_gateway(cfg, ServerSettings()))
    live = start_server(gw.state)
    return live.url, lambda: live.stop(gw)


def _chat_and_completions(url: str, model: str, before: Callable[[], None]) -> dict:
    with openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=300) as oc:
        kw = {"model": model, "max_tokens": MAX_TOKENS, "temperature": 0, "seed": 7}
        out = {}
        before()
        r = httpx.post(url + "/v1/chat/completions", timeout=300, json={**kw, "messages": MESSAGES})
        u = r.json()["usage"]
        out["chat"] = Counts(u["prompt_tokens"], u["completion_tokens"],
                             r.json()["choices"][0]["message"]["content"],
                             r.headers["tokenwire-usage-source"])
        before()
        chunks = list(oc.chat.completions.create(messages=MESSAGES, stream=True,
                                                 stream_options={"include_usage": True}, **kw))
        u = chunks[-1].usage
        out["chat stream"] = Counts(u.prompt_tokens, u.completion_tokens, "".join(
            c.choices[0].delta.content or "" for c in chunks if c.choices), u.tokenwire_source)
        before()
        done = oc.completions.create(prompt=PROMPT, **kw)
        out["completions"] = Counts(done.usage.prompt_tokens, done.usage.completion_tokens,
                                    done.choices[0].text, done.usage.tokenwire_source)
        before()
        chunks = list(oc.completions.create(prompt=PROMPT, stream=True,
                                            stream_options={"include_usage": True}, **kw))
        u = chunks[-1].usage
        out["completions stream"] = Counts(u.prompt_tokens, u.completion_tokens, "".join(
            c.choices[0].text for c in chunks if c.choices), u.tokenwire_source)
        return out


def _responses(url: str, model: str, before: Callable[[], None]) -> dict:
    with openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=300) as oc:
        kw = {"model": model, "max_output_tokens": MAX_TOKENS, "temperature": 0,
              "input": MESSAGES[0]["content"], "store": True}
        out = {}
        before()
        resp = oc.responses.create(**kw)
        u = resp.usage
        assert u.total_tokens == u.input_tokens + u.output_tokens
        assert u.output_tokens_details.reasoning_tokens == 0  # no reasoning text was produced
        out["responses"] = Counts(u.input_tokens, u.output_tokens, resp.output_text,
                                  u.tokenwire_source)
        stored = httpx.get(f"{url}/v1/responses/{resp.id}", timeout=60).json()["usage"]
        out["responses GET"] = Counts(stored["input_tokens"], stored["output_tokens"],
                                      resp.output_text, stored["tokenwire_source"])
        before()
        events = list(oc.responses.create(stream=True, **kw))
        final = next(e for e in events if e.type == "response.completed").response
        out["responses stream"] = Counts(final.usage.input_tokens, final.usage.output_tokens,
                                         final.output_text, final.usage.tokenwire_source)
        return out


def _messages(url: str, model: str, before: Callable[[], None]) -> dict:
    with anthropic.Anthropic(base_url=url, api_key="x", max_retries=0, timeout=300) as ac:
        kw = {"model": model, "max_tokens": MAX_TOKENS, "messages": MESSAGES,
              "extra_body": {"temperature": 0}}
        out = {}
        before()
        msg = ac.messages.create(**kw)
        out["messages"] = Counts(msg.usage.input_tokens, msg.usage.output_tokens,
                                 msg.content[0].text, msg.usage.tokenwire_source)
        before()
        start = delta = None
        with ac.messages.stream(**kw) as stream:
            for event in stream:
                if event.type == "message_start":
                    start = event.message.usage
                elif event.type == "message_delta":
                    delta = event.usage
            text = stream.get_final_message().content[0].text
        assert start is not None and delta is not None
        out["messages start"] = Counts(start.input_tokens, None, text, start.tokenwire_source)
        out["messages delta"] = Counts(delta.input_tokens, delta.output_tokens, text,
                                       delta.tokenwire_source)
        return out


def _every_api(url: str, model: str, before: Callable[[], None] = lambda: None) -> dict:
    return {**_chat_and_completions(url, model, before), **_responses(url, model, before),
            **_messages(url, model, before)}


def _check(got: dict, chat: Counts, text: Counts, source: str) -> None:
    """Every API's counts and text against the reference's; messages_start has no output."""
    for api, counts in got.items():
        want = text if api.startswith("completions") else chat
        if api == "messages start":
            want = Counts(want.prompt, None, want.text)
        assert (api, counts.prompt, counts.completion, counts.text) == (
            api, want.prompt, want.completion, want.text)
        assert counts.source == source, api


# -- python -m llama_cpp.server ----------------------------------------------------------------


def test_llama_cpp_server_counts_equal_its_own_on_every_api(llama_server):
    url, upstream_model = llama_server
    evict = lambda: _evict(url, upstream_model)  # noqa: E731
    greedy = {"model": upstream_model, "max_tokens": MAX_TOKENS, "temperature": 0, "seed": 7}
    evict()
    direct = httpx.post(url + "/chat/completions", timeout=300,
                        json={**greedy, "messages": MESSAGES}).json()
    chat = Counts(direct["usage"]["prompt_tokens"], direct["usage"]["completion_tokens"],
                  direct["choices"][0]["message"]["content"])
    evict()
    direct = httpx.post(url + "/completions", timeout=300,
                        json={**greedy, "prompt": PROMPT}).json()
    text = Counts(direct["usage"]["prompt_tokens"], direct["usage"]["completion_tokens"],
                  direct["choices"][0]["text"])
    gw, stop = _served({
        "name": "llama", "kind": "openai", "base_url": url, "probe": False,
        "models": [{"name": "smollm2", "upstream_model": upstream_model, "map": SMOLLM2_MAP_ID,
                    "chat_template": str(smollm2_gguf_path())}]})
    try:
        got = _every_api(gw, "smollm2", evict)
    finally:
        stop()
    print("llama_cpp.server direct: chat", chat, "completions", text)
    _check(got, chat, text, "gateway")


def test_llama_cpp_server_does_not_stream_usage_even_when_asked(llama_server):
    """Why tokenwire counts: the peer's streams carry no usage chunk (if a release starts
    sending one, the adapter takes its counts and this test says so)."""
    url, upstream_model = llama_server
    body = {"model": upstream_model, "max_tokens": 4, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "messages": MESSAGES}
    raw = httpx.post(url + "/chat/completions", json=body, timeout=300).text
    assert '"usage"' not in raw and "[DONE]" in raw


# -- a Codec upstream (tokenwire in front of tokenwire) --------------------------------------


@pytest.fixture(scope="module")
def codec_pair(engine, serve):
    a = serve(engine)
    gw, stop = _served({
        "name": "a", "kind": "codec", "base_url": a.url, "probe": False,
        "models": [{"name": "smol-via-a", "upstream_model": engine.model_id,
                    "map": SMOLLM2_MAP_ID, "chat_template": str(smollm2_gguf_path())}]})
    yield a.url, gw
    stop()


def _engine_reference(url: str, engine) -> tuple[Counts, Counts]:
    """The engine's counts for the chat and the text prompt, asked directly, each checked
    against the engine's own job record (the ids it evaluated and sampled)."""
    kw = {"model": engine.model_id, "max_tokens": MAX_TOKENS, "temperature": 0, "seed": 7}
    out = []
    for path, field, key in (("/v1/chat/completions", "messages", MESSAGES),
                             ("/v1/completions", "prompt", PROMPT)):
        r = httpx.post(url + path, timeout=300, json={**kw, field: key})
        body, usage = r.json(), r.json()["usage"]
        record = engine.wait_for_record(r.headers["x-request-id"])
        assert (record.prompt_tokens, len(record.ids)) == (
            usage["prompt_tokens"], usage["completion_tokens"])
        assert usage["tokenwire_source"] == r.headers["tokenwire-usage-source"] == "engine"
        choice = body["choices"][0]
        out.append(Counts(usage["prompt_tokens"], usage["completion_tokens"],
                          choice["message"]["content"] if field == "messages"
                          else choice["text"]))
    return out[0], out[1]


def test_codec_upstream_counts_equal_the_engines_own_on_every_api(codec_pair, engine):
    a_url, b_url = codec_pair
    chat, text = _engine_reference(a_url, engine)
    got = _every_api(b_url, "smol-via-a")
    print("engine behind Codec: chat", chat, "completions", text)
    _check(got, chat, text, "gateway")


# -- the embedded engine ---------------------------------------------------------------------


def test_embedded_counts_are_the_engines_own_on_every_api(engine, serve, smollm2_map):
    from llama_cpp import Llama
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    served = serve(engine)
    chat, text = _engine_reference(served.url, engine)
    # The prompt count is llama.cpp's tokenization of the chat its template renders.
    llm = Llama(model_path=str(smollm2_gguf_path()), vocab_only=True, verbose=False)
    rendered = Jinja2ChatFormatter(template=llm.metadata["tokenizer.chat_template"],
                                   eos_token="<|im_end|>", bos_token="<|im_start|>"
                                   )(messages=MESSAGES).prompt
    assert chat.prompt == len(llm.tokenize(rendered.encode(), add_bos=False, special=True))
    got = _every_api(served.url, engine.model_id)
    print("embedded: chat", chat, "completions", text)
    _check(got, chat, text, "engine")
