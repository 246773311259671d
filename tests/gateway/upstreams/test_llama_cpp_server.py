"""A real OpenAI-compatible upstream: ``python -m llama_cpp.server`` with the SmolLM2 GGUF.

The server runs from ``.venv-peers`` (``scripts/peers-venv.sh``; its FastAPI extras do not
fit our starlette), on a free loopback port; tokenwire's gateway app sits in front of it
with the ``openai`` adapter. llama_cpp.server returns text only (no ids, no usage chunk; its
``logprobs`` name tokens by text), so Codec streams carry ids retokenized with the SmolLM2
map (``Codec-Ids-Source: retokenized``). The ground truth is llama.cpp itself: an in-process
``llama_cpp.Llama`` on the same GGUF with the server's sampling defaults, greedy, whose
``generate`` is wrapped to record every id it sampled.

llama-cpp-python reuses the KV cache of the longest prompt prefix it has seen, and a prompt
evaluated partly from cache gets slightly different logits (other batch shapes), enough to
flip a close greedy choice (observed: EOS vs ``\n`` after a list item). So every compared
generation starts from an empty cache: the server is first sent an unrelated prompt
(:func:`_evict`), the in-process model is ``reset()``.
"""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from tests.gateway.conftest import start_server
from tests.gateway.upstreams import llama_cpp_peer as peer
from tests.gateway.upstreams.llama_cpp_peer import require_peer
from tokenwire.codec import frames_msgpack, frames_protobuf
from tokenwire.codec.maps import bundled_map_path, load_map_file
from tokenwire.codec.versioning import CLIENT_VERSION_HEADER, OWN_VERSION, format_version
from tokenwire.gateway.http.state import GatewayState
from tokenwire.gateway.routing.router import Router, ServedModel
from tokenwire.gateway.settings import ServerSettings
from tokenwire.gateway.upstreams.base import ModelRoute, UpstreamConfig
from tokenwire.gateway.upstreams.openai_compat import OpenAICompatUpstream
from tokenwire.gguf_tokenizer import smollm2_gguf_path

pytestmark = pytest.mark.slow

require_peer()

PROMPT = "The three most useful kitchen tools are"
MESSAGES = [{"role": "user", "content": "Name three fruits."}]
MAX_TOKENS = 24
#: Greedy, plus llama_cpp.server's own sampling defaults (server/types.py), which the
#: in-process reference must repeat: repeat_penalty 1.1 changes even greedy choices.
GREEDY = {"temperature": 0, "seed": 7, "top_p": 1.0}
SERVER_DEFAULTS = {"repeat_penalty": 1.1, "top_k": 40, "min_p": 0.05}
N_CTX = peer.SHARED_N_CTX  # the session's shared server (conftest.py)


def _evict(upstream_url: str, model: str) -> None:
    """Make the server's cached prefix unrelated to the next prompt (see module docstring)."""
    httpx.post(upstream_url + "/completions", timeout=180, json={
        "model": model, "prompt": "Zebra", "max_tokens": 1, "temperature": 0})


@pytest.fixture(scope="module")
def gateway(llama_server):
    url, upstream_model = llama_server
    smollm2 = load_map_file(bundled_map_path("huggingfacetb/smollm2"))
    cfg = UpstreamConfig(name="llama-cpp-python", kind="openai", base_url=url,
                         models=(ModelRoute(name="smollm2", upstream_model=upstream_model,
                                            map_id=smollm2.id),))
    maps = {smollm2.id: smollm2}
    prober = OpenAICompatUpstream.from_config(cfg, maps=maps)

    async def probe():
        try:
            return await prober.probe()
        finally:
            await prober.aclose()
    health = asyncio.run(probe())
    assert health.state.value == "up", health
    adapter = OpenAICompatUpstream.from_config(cfg, maps=maps)
    adapter.ids_mode = prober.effective_ids  # "none": owned_by "me" returns no ids
    served = ServedModel(name="smollm2", upstream=adapter, tmap=smollm2, max_model_len=N_CTX,
                         ids_source=adapter.ids_source_for("smollm2"),
                         upstream_name=adapter.name)
    state = GatewayState(settings=ServerSettings(), router=Router([served]))
    live = start_server(state)
    yield live.url + "/v1"
    live.stop(adapter)


