"""End to end: the real embedded engine (SmolLM2 through llama.cpp) behind a loopback server.

Peers are real: the ``codecai`` reference client decodes our binary streams, the ``openai``
SDK reads our JSON streams, stock ``zlib`` / ``brotli`` / ``zstandard`` decode our bodies.
Generation is greedy (temperature 0, fixed seed) so the same request gives the same ids in
every format, and the engine's own record (ids and per-token times, keyed by the response's
``X-Request-Id``) is the ground truth the client side is compared with.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
import zlib

import brotli
import httpx
import openai
import pytest
import zstandard

from tokenwire.codec import frames_delta, frames_msgpack, frames_protobuf
from tokenwire.codec.compression import ZstdDict, train_dictionary
from tokenwire.codec.detokenizer import Detokenizer
from tokenwire.codec.frames import StreamFormat
from tokenwire.codec.requests import CodecRequest, encode_request
from tokenwire.codec.safety_policy import hash_policy
from tokenwire.codec.versioning import VersionPolicy
from tokenwire.gateway.apis.codec_stream import CodecStreamRenderer
from tokenwire.gateway.apis.completions import CompletionsRenderer
from tokenwire.gateway.ir import Finish, FinishKind, TokenDelta

from .paced_engine import GATE_TIMEOUT_S, Gate, PacedLlama

codecai = pytest.importorskip("codecai")

pytestmark = pytest.mark.slow

PROMPT = "The three most useful kitchen tools are"
GREEDY = {"temperature": 0, "seed": 7}
FORMATS = ["json", "msgpack", "protobuf", "msgpack-delta"]
ENCODINGS = ["identity", "gzip", "br", "zstd"]
DECODERS = {"msgpack": frames_msgpack.FrameDecoder, "protobuf": frames_protobuf.FrameDecoder,
            "msgpack-delta": frames_delta.FrameDecoder}


def _synthetic_stream(fmt: str, rng: random.Random) -> bytes:
    ids = [rng.choice([rng.randint(0, 400), rng.randint(0, 49151)])
           for _ in range(rng.randint(20, 200))]
    if fmt == "json":
        r = CompletionsRenderer(completion_id="cmpl-0", model="m", created=0, stream=True)
        events = [TokenDelta(ids=(i,), text=f" w{i}") for i in ids]
    else:
        r = CodecStreamRenderer(StreamFormat(fmt))
        events = [TokenDelta(ids=(i,)) for i in ids]
    out = [c for ev in events for c in r.on_event(ev)]
    return b"".join(out + r.on_event(Finish(reason=FinishKind.EOS)))


@pytest.fixture(scope="module")
def dicts() -> dict[str, ZstdDict]:
    """Small dictionaries trained on synthetic streams of each format (the real ones come
    from ``tokenwire dict train`` over recorded streams)."""
    rng = random.Random(3)
    return {fmt: ZstdDict.from_bytes(train_dictionary(
        [_synthetic_stream(fmt, rng) for _ in range(200)], size=4096)) for fmt in FORMATS}


@pytest.fixture(scope="module")
def live(engine, serve, dicts):
    return serve(engine, zstd_dicts=dicts, window_s=0.05)


@pytest.fixture(scope="module")
def reference(live):
    """Greedy answer to PROMPT as the JSON API reports it: ids and text."""
    resp = httpx.post(live.url + "/v1/completions", timeout=120, json={
        "prompt": PROMPT, "max_tokens": 24, "return_token_ids": True, **GREEDY})
    choice = resp.json()["choices"][0]
    assert choice["token_ids"], choice
    return choice["token_ids"], choice["text"]


#: Tokens the paced engine generates freely (they share coalescing windows), and bursts per
#: answer: each burst after the first waits until the client decoded the one before.
BURST = 8
BURSTS = 6
#: The paced server's coalescing window.
WINDOW = 0.1


@pytest.fixture(scope="module")
def paced(engine, serve, dicts):
    """A second engine over the same GGUF whose tokens pass a :class:`Gate`, served with a
    short coalescing window (its own ``Llama``: the session engine's stays untouched)."""
    from llama_cpp import Llama

    from tokenwire.gateway.upstreams.embedded import EmbeddedEngine
    from tokenwire.gguf_tokenizer import smollm2_gguf_path

    gate = Gate()
    llm = Llama(model_path=str(smollm2_gguf_path()), n_ctx=1024, n_threads=1, verbose=False)
    paced_engine = EmbeddedEngine(PacedLlama(llm, gate), engine.tmap,
                                  model_id=engine.model_id, queue_size=4)
    paced_engine.start()
    gate.engine = paced_engine
    yield serve(paced_engine, zstd_dicts=dicts, window_s=WINDOW), gate
    gate.release()
    paced_engine.close()


def _until(cond, limit_s: float = 60.0) -> None:
    """Poll ``cond`` (a safety limit, not a timing claim)."""
    deadline = time.monotonic() + limit_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def _stock(encoding: str, zdict: ZstdDict | None):
    if encoding == "gzip":
        return zlib.decompressobj(wbits=31).decompress
    if encoding == "br":
        return brotli.Decompressor().process
    if encoding == "zstd":
        zd = zstandard.ZstdCompressionDict(zdict.raw)
        return zstandard.ZstdDecompressor(dict_data=zd).decompressobj().decompress
    return lambda b: b


def _sse_text(body: bytes) -> tuple[str, list[int]]:
    text, ids = [], []
    for block in body.decode().split("\n\n"):
        if block.startswith("data: {"):
            choice = json.loads(block[6:])["choices"]
            if choice:
                text.append(choice[0]["text"])
                ids += choice[0].get("token_ids", [])
    return "".join(text), ids


# -- interop with the reference client and the openai SDK -------------------------------------


@pytest.mark.parametrize("fmt", ["msgpack", "protobuf"])
def test_codecai_decodes_our_streams_to_the_ids_we_generated(live, engine, reference, fmt):
    ids, _ = reference
    decode = {"msgpack": codecai.decode_msgpack_stream,
              "protobuf": codecai.decode_protobuf_stream}[fmt]

    async def run() -> tuple[list, str]:
        async with httpx.AsyncClient(timeout=120) as client, client.stream(
            "POST", live.url + "/v1/completions", headers={"Accept-Encoding": "identity"},
            json={"prompt": PROMPT, "max_tokens": 24, "stream_format": fmt, **GREEDY},
        ) as resp:
            assert resp.headers["content-type"] == StreamFormat(fmt).content_type
            return [f async for f in decode(resp.aiter_raw())], resp.headers["x-request-id"]

    frames, rid = asyncio.run(run())
    got = [i for f in frames for i in f.ids]
    assert got == ids
    assert list(engine.wait_for_record(rid).ids) == ids
    assert frames[-1].done and frames[-1].finish_reason in ("length", "eos_token")


def test_openai_sdk_streams_completions_unchanged(live, reference, closing):
    ids, text = reference
    client = closing(openai.OpenAI(base_url=live.url + "/v1", api_key="unused",
                                   max_retries=0))
    model = client.models.list().data[0].id
    chunks = list(client.completions.create(model=model, prompt=PROMPT, max_tokens=24,
                                            stream=True, **GREEDY))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")
    whole = client.completions.create(model=model, prompt=PROMPT, max_tokens=24, **GREEDY)
    assert whole.choices[0].text == text and whole.usage.completion_tokens == len(ids)


def test_openai_sdk_streams_chat_unchanged(live, smollm2_map, closing):
    client = closing(openai.OpenAI(base_url=live.url + "/v1", api_key="unused",
                                   max_retries=0))
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": "Name a fruit."}]
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=16,
                                            stream=True, **GREEDY)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")
    whole = client.chat.completions.create(model=model, messages=messages, max_tokens=16,
                                           **GREEDY)
    assert whole.choices[0].message.content == text and text
    # The same chat as Codec frames: the ids detokenize to the same answer.
    resp = httpx.post(live.url + "/v1/chat/completions", timeout=120, json={
        "messages": messages, "max_tokens": 16, "stream_format": "msgpack", **GREEDY})
    dec = frames_msgpack.FrameDecoder()
    ids = [i for f in dec.feed(resp.content) for i in f.ids]
    assert Detokenizer(smollm2_map).decode(ids) == text


