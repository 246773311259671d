"""End to end: our client against the real server and the real embedded engine (slow).

The module records real streams from a server without dictionaries, trains one dictionary
per stream format with ``tokenwire dict train``, and starts a second server with them
(``--zstd-dict`` equivalent). Then every stream_format x encoding round-trips through the
client, and every compressed body also decodes with the stock zlib, brotli and zstandard
decoders to the same frames.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import brotli
import httpx
import pytest
import zstandard

from tests.client._loopback import serve
from tokenwire.cli.main import main
from tokenwire.client.codec_client import CodecClient
from tokenwire.client.discovery import DiscoveryCache
from tokenwire.codec import frames_delta, frames_msgpack, frames_protobuf
from tokenwire.codec.compression import ZstdDict
from tokenwire.codec.detokenizer import Detokenizer
from tokenwire.codec.frames import StreamFormat
from tokenwire.codec.maps import TokenizerMap, bundled_map_path, load_map_file
from tokenwire.errors import TokenizerMapMismatch

pytestmark = pytest.mark.slow

FORMATS = [f.value for f in StreamFormat]
ENCODINGS = ["identity", "gzip", "br", "zstd"]
PROMPT = "The three primary colours are"
MAX_TOKENS = 16
RECORD_PROMPTS = [f"Write one sentence about the number {i}." for i in range(6)]
# One cache for every client here: each would otherwise fetch and parse the 1.9 MB map.
CACHE = DiscoveryCache()
_PROBE = """
from llama_cpp import Llama
from tokenwire.gguf_tokenizer import smollm2_gguf_path
llm = Llama(model_path=str(smollm2_gguf_path()), n_ctx=64, verbose=False)
next(iter(llm.generate(llm.tokenize(b"Hi", add_bos=False), temp=0.0)))
"""
_DECODERS = {"msgpack": frames_msgpack.FrameDecoder, "protobuf": frames_protobuf.FrameDecoder,
             "msgpack-delta": frames_delta.FrameDecoder}


@dataclass
class Deployment:
    plain: str  # no dictionaries
    dicts: str  # one trained dictionary per format
    bundled: TokenizerMap
    served: TokenizerMap  # the map that advertises the dictionaries
    zstd_dicts: dict[str, ZstdDict]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory) -> Iterator[Deployment]:
    probe = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, timeout=120)
    if probe.returncode != 0:
        pytest.skip("llama-cpp-python cannot decode on this machine")
    from tokenwire.gateway.http.app import create_app
    from tokenwire.gateway.server import build_embedded_state
    from tokenwire.gateway.settings import ServerSettings, load_zstd_dict_arg
    from tokenwire.gateway.upstreams.embedded import EmbeddedEngine

    bundled = load_map_file(bundled_map_path("huggingfacetb/smollm2"))
    # One thread: beside the suite's other worker, llama.cpp's two threads wait on each
    # other (tests/gateway/test_codex_cli_tools.py has the measurement).
    engine = EmbeddedEngine.load(bundled, n_ctx=1024, n_threads=1, queue_size=4)
    engine.start()
    work = tmp_path_factory.mktemp("e2e")
    try:
        plain = build_embedded_state(ServerSettings(window_s=0.02), tmap=bundled, engine=engine)
        with serve(create_app(plain.state)) as origin:
            dict_args = _record_and_train(origin, work)
        settings = ServerSettings(window_s=0.02,
                                  zstd_dicts=dict(load_zstd_dict_arg(a) for a in dict_args))
        with_dicts = build_embedded_state(settings, tmap=bundled, engine=engine)
        with serve(create_app(plain.state)) as plain_origin, \
                serve(create_app(with_dicts.state)) as dict_origin:
            yield Deployment(plain_origin, dict_origin, bundled, with_dicts.state.tmap,
                             dict(settings.zstd_dicts))
    finally:
        engine.close()


def _record_and_train(origin: str, work: Path) -> list[str]:
    prompts = work / "prompts.txt"
    prompts.write_text("\n".join(RECORD_PROMPTS) + "\n", "utf-8")
    args = []
    for fmt in FORMATS:
        rec = work / fmt
        assert main(["dict", "record", "--url", origin, "--format", fmt, "--prompts",
                     str(prompts), "-o", str(rec), "--max-tokens", "24",
                     "--temperature", "0"]) == 0
        out = work / f"{fmt}.zstd"
        files = [str(p) for p in sorted(rec.glob("*.bin"))]
        assert main(["dict", "train", "--format", fmt, "-o", str(out), "--size", "4096",
                     *files]) == 0
        args.append(f"{fmt}={out}")
    return args


def _complete(url: str, fmt: str, encoding: str, path: str = "a", **kw):
    with CodecClient(url, stream_format=fmt, accept_encoding=encoding, cache=CACHE,
                     **kw) as client:
        return client.complete(PROMPT, max_tokens=MAX_TOKENS, temperature=0.0, path=path)


@pytest.fixture(scope="module")
def reference_ids(deployment) -> tuple[int, ...]:
    return _complete(deployment.plain, "msgpack", "identity").ids


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_and_encoding_round_trips_through_the_real_server(
        deployment, reference_ids, fmt, encoding) -> None:
    done = _complete(deployment.dicts, fmt, encoding)
    assert done.stats.content_encoding == encoding
    assert done.ids == reference_ids  # greedy: same ids whatever the wire
    assert done.text == Detokenizer(deployment.bundled).decode(done.ids)
    assert done.stats.tokenizer_map == deployment.served.hash
    if encoding == "zstd":
        assert done.stats.zstd_dict == deployment.zstd_dicts[fmt].hash


@pytest.mark.parametrize("path", ["b", "c"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_paths_b_and_c_round_trip(deployment, reference_ids, fmt, path) -> None:
    done = _complete(deployment.dicts, fmt, "br", path=path)
    assert done.stats.path == path and done.ids == reference_ids


@pytest.mark.parametrize("encoding", ["gzip", "br", "zstd"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_compressed_bodies_decode_with_the_stock_decoders(
        deployment, reference_ids, fmt, encoding) -> None:
    body = {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0.0, "stream": True,
            "stream_format": fmt}
    headers = {"Accept-Encoding": encoding, "Codec-Client-Version": "0.5"}
    with httpx.Client(timeout=60) as http, http.stream(
            "POST", f"{deployment.dicts}/v1/completions", json=body, headers=headers) as resp:
        assert resp.headers.get("content-encoding") == encoding
        wire = b"".join(resp.iter_raw())
        zdict_hdr = resp.headers.get("codec-zstd-dict")
    if encoding == "gzip":
        raw = zlib.decompress(wire, 31)
    elif encoding == "br":
        raw = brotli.decompress(wire)
    else:
        zdict = deployment.zstd_dicts[fmt]
        assert zdict_hdr == zdict.hash
        dctx = zstandard.ZstdDecompressor(dict_data=zstandard.ZstdCompressionDict(zdict.raw))
        raw = dctx.decompressobj().decompress(wire)
    dec = _DECODERS[fmt]()
    frames = dec.feed(raw)
    dec.feed_eof()
    assert tuple(i for f in frames for i in f.ids) == reference_ids


def test_json_sse_text_equals_the_detokenized_binary_stream(deployment, reference_ids) -> None:
    body = {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0.0, "stream": True}
    with httpx.Client(timeout=60) as http:
        resp = http.post(f"{deployment.plain}/v1/completions", json=body)
    texts = [json.loads(line[6:])["choices"][0]["text"] for line in resp.text.splitlines()
             if line.startswith("data: {")]
    assert "".join(texts) == Detokenizer(deployment.bundled).decode(reference_ids)


def test_advertised_map_is_a_new_map_so_a_bundled_pin_is_refused(deployment) -> None:
    # Documented consequence of advertising dictionaries (gateway/http/wellknown.py).
    ok = _complete(deployment.plain, "msgpack", "gzip", tokenizer_map=deployment.bundled)
    assert ok.stats.tokenizer_map == deployment.bundled.hash
    with pytest.raises(TokenizerMapMismatch):
        _complete(deployment.dicts, "msgpack", "gzip", tokenizer_map=deployment.bundled)
    assert deployment.served.zstd_dictionaries and deployment.served.vocab == \
        deployment.bundled.vocab