@pytest.fixture(scope="module")
def llama_inprocess(llama_server):
    """llama.cpp in this process on the same GGUF; ``run(fn, **kw) -> (ids, result)``."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(smollm2_gguf_path()), n_ctx=N_CTX, n_threads=1,
                verbose=False, seed=GREEDY["seed"])
    sampled: list[int] = []
    generate = llm.generate

    def recording_generate(*args, **kwargs):
        for token in generate(*args, **kwargs):
            sampled.append(token)
            yield token

    llm.generate = recording_generate

    def run(method: str, **kw):
        sampled.clear()
        llm.reset()
        result = getattr(llm, method)(max_tokens=MAX_TOKENS, **GREEDY, **SERVER_DEFAULTS,
                                      **kw)
        ids = [t for t in sampled if t != llm.token_eos()]
        return ids, result
    return run


def _codec_ids(url: str, path: str, body: dict, fmt: str,
               upstream: tuple[str, str]) -> tuple[list[int], dict, str]:
    _evict(*upstream)
    headers = {"Accept-Encoding": "identity",  # a current client sees Codec-Ids-Source (§5.3)
               CLIENT_VERSION_HEADER: format_version(OWN_VERSION)}
    resp = httpx.post(url + path, timeout=180, headers=headers,
                      json={**body, "max_tokens": MAX_TOKENS, "stream_format": fmt, **GREEDY})
    assert resp.status_code == 200, resp.text
    dec = {"msgpack": frames_msgpack.FrameDecoder,
           "protobuf": frames_protobuf.FrameDecoder}[fmt]()
    frames = dec.feed(resp.content)
    return [i for f in frames for i in f.ids], resp.headers, frames[-1].finish_reason


@pytest.mark.parametrize("fmt", ["msgpack", "protobuf"])
def test_codec_completion_streams_carry_the_ids_llama_cpp_generated(gateway, llama_inprocess,
                                                                   llama_server, fmt):
    expected, result = llama_inprocess("create_completion", prompt=PROMPT)
    body = {"model": "smollm2", "prompt": PROMPT}
    ids, headers, finish = _codec_ids(gateway, "/completions", body, fmt, llama_server)
    assert headers["codec-ids-source"] == "retokenized"
    assert ids == expected and len(ids) > 0
    assert finish in ("length", "eos_token")
    assert result["choices"][0]["finish_reason"] == ("length" if finish == "length" else "stop")


@pytest.mark.parametrize("fmt", ["msgpack", "protobuf"])
def test_codec_chat_streams_carry_the_ids_llama_cpp_generated(gateway, llama_inprocess,
                                                             llama_server, fmt):
    expected, _ = llama_inprocess("create_chat_completion", messages=MESSAGES)
    ids, _, _ = _codec_ids(gateway, "/chat/completions", {"model": "smollm2",
                                                          "messages": MESSAGES}, fmt, llama_server)
    assert ids == expected and len(ids) > 0


def _sdk(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=180)


def _completion_view(chunks) -> tuple:
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices
              and c.choices[0].finish_reason]
    return text, finish, {c.object for c in chunks}


def _chat_view(chunks) -> tuple:
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices
              and c.choices[0].finish_reason]
    roles = [c.choices[0].delta.role for c in chunks if c.choices and c.choices[0].delta.role]
    return text, finish, roles, {c.object for c in chunks}


def test_openai_sdk_completion_stream_is_unchanged_through_tokenwire(gateway, llama_server,
                                                                     closing):
    url, upstream_model = llama_server
    _evict(url, upstream_model)
    direct = list(closing(_sdk(url)).completions.create(
        model=upstream_model, prompt=PROMPT, max_tokens=MAX_TOKENS, stream=True, **GREEDY))
    _evict(url, upstream_model)
    via = list(closing(_sdk(gateway)).completions.create(
        model="smollm2", prompt=PROMPT, max_tokens=MAX_TOKENS, stream=True, **GREEDY))
    assert _completion_view(via) == _completion_view(direct)
    assert _completion_view(via)[0]


def test_openai_sdk_chat_stream_is_unchanged_through_tokenwire(gateway, llama_server,
                                                               closing):
    url, upstream_model = llama_server
    _evict(url, upstream_model)
    direct = list(closing(_sdk(url)).chat.completions.create(
        model=upstream_model, messages=MESSAGES, max_tokens=MAX_TOKENS, stream=True, **GREEDY))
    _evict(url, upstream_model)
    via = list(closing(_sdk(gateway)).chat.completions.create(
        model="smollm2", messages=MESSAGES, max_tokens=MAX_TOKENS, stream=True, **GREEDY))
    assert _chat_view(via) == _chat_view(direct)
    assert _chat_view(via)[0]