# -- every stream_format x encoding, decoded by stock decoders --------------------------------


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_and_encoding_decodes_with_stock_decoders(
    live, dicts, reference, fmt, encoding
):
    ids, text = reference
    body = {"prompt": PROMPT, "max_tokens": 24, "stream": True, "return_token_ids": True,
            **GREEDY}
    if fmt != "json":
        body["stream_format"] = fmt
    with httpx.stream("POST", live.url + "/v1/completions", json=body, timeout=120,
                      headers={"Accept-Encoding": encoding, "Codec-Client-Version": "0.5"}
                      ) as resp:
        assert resp.status_code == 200
        assert resp.headers.get("content-encoding", "identity") == encoding
        zdict = dicts[fmt] if encoding == "zstd" else None
        assert resp.headers.get("codec-zstd-dict") == (zdict.hash if zdict else None)
        assert "Codec-Client-Version" in resp.headers["vary"]
        decompress = _stock(encoding, zdict)
        plain = b"".join(decompress(chunk) for chunk in resp.iter_raw())
    if fmt == "json":
        assert _sse_text(plain) == (text, ids)
        return
    dec = DECODERS[fmt]()
    frames = dec.feed(plain)
    dec.feed_eof()
    assert [i for f in frames for i in f.ids] == ids


@pytest.mark.parametrize("fmt", FORMATS)
def test_generic_clients_offering_zstd_never_get_dictionary_zstd(live, fmt):
    """httpx (like browsers) sends "gzip, deflate, br, zstd" without knowing our dictionary.
    (OpenAI's own SSE, ``json``, goes to such a client uncompressed: http/generation.py.)"""
    body = {"prompt": PROMPT, "max_tokens": 2, "stream": True, **GREEDY}
    if fmt != "json":
        body["stream_format"] = fmt
    resp = httpx.post(live.url + "/v1/completions", json=body, timeout=120)
    assert resp.status_code == 200
    assert resp.headers.get("content-encoding", "identity") in (
        ("identity",) if fmt == "json" else ("gzip", "br"))
    assert "codec-zstd-dict" not in resp.headers


