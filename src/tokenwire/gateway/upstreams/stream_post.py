"""The SSE adapters' one way to POST a request and read its answer's body.

:class:`stream_post` sends through the lean transport's :meth:`~.http_transport.
LeanTransport.post` when the upstream client has one (no httpx ``Request`` or ``Response``
built, the body read straight off the connection), else through httpx's ``client.stream``
(a proxy's transport, a test's ``MockTransport``). Either way :meth:`stream_post.reader`
gives the body as a :class:`BodyReader` whose reads can be cancelled without losing a byte,
which is what lets ``sse_http.SSEUpstreamStream`` read it in its consumer's task.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Protocol

import httpx

from tokenwire.gateway.upstreams.content_coding import add_coding
from tokenwire.gateway.upstreams.http_heads import head_bytes, request_bytes
from tokenwire.gateway.upstreams.http_transport import (
    MAX_BUFFERED_BYTES,
    LeanAnswer,
    UpstreamClient,
    decoded_body,
)
from tokenwire.gateway.wakeups import wake

__all__ = ["BodyReader", "body_pieces", "post_bytes", "post_fields", "stream_post"]

#: Distinct (target, headers) heads an upstream client keeps (a few per upstream: its
#: paths, and per-request keys where a caller forwards them); past it they start over.
MAX_POST_HEADS = 64


class BodyReader(Protocol):
    """An answer's body as an SSE stream reads it: :meth:`read` may be cancelled at any
    time without losing a byte."""

    @property
    def ended(self) -> bool:
        """The body's end was read: :meth:`read` returns ``b""`` without waiting."""

    async def read(self) -> bytes:
        """The next bytes, ``b""`` at the end (the connection is then given back)."""

    def close(self) -> None:
        """Stop reading: the connection is pooled if the end was read, else closed (the
        upstream sees the disconnect)."""


def post_fields(defaults: httpx.Headers, url: httpx.URL, headers: Mapping[str, str],
                length: int | None) -> list[tuple[bytes, bytes]]:
    """The head httpx would send for ``client.stream("POST", url, content=<length bytes>,
    headers=headers)``: ``Host``, the client's headers (``defaults``: its own ``Accept``,
    ``User-Agent``... and the upstream's auth), each replaced by a request header of the
    same name, the other request headers, then ``Content-Length`` (``length`` None: left for
    the caller). Values are encoded as httpx encodes them (ASCII); ``http_heads`` checks
    every name and value."""
    given = {name.lower(): (name.encode("ascii"), value.encode("ascii"))
             for name, value in headers.items()}
    framed = "content-length" in given
    fields = [] if "host" in given else [(b"Host", url.netloc)]
    for name, value in defaults.raw:
        lower = name.decode("latin-1").lower()
        framed = framed or lower == "content-length"
        fields.append(given.pop(lower, None) or (name, value))
    fields += given.values()
    if not framed and length is not None:
        fields.append((b"Content-Length", b"%d" % length))
    return fields


def post_bytes(client: UpstreamClient, url: httpx.URL, headers: Mapping[str, str],
               body: bytes) -> bytes:
    """The whole POST as :func:`post_fields` and ``http_heads.request_bytes`` write it. Its
    head up to ``Content-Length`` is the same for every request of a target and headers, so
    it is built and checked once (``client.post_heads``): 72 -> 35 µs per request with the
    caches cold, on the way to the first token (BENCHMARKS.md, "Session of 2026-12-05
    (6)"). A caller that frames the body itself (its own ``Content-Length`` or
    ``Transfer-Encoding``) gets it built each time."""
    key = (url.raw_path, url.netloc, tuple(headers.items()))
    head = client.post_heads.get(key)
    if head is None:
        fields = post_fields(client.headers, url, headers, None)
        if any(name.lower() in (b"content-length", b"transfer-encoding") for name, _ in fields):
            return request_bytes(b"POST", url.raw_path,
                                 post_fields(client.headers, url, headers, len(body)), body)
        head = head_bytes(b"POST", url.raw_path, fields)[0]
        if len(client.post_heads) >= MAX_POST_HEADS:
            client.post_heads.clear()
        client.post_heads[key] = head
    return b"%sContent-Length: %d\r\n\r\n%s" % (head, len(body), body)


