"""Usage (README "Usage"): every figure an upstream reports reaches every API in that API's
shape; what it leaves out is counted with the model's map; nothing unknown becomes a 0.

Scripted upstreams (``upstreams/fakes*.py``) inject what real peers here cannot: cached
and reasoning counts, Anthropic cache figures, an upstream that reports nothing. The
interop claims against real peers are in ``upstreams/test_usage_real_peers.py``. The
prompt counter is checked against llama.cpp's own tokenizer on the same GGUF.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from tests.gateway.conftest import start_server
from tests.gateway.upstreams.fakes import Reply, chat_stream, sse, start_fake
from tests.gateway.upstreams.fakes_anthropic import MessagesStream, Script, anthropic_server
from tokenwire.codec.maps import TokenizerMap
from tokenwire.gateway.apis.usage_json import anthropic_usage, openai_usage, responses_usage
from tokenwire.gateway.http.state import GatewayState
from tokenwire.gateway.ir import (
    ChatMessage,
    ChatPrompt,
    Failure,
    FailureClass,
    Finish,
    FinishKind,
    GenerationRequest,
    IdsSource,
    PromptIds,
    PromptText,
    ReasoningDelta,
    TokenDelta,
    Usage,
    UsageSource,
)
from tokenwire.gateway.routing.router import Router, ServedModel
from tokenwire.gateway.settings import ServerSettings
from tokenwire.gateway.upstreams import usage_wire
from tokenwire.gateway.upstreams.anthropic_upstream import AnthropicUpstream
from tokenwire.gateway.upstreams.base import ModelRoute, UpstreamConfig
from tokenwire.gateway.upstreams.openai_compat import OpenAICompatUpstream
from tokenwire.gateway.usage import PromptCounter, PromptFormat, UsageMeter, load_prompt_format
from tokenwire.gguf_tokenizer import smollm2_gguf_path

USER = [{"role": "user", "content": "Name three fruits."}]
HELLO = ChatPrompt(messages=(ChatMessage(role="user", content="Name three fruits."),))


# -- reading what upstreams report -------------------------------------------------------------


def test_openai_usage_keeps_cached_and_reasoning_details() -> None:
    got = usage_wire.openai_usage({
        "prompt_tokens": 40, "completion_tokens": 9, "total_tokens": 49,
        "prompt_tokens_details": {"cached_tokens": 32},
        "completion_tokens_details": {"reasoning_tokens": 5}})
    assert got == Usage(prompt_tokens=40, completion_tokens=9, cached_tokens=32,
                        reasoning_tokens=5, source=UsageSource.UPSTREAM)


def test_figures_an_upstream_leaves_out_or_garbles_are_unknown_not_zero() -> None:
    got = usage_wire.openai_usage({"prompt_tokens": 7, "completion_tokens": "x",
                                   "prompt_tokens_details": None})
    assert got == Usage(prompt_tokens=7, completion_tokens=None)
    assert usage_wire.openai_usage({"total_tokens": 3}) is None  # not a usage object
    got = usage_wire.responses_usage({"input_tokens": 4, "output_tokens": 2})
    assert (got.cached_tokens, got.reasoning_tokens) == (None, None)


def test_anthropic_prompt_is_input_plus_both_cache_figures() -> None:
    got = usage_wire.anthropic_usage({"input_tokens": 10, "cache_read_input_tokens": 300,
                                      "cache_creation_input_tokens": 50, "output_tokens": 7})
    assert got == Usage(prompt_tokens=360, completion_tokens=7, cached_tokens=300,
                        cache_creation_tokens=50)


# -- rendering in each API's shape -----------------------------------------------------------

CACHED = Usage(prompt_tokens=360, completion_tokens=7, cached_tokens=300,
               cache_creation_tokens=50, reasoning_tokens=2, source=UsageSource.UPSTREAM)


def test_each_api_shape_carries_the_same_counts() -> None:
    assert openai_usage(CACHED) == {
        "prompt_tokens": 360, "completion_tokens": 7, "total_tokens": 367,
        "prompt_tokens_details": {"cached_tokens": 300},
        "completion_tokens_details": {"reasoning_tokens": 2}, "tokenwire_source": "upstream"}
    assert responses_usage(CACHED) == {
        "input_tokens": 360, "input_tokens_details": {"cached_tokens": 300},
        "output_tokens": 7, "output_tokens_details": {"reasoning_tokens": 2},
        "total_tokens": 367, "tokenwire_source": "upstream"}
    # Anthropic's input_tokens leaves both cache figures out; the sum is the prompt again.
    assert anthropic_usage(CACHED) == {
        "input_tokens": 10, "cache_creation_input_tokens": 50,
        "cache_read_input_tokens": 300, "output_tokens": 7, "tokenwire_source": "upstream"}


def test_unknown_counts_render_as_null() -> None:
    unknown = Usage(prompt_tokens=None, completion_tokens=4, source=UsageSource.GATEWAY)
    assert openai_usage(unknown)["prompt_tokens"] is None
    assert openai_usage(unknown)["total_tokens"] is None
    assert anthropic_usage(unknown)["input_tokens"] is None
    assert anthropic_usage(None)["output_tokens"] is None


# -- the meter (sans-IO) -----------------------------------------------------------------------


def _meter(smollm2_map: TokenizerMap, prompt=HELLO, fmt: PromptFormat | None = None):
    request = GenerationRequest(prompt=prompt, model="m")
    return UsageMeter(request, PromptCounter(smollm2_map, fmt))


def _run(meter: UsageMeter, events) -> list:
    return [*meter.start(), *(out for ev in events for out in meter.on_event(ev))]


def test_an_upstreams_complete_usage_passes_unchanged(smollm2_map: TokenizerMap) -> None:
    usage = Usage(prompt_tokens=3, completion_tokens=1, cached_tokens=2)
    out = _run(_meter(smollm2_map, PromptIds(ids=(1, 2, 3))),
               [TokenDelta(text="a"), usage, Finish(reason=FinishKind.EOS)])
    assert out == [Usage(prompt_tokens=3, completion_tokens=None, source=UsageSource.GATEWAY),
                   TokenDelta(text="a"), usage, Finish(reason=FinishKind.EOS)]


def test_nothing_reported_is_counted_from_ids_or_text(smollm2_map: TokenizerMap) -> None:
    text = "Bananas, apples and cherries."
    expected = PromptCounter(smollm2_map).completion(text)
    out = _run(_meter(smollm2_map, PromptText(text="Name three")),
               [TokenDelta(text=text), Finish(reason=FinishKind.EOS)])
    assert out[-2] == Usage(prompt_tokens=2, completion_tokens=expected, reasoning_tokens=0,
                            source=UsageSource.GATEWAY)
    out = _run(_meter(smollm2_map, PromptIds(ids=(5, 6))),
               [TokenDelta(ids=(7, 8, 9), text="xyz"), Finish(reason=FinishKind.LENGTH)])
    assert out[-2] == Usage(prompt_tokens=2, completion_tokens=3, reasoning_tokens=0,
                            source=UsageSource.GATEWAY)


def test_reasoning_text_counts_in_the_completion_and_its_detail(
        smollm2_map: TokenizerMap) -> None:
    enc = PromptCounter(smollm2_map).completion
    out = _run(_meter(smollm2_map, PromptIds(ids=(1,))),
               [ReasoningDelta(text="Let me think."), TokenDelta(text="Four."),
                Finish(reason=FinishKind.EOS)])
    assert out[-2].completion_tokens == enc("Let me think.") + enc("Four.")
    assert out[-2].reasoning_tokens == enc("Let me think.")


def test_a_partial_report_is_completed_and_marked_gateway(smollm2_map: TokenizerMap) -> None:
    out = _run(_meter(smollm2_map, PromptIds(ids=(1, 2))),
               [TokenDelta(ids=(4, 5)), Usage(prompt_tokens=2, completion_tokens=None,
                                             cached_tokens=1),
                Finish(reason=FinishKind.EOS)])
    assert out[-2] == Usage(prompt_tokens=2, completion_tokens=2, cached_tokens=1,
                            reasoning_tokens=0, source=UsageSource.GATEWAY)


def test_a_chat_without_a_template_has_an_unknown_prompt_count(
        smollm2_map: TokenizerMap) -> None:
    out = _run(_meter(smollm2_map), [TokenDelta(text="Hi"), Finish(reason=FinishKind.EOS)])
    assert out[0] == TokenDelta(text="Hi")  # no early count: there is none to give
    assert out[-2].prompt_tokens is None and out[-2].completion_tokens == 1


def test_a_failure_keeps_what_the_upstream_reported(smollm2_map: TokenizerMap) -> None:
    fail = Failure(failure_class=FailureClass.UPSTREAM, message="x", status=502)
    reported = Usage(prompt_tokens=9, completion_tokens=None)
    out = _run(_meter(smollm2_map, PromptIds(ids=(1,))), [reported, fail])
    early = Usage(prompt_tokens=1, completion_tokens=None, source=UsageSource.GATEWAY)
    assert out == [early, reported, reported, fail]


# -- the prompt counter against llama.cpp's own tokenizer ------------------------------------


@pytest.fixture(scope="module")
def llama_vocab():
    from llama_cpp import Llama
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    llm = Llama(model_path=str(smollm2_gguf_path()), vocab_only=True, verbose=False)
    template = llm.metadata["tokenizer.chat_template"]
    fmt = Jinja2ChatFormatter(template=template, eos_token="<|im_end|>",
                              bos_token="<|im_start|>")
    return llm, fmt


@pytest.fixture(scope="module")
def gguf_format() -> PromptFormat:
    return load_prompt_format(smollm2_gguf_path())


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": "Name three fruits."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <b>"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Ça va ? 🍌"}],
])
def test_chat_count_is_llama_cpps_tokenization_of_the_rendered_chat(
        smollm2_map: TokenizerMap, gguf_format: PromptFormat, llama_vocab, messages) -> None:
    llm, fmt = llama_vocab
    rendered = fmt(messages=messages).prompt
    expected = llm.tokenize(rendered.encode(), add_bos=False, special=True)
    prompt = ChatPrompt(messages=tuple(ChatMessage(**m) for m in messages))
    request = GenerationRequest(prompt=prompt, model="m")
    assert gguf_format.render(request) == rendered
    assert PromptCounter(smollm2_map, gguf_format).count(request) == len(expected)


def test_text_count_is_llama_cpps_with_its_bos_rule(smollm2_map: TokenizerMap,
                                                    gguf_format: PromptFormat,
                                                    llama_vocab) -> None:
    llm, _ = llama_vocab
    text = "The three most useful kitchen tools are"
    expected = llm.tokenize(text.encode(), add_bos=True, special=True)
    request = GenerationRequest(prompt=PromptText(text=text), model="m")
    assert PromptCounter(smollm2_map, gguf_format).count(request) == len(expected)


def test_prompt_format_from_a_tokenizer_config_json(tmp_path, gguf_format) -> None:
    path = tmp_path / "tokenizer_config.json"
    path.write_text(json.dumps({"chat_template": gguf_format.chat_template,
                                "bos_token": {"content": "<|im_start|>"},
                                "eos_token": "<|im_end|>", "add_bos_token": False}))
    fmt = load_prompt_format(path)
    assert (fmt.chat_template, fmt.bos_token, fmt.eos_token, fmt.add_bos) == (
        gguf_format.chat_template, "<|im_start|>", "<|im_end|>", False)


# -- through the gateway, with real SDK clients ----------------------------------------------


def _openai_usage_reply(usage: dict | None) -> Reply:
    body = chat_stream("vllm", ["Bananas", ", apples."], usage=None, done=False)
    tail = () if usage is None else sse({"id": "chatcmpl-1", "object": "chat.completion.chunk",
                                         "created": 1, "model": "m", "choices": [],
                                         "usage": usage})
    return Reply(chunks=body + tail + sse("[DONE]"))


@pytest.fixture
def openai_gateway(smollm2_map: TokenizerMap, gguf_format: PromptFormat):
    """A gateway over a scripted OpenAI-compatible upstream; ``reply`` is what it answers."""
    replies: list[Reply] = []
    fake = start_fake(lambda path, body: replies.pop(0), owned_by="me")
    cfg = UpstreamConfig(name="fake", kind="openai", base_url=fake.url + "/v1",
                         models=(ModelRoute(name="m", map_id=smollm2_map.id),))
    up = OpenAICompatUpstream.from_config(cfg, maps={smollm2_map.id: smollm2_map})
    served = ServedModel(name="m", upstream=up, tmap=smollm2_map,
                         ids_source=IdsSource.RETOKENIZED, upstream_name="fake",
                         usage=PromptCounter(smollm2_map, gguf_format))
    live = start_server(GatewayState(settings=ServerSettings(), router=Router([served])))
    yield live.url, replies
    live.stop()
    fake.stop()


REPORTED = {"prompt_tokens": 40, "completion_tokens": 9, "total_tokens": 49,
            "prompt_tokens_details": {"cached_tokens": 32},
            "completion_tokens_details": {"reasoning_tokens": 5}}


def test_cached_and_reasoning_counts_reach_chat_responses_and_messages(openai_gateway,
                                                                       closing):
    url, replies = openai_gateway
    replies += [_openai_usage_reply(REPORTED) for _ in range(4)]
    oc = closing(openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0))
    chat = oc.chat.completions.create(model="m", messages=USER)
    assert (chat.usage.prompt_tokens, chat.usage.completion_tokens) == (40, 9)
    assert chat.usage.prompt_tokens_details.cached_tokens == 32
    assert chat.usage.completion_tokens_details.reasoning_tokens == 5
    resp = oc.responses.create(model="m", input="Name three fruits.")
    assert (resp.usage.input_tokens, resp.usage.output_tokens, resp.usage.total_tokens) == (
        40, 9, 49)
    assert resp.usage.input_tokens_details.cached_tokens == 32
    assert resp.usage.output_tokens_details.reasoning_tokens == 5
    # An Anthropic client behind an OpenAI upstream: input_tokens excludes the cache read.
    ac = closing(anthropic.Anthropic(base_url=url, api_key="x", max_retries=0))
    msg = ac.messages.create(model="m", max_tokens=20, messages=USER)
    assert (msg.usage.input_tokens, msg.usage.cache_read_input_tokens,
            msg.usage.output_tokens) == (8, 32, 9)
    with ac.messages.stream(model="m", max_tokens=20, messages=USER) as stream:
        final = stream.get_final_message()
    assert (final.usage.input_tokens, final.usage.cache_read_input_tokens,
            final.usage.output_tokens) == (8, 32, 9)


def test_an_upstream_that_reports_nothing_is_counted_with_the_map(openai_gateway,
                                                                  smollm2_map, gguf_format,
                                                                  closing):
    url, replies = openai_gateway
    replies += [_openai_usage_reply(None) for _ in range(2)]
    counter = PromptCounter(smollm2_map, gguf_format)
    prompt = counter.count(GenerationRequest(prompt=HELLO, model="m"))
    completion = counter.completion("Bananas, apples.")
    r = httpx.post(url + "/v1/chat/completions", timeout=60,
                   json={"model": "m", "messages": USER})
    assert r.headers["tokenwire-usage-source"] == "gateway"
    usage = r.json()["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (prompt, completion)
    assert usage["prompt_tokens_details"] is None  # the upstream's cache is not ours to know
    assert usage["tokenwire_source"] == "gateway"
    oc = closing(openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0))
    chunks = list(oc.chat.completions.create(model="m", messages=USER, stream=True,
                                             stream_options={"include_usage": True}))
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (
        prompt, completion)


def test_upstream_reported_usage_is_named_upstream_in_the_header(openai_gateway):
    url, replies = openai_gateway
    replies.append(_openai_usage_reply(REPORTED))
    r = httpx.post(url + "/v1/chat/completions", timeout=60,
                   json={"model": "m", "messages": USER})
    assert r.headers["tokenwire-usage-source"] == "upstream"


@pytest.fixture
def anthropic_gateway() -> Iterator[tuple[str, object]]:
    srv = anthropic_server()
    cfg = UpstreamConfig(name="claude", kind="anthropic", base_url=srv.url,
                         models=(ModelRoute(name="sonnet", upstream_model="claude-test"),))
    up = AnthropicUpstream.from_config(cfg)
    served = ServedModel(name="sonnet", upstream=up, ids_source=IdsSource.NONE,
                         upstream_name="claude")
    live = start_server(GatewayState(settings=ServerSettings(), router=Router([served])))
    yield live.url, srv
    live.stop()
    srv.stop()


def _cached_messages_stream() -> Script:
    s = MessagesStream()
    s.events[0][1]["message"]["usage"] = {
        "input_tokens": 10, "output_tokens": 1, "cache_read_input_tokens": 300,
        "cache_creation_input_tokens": 50}
    return Script(s.text(["Hi"]).end("end_turn", 7).chunks())


def test_anthropic_cache_figures_reach_openai_and_anthropic_clients(anthropic_gateway,
                                                                    closing):
    url, srv = anthropic_gateway
    srv.push(*[_cached_messages_stream() for _ in range(3)])
    oc = closing(openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0))
    chat = oc.chat.completions.create(model="sonnet", messages=USER)
    assert (chat.usage.prompt_tokens, chat.usage.completion_tokens) == (360, 7)
    assert chat.usage.prompt_tokens_details.cached_tokens == 300
    ac = closing(anthropic.Anthropic(base_url=url, api_key="x", max_retries=0))
    msg = ac.messages.create(model="sonnet", max_tokens=20, messages=USER)
    assert (msg.usage.input_tokens, msg.usage.cache_read_input_tokens,
            msg.usage.cache_creation_input_tokens, msg.usage.output_tokens) == (10, 300, 50, 7)
    starts = []
    with ac.messages.stream(model="sonnet", max_tokens=20, messages=USER) as stream:
        for event in stream:
            if event.type == "message_start":
                starts.append(event.message.usage)
        final = stream.get_final_message()
    assert (starts[0].input_tokens, starts[0].cache_read_input_tokens) == (10, 300)
    assert (final.usage.input_tokens, final.usage.output_tokens) == (10, 7)


def test_a_failure_after_the_early_count_keeps_its_http_status(anthropic_gateway):
    """message_start's count is a fact, not output: an error event right after it is still
    answered with its own status, not a 200 stream."""
    url, srv = anthropic_gateway
    srv.push(Script(MessagesStream().error("overloaded_error", "Overloaded").chunks()),
             Script(MessagesStream().error("overloaded_error", "Overloaded").chunks()))
    r = httpx.post(url + "/v1/chat/completions", timeout=60,
                   json={"model": "sonnet", "messages": USER, "stream": True})
    assert r.status_code == 503, r.text


def test_count_tokens_counts_a_chat_with_the_models_template(openai_gateway, llama_vocab,
                                                             closing):
    """``messages.count_tokens`` for an upstream without a counting endpoint: the model's
    map and template, equal to llama.cpp's tokenization of the rendered chat."""
    url, _ = openai_gateway
    llm, fmt = llama_vocab
    expected = llm.tokenize(fmt(messages=USER).prompt.encode(), add_bos=False, special=True)
    ac = closing(anthropic.Anthropic(base_url=url, api_key="x", max_retries=0))
    assert ac.messages.count_tokens(model="m", messages=USER).input_tokens == len(expected)