def test_path_c_protobuf_request_gives_the_same_ids(live, reference):
    ids, _ = reference
    tokens = httpx.post(live.url + "/tokenize", json={"prompt": PROMPT}).json()["tokens"]
    body = encode_request(CodecRequest(prompt_ids=tuple(tokens), max_tokens=24, temperature=0.0,
                                       stream_format="protobuf"), "protobuf")
    resp = httpx.post(live.url + "/v1/completions/codec", content=body, timeout=120,
                      headers={"content-type": "application/x-protobuf"})
    dec = frames_protobuf.FrameDecoder()
    assert [i for f in dec.feed(resp.content) for i in f.ids] == ids


def test_tokenize_matches_the_engine_and_detokenize_inverts_it(live):
    tok = httpx.post(live.url + "/tokenize", json={"prompt": PROMPT}).json()
    assert tok["count"] == len(tok["tokens"]) and tok["max_model_len"] == 1024
    usage = httpx.post(live.url + "/v1/completions", timeout=120, json={
        "prompt": PROMPT, "max_tokens": 1, **GREEDY}).json()["usage"]
    assert usage["prompt_tokens"] == tok["count"]
    back = httpx.post(live.url + "/detokenize", json={"tokens": tok["tokens"]}).json()
    assert back == {"prompt": PROMPT}


# -- stop sequences and the safety policy -----------------------------------------------------


def test_stop_sequence_ends_text_before_it(live, reference):
    _, text = reference
    cut = next(i for i in range(4, len(text)) if text[i] == " ")
    stop = text[cut:cut + 3]
    pos = text.find(stop)
    doc = httpx.post(live.url + "/v1/completions", timeout=120, json={
        "prompt": PROMPT, "max_tokens": 24, "stop": [stop], **GREEDY}).json()
    assert doc["choices"][0]["text"] == text[:pos]
    assert doc["choices"][0]["finish_reason"] == "stop"
    resp = httpx.post(live.url + "/v1/completions", timeout=120, json={
        "prompt": PROMPT, "max_tokens": 24, "stop": [stop], "stream_format": "msgpack",
        **GREEDY})
    frames = frames_msgpack.FrameDecoder().feed(resp.content)
    assert frames[-1].finish_reason == "stop_sequence"


