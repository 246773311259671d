"""A scripted Codec server for client fault tests: recorded frame bytes, every encoding, and
every wrong answer codec-spec §2.7 tells a client how to handle.

The scenario is the first path segment of the client's ``base_url``
(``<origin>/s/<scenario>/v1/completions``), so one server serves every test. The
well-known routes are our real :mod:`tokenwire.gateway.http.wellknown` ones.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import brotli
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from tokenwire.codec import frames_delta, frames_msgpack, frames_protobuf
from tokenwire.codec.compression import ZstdDict, new_compressor
from tokenwire.codec.frames import Frame, StreamFormat
from tokenwire.codec.maps import bundled_map_path, load_map_file, sha256_hash
from tokenwire.codec.requests import decode_request, request_format_for_content_type
from tokenwire.codec.tokenizer import Tokenizer
from tokenwire.codec.versioning import VersionPolicy, upgrade_required_response
from tokenwire.gateway.http.wellknown import DiscoveryState, wellknown_routes

MAP = load_map_file(bundled_map_path("huggingfacetb/smollm2"))
TOKENIZER = Tokenizer.from_map(MAP)
ANSWER = "Bonjour! Ça va? 日本語 and emoji 🙂 too.\nSecond line."
ANSWER_IDS = tuple(TOKENIZER.encode(ANSWER))

#: An OpenAI-shaped 400 with a long message (clients must show it whole, not cut at 300 B).
LONG_ERROR = {"error": {"message": "the prompt is too long: " + "very " * 80 + "long. END",
                        "type": "invalid_request_error", "param": "prompt",
                        "code": "context_length_exceeded"}}

ENCODERS = {  # classes: the delta encoder keeps state (base_id), so one per stream
    StreamFormat.MSGPACK: frames_msgpack.FrameEncoder,
    StreamFormat.PROTOBUF: frames_protobuf.FrameEncoder,
    StreamFormat.MSGPACK_DELTA: frames_delta.FrameEncoder,
}


def frame_bytes(fmt: StreamFormat, ids: tuple[int, ...] = ANSWER_IDS,
                finish_reason: str = "eos_token") -> list[bytes]:
    """One frame per id, the last one terminal: what an engine sends at 1 token/frame."""
    enc = ENCODERS[fmt]()
    out = [enc.encode(Frame(ids=(i,), done=False)) for i in ids[:-1]]
    out.append(enc.encode(Frame(ids=ids[-1:], done=True, finish_reason=finish_reason)))
    return out


# Raw-content dictionaries (any bytes work as a zstd dictionary): a stream of each format.
DICTS = {fmt.value: ZstdDict.from_bytes(b"".join(frame_bytes(fmt, ANSWER_IDS[:20])) * 4)
         for fmt in StreamFormat}
ROGUE_DICT = ZstdDict.from_bytes(b"a dictionary nobody publishes" * 20)


def compressed_chunks(frames: list[bytes], encoding: str, zdict: ZstdDict | None) -> list[bytes]:
    """Each frame compressed and flushed, as a per-frame-flushing server sends them."""
    comp = new_compressor(encoding, dictionary=zdict)
    chunks = [comp.compress(f) + comp.flush() for f in frames]
    chunks[-1] += comp.finish()
    return [c for c in chunks if c]


@dataclass
class Seen:
    """What the server received (the tests inspect it)."""

    requests: list[tuple[str, dict[str, str], bytes]] = field(default_factory=list)


def _pick(accept: str, fmt: StreamFormat) -> str:
    offered = [p.split(";")[0].strip().lower() for p in accept.split(",") if p.strip()]
    for token in offered:
        if token == "zstd" and fmt.value in DICTS:
            return token
        if token in ("br", "gzip", "identity"):
            return token
    return "identity"


def _body_stream(chunks: list[bytes]) -> Iterator[bytes]:
    yield from chunks


class ScriptedCodecServer:
    def __init__(self) -> None:
        self.seen = Seen()
        state = DiscoveryState(maps=(MAP,), dicts={"msgpack": DICTS["msgpack"],
                                                   "protobuf": DICTS["protobuf"],
                                                   "msgpack-delta": DICTS["msgpack-delta"]})
        self.app = Starlette(routes=[
            *wellknown_routes(state),
            Route("/s/{scenario}/v1/completions", self.completions, methods=["POST"]),
            Route("/s/{scenario}/v1/completions/codec", self.codec_path, methods=["POST"]),
        ])

    async def completions(self, request: Request) -> Response:
        body = await request.body()
        self.seen.requests.append((request.url.path, dict(request.headers), body))
        doc = json.loads(body)
        return self._answer(request, StreamFormat(doc.get("stream_format", "msgpack")))

    async def codec_path(self, request: Request) -> Response:
        scenario = request.path_params["scenario"]
        if scenario == "no-path-c":
            return Response(b'{"error":"not found"}', status_code=404)
        body = await request.body()
        self.seen.requests.append((request.url.path, dict(request.headers), body))
        req = decode_request(body, request_format_for_content_type(
            request.headers.get("content-type", "")))
        return self._answer(request, StreamFormat(req.stream_format))

    def _answer(self, request: Request, fmt: StreamFormat) -> Response:
        scenario = request.path_params["scenario"]
        version = request.headers.get("codec-client-version")
        if scenario == "426":
            status, headers, body = upgrade_required_response(
                VersionPolicy(version_policy="strict", deployment_id="scripted"), version)
            return Response(body, status_code=status, headers=dict(headers))
        if scenario == "426-garbage":
            return Response(b"<html>upgrade</html>", status_code=426)
        if scenario == "500":
            return Response(b'{"error":"engine exploded"}', status_code=500)
        if scenario == "long-error":  # an OpenAI error whose message runs past 300 bytes
            return Response(json.dumps(LONG_ERROR).encode(), status_code=400,
                            media_type="application/json")
        if scenario == "json-sse":
            text = 'data: {"choices":[{"text":"hi","index":0}]}\n\ndata: [DONE]\n\n'
            return Response(text.encode(), media_type="text/event-stream")
        return self._stream(request, fmt, scenario)

    def _stream(self, request: Request, fmt: StreamFormat, scenario: str) -> Response:
        encoding = _pick(request.headers.get("accept-encoding", ""), fmt)
        frames = frame_bytes(fmt)
        if scenario == "truncated":
            frames = [*frames[:-1], frames[-1][:-1]]
        elif scenario == "trailing":
            frames = [*frames, frames[0]]
        zdict = DICTS.get(fmt.value) if encoding == "zstd" else None
        if scenario == "unknown-dict" and encoding == "zstd":
            zdict = ROGUE_DICT
        chunks = compressed_chunks(frames, encoding, zdict)
        if scenario == "gzip-bomb":
            # valid frames, so that the budget, not the frame decoder, is what stops them
            bomb = frames[0] * (4 * 1024 * 1024 // len(frames[0]) + 1)
            encoding, chunks = "gzip", [_gzip(bomb)]
        headers = {"Content-Type": fmt.content_type,
                   "Codec-Tokenizer-Map": MAP.hash,
                   "Vary": "Accept-Encoding, Codec-Client-Version"}
        if encoding != "identity":
            headers["Content-Encoding"] = encoding
        if zdict is not None and scenario != "zstd-without-dict-header":
            headers["Codec-Zstd-Dict"] = zdict.hash
        if scenario == "dict-header-on-gzip":
            headers["Codec-Zstd-Dict"] = DICTS[fmt.value].hash
        if scenario == "wrong-map":
            headers["Codec-Tokenizer-Map"] = sha256_hash(b"some other map")
        if scenario == "no-map-header":
            del headers["Codec-Tokenizer-Map"]
        return StreamingResponse(_body_stream(chunks), headers=headers)


def _gzip(data: bytes) -> bytes:
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    return z.compress(data) + z.flush()


def stock_decode(encoding: str, body: bytes, zdict: ZstdDict | None) -> bytes:
    """Decode with the stock libraries only (zlib, brotli, zstandard), not ours."""
    import zstandard

    if encoding == "gzip":
        return zlib.decompress(body, 31)
    if encoding == "br":
        return brotli.decompress(body)
    if encoding == "zstd":
        assert zdict is not None
        dctx = zstandard.ZstdDecompressor(dict_data=zstandard.ZstdCompressionDict(zdict.raw))
        return dctx.decompressobj().decompress(body)
    return body