def test_request_log_and_metrics_use_the_counts_the_client_got(openai_gateway):
    import logging

    from prometheus_client.parser import text_string_to_metric_families

    class Keep(logging.Handler):  # on the logger itself: `tokenwire serve` stops propagation
        def __init__(self) -> None:
            super().__init__(logging.INFO)
            self.events: list[dict] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.events.append(record.event)  # type: ignore[attr-defined]

    url, replies = openai_gateway
    replies.append(_openai_usage_reply(None))
    logger, keep = logging.getLogger("tokenwire.requests"), Keep()
    level = logger.level
    logger.addHandler(keep)
    logger.setLevel(logging.INFO)
    try:
        usage = httpx.post(url + "/v1/chat/completions", timeout=60,
                           json={"model": "m", "messages": USER}).json()["usage"]
        # The record is written when the request's slot is released, just after the body
        # went out: wait for it (a safety net, not a timing).
        deadline = time.monotonic() + 60
        while not keep.events:
            assert time.monotonic() < deadline, "no request log record"
            time.sleep(0.05)
    finally:
        logger.removeHandler(keep)
        logger.setLevel(level)
    events = keep.events
    [event] = events
    assert (event["usage_prompt_tokens"], event["usage_completion_tokens"],
            event["usage_source"]) == (usage["prompt_tokens"], usage["completion_tokens"],
                                       "gateway")
    metrics = httpx.get(url + "/metrics", timeout=10).text
    samples = {s.name: s.value for fam in text_string_to_metric_families(metrics)
               for s in fam.samples if s.labels.get("model") == "m"}
    assert samples["tokenwire_prompt_tokens_total"] == usage["prompt_tokens"]
    assert samples["tokenwire_completion_tokens_total"] == usage["completion_tokens"]


