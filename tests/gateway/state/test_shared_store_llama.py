"""A real engine behind three instances on one Redis: the content of a shared conversation.

``python -m llama_cpp.server`` (the real peer, SmolLM2) behind three ``tokenwire serve``
processes sharing a real ``redis-server``. The ``openai`` SDK holds a Responses
conversation whose every turn goes to another instance (``previous_response_id``). Each
turn is then replayed **directly** against llama_cpp.server's own Chat API with the whole
conversation as it should be (every earlier user turn and answer): the engine's prompt token
count and its greedy answer must be the gateway's exactly, so each instance sent the engine
the full, correct conversation it had never seen itself. (llama_cpp.server reports no usage
on a stream, which is how the gateway talks to it: the gateway counts with the SmolLM2 map
and the GGUF's chat template, as ``tests/gateway/upstreams/test_usage_real_peers.py``
checks; and the KV cache is evicted before each answer, as there, for exact greedy text.)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.gateway.state.conftest import start_instances
from tests.gateway.upstreams.llama_cpp_peer import LlamaServer, llama_server, require_peer
from tests.gateway.upstreams.test_llama_cpp_server import _evict
from tests.redis_server import RedisServer
from tokenwire.gguf_tokenizer import SMOLLM2_MAP_ID, smollm2_gguf_path

require_peer()
pytestmark = pytest.mark.slow

TURNS = ("My name is Ada. Say hello.", "What is my name?", "Say it once more.")
#: Short answers keep the run short; greedy decoding makes them reproducible.
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    with llama_server(tmp_path_factory.mktemp("llama"), n_ctx=2048) as server:
        yield server


def _upstream(llama: LlamaServer) -> str:
    return f"""
[[upstreams]]
name = "llama"
kind = "openai"
base_url = "{llama.url}"
max_concurrent = 1
[[upstreams.models]]
name = "smollm2"
upstream_model = "{llama.model}"
map = "{SMOLLM2_MAP_ID}"
chat_template = "{smollm2_gguf_path()}"
"""


def test_every_turn_on_another_instance_sends_the_engine_the_whole_conversation(
        redis_server: RedisServer, llama: LlamaServer, tmp_path: Path, closing) -> None:
    with start_instances(3, state_url=redis_server.url, tmp=tmp_path,
                         upstreams=_upstream(llama)) as gws:
        previous, history = None, []
        for i, text in enumerate(TURNS):
            client = closing(openai.OpenAI(base_url=gws[i % 3].url + "/v1", api_key="none",
                                           max_retries=0, timeout=300))
            extra = {"previous_response_id": previous} if previous else {}
            _evict(llama.url, llama.model)  # each answer from an unrelated cached prefix
            r = client.responses.create(model="smollm2", input=text, temperature=0,
                                        max_output_tokens=MAX_TOKENS, **extra)
            history.append({"role": "user", "content": text})
            _evict(llama.url, llama.model)
            direct = httpx.post(llama.url + "/chat/completions", timeout=300, json={
                "model": llama.model, "messages": history, "temperature": 0,
                "max_tokens": MAX_TOKENS}).json()
            assert r.usage is not None
            assert r.usage.input_tokens == direct["usage"]["prompt_tokens"], (i, r.usage)
            assert r.output_text == direct["choices"][0]["message"]["content"], i
            history.append({"role": "assistant", "content": r.output_text})
            previous = r.id