def test_banned_token_stops_generation_with_policy_violation(engine, serve, reference):
    ids, _ = reference
    k = next(i for i in range(2, len(ids)) if ids[i] not in ids[:i])
    served = serve(engine, version_policy=VersionPolicy(safety_policy_id="tw-test"),
                   banned_ids=frozenset({ids[k]}))
    body = {"prompt": PROMPT, "max_tokens": 24, "stream_format": "msgpack", **GREEDY}
    resp = httpx.post(served.url + "/v1/completions", json=body, timeout=120,
                      headers={"Codec-Client-Version": "0.4"})
    frames = frames_msgpack.FrameDecoder().feed(resp.content)
    assert [i for f in frames for i in f.ids] == ids[:k]
    assert frames[-1].done and frames[-1].finish_reason == "policy_violation"
    assert resp.headers["codec-safety-policy"] == "tw-test"
    assert resp.headers["codec-safety-policy-hash"] == hash_policy(served.state.descriptor)
    old = httpx.post(served.url + "/v1/completions", json=body, timeout=120,
                     headers={"Codec-Client-Version": "0.3"})
    assert frames_msgpack.FrameDecoder().feed(old.content)[-1].finish_reason == "error"
    assert "codec-safety-policy" not in old.headers


# -- cancellation and the streaming promise ---------------------------------------------------


def test_disconnect_stops_generation_and_the_next_queued_request_starts(paced):
    """A's generation is held after its first burst while the test disconnects it, so A
    cannot finish first however fast the machine is; B is queued behind A (the admission
    queue says so) before A's client leaves."""
    served, gate = paced
    long_body = {"prompt": PROMPT, "max_tokens": 400, "ignore_eos": True,
                 "stream_format": "msgpack", **GREEDY}
    result: dict[str, httpx.Response] = {}
    gate.hold_after(BURST)
    with httpx.stream("POST", served.url + "/v1/completions", json=long_body,
                      timeout=120) as a:
        a_id = a.headers["x-request-id"]
        chunks = a.iter_raw()  # kept: a dropped iterator closes the response (a disconnect)
        next(chunks)
        waiter = threading.Thread(target=lambda: result.setdefault("b", httpx.post(
            served.url + "/v1/completions", timeout=120,
            json={"prompt": "Hi", "max_tokens": 3, **GREEDY})))
        waiter.start()
        _until(gate.holding)  # A is generating and cannot finish
        _until(lambda: served.state.admission.queued == 1)  # B waits behind A
    # B got A's slot, so A's client is gone and A's job is cancelled (the supervisor cancels
    # the upstream before it gives the slot back); only then may A's next token come.
    _until(lambda: served.state.admission.queued == 0)
    gate.release()  # the next token finds A cancelled
    rec_a = gate.engine.wait_for_record(a_id, timeout=60)
    waiter.join(120)
    assert rec_a.outcome == "aborted" and rec_a.reason == "abort"
    assert len(rec_a.ids) <= BURST + 1
    b_id = result["b"].headers["x-request-id"]
    rec_b = gate.engine.wait_for_record(b_id, timeout=60)
    assert rec_b.outcome == "finished" and rec_b.started_at >= rec_a.ended_at