# -- the prompt counted after the request went out ---------------------------------------------


def test_the_request_goes_out_before_the_prompt_is_counted(smollm2_map: TokenizerMap) -> None:
    """Counting tokenizes the whole rendered prompt (milliseconds on a long context): the
    metered stream first has its upstream send the request (``start()``, then one loop turn
    for its task to write it), so the count overlaps the upstream's work instead of
    delaying the first token."""
    import asyncio

    from tokenwire.gateway.usage import MeteredStream

    order: list[str] = []

    class Upstream:
        def start(self) -> None:
            order.append("start")
            asyncio.get_running_loop().call_soon(order.append, "request written")

        async def next_event(self) -> Finish:
            order.append("next_event")
            return Finish(reason=FinishKind.EOS)

        def cancel(self) -> None:
            pass

    class Counting(PromptCounter):
        def count(self, request: GenerationRequest) -> int | None:
            order.append("count")
            return super().count(request)

    async def main(prompt) -> list:
        meter = UsageMeter(GenerationRequest(prompt=prompt, model="m"), Counting(smollm2_map))
        stream = MeteredStream(Upstream(), meter)
        return [await stream.next_event(), await stream.next_event()]

    first, second = asyncio.run(main(PromptText(text="a long prompt, counted by tokenizing")))
    assert order == ["start", "request written", "count", "next_event"]
    assert isinstance(first, Usage) and first.source is UsageSource.GATEWAY
    assert isinstance(second, Usage | Finish)
    # A count that tokenizes nothing (ids) takes no loop turn: the request starts as ever.
    order.clear()
    asyncio.run(main(PromptIds(ids=(1, 2, 3))))
    assert order == ["count", "next_event"]


