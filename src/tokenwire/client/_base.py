"""The sans-IO core of the Codec client: request building, response checks, the decode pipeline.

:class:`~tokenwire.client.codec_client.CodecClient` and ``AsyncCodecClient`` only perform
I/O (STYLE §3, §6 item 11). Everything that decides something lives here:

* **Requests** (codec-spec §2.1-§2.5): Path A (text prompt), B (id prompt) and C (binary
  ``CodecRequest`` body to ``/v1/completions/codec``); ``Codec-Client-Version`` on every
  request (§2.5: v0.4+ clients MUST); an ``Accept-Encoding`` offer that names zstd only when
  the caller opted in or holds a dictionary (§4.1: zstd is dictionary-only); ``X-Codec-Map``
  when a map is pinned.
* **Response checks** (§2.7), in this order: 426 -> :class:`CodecVersionRequired` (a 426
  that does not parse still raises); 404 on Path C -> fall back to Path B; other errors ->
  :class:`CodecHTTPError`; ``Content-Type`` not the binary type asked for ->
  :class:`ContentTypeMismatch` (a JSON-SSE fallback is reported, never parsed as frames);
  ``Codec-Zstd-Dict`` on a non-zstd body, or zstd without it -> :class:`ZstdDictError`;
  ``Codec-Tokenizer-Map`` other than the expected map -> :class:`TokenizerMapMismatch`.
* **Resolution flows** (discovery generators, see :mod:`tokenwire.client.discovery`) for a
  dictionary the response names but we do not hold, and for the map: the pinned map, or
  one fetched by the hash the response names (verified), or - to tokenize a Path B/C prompt
  - one found by id or through ``index.json``.
* **The decode pipeline** :class:`ResponseDecoder`: raw wire bytes -> bounded decompressor
  (in pieces) -> incremental frame decoder -> streaming detokenizer -> :class:`TokenChunk`
  values.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from tokenwire.background import in_background
from tokenwire.client.discovery import (
    DiscoveryCache,
    Flow,
    dict_flow,
    index_flow,
    is_loopback,
    map_by_hash_flow,
    map_flow,
)
from tokenwire.codec import frames_delta, frames_msgpack, frames_protobuf
from tokenwire.codec.compression import (
    DECOMPRESSORS,
    DEFAULT_MAX_DECOMPRESSED,
    Decompressor,
    ZstdDict,
    new_decompressor,
)
from tokenwire.codec.detokenizer import Detokenizer, StreamDecoder
from tokenwire.codec.finish_reason import ClientFinishReason
from tokenwire.codec.frames import MAX_FRAME_BYTES, FrameDecoderBase, StreamFormat, ToolCall
from tokenwire.codec.maps import TokenizerMap, parse_hash
from tokenwire.codec.requests import CodecRequest, encode_request
from tokenwire.codec.tokenizer import Tokenizer
from tokenwire.codec.versioning import CLIENT_VERSION_HEADER, OWN_VERSION, format_version
from tokenwire.codec.versioning import parse_version_required as _parse_426
from tokenwire.errors import (
    CodecHTTPError,
    ContentTypeMismatch,
    DiscoveryError,
    HashFormatError,
    LocalProtocolError,
    RemoteProtocolError,
    TokenizerMapMismatch,
    ZstdDictError,
)

__all__ = [
    "DEFAULT_CLIENT_VERSION",
    "MAX_ERROR_BODY",
    "PATHS",
    "BaseCodecClient",
    "Completion",
    "CompletionOptions",
    "ResponseDecoder",
    "ResponseHead",
    "StreamStats",
    "TokenChunk",
    "default_accept_encoding",
]

PathName = Literal["a", "b", "c"]
PATHS: tuple[str, ...] = ("a", "b", "c")
#: What we declare in ``Codec-Client-Version`` (§5.1): the version we implement.
DEFAULT_CLIENT_VERSION = format_version(OWN_VERSION)
#: Error bodies (4xx/5xx, 426) are read only this far: the peer controls their length.
MAX_ERROR_BODY = 64 * 1024

_DECODERS: dict[StreamFormat, type[FrameDecoderBase]] = {
    StreamFormat.MSGPACK: frames_msgpack.FrameDecoder,
    StreamFormat.PROTOBUF: frames_protobuf.FrameDecoder,
    StreamFormat.MSGPACK_DELTA: frames_delta.FrameDecoder,
}


def default_accept_encoding(*, zstd: bool) -> str:
    """The offer: br and gzip always (§4.1 SHOULD), zstd only when a dictionary can be had."""
    codings = ["br", "gzip"] if "br" in DECOMPRESSORS else ["gzip"]
    if zstd and "zstd" in DECOMPRESSORS:
        codings.insert(0, "zstd")
    return ", ".join([*codings, "identity"])


# -- values -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TokenChunk:
    """One decoded frame: its ids and the text they complete (never half a character)."""

    ids: tuple[int, ...]
    text: str
    done: bool = False
    finish_reason: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True, slots=True)
class StreamStats:
    """What one response cost: bytes on the wire (as sent, compressed) and decoded."""

    path: str
    stream_format: str
    content_type: str
    content_encoding: str
    zstd_dict: str | None
    tokenizer_map: str | None
    wire_bytes: int
    body_bytes: int
    frames: int
    tokens: int


@dataclass(frozen=True, slots=True)
class Completion:
    """A whole (non-streamed) result of :meth:`CodecClient.complete`."""

    ids: tuple[int, ...]
    text: str
    finish_reason: ClientFinishReason | None
    raw_finish_reason: str | None
    stats: StreamStats


@dataclass(frozen=True, slots=True)
class CompletionOptions:
    prompt: str | tuple[int, ...]
    max_tokens: int = 256
    temperature: float | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    path: str = "a"
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ResponseHead:
    """The checked headers of a 200 response."""

    content_type: str
    content_encoding: str
    zstd_dict: str | None
    tokenizer_map: str | None


# -- the decode pipeline ------------------------------------------------------------------


class ResponseDecoder:
    """Raw wire bytes in, :class:`TokenChunk` values out; ``feed_eof`` checks the ending.

    ``record`` (optional) receives the decompressed body bytes, e.g. to record streams for
    ``tokenwire dict train``.
    """

    def __init__(
        self,
        *,
        path: str,
        stream_format: StreamFormat,
        head: ResponseHead,
        decompressor: Decompressor,
        detokenizer: StreamDecoder | None,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        record: Callable[[bytes], None] | None = None,
    ) -> None:
        self._path = path
        self._format = stream_format
        self._head = head
        self._decompressor = decompressor
        self._frames = _DECODERS[stream_format](max_frame_bytes)
        self._detok = detokenizer
        self._record = record
        self.wire_bytes = 0
        self.body_bytes = 0
        self.frames = 0
        self.tokens = 0
        self.finish_reason: str | None = None

    def feed(self, raw: bytes) -> Iterator[TokenChunk]:
        """The frames ``raw`` completes, decoded one decompressed piece at a time: a piece's
        frames are made only once the caller took the last piece's, so a few KB that inflate
        to the whole budget are never a million frames held at once."""
        self.wire_bytes += len(raw)
        for piece in self._decompressor.pieces(raw):
            yield from self._body(piece)

    def feed_eof(self) -> list[TokenChunk]:
        chunks = self._body(self._decompressor.finish())
        self._frames.feed_eof()
        return chunks

    def _body(self, data: bytes) -> list[TokenChunk]:
        if not data:
            return []
        self.body_bytes += len(data)
        if self._record is not None:
            self._record(data)
        out = []
        for frame in self._frames.feed(data):
            self.frames += 1
            self.tokens += len(frame.ids)
            text = ""
            if self._detok is not None:
                text = self._detok.feed(frame.ids)
                if frame.done:
                    text += self._detok.flush()
            if frame.done:
                self.finish_reason = frame.finish_reason
            out.append(TokenChunk(tuple(frame.ids), text, frame.done, frame.finish_reason,
                                  tuple(frame.tool_calls)))
        return out

    @property
    def renders_text(self) -> bool:
        """Whether ids become text: False when no map was named or pinned."""
        return self._detok is not None

    @property
    def stats(self) -> StreamStats:
        return StreamStats(
            path=self._path, stream_format=self._format.value,
            content_type=self._head.content_type, content_encoding=self._head.content_encoding,
            zstd_dict=self._head.zstd_dict, tokenizer_map=self._head.tokenizer_map,
            wire_bytes=self.wire_bytes, body_bytes=self.body_bytes, frames=self.frames,
            tokens=self.tokens,
        )


# -- the shared client core ----------------------------------------------------------------


class BaseCodecClient:
    """Configuration, caches and every decision of the Codec client; no I/O.

    ``tokenizer_map`` pins a map: every response must name it in ``Codec-Tokenizer-Map``
    (mismatch is fatal, §2.7). ``map_hash`` pins by hash only (fetched from the origin's
    content-addressed sibling when needed). ``map_id`` names the map to discover for
    tokenizing Path B/C prompts. With none of these, the map a response names is fetched
    by hash and verified, and a text prompt for Path B/C uses the map ``index.json`` lists.

    ``allow_http``: discovery is https only (§6.1); ``None`` allows http for a loopback
    ``base_url`` (local development), and nothing else.
    """

    def __init__(
        self,
        base_url: str,
        *,
        stream_format: StreamFormat | str = StreamFormat.MSGPACK,
        tokenizer_map: TokenizerMap | None = None,
        map_hash: str | None = None,
        map_id: str | None = None,
        model: str | None = None,
        client_version: str = DEFAULT_CLIENT_VERSION,
        accept_encoding: str | None = None,
        zstd: bool = False,
        zstd_dicts: Iterable[ZstdDict] = (),
        allow_http: bool | None = None,
        max_decompressed: int = DEFAULT_MAX_DECOMPRESSED,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        cache: DiscoveryCache | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.stream_format = StreamFormat(stream_format)
        self.model = model
        self.client_version = client_version
        self.cache = cache if cache is not None else DiscoveryCache()
        for zdict in zstd_dicts:
            self.cache.dicts.put(zdict)
        self._zstd = zstd
        self._accept_encoding = accept_encoding
        self.allow_http = is_loopback(base_url) if allow_http is None else allow_http
        self.max_decompressed = max_decompressed
        self.max_frame_bytes = max_frame_bytes
        self.map_id = map_id
        self.pinned_hash = parse_hash(map_hash) if map_hash else None
        if tokenizer_map is not None:
            if self.pinned_hash is not None and tokenizer_map.hash != self.pinned_hash:
                raise LocalProtocolError("tokenizer_map and map_hash name different maps")
            self.pinned_hash = tokenizer_map.hash
            self.cache.maps.put(tokenizer_map)
        self._tokenizers: dict[str, Tokenizer] = {}

    @property
    def origin(self) -> str:
        parts = urlsplit(self.base_url)
        return f"{parts.scheme}://{parts.netloc}"

    # -- requests --------------------------------------------------------------------------

    def accept_encoding(self) -> str:
        if self._accept_encoding is not None:
            return self._accept_encoding
        return default_accept_encoding(zstd=self._zstd or len(self.cache.dicts) > 0)

    def _options(self, prompt: str | Iterable[int], *, max_tokens: int = 256,
                 temperature: float | None = None, stop: Iterable[str] = (),
                 seed: int | None = None, path: str | None = None,
                 extra: Mapping[str, Any] | None = None) -> CompletionOptions:
        chosen = path or ("a" if isinstance(prompt, str) else "b")
        if chosen not in PATHS:
            raise LocalProtocolError(f"path must be one of {PATHS}, got {chosen!r}")
        if chosen == "a" and not isinstance(prompt, str):
            raise LocalProtocolError("Path A sends a text prompt; use path 'b' or 'c' for ids")
        value = prompt if isinstance(prompt, str) else tuple(int(i) for i in prompt)
        return CompletionOptions(value, max_tokens, temperature, tuple(stop), seed, chosen,
                                 dict(extra or {}))

    def _headers(self, content_type: str) -> dict[str, str]:
        headers = {
            "Content-Type": content_type,
            "Accept": self.stream_format.content_type,
            "Accept-Encoding": self.accept_encoding(),
            CLIENT_VERSION_HEADER: self.client_version,
        }
        if self.pinned_hash is not None:
            headers["X-Codec-Map"] = self.pinned_hash
        return headers

    def _request(
        self, opts: CompletionOptions, path: str, ids: tuple[int, ...] | None
    ) -> tuple[str, dict[str, str], bytes]:
        """``(url, headers, body)`` for one attempt on ``path`` (ids given for B and C)."""
        if path == "c":
            assert ids is not None
            fmt = StreamFormat.PROTOBUF if self.stream_format is StreamFormat.PROTOBUF \
                else StreamFormat.MSGPACK
            req = CodecRequest(prompt_ids=ids, max_tokens=opts.max_tokens,
                               temperature=opts.temperature, stop=opts.stop,
                               stream_format=self.stream_format.value)
            return (f"{self.base_url}/v1/completions/codec", self._headers(fmt.content_type),
                    encode_request(req, fmt))
        body: dict[str, Any] = {
            "prompt": opts.prompt if path == "a" else list(ids or ()),
            "max_tokens": opts.max_tokens,
            "stream": True,
            "stream_format": self.stream_format.value,
        }
        if self.model is not None:
            body["model"] = self.model
        if opts.temperature is not None:
            body["temperature"] = opts.temperature
        if opts.stop:
            body["stop"] = list(opts.stop)
        if opts.seed is not None:
            body["seed"] = opts.seed
        body.update(opts.extra)
        return (f"{self.base_url}/v1/completions", self._headers("application/json"),
                json.dumps(body, ensure_ascii=False).encode("utf-8"))

    # -- maps --------------------------------------------------------------------------------

    def _prompt_map_flow(self) -> Flow:
        """The map that tokenizes a Path B/C text prompt."""
        if self.pinned_hash is not None:
            if (hit := self.cache.maps.get(self.pinned_hash)) is not None:
                return hit
            if self.map_id is not None:
                return (yield from map_flow(self.origin, self.map_id,
                                            expected_hash=self.pinned_hash,
                                            allow_http=self.allow_http, cache=self.cache))
            return (yield from map_by_hash_flow(self.origin, self.pinned_hash,
                                                allow_http=self.allow_http, cache=self.cache))
        if self.map_id is not None:
            return (yield from map_flow(self.origin, self.map_id, allow_http=self.allow_http,
                                        cache=self.cache))
        entries = yield from index_flow(self.origin, allow_http=self.allow_http)
        if len(entries) != 1:
            raise DiscoveryError(
                f"{self.origin} lists {len(entries)} maps; pass map_id= or tokenizer_map="
            )
        return (yield from map_by_hash_flow(self.origin, entries[0][1],
                                            allow_http=self.allow_http, cache=self.cache))

    def _tokenize(self, tmap: TokenizerMap, text: str) -> tuple[int, ...]:
        tok = self._tokenizers.get(tmap.hash)
        if tok is None:
            # defer: the first prompts encode on the exact Python engine while tiktoken's
            # core is built on a background thread (map load-to-ready, BENCHMARKS.md).
            tok = self._tokenizers[tmap.hash] = Tokenizer.from_map(tmap, defer=in_background)
        return tuple(tok.encode(text))

    # -- responses ---------------------------------------------------------------------------

    def _error_status(self, status: int, headers: Mapping[str, str], body: bytes,
                      url: str) -> None:
        """Raise the typed error for a non-200 answer (§2.6, §2.7, §5.4)."""
        required = _parse_426(status, headers, body)  # raises for an unrecognised 426 body
        if required is not None:
            raise required
        raise CodecHTTPError(status, body, url)

    def _check_head(self, headers: Mapping[str, str], expected_map: str | None) -> ResponseHead:
        """§2.7 on a 200 response; the header names are case-insensitive in httpx."""
        ctype = headers.get("content-type", "")
        want = self.stream_format.content_type
        if ctype.split(";")[0].strip().lower() != want:
            raise ContentTypeMismatch(
                f"asked for {self.stream_format.value} ({want}) but the response is "
                f"{ctype or 'untyped'}; the server may have fallen back to JSON-SSE",
                content_type=ctype, expected=want,
            )
        encoding = (headers.get("content-encoding") or "identity").strip().lower()
        zhdr = headers.get("codec-zstd-dict")
        zstd_dict = None
        if encoding != "zstd":
            if zhdr is not None:
                raise ZstdDictError(f"Codec-Zstd-Dict on a {encoding} response (§2.7)")
        elif not zhdr:
            raise ZstdDictError("Content-Encoding: zstd without Codec-Zstd-Dict (§2.7)")
        else:
            zstd_dict = _header_hash(zhdr, "Codec-Zstd-Dict", ZstdDictError)
        tmap_hdr = headers.get("codec-tokenizer-map")
        tmap_hash = None
        if tmap_hdr is not None:
            tmap_hash = _header_hash(tmap_hdr, "Codec-Tokenizer-Map", RemoteProtocolError)
            if expected_map is not None and tmap_hash != expected_map:
                raise TokenizerMapMismatch(
                    f"response is for map {tmap_hash}, expected {expected_map} (§2.7: fatal)"
                )
        return ResponseHead(ctype, encoding, zstd_dict, tmap_hash)

    def _needs_flow(self, head: ResponseHead, prompt_map: TokenizerMap | None) -> Flow:
        """Fetch what the head names and we lack; returns ``(dict or None, map or None)``."""
        zdict = None
        if head.zstd_dict is not None:
            zdict = self.cache.dicts.get(head.zstd_dict)
            if zdict is None:
                url = _dict_url(prompt_map, head.zstd_dict)
                zdict = yield from dict_flow(self.origin, head.zstd_dict, url=url,
                                             allow_http=self.allow_http, cache=self.cache)
        tmap = prompt_map
        wanted = head.tokenizer_map or self.pinned_hash
        if tmap is None and wanted is not None:
            tmap = self.cache.maps.get(wanted)
            if tmap is None:
                tmap = yield from map_by_hash_flow(self.origin, wanted,
                                                   allow_http=self.allow_http, cache=self.cache)
        return zdict, tmap

    def _decoder(self, path: str, head: ResponseHead, zdict: ZstdDict | None,
                 tmap: TokenizerMap | None,
                 record: Callable[[bytes], None] | None) -> ResponseDecoder:
        decompressor = new_decompressor(head.content_encoding, dictionary=zdict,
                                        max_output=self.max_decompressed)
        detok = Detokenizer(tmap).stream() if tmap is not None else None
        return ResponseDecoder(path=path, stream_format=self.stream_format, head=head,
                               decompressor=decompressor, detokenizer=detok,
                               max_frame_bytes=self.max_frame_bytes, record=record)


def _header_hash(value: str, name: str, error: type[RemoteProtocolError]) -> str:
    try:
        return parse_hash(value.strip())
    except HashFormatError as exc:
        raise error(f"bad {name} value {value!r}") from exc


def _dict_url(tmap: TokenizerMap | None, digest: str) -> str | None:
    """The URL a map's ``zstd_dictionaries`` gives for ``digest`` (§3.7), if any."""
    if tmap is None:
        return None
    for entry in tmap.zstd_dictionaries:
        try:
            if parse_hash(entry.get("hash", "")) == digest:
                return entry.get("url")
        except HashFormatError:
            continue
    return None