def test_a_client_that_leaves_during_a_long_prompt_frees_the_engine_before_it_ends(
        engine, monkeypatch):
    """The prompt is evaluated batch by batch with the cancel flag checked between batches:
    a client that left during a long prompt held the engine until all of it was evaluated
    (llama.cpp's ``generate`` yields nothing before the first token; ~35 s for 3,500 tokens
    on a busy CPU). Here the client leaves during the first batch."""
    from tokenwire.gateway.ir import GenerationRequest, PromptIds, is_terminal

    n_batch = engine._llm.n_batch
    prompt = PromptIds(ids=tuple(range(1000, 1000 + n_batch * 2 - 24)))  # two batches
    assert n_batch < len(prompt.ids) < engine.n_ctx
    evaluated: list[int] = []
    submitted = threading.Event()
    stream: list = []
    real_eval = engine._llm.eval

    def eval_then_leave(tokens):
        real_eval(tokens)
        evaluated.append(len(tokens))
        assert submitted.wait(30)
        stream[0].cancel()  # the client leaves while the prompt is being evaluated

    monkeypatch.setattr(engine._llm, "eval", eval_then_leave)

    async def go():
        stream.append(engine.submit(GenerationRequest(
            prompt=prompt, max_tokens=5, temperature=0.0, request_id="leaves-early")))
        submitted.set()
        while not is_terminal(event := await stream[0].next_event()):
            pass
        return event

    finish = asyncio.run(go())
    record = engine.wait_for_record("leaves-early")
    assert isinstance(finish, Finish) and finish.reason is FinishKind.ABORT
    assert record.outcome == "aborted"
    assert record.ids == () and evaluated == [n_batch]  # the second batch never ran


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_each_frame_is_decodable_before_the_next_window_closes(paced, dicts, encoding):
    """The engine generates a burst of tokens (coalesced into one window), then holds the
    next burst until the client has decoded every token of this one. Held tokens produce no
    frames, so only the window's own timer can flush the burst: a server that buffers
    (until the end, a byte count, or the next frame) never gets the next burst generated.
    The gate's safety timeout then lets generation go on, and the test fails naming how
    many bursts were released by the timeout instead of by the client. No speed of this
    machine is assumed: a fast engine waits at every gate, a slow one is just slower."""
    served, gate = paced
    decompress = _stock(encoding, dicts["msgpack"] if encoding == "zstd" else None)
    dec = frames_msgpack.FrameDecoder()
    body = {"prompt": PROMPT, "max_tokens": BURSTS * BURST, "ignore_eos": True,
            "stream_format": "msgpack", **GREEDY}
    gate.gate_every(BURST)
    with httpx.stream("POST", served.url + "/v1/completions", json=body, timeout=120,
                      headers={"Accept-Encoding": encoding, "Codec-Client-Version": "0.5"}
                      ) as resp:
        assert resp.headers.get("content-encoding", "identity") == encoding
        rid = resp.headers["x-request-id"]
        for chunk in resp.iter_raw():
            for frame in dec.feed(decompress(chunk)):
                gate.decoded(len(frame.ids))
    rec = gate.engine.wait_for_record(rid)
    assert len(rec.ids) == gate.decoded_count == BURSTS * BURST
    assert gate.timed_out == 0, (
        f"{gate.timed_out} of {BURSTS - 1} bursts were generated only after the gate's "
        f"{GATE_TIMEOUT_S:g} s safety timeout: the previous burst was not decodable while "
        "the engine waited")
    assert gate.released_by_client == BURSTS - 1


# -- the names the model answers to (issue 10) ----------------------------------------------


def test_the_model_answers_to_its_hugging_face_id_file_name_and_family(live) -> None:
    [entry] = httpx.get(live.url + "/v1/models").json()["data"]
    assert entry["id"] == "SmolLM2-135M-Instruct"
    assert entry["aliases"] == ["HuggingFaceTB/SmolLM2-135M-Instruct",
                                "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2"]
    for name in [entry["id"], *entry["aliases"]]:
        resp = httpx.post(live.url + "/v1/completions", timeout=120, json={
            "model": name, "prompt": PROMPT, "max_tokens": 2, **GREEDY})
        assert resp.status_code == 200, (name, resp.text)


def test_an_embedded_upstream_in_a_config_file_serves_ids_with_the_bundled_map(
        smollm2_map) -> None:
    """`kind = "embedded"` in a file gets its map exactly as a bare `tokenwire serve` does
    (it used to be served as "ids engine, no map": ids a client cannot render)."""
    from tokenwire.gateway.config import parse_config
    from tokenwire.gateway.server import build_gateway
    from tokenwire.gateway.settings import ServerSettings

    cfg = parse_config({"upstreams": [{"name": "local", "kind": "embedded",
                                       "options": {"n_ctx": 512, "threads": 1},
                                       "models": [{"name": "smol"}]}]}, env={})

    async def build():
        gw = await build_gateway(cfg, ServerSettings())
        try:
            return gw.state.router.route("smol"), gw.state.router.route("smollm2")
        finally:
            await gw.aclose()

    smol, by_alias = asyncio.run(build())
    assert smol.tmap is not None and smol.tmap.hash == smollm2_map.hash
    assert smol.ids_source.value == "engine" and by_alias is smol
