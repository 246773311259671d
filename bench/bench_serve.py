"""Serving: bytes per token and time-to-decodable per stream_format x encoding, and the
server's added latency to the first token.

How it is measured, in one run on the real embedded engine (SmolLM2-135M-Instruct Q4_1):

1. Record real engine output: the IR events of one greedy generation (``ignore_eos``, so the
   length is exact) of 256 and of 2,048 tokens, each event stamped with the time the engine
   produced it; and 24 other 256-token answers to train one zstd dictionary per format.
2. Replay each recording through exactly what ``serve`` runs for a response body: the API
   renderer (JSON-SSE, or Codec frames) and the sans-IO :class:`Coalescer` with the default
   window, driven by the recorded clock, with the server's window timer simulated (a window
   is flushed at its deadline). Bytes per token and, for every token, the time from its
   generation to the flush that makes it decodable are exact for that schedule; every
   compressed body is decompressed with the stock decoders and checked.
3. Time to first token: the same 16-token prompt, max_tokens=1, alternately through the
   running server over loopback HTTP (msgpack, identity, until the first frame decodes) and
   through llama-cpp-python directly (a second ``Llama`` on the same GGUF), 15 times each.

Published reference (codec-spec 8): msgpack+br 2.79 B/token measured without per-token
delivery; zstd's first decodable byte came after 3.6 s in the reference engine.
"""

from __future__ import annotations

import asyncio
import gzip
import socket
import statistics
import threading
import time
from collections.abc import Sequence

import brotli
import zstandard

from tokenwire.codec.coalescer import DEFAULT_WINDOW_S, Coalescer
from tokenwire.codec.compression import (
    ZstdDict,
    new_compressor,
    train_dictionary,
)
from tokenwire.codec.frames import StreamFormat
from tokenwire.codec.maps import bundled_map_path, load_map_file
from tokenwire.gateway.apis.codec_stream import CodecStreamRenderer
from tokenwire.gateway.apis.completions import CompletionsRenderer
from tokenwire.gateway.ir import Event, GenerationRequest, PromptText, TokenDelta, is_terminal
from tokenwire.gateway.upstreams.embedded import EmbeddedEngine
from tokenwire.gateway.upstreams.embedded_model import default_model_path, default_threads

LENGTHS = (256, 2048)
FORMATS = (StreamFormat.MSGPACK, StreamFormat.PROTOBUF, StreamFormat.MSGPACK_DELTA)
ENCODINGS = ("identity", "gzip", "br", "zstd")
PROMPT = "Write a long story about a lighthouse keeper and the sea."
TRAIN_PROMPTS = [f"Tell me about topic number {i}: {t}" for i, t in enumerate(
    ["rivers", "bread", "compilers", "owls", "trains", "chess", "tea", "volcanoes",
     "music", "glass", "bees", "maps", "clocks", "ships", "paper", "salt", "bridges",
     "comets", "cheese", "wolves", "kites", "rain", "silk", "lamps"])]
TTFT_PROMPT = "The quick brown fox jumps over the lazy dog, and then it"
TTFT_RUNS = 15

Recording = list[tuple[float, Event]]


async def _record(engine: EmbeddedEngine, prompt: str, tokens: int) -> Recording:
    req = GenerationRequest(prompt=PromptText(text=prompt), max_tokens=tokens, temperature=0.0,
                            seed=1, ignore_eos=True)
    stream = engine.submit(req)
    out: Recording = []
    while True:
        event = await stream.next_event()
        out.append((time.perf_counter(), event))
        if is_terminal(event):
            return out


def _json_sse_bytes(rec: Recording) -> int:
    renderer = CompletionsRenderer(completion_id="cmpl-bench", model="smollm2", created=0,
                                   stream=True)
    return sum(len(chunk) for _, ev in rec for chunk in renderer.on_event(ev))


def _decoder(encoding: str, zdict: ZstdDict | None):
    if encoding == "gzip":
        return gzip.decompress
    if encoding == "br":
        return brotli.decompress
    if encoding == "zstd":
        d = zstandard.ZstdDecompressor(dict_data=zstandard.ZstdCompressionDict(zdict.raw))
        return lambda body: d.decompressobj().decompress(body)
    return lambda body: body


def _replay(rec: Recording, fmt: StreamFormat, encoding: str, zdict: ZstdDict | None,
            window: float) -> tuple[int, list[float], bytes, bytes]:
    """(wire bytes, per-token delay to decodable, wire body, raw body) for one schedule."""
    renderer = CodecStreamRenderer(fmt)
    coalescer = Coalescer(new_compressor(encoding, dictionary=zdict), window=window)
    wire, raw, pending, delays = [], [], [], []

    def emit(data: bytes, at: float) -> None:
        if data:
            wire.append(data)
            delays.extend(at - t for t in pending)
            pending.clear()

    for t, event in rec:
        deadline = coalescer.deadline
        if deadline is not None and deadline <= t:  # the server's window timer fired
            emit(coalescer.poll(deadline), deadline)
        frames = renderer.on_event(event)
        if isinstance(event, TokenDelta) and event.ids:
            pending.extend([t] * len(event.ids))
        for frame in frames:
            raw.append(frame)
            emit(coalescer.add(frame, t), t)
    end = rec[-1][0]
    emit(coalescer.close(end), end)
    return sum(map(len, wire)), delays, b"".join(wire), b"".join(raw)