class stream_post:  # a lower-case name: used as ``async with``, like ``client.stream``
    """``async with stream_post(client, url, body, headers) as answer``: the one way the SSE
    adapters POST. On an :class:`UpstreamClient` over the lean transport the answer is a
    :class:`LeanAnswer`; on any other client (httpx's transport, a test's
    ``MockTransport``) it is ``client.stream``'s ``httpx.Response``. Either way the answer
    is closed on exit (an unfinished body closes its connection), or by :meth:`aclose`;
    :meth:`reader` reads its body with cancel-safe reads."""

    def __init__(self, client: httpx.AsyncClient, url: httpx.URL, body: bytes,
                 headers: Mapping[str, str]) -> None:
        self._client, self._url, self._body, self._headers = client, url, body, headers
        self._answer: LeanAnswer | None = None
        self._httpx: Any = None  # client.stream's context manager
        self._response: httpx.Response | None = None
        self._closed = False

    async def __aenter__(self) -> LeanAnswer | httpx.Response:
        lean = getattr(self._client, "lean", None)
        if lean is None:
            manager = self._client.stream("POST", self._url, content=self._body,
                                          headers=self._headers)
            self._response = await manager.__aenter__()
            self._httpx = manager  # entered: exited by aclose
            return self._response
        client = self._client
        self._answer = await lean.post(
            self._url, post_bytes(client, self._url, self._headers, self._body),
            client.timeout.as_dict())
        return self._answer

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the answer (once): pooled if its body's end was read, else closed."""
        if self._closed:
            return
        self._closed = True
        if self._answer is not None:
            self._answer.close()
        elif self._httpx is not None:
            await self._httpx.__aexit__(None, None, None)

    @property
    def content_type(self) -> str:
        """The answer's ``Content-Type`` ("" when it has none)."""
        if self._answer is not None:
            return self._answer.content_type
        assert self._response is not None, "content_type before the answer's head"
        return self._response.headers.get("content-type", "")

    def reader(self) -> BodyReader:
        """The answer's body for an SSE stream: the lean body itself, else (httpx's
        response, or a body with a Content-Encoding) a :class:`_Pump` over its bytes."""
        if self._answer is not None and (body := self._answer.reader()) is not None:
            return body
        resp = self._answer if self._answer is not None else self._response
        assert resp is not None, "reader() before the answer's head"
        return _Pump(body_pieces(resp), self.aclose)


class _Pump:
    """Cancel-safe reads of an async iterator of body bytes (httpx's decoded body): a task
    reads ahead, at most :data:`MAX_BUFFERED_BYTES`, then waits for the reader. Only
    answers the lean transport cannot hand over as they are come this way (a test's
    ``MockTransport``, a proxy's httpx transport, a ``Content-Encoding``)."""

    def __init__(self, chunks: AsyncIterator[bytes],
                 closer: Callable[[], Awaitable[None]]) -> None:
        self._chunks, self._closer = chunks, closer
        self._buffered: deque[bytes] = deque()
        self._size = 0
        self._at_end = False
        self._error: BaseException | None = None
        self._wake: asyncio.Future[None] | None = None  # the reader, waiting for bytes
        self._room: asyncio.Future[None] | None = None  # the task, waiting for room
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        try:
            async for chunk in self._chunks:
                self._buffered.append(chunk)
                self._size += len(chunk)
                wake(self._wake)
                while self._size > MAX_BUFFERED_BYTES:
                    self._room = asyncio.get_running_loop().create_future()
                    await self._room
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the reader raises it (httpx's errors)
            self._error = exc
        finally:
            self._at_end = True
            wake(self._wake)
            await self._closer()

    @property
    def ended(self) -> bool:
        return self._at_end and not self._buffered and self._error is None

    async def read(self) -> bytes:
        while not self._buffered:
            if self._error is not None:
                raise self._error
            if self._at_end:
                return b""
            self._wake = asyncio.get_running_loop().create_future()
            await self._wake
        data = self._buffered.popleft()
        self._size -= len(data)
        wake(self._room)
        return data

    def close(self) -> None:
        if not self._task.done():
            self._task.cancel()  # its cleanup closes the answer


def body_pieces(resp: LeanAnswer | httpx.Response) -> AsyncIterator[bytes]:
    """An answer's body as it reads, decoded in bounded pieces (``decoded_body``) whichever
    transport read it. httpx's own decoders (``aiter_bytes``, ``content``) expand a read
    whole; its answers come from a proxy's transport, ``client.get`` and the like."""
    if isinstance(resp, LeanAnswer):
        return resp.aiter_bytes()
    if resp.is_stream_consumed:  # read whole when made (a test's MockTransport answer)
        return _content(resp.content)
    coding = ""
    for value in resp.headers.get_list("content-encoding"):
        coding = add_coding(coding, value)
    return decoded_body(resp.aiter_raw(), coding) if coding else resp.aiter_raw()


async def _content(content: bytes) -> AsyncIterator[bytes]:
    yield content
