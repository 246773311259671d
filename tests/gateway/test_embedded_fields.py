"""Request fields reach llama.cpp in the embedded engine, shown by what they change.

Each sampling field is checked by its effect on the real engine (SmolLM2-135M), never by a
recorded value alone: a penalty changes a greedy continuation, ``top_k: 1`` / ``min_p: 1``
make a hot sample greedy whatever the seed. Logprobs are compared with llama-cpp-python's
own ``create_completion(logprobs=...)`` on a second model instance (``logits_all``), and
rendered in each API's shape through the ``openai`` SDK.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from types import SimpleNamespace

import pytest

from tokenwire.gateway.ir import GenerationRequest, PromptIds, PromptText, TokenDelta, is_terminal

STORY = "Once upon a time"
REPEATS = "one one one one one one one one"


def generate(engine, prompt, **kw) -> tuple[list[int], str, list]:
    async def go():
        stream = engine.submit(GenerationRequest(prompt=prompt, **kw))
        ids, text, lps = [], "", []
        while not is_terminal(event := await stream.next_event()):
            if isinstance(event, TokenDelta):
                ids += event.ids
                text += event.text
                lps += event.logprobs
        return ids, text, lps
    return asyncio.run(go())


def _repeats(ids: list[int]) -> int:
    return sum(n - 1 for n in Counter(ids).values())


@pytest.mark.parametrize(("prompt", "field", "value"), [
    (REPEATS, "frequency_penalty", 2.0),
    (STORY, "presence_penalty", 2.0),
    (REPEATS, "repeat_penalty", 1.5),
])
def test_penalties_change_a_greedy_repetition(engine, prompt, field, value) -> None:
    greedy, _, _ = generate(engine, PromptText(text=prompt), max_tokens=40, temperature=0.0)
    penalised, _, _ = generate(engine, PromptText(text=prompt), max_tokens=40,
                               temperature=0.0, **{field: value})
    assert penalised != greedy
    assert _repeats(penalised) <= _repeats(greedy)


@pytest.mark.parametrize(("field", "value"), [("top_k", 1), ("min_p", 1.0)])
def test_top_k_and_min_p_narrow_a_hot_sample_to_the_greedy_token(engine, field, value) -> None:
    greedy, _, _ = generate(engine, PromptText(text=STORY), max_tokens=24, temperature=0.0)
    hot = [generate(engine, PromptText(text=STORY), max_tokens=24, temperature=1.5,
                    seed=seed)[0] for seed in (1, 2)]
    assert hot[0] != hot[1]  # without the field, the seeds pick different tokens
    for seed in (1, 2):
        narrowed, _, _ = generate(engine, PromptText(text=STORY), max_tokens=24,
                                  temperature=1.5, seed=seed, **{field: value})
        assert narrowed == greedy


@pytest.fixture(scope="module")
def reference_llm():
    """llama-cpp-python's own logprobs need ``logits_all``: a second, small instance."""
    from llama_cpp import Llama

    from tokenwire.gguf_tokenizer import smollm2_gguf_path

    llm = Llama(model_path=str(smollm2_gguf_path()), n_ctx=256, n_threads=1,
                logits_all=True, verbose=False)
    yield llm
    llm.close()


def test_logprobs_equal_llama_cpp_pythons_own(engine, reference_llm) -> None:
    prompt = reference_llm.tokenize(STORY.encode(), add_bos=False)
    ids, _, lps = generate(engine, PromptIds(ids=tuple(prompt)), max_tokens=6,
                           temperature=0.0, logprobs=True, top_logprobs=3)
    ref = reference_llm.create_completion(prompt, max_tokens=6, temperature=0.0,
                                          logprobs=3)["choices"][0]["logprobs"]
    assert len(lps) == len(ids) == len(ref["token_logprobs"])
    for ours, token, value, top in zip(lps, ref["tokens"], ref["token_logprobs"],
                                       ref["top_logprobs"], strict=True):
        assert ours.token == token
        assert ours.logprob == pytest.approx(value, abs=1e-3)
        assert [t.token for t in ours.top] == list(top)  # most likely first
        assert [t.logprob for t in ours.top] == pytest.approx(list(top.values()), abs=1e-3)
        assert ours.logprob == ours.top[0].logprob  # greedy: the chosen token is the top one


