"""``gateway/context_window.py``: the certain prompt count, the refusal rule, the reported
windows, the order of precedence, and the refusal reaching every API before any attempt."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenwire.codec.maps import TokenizerMap
from tokenwire.gateway.context_window import (
    CHAT_BOUNDARY_SLACK,
    TEXT_SLACK,
    ContextSource,
    certain_prompt_tokens,
    context_length_from_listing,
    context_length_from_props,
    context_length_from_show,
    first_known,
    overflow_before_sending,
)
from tokenwire.gateway.ir import (
    ChatMessage,
    ChatPrompt,
    FailureClass,
    GenerationRequest,
    PromptIds,
    PromptText,
)
from tokenwire.gateway.retokenize import tokenizer_for
from tokenwire.gateway.routing.router import ServedModel


def _chat(*texts: str) -> ChatPrompt:
    return ChatPrompt(messages=tuple(ChatMessage(role="user", content=t) for t in texts))


# -- the certain count -------------------------------------------------------------------------


def test_ids_count_exactly_with_or_without_a_map(smollm2_map) -> None:
    assert certain_prompt_tokens(PromptIds(ids=(1, 2, 3)), None) == 3
    assert certain_prompt_tokens(PromptIds(ids=(1, 2, 3)), smollm2_map) == 3


def test_text_and_chat_have_no_certain_count_without_a_map() -> None:
    assert certain_prompt_tokens(PromptText(text="hello"), None) is None
    assert certain_prompt_tokens(_chat("hello"), None) is None


def test_text_counts_its_encoding(smollm2_map) -> None:
    text = "The three most useful kitchen tools are"
    assert certain_prompt_tokens(PromptText(text=text), smollm2_map) == len(
        tokenizer_for(smollm2_map).encode(text)) - TEXT_SLACK


def test_a_special_token_string_in_text_counts_as_one_token(smollm2_map) -> None:
    """llama.cpp parses specials in a completion prompt: ``<|im_end|>`` is one token there,
    six as text; the lower bound takes the smaller."""
    tok = tokenizer_for(smollm2_map)
    text = "a<|im_end|>b"
    assert len(tok.encode(text)) > 3
    assert certain_prompt_tokens(PromptText(text=text), smollm2_map) == 3 - TEXT_SLACK


def test_chat_counts_each_message_less_its_boundary_slack(smollm2_map) -> None:
    tok = tokenizer_for(smollm2_map)
    texts = ("word " * 50, "Hi", "")
    expected = sum(max(0, len(tok.encode(t)) - CHAT_BOUNDARY_SLACK) for t in texts if t)
    assert certain_prompt_tokens(_chat(*texts), smollm2_map) == expected


def _chatml(texts: tuple[str, ...]) -> str:
    """SmolLM2's chat template (ChatML), as llama.cpp renders it, with the generation
    prompt: what the upstream tokenizes, specials parsed."""
    turns = "".join(f"<|im_start|>user\n{t}<|im_end|>\n" for t in texts)
    return "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by " \
           f"Hugging Face<|im_end|>\n{turns}<|im_start|>assistant\n"


_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=80) | \
    st.lists(st.sampled_from(["word", " ", "\n", "<|im_end|>", "Hi", "'re", "  ", "é", "1"]),
             max_size=30).map("".join)


@settings(max_examples=200, deadline=None)
@given(st.lists(_TEXT, min_size=1, max_size=4))
def test_the_chat_bound_never_exceeds_the_templated_count(smollm2_map, texts) -> None:
    """The rule's promise, for SmolLM2's own template: whatever the messages, the bound is
    at most what the upstream counts, so a refusal never hits a prompt it would take."""
    tok = tokenizer_for(smollm2_map)
    rendered = len(tok.encode(_chatml(tuple(texts)), allowed_special="all"))
    bound = certain_prompt_tokens(_chat(*texts), smollm2_map)
    assert bound is not None and bound <= rendered


# -- the rule ----------------------------------------------------------------------------------


def test_a_prompt_that_leaves_room_for_one_token_is_sent() -> None:
    assert overflow_before_sending(511, 512) is None
    assert overflow_before_sending(None, 512) is None
    assert overflow_before_sending(9000, None) is None


def test_a_prompt_that_fills_the_window_is_refused_with_its_counts() -> None:
    failure = overflow_before_sending(512, 512, source="config")
    assert failure is not None
    assert failure.failure_class is FailureClass.CONTEXT_LENGTH and failure.status == 400
    assert failure.code == "context_length_exceeded"
    assert (failure.prompt_tokens, failure.context_tokens) == (512, 512)
    assert "512 tokens (config)" in failure.message


def test_max_tokens_counts_only_where_the_upstream_binds_it() -> None:
    assert overflow_before_sending(400, 512, max_tokens=200) is None  # llama.cpp shortens
    failure = overflow_before_sending(400, 512, max_tokens=200, max_tokens_binding=True)
    assert failure is not None and "max_tokens is 200" in failure.message
    assert overflow_before_sending(400, 512, max_tokens=112, max_tokens_binding=True) is None


# -- what upstreams report ----------------------------------------------------------------------


def test_vllm_listing_gives_max_model_len_and_llama_cpp_train_length_is_not_the_window() -> None:
    vllm = {"id": "Qwen/Qwen2.5-7B-Instruct", "object": "model", "owned_by": "vllm",
            "root": "Qwen/Qwen2.5-7B-Instruct", "max_model_len": 32768}
    assert context_length_from_listing(vllm) == 32768
    llama = {"id": "m.gguf", "owned_by": "llamacpp",
             "meta": {"n_ctx_train": 131072, "n_vocab": 49152}}
    assert context_length_from_listing(llama) is None
    assert context_length_from_listing({"id": "x", "max_model_len": -1}) is None
    assert context_length_from_listing({"id": "x", "max_model_len": True}) is None


def test_llama_server_props_give_the_slot_window() -> None:
    props = {"default_generation_settings": {"n_ctx": 65536, "params": {}},
             "total_slots": 4, "model_path": "m.gguf"}
    assert context_length_from_props(props) == 65536
    assert context_length_from_props({"detail": "Not Found"}) is None


def test_ollama_show_gives_the_architectures_context_length() -> None:
    show = {"parameters": "stop \"<|im_end|>\"", "model_info": {
        "general.architecture": "qwen2", "qwen2.context_length": 32768,
        "qwen2.embedding_length": 3584}}
    assert context_length_from_show(show) == 32768
    assert context_length_from_show({"model_info": {"general.architecture": "x"}}) is None


def test_configuration_wins_then_the_upstream_then_the_engine() -> None:
    assert first_known((None, ContextSource.CONFIG), (8192, ContextSource.UPSTREAM),
                       (4096, ContextSource.ENGINE)) == (8192, ContextSource.UPSTREAM)
    assert first_known((2048, ContextSource.CONFIG), (8192, ContextSource.UPSTREAM)) == (
        2048, ContextSource.CONFIG)
    assert first_known((None, ContextSource.CONFIG)) == (None, None)


# -- before any attempt -------------------------------------------------------------------------


class _Counting:
    """An upstream that counts submissions (it must never see a refused request)."""

    model_id = "m"

    def __init__(self) -> None:
        self.submitted = 0

    def submit(self, request: GenerationRequest) -> Any:
        self.submitted += 1
        raise AssertionError("a refused request reached the upstream")


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_certain_overflow_is_a_400_without_an_attempt(smollm2_map: TokenizerMap,
                                                         path: str) -> None:
    import httpx

    from tokenwire.gateway.http.app import create_app
    from tokenwire.gateway.http.state import GatewayState
    from tokenwire.gateway.routing.router import Router
    from tokenwire.gateway.settings import ServerSettings

    up = _Counting()
    served = ServedModel(name="m", upstream=up, tmap=smollm2_map, max_model_len=64,
                         context_source="config", upstream_name="up")
    state = GatewayState(settings=ServerSettings(), router=Router([served]))
    body: dict[str, Any] = {"model": "m", "max_tokens": 4, "stream": True}
    body.update({"messages": [{"role": "user", "content": "word " * 100}]}
                if "chat" in path else {"prompt": "word " * 100})

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=create_app(state))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            return await c.post(path, json=body)

    resp = asyncio.run(go())
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["code"] == "context_length_exceeded"
    assert "context window of 64 tokens (config)" in err["message"]
    assert up.submitted == 0


def test_preflight_reads_the_served_models_window(smollm2_map) -> None:
    served = ServedModel(name="m", upstream=_Counting(), tmap=smollm2_map, max_model_len=8)
    assert served.preflight(GenerationRequest(prompt=PromptIds(ids=(1,) * 7))) is None
    refusal = served.preflight(GenerationRequest(prompt=PromptIds(ids=(1,) * 8)))
    assert refusal is not None and refusal.context_tokens == 8
    unknown = ServedModel(name="m", upstream=_Counting(), tmap=smollm2_map)
    assert unknown.preflight(GenerationRequest(prompt=PromptIds(ids=(1,) * 99))) is None


def test_an_upstream_that_counts_exactly_itself_is_not_counted_again(smollm2_map) -> None:
    """The embedded engine and Codec engines refuse an overflow at once, exactly."""
    from tokenwire.gateway.upstreams.codec_native import CodecNativeUpstream
    from tokenwire.gateway.upstreams.embedded import EmbeddedEngine

    assert EmbeddedEngine.checks_context_itself and CodecNativeUpstream.checks_context_itself
    up = _Counting()
    up.checks_context_itself = True  # type: ignore[attr-defined]
    served = ServedModel(name="m", upstream=up, tmap=smollm2_map, max_model_len=8)
    assert served.preflight(GenerationRequest(prompt=PromptIds(ids=(1,) * 99))) is None


# -- configuration and the order of precedence, through build_gateway ---------------------------


def _vllm(max_model_len: int) -> Any:
    import httpx

    return httpx.MockTransport(lambda r: httpx.Response(200, json={"object": "list", "data": [
        {"id": "u", "object": "model", "owned_by": "vllm", "max_model_len": max_model_len}]}))


@pytest.mark.parametrize(("model_len", "upstream_len", "expected"), [
    (None, None, (32768, "upstream")),  # the upstream's report
    (None, 8192, (8192, "config")),  # the upstream's configured length
    (2048, 8192, (2048, "config")),  # the model's own wins
])
def test_the_window_comes_from_config_then_the_upstream(model_len, upstream_len,
                                                        expected) -> None:
    from tokenwire.gateway.config import parse_config
    from tokenwire.gateway.server import build_gateway
    from tokenwire.gateway.settings import ServerSettings

    model: dict[str, Any] = {"name": "m", "upstream_model": "u"}
    if model_len is not None:
        model["context_length"] = model_len
    up: dict[str, Any] = {"name": "v", "kind": "openai", "base_url": "http://v/v1",
                          "models": [model]}
    if upstream_len is not None:
        up["context_length"] = upstream_len
    cfg = parse_config({"upstreams": [up]}, env={})

    async def go() -> tuple[int | None, str]:
        gw = await build_gateway(cfg, ServerSettings(), transports={"v": _vllm(32768)})
        try:
            served = gw.state.router.route("m")
            return served.max_model_len, served.context_source
        finally:
            await gw.aclose()

    assert asyncio.run(go()) == expected


@pytest.mark.parametrize(("where", "value", "problem"), [
    ("model", 0, "context_length must be a number of tokens from 1 to 16777215, got 0"),
    ("upstream", -5, "context_length must be a number of tokens from 1 to 16777215"),
    ("model", "4k", "context_length must be an integer"),
    ("model", True, "context_length must be an integer"),
])
def test_a_bad_context_length_is_a_config_error(where, value, problem) -> None:
    from tokenwire.errors import ConfigError
    from tokenwire.gateway.config import parse_config

    model: dict[str, Any] = {"name": "m"}
    up: dict[str, Any] = {"name": "v", "kind": "openai", "base_url": "http://v/v1",
                          "models": [model]}
    (model if where == "model" else up)["context_length"] = value
    with pytest.raises(ConfigError, match=problem):
        parse_config({"upstreams": [up]}, env={})


def test_the_flag_sets_the_upstreams_context_length() -> None:
    from tokenwire.gateway.config import resolve

    cfg = resolve(upstream_urls=["http://h/v1"], context_length=16384, env={})
    assert cfg is not None and cfg.upstreams[0].context_length == 16384


@pytest.mark.parametrize(("words", "on_loop"), [(100, True), (20_000, False)])
def test_a_long_prompt_is_counted_off_the_event_loop(smollm2_map: TokenizerMap, words: int,
                                                     on_loop: bool) -> None:
    """An 8 MB prompt took seconds to encode for the preflight, on the loop every other
    client waits on; past ``INLINE_COUNT_CHARS`` it is counted on a worker thread (a
    short one stays inline: a thread's round trip would cost every first token)."""
    import threading

    import httpx

    from tokenwire.gateway.context_window import INLINE_COUNT_CHARS
    from tokenwire.gateway.http.app import create_app
    from tokenwire.gateway.http.state import GatewayState
    from tokenwire.gateway.routing.router import Router
    from tokenwire.gateway.settings import ServerSettings

    assert (len("word " * words) > INLINE_COUNT_CHARS) is not on_loop
    threads: list[threading.Thread] = []

    class Recorded(ServedModel):
        def preflight(self, request: GenerationRequest) -> Any:
            threads.append(threading.current_thread())
            return super().preflight(request)

    served = Recorded(name="m", upstream=_Counting(), tmap=smollm2_map, max_model_len=64,
                      context_source="config", upstream_name="up")
    state = GatewayState(settings=ServerSettings(), router=Router([served]))

    async def go() -> tuple[httpx.Response, threading.Thread]:
        transport = httpx.ASGITransport(app=create_app(state))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            return await c.post("/v1/chat/completions", json={
                "model": "m", "max_tokens": 4,
                "messages": [{"role": "user", "content": "word " * words}]}), \
                threading.current_thread()

    resp, loop_thread = asyncio.run(go())
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "context_length_exceeded"
    assert (threads == [loop_thread]) is on_loop and len(threads) == 1