@pytest.mark.parametrize("long", [False, True])
def test_a_long_prompt_is_counted_on_a_worker_thread(smollm2_map: TokenizerMap,
                                                     long: bool) -> None:
    """Counted on the event loop, a prompt near the 8 MiB body limit held every other
    client for seconds; past ``INLINE_COUNT_CHARS`` characters the meter counts it on a
    worker thread (a short one inline), and a heartbeat that cancels the wait for the
    count neither loses it nor starts another."""
    import asyncio
    import threading

    from tokenwire.codec.tokenizer import Tokenizer
    from tokenwire.gateway.context_window import INLINE_COUNT_CHARS
    from tokenwire.gateway.usage import MeteredStream

    threads: list[threading.Thread] = []
    release = threading.Event()

    class Upstream:
        async def next_event(self) -> Finish:
            return Finish(reason=FinishKind.EOS)

        def cancel(self) -> None:
            pass

    class Counting(PromptCounter):
        def count(self, request: GenerationRequest) -> int | None:
            threads.append(threading.current_thread())
            if threading.current_thread() is not threading.main_thread():
                release.wait(30)  # held until the loop showed it is free meanwhile
            return super().count(request)

    text = "word " * (INLINE_COUNT_CHARS // 5 + 1 if long else 100)

    async def main() -> list:
        meter = UsageMeter(GenerationRequest(prompt=PromptText(text=text), model="m"),
                           Counting(smollm2_map))
        stream = MeteredStream(Upstream(), meter)
        if long:  # the loop runs other work while the count is held: it is not on the loop
            with pytest.raises(TimeoutError):  # a heartbeat's cancel, then the wait again
                await asyncio.wait_for(stream.next_event(), 0.05)
            release.set()
        return [await stream.next_event(), await stream.next_event()]

    first, second = asyncio.run(main())
    assert len(threads) == 1 and (threads[0] is threading.main_thread()) is not long
    assert isinstance(first, Usage) and first.prompt_tokens == len(
        Tokenizer.from_map(smollm2_map).encode(text))
    assert isinstance(second, Usage | Finish)
