"""The Codec streaming client: sync and async twins that only do I/O (STYLE §3, §6 items 11-12).

Every decision (request shape, header checks, discovery, caches, decoding) is in
:class:`~tokenwire.client._base.BaseCodecClient`; the two classes below repeat the same
I/O steps line for line. Both take ``transport=`` (any httpx transport) or a ready
``http_client=``.

::

    with CodecClient("http://127.0.0.1:8080", stream_format="msgpack") as client:
        with client.stream("Once upon a time", max_tokens=64) as stream:
            for chunk in stream:
                print(chunk.text, end="", flush=True)
        print(stream.stats)

Bodies are read with ``iter_raw``/``aiter_raw`` so httpx never decodes them: our own bounded
decompressor does (codec-spec §9.1 item 23, §10 item 4), and ``wire_bytes`` counts what
really crossed the wire.

``timeout=`` bounds each wait (httpx's: a connect, one read); ``deadline=`` (seconds, default
an hour, ``None`` for none) bounds a whole ``stream()`` / ``complete()`` call, discovery and
body included (:mod:`tokenwire.client.deadline`), so a server that drips bytes ends in
:class:`~tokenwire.errors.CodecDeadlineExceeded`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import httpx

from tokenwire.client._base import (
    MAX_ERROR_BODY,
    BaseCodecClient,
    Completion,
    CompletionOptions,
    ResponseDecoder,
    StreamStats,
    TokenChunk,
)
from tokenwire.client.bounded_read import aread_error_body, read_error_body
from tokenwire.client.deadline import DEFAULT_DEADLINE_S, Deadline
from tokenwire.client.discovery import Flow, adrive, drive
from tokenwire.codec.finish_reason import ClientFinishReason, normalize_finish_reason
from tokenwire.codec.maps import TokenizerMap
from tokenwire.errors import CodecTransportError

__all__ = ["AsyncCodecClient", "AsyncCodecStream", "CodecClient", "CodecStream"]

DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=10.0)


class _StreamBase:
    def __init__(self, decoder: ResponseDecoder, deadline: Deadline) -> None:
        self._decoder = decoder
        self._deadline = deadline
        self.ids: list[int] = []
        self.text_parts: list[str] = []

    def _keep(self, chunk: TokenChunk) -> TokenChunk:
        self.ids.extend(chunk.ids)
        self.text_parts.append(chunk.text)
        return chunk

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    @property
    def renders_text(self) -> bool:
        """False when the response names no tokenizer map (no ``Codec-Tokenizer-Map`` and
        none pinned): the ids cannot be rendered and every chunk's ``text`` is empty, so a
        caller that shows text must say so rather than print nothing."""
        return self._decoder.renders_text

    @property
    def stats(self) -> StreamStats:
        return self._decoder.stats

    @property
    def raw_finish_reason(self) -> str | None:
        return self._decoder.finish_reason

    @property
    def finish_reason(self) -> ClientFinishReason | None:
        """Normalised (§5.7): unknown values become ``error``."""
        return normalize_finish_reason(self._decoder.finish_reason)

    def completion(self) -> Completion:
        return Completion(tuple(self.ids), self.text, self.finish_reason,
                          self.raw_finish_reason, self.stats)


def _broke(exc: httpx.HTTPError, deadline: Deadline) -> CodecTransportError:
    deadline.check()  # a read cut short by the deadline is the deadline's failure
    if isinstance(exc, httpx.ReadTimeout):  # httpx says only "timed out"
        waited = exc.request.extensions.get("timeout", {}).get("read")
        return CodecTransportError(f"stream broke: the server sent nothing for {waited:g} s "
                                   "(the client's read timeout)")
    return CodecTransportError(f"stream broke: {exc}")


class CodecStream(_StreamBase):
    """An open response; iterating yields :class:`TokenChunk` values as frames arrive."""

    def __init__(self, response: httpx.Response, decoder: ResponseDecoder,
                 deadline: Deadline) -> None:
        super().__init__(decoder, deadline)
        self._response = response

    def __iter__(self) -> Iterator[TokenChunk]:
        try:
            for raw in self._response.iter_raw():
                self._deadline.check()
                for chunk in self._decoder.feed(raw):
                    yield self._keep(chunk)
        except httpx.HTTPError as exc:
            raise _broke(exc, self._deadline) from exc
        for chunk in self._decoder.feed_eof():
            yield self._keep(chunk)


class AsyncCodecStream(_StreamBase):
    """The async twin of :class:`CodecStream`."""

    def __init__(self, response: httpx.Response, decoder: ResponseDecoder,
                 deadline: Deadline) -> None:
        super().__init__(decoder, deadline)
        self._response = response

    async def __aiter__(self) -> AsyncIterator[TokenChunk]:
        raws = self._response.aiter_raw()
        try:
            while True:
                with self._deadline.cancelling():  # around the read only, never a yield
                    raw = await anext(raws, None)
                if raw is None:
                    break
                for chunk in self._decoder.feed(raw):
                    yield self._keep(chunk)
        except httpx.HTTPError as exc:
            raise _broke(exc, self._deadline) from exc
        for chunk in self._decoder.feed_eof():
            yield self._keep(chunk)


class CodecClient(BaseCodecClient):
    """Sync Codec client. See :class:`BaseCodecClient` for the options."""

    def __init__(self, base_url: str, *, transport: httpx.BaseTransport | None = None,
                 http_client: httpx.Client | None = None,
                 timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
                 deadline: float | None = DEFAULT_DEADLINE_S, **options: Any) -> None:
        super().__init__(base_url, **options)
        Deadline(deadline)  # a bad value fails here, not at the first request
        self.deadline = deadline
        self._own = http_client is None
        self._http = http_client or httpx.Client(transport=transport, timeout=timeout)

    def close(self) -> None:
        if self._own:
            self._http.close()

    def __enter__(self) -> CodecClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _drive(self, flow: Flow, deadline: Deadline) -> Any:
        return drive(flow, self._http, deadline)

    def _post(self, url: str, headers: dict[str, str], body: bytes,
              deadline: Deadline) -> httpx.Response:
        try:
            request = self._http.build_request("POST", url, headers=headers, content=body,
                                               timeout=deadline.timeout(self._http.timeout))
            return self._http.send(request, stream=True)
        except httpx.HTTPError as exc:
            deadline.check()
            raise CodecTransportError(f"POST {url} failed: {exc}") from exc

    def _read_error(self, resp: httpx.Response, deadline: Deadline) -> bytes:
        try:
            return read_error_body(resp, MAX_ERROR_BODY, deadline)
        except httpx.HTTPError as exc:
            deadline.check()
            raise CodecTransportError(f"reading a {resp.status_code} body failed: {exc}") from exc
        finally:
            resp.close()

    def _send(self, opts: CompletionOptions, ids: tuple[int, ...] | None,
              deadline: Deadline) -> tuple[httpx.Response, str]:
        path = opts.path
        while True:
            url, headers, body = self._request(opts, path, ids)
            resp = self._post(url, headers, body, deadline)
            if resp.status_code == 200:
                return resp, path
            error_body = self._read_error(resp, deadline)
            if resp.status_code == 404 and path == "c":  # §2.1: fall back to Path B
                path = "b"
                continue
            self._error_status(resp.status_code, resp.headers, error_body, url)

    @contextmanager
    def stream(self, prompt: str | Iterable[int], *, max_tokens: int = 256,
               temperature: float | None = None, stop: Iterable[str] = (),
               seed: int | None = None, path: str | None = None,
               record: Callable[[bytes], None] | None = None,
               **extra: Any) -> Iterator[CodecStream]:
        opts = self._options(prompt, max_tokens=max_tokens, temperature=temperature, stop=stop,
                             seed=seed, path=path, extra=extra)
        deadline = Deadline(self.deadline)
        prompt_map: TokenizerMap | None = None
        ids = opts.prompt if isinstance(opts.prompt, tuple) else None
        if opts.path != "a" and ids is None:
            prompt_map = self._drive(self._prompt_map_flow(), deadline)
            ids = self._tokenize(prompt_map, str(opts.prompt))
        resp, used = self._send(opts, ids, deadline)
        try:
            expected = prompt_map.hash if prompt_map is not None else self.pinned_hash
            head = self._check_head(resp.headers, expected)
            zdict, tmap = self._drive(self._needs_flow(head, prompt_map), deadline)
            yield CodecStream(resp, self._decoder(used, head, zdict, tmap, record), deadline)
        finally:
            resp.close()

    def complete(self, prompt: str | Iterable[int], **kwargs: Any) -> Completion:
        """Stream a whole completion and return it."""
        with self.stream(prompt, **kwargs) as stream:
            for _ in stream:
                pass
        return stream.completion()


class AsyncCodecClient(BaseCodecClient):
    """Async Codec client; the twin of :class:`CodecClient`."""

    def __init__(self, base_url: str, *, transport: httpx.AsyncBaseTransport | None = None,
                 http_client: httpx.AsyncClient | None = None,
                 timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
                 deadline: float | None = DEFAULT_DEADLINE_S, **options: Any) -> None:
        super().__init__(base_url, **options)
        Deadline(deadline)
        self.deadline = deadline
        self._own = http_client is None
        self._http = http_client or httpx.AsyncClient(transport=transport, timeout=timeout)

    async def aclose(self) -> None:
        if self._own:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncCodecClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _drive(self, flow: Flow, deadline: Deadline) -> Any:
        return await adrive(flow, self._http, deadline)

    async def _post(self, url: str, headers: dict[str, str], body: bytes,
                    deadline: Deadline) -> httpx.Response:
        try:
            request = self._http.build_request("POST", url, headers=headers, content=body,
                                               timeout=deadline.timeout(self._http.timeout))
            with deadline.cancelling():  # endless 1xx heads included
                return await self._http.send(request, stream=True)
        except httpx.HTTPError as exc:
            deadline.check()
            raise CodecTransportError(f"POST {url} failed: {exc}") from exc

    async def _read_error(self, resp: httpx.Response, deadline: Deadline) -> bytes:
        try:
            with deadline.cancelling():
                return await aread_error_body(resp, MAX_ERROR_BODY, deadline)
        except httpx.HTTPError as exc:
            deadline.check()
            raise CodecTransportError(f"reading a {resp.status_code} body failed: {exc}") from exc
        finally:
            await resp.aclose()

    async def _send(self, opts: CompletionOptions, ids: tuple[int, ...] | None,
                    deadline: Deadline) -> tuple[httpx.Response, str]:
        path = opts.path
        while True:
            url, headers, body = self._request(opts, path, ids)
            resp = await self._post(url, headers, body, deadline)
            if resp.status_code == 200:
                return resp, path
            error_body = await self._read_error(resp, deadline)
            if resp.status_code == 404 and path == "c":  # §2.1: fall back to Path B
                path = "b"
                continue
            self._error_status(resp.status_code, resp.headers, error_body, url)

    @asynccontextmanager
    async def stream(self, prompt: str | Iterable[int], *, max_tokens: int = 256,
                     temperature: float | None = None, stop: Iterable[str] = (),
                     seed: int | None = None, path: str | None = None,
                     record: Callable[[bytes], None] | None = None,
                     **extra: Any) -> AsyncIterator[AsyncCodecStream]:
        opts = self._options(prompt, max_tokens=max_tokens, temperature=temperature, stop=stop,
                             seed=seed, path=path, extra=extra)
        deadline = Deadline(self.deadline)
        prompt_map: TokenizerMap | None = None
        ids = opts.prompt if isinstance(opts.prompt, tuple) else None
        if opts.path != "a" and ids is None:
            prompt_map = await self._drive(self._prompt_map_flow(), deadline)
            ids = self._tokenize(prompt_map, str(opts.prompt))
        resp, used = await self._send(opts, ids, deadline)
        try:
            expected = prompt_map.hash if prompt_map is not None else self.pinned_hash
            head = self._check_head(resp.headers, expected)
            zdict, tmap = await self._drive(self._needs_flow(head, prompt_map), deadline)
            yield AsyncCodecStream(resp, self._decoder(used, head, zdict, tmap, record),
                                   deadline)
        finally:
            await resp.aclose()

    async def complete(self, prompt: str | Iterable[int], **kwargs: Any) -> Completion:
        async with self.stream(prompt, **kwargs) as stream:
            async for _ in stream:
                pass
        return stream.completion()