def _train(recordings: Sequence[Recording], fmt: StreamFormat) -> ZstdDict:
    samples = []
    for rec in recordings:
        renderer = CodecStreamRenderer(fmt)
        samples.append(b"".join(f for _, ev in rec for f in renderer.on_event(ev)))
    return ZstdDict.from_bytes(train_dictionary(samples))


def _bytes_rows(recs: dict[int, Recording], dicts: dict[StreamFormat, ZstdDict]) -> list[dict]:
    rows = []
    for rec in recs.values():
        tokens = sum(len(ev.ids) for _, ev in rec if isinstance(ev, TokenDelta))
        rows.append({"tokens": tokens, "stream_format": "json (SSE)", "encoding": "identity",
                     "B/token": round(_json_sse_bytes(rec) / tokens, 2),
                     "max delay ms": "", "p50 delay ms": ""})
        for fmt in FORMATS:
            for enc in ENCODINGS:
                zdict = dicts[fmt] if enc == "zstd" else None
                if enc == "zstd" and zdict is None:
                    continue
                size, delays, body, raw = _replay(rec, fmt, enc, zdict, DEFAULT_WINDOW_S)
                assert _decoder(enc, zdict)(body) == raw, (fmt, enc)
                rows.append({
                    "tokens": tokens, "stream_format": fmt.value, "encoding": enc,
                    "B/token": round(size / tokens, 2),
                    "max delay ms": round(1000 * max(delays), 1),
                    "p50 delay ms": round(1000 * statistics.median(delays), 1),
                })
    return rows


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ttft_rows(engine: EmbeddedEngine) -> list[dict]:
    import httpx
    import uvicorn
    from llama_cpp import Llama

    from tokenwire.codec.frames_msgpack import FrameDecoder
    from tokenwire.gateway.http.app import create_app
    from tokenwire.gateway.server import build_embedded_state
    from tokenwire.gateway.settings import ServerSettings

    port = _free_port()
    settings = ServerSettings(host="127.0.0.1", port=port)
    plan = build_embedded_state(settings, engine=engine)
    server = uvicorn.Server(uvicorn.Config(create_app(plan.state), host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    direct = Llama(model_path=str(default_model_path()), n_ctx=512, n_threads=default_threads(),
                   verbose=False)
    prompt_ids = direct.tokenize(TTFT_PROMPT.encode(), add_bos=False, special=False)
    body = {"prompt": TTFT_PROMPT, "max_tokens": 1, "temperature": 0, "stream": True,
            "stream_format": "msgpack"}
    via_server, via_direct = [], []
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
        for _ in range(TTFT_RUNS):
            t0 = time.perf_counter()
            dec = FrameDecoder()
            with client.stream("POST", "/v1/completions", json=body,
                               headers={"Accept-Encoding": "identity"}) as resp:
                for chunk in resp.iter_raw():
                    if any(f.ids for f in dec.feed(chunk)):
                        via_server.append(time.perf_counter() - t0)
                        break
            t0 = time.perf_counter()
            direct.reset()  # no prefix reuse, like the server
            next(iter(direct.generate(prompt_ids, temp=0.0)))
            via_direct.append(time.perf_counter() - t0)
    server.should_exit = True
    thread.join(10)
    s, d = statistics.median(via_server), statistics.median(via_direct)
    return [
        {"measure": "time to first token, llama-cpp-python direct",
         "median ms": round(1000 * d, 1)},
        {"measure": "time to first token, through tokenwire serve (HTTP, msgpack)",
         "median ms": round(1000 * s, 1)},
        {"measure": "added by tokenwire", "median ms": round(1000 * (s - d), 1)},
    ]


def run() -> list[dict]:
    tmap = load_map_file(bundled_map_path("huggingfacetb/smollm2"))
    engine = EmbeddedEngine.load(tmap, n_ctx=max(LENGTHS) + 256)
    engine.start()
    try:
        recs = {n: asyncio.run(_record(engine, PROMPT, n)) for n in LENGTHS}
        train = [asyncio.run(_record(engine, p, 256)) for p in TRAIN_PROMPTS]
        dicts = {fmt: _train(train, fmt) for fmt in FORMATS}
        rows = _bytes_rows(recs, dicts)
        rows += _ttft_rows(engine)
    finally:
        engine.close()
    return rows


if __name__ == "__main__":
    for row in run():
        print(row)