def test_logprobs_through_the_sdk_in_each_api_shape(engine, serve, closing) -> None:
    import openai

    served = serve(engine)
    client = closing(openai.OpenAI(base_url=f"{served.url}/v1", api_key="x"))
    chat = client.chat.completions.create(
        model=engine.model_id, messages=[{"role": "user", "content": "Say hi"}],
        max_tokens=8, temperature=0, logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert content and all(len(c.top_logprobs) == 2 and c.logprob <= 0 for c in content)
    assert b"".join(bytes(c.bytes) for c in content).decode() == chat.choices[0].message.content

    streamed_chat = [c for chunk in client.chat.completions.create(
        model=engine.model_id, messages=[{"role": "user", "content": "Say hi"}], max_tokens=8,
        temperature=0, logprobs=True, top_logprobs=2, stream=True)
        for choice in chunk.choices if choice.logprobs is not None
        for c in choice.logprobs.content]
    assert [(c.token, c.logprob) for c in streamed_chat] == [(c.token, c.logprob)
                                                              for c in content]

    pieces, streamed = [], ""
    for chunk in client.completions.create(model=engine.model_id, prompt=STORY, max_tokens=8,
                                           temperature=0, logprobs=2, stream=True):
        choice = chunk.choices[0]
        streamed += choice.text
        if choice.logprobs is not None:
            pieces.append(choice.logprobs)
    tokens = [t for p in pieces for t in p.tokens]
    offsets = [o for p in pieces for o in p.text_offset]
    assert "".join(tokens) == streamed and len(tokens) == 8
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    assert all(len(top) == 2 for p in pieces for top in p.top_logprobs)

    resp = client.responses.create(model=engine.model_id, input="Say hi", max_output_tokens=8,
                                   temperature=0, top_logprobs=2,
                                   include=["message.output_text.logprobs"])
    part = resp.output[0].content[0]
    assert part.logprobs and "".join(lp.token for lp in part.logprobs) == part.text
    assert all(len(lp.top_logprobs) == 2 for lp in part.logprobs)


@pytest.mark.parametrize("kind", ["text", "chat"])
def test_a_prompt_too_long_to_fit_is_refused_before_it_is_tokenized(engine, kind,
                                                                    monkeypatch) -> None:
    """More characters than the window's tokens can cover: a 400 at once (an 8 MB prompt
    was tokenized first, holding the only engine ~19 s)."""
    from tokenwire.gateway.ir import ChatMessage, ChatPrompt, Failure

    text = " " * (engine.n_ctx * engine._longest_piece)
    prompt = PromptText(text=text) if kind == "text" else ChatPrompt(
        messages=(ChatMessage(role="user", content=text),))

    def tokenize(piece: str, **kw) -> list[int]:
        assert len(piece) < 1000, "the long text was tokenized"
        return real(piece, **kw)

    real = engine._tokenize_text
    monkeypatch.setattr(engine, "_tokenize_text", tokenize)

    async def go():
        return await engine.submit(GenerationRequest(prompt=prompt, max_tokens=1)).next_event()
    failure = asyncio.run(go())
    assert isinstance(failure, Failure) and failure.code == "context_length_exceeded"
    assert failure.context_tokens == engine.n_ctx and failure.prompt_tokens >= engine.n_ctx
    assert "at least" in failure.message
    ids, _, _ = generate(engine, PromptText(text=STORY), max_tokens=2)  # the engine goes on
    assert len(ids) == 2


@pytest.mark.parametrize("kind", ["text", "chat"])
def test_a_prompt_too_long_to_fit_is_still_counted_whole(engine, kind) -> None:
    """count_tokens and /tokenize count what the engine would evaluate, however long: the
    early refusal above is for generations only (it made them count 0 tokens)."""
    from tokenwire.gateway.ir import ChatMessage

    text = " word" * (engine.n_ctx * engine._longest_piece // 5 + 1)
    if kind == "text":
        ids = engine.prompt_ids(PromptText(text=text))
        assert ids == engine._tokenize_text(text, add_bos=engine._add_bos)
    else:
        ids = asyncio.run(engine.chat_prompt_ids((ChatMessage(role="user", content=text),)))
    assert len(ids) >= len(text) // 5 > engine.n_ctx  # every word (one token each) counted


def test_a_stop_strings_tokens_send_no_logprobs(engine) -> None:
    """The text stops before the stop string, and so do the logprobs: the tokens that
    begin inside it were sent (Chat's ``logprobs.content`` spelled out the stop string the
    text had hidden, Completions' ``text_offset`` pointed past the text's end)."""
    _, text, lps = generate(engine, PromptText(text=STORY), max_tokens=8, temperature=0.0,
                            logprobs=True)
    tokens = [lp.token for lp in lps]
    assert "".join(tokens) == text and len(tokens) == 8
    stop = tokens[3] + tokens[4][:1]  # across a token boundary, held back one token
    _, stopped, lps = generate(engine, PromptText(text=STORY), max_tokens=8,
                               temperature=0.0, logprobs=True, stop=(stop,))
    assert stopped == "".join(tokens[:3])
    assert [lp.token for lp in lps] == tokens[:3]


def test_text_held_for_a_stop_string_comes_before_the_decoders_last_text(engine,
                                                                        monkeypatch) -> None:
    """At the end the decoder's last text (bytes of an unfinished character) goes through
    the stop matcher before the matcher lets go of what it held: the answer keeps its
    order (a stop that the answer's last character could begin held that character)."""
    _, text, _ = generate(engine, PromptText(text=STORY), max_tokens=6, temperature=0.0)
    real = engine._detok

    class EndsUnfinished:  # a decoder whose last text is an unfinished character
        def __init__(self) -> None:
            self.decoder = real.stream()
            self.feed = self.decoder.feed

        def flush(self) -> str:
            return self.decoder.flush() + "\ufffd"

    monkeypatch.setattr(engine, "_detok", SimpleNamespace(stream=EndsUnfinished))
    _, held, _ = generate(engine, PromptText(text=STORY), max_tokens=6, temperature=0.0,
                          stop=(text[-1] + "\x00",))
    assert held == text + "\ufffd"
