"""The heads of the lean transport's HTTP/1.1 exchanges (``http_transport.py``): the request
head it writes, checked as h11 checked it, and the response head read by llhttp (httptools,
the parser under uvicorn and Node). Split from the transport for its size; nothing else
uses them."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

import httptools
import httpx

from tokenwire.gateway.upstreams.content_coding import add_coding

__all__ = ["Head", "MalformedAnswer", "head_bytes", "parse_head", "request_bytes"]


class MalformedAnswer(httpx.RemoteProtocolError):
    """Bytes that break HTTP/1.1 (a head llhttp refuses or too large, bad chunk framing):
    the same answer again would break the same way, so the failure is final
    (``failures.failure_from_exception``), not the transient hang-up that a plain
    ``RemoteProtocolError`` (a connection closed before or during the answer) is."""


# -- the request head ----------------------------------------------------------------------

#: What h11 checked of every request head this transport wrote before: a header name is an
#: RFC 9110 token; a value holds no control character but tab and neither starts nor ends
#: with whitespace; the target has no whitespace or control character. A value that breaks
#: them would be a caller's text spliced into the head as headers of its own.
_NAME = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VALUE = re.compile(rb"(?:[\x21-\x7e\x80-\xff](?:[\t\x20-\x7e\x80-\xff]*[\x21-\x7e\x80-\xff])?)?")
_TARGET = re.compile(rb"[\x21-\x7e\x80-\xff]+")


def head_bytes(method: bytes, target: bytes, fields: Iterable[tuple[bytes, bytes]],
               request: httpx.Request | None = None) -> tuple[bytes, bool]:
    """The request line and ``fields``, each checked, up to (not including) the blank line
    that ends the head; and whether they frame the body chunked. ``request`` is only named
    in the errors (the lean path has none)."""
    if not _TARGET.fullmatch(target):
        raise httpx.LocalProtocolError(f"invalid request target {target!r}", request=request)
    parts = [method, b" ", target, b" HTTP/1.1\r\n"]
    chunked = False
    for name, value in fields:
        if not _NAME.fullmatch(name) or not _VALUE.fullmatch(value):
            raise httpx.LocalProtocolError(f"invalid request header {name!r}",
                                           request=request)
        chunked = chunked or (name.lower() == b"transfer-encoding"
                              and value.lower() == b"chunked")
        parts += [name, b": ", value, b"\r\n"]
    return b"".join(parts), chunked


def request_bytes(method: bytes, target: bytes, fields: Iterable[tuple[bytes, bytes]],
                  body: bytes, request: httpx.Request | None = None) -> bytes:
    """The request as it goes on the wire: head and body in one write."""
    head, chunked = head_bytes(method, target, fields, request)
    if not chunked:
        return b"".join((head, b"\r\n", body))
    # httpx's framing of a streamed request body, which ``aread`` joined
    chunk = b"%x\r\n%s\r\n" % (len(body), body) if body else b""
    return b"".join((head, b"\r\n", chunk, b"0\r\n\r\n"))


# -- the response head ---------------------------------------------------------------------


class Head:
    """A response head as llhttp reads it (the callbacks of ``HttpResponseParser``)."""

    def __init__(self) -> None:
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.status = 0
        self.keep_alive = False
        self.length: int | None = None  # Content-Length, when the head gives one
        self.chunked = False
        #: The Content-Encoding other than identity, lower case ("" when none; repeated
        #: ones joined, which ``content_coding`` refuses): decoded by ``content_coding``.
        self.coding = ""
        #: Content-Type ("" when none; repeated ones joined as ``httpx.Headers.get`` joins
        #: them): read here, the SSE adapters build no ``httpx.Headers`` for a good answer.
        self.content_type = ""

    def on_status(self, status: bytes) -> None:
        self.reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        # llhttp keeps the trailing whitespace RFC 9110 §5.5 excludes from a value.
        self.headers.append((name, value.rstrip(b" \t")))


def parse_head(raw: bytes, close: Callable[[], None], request: httpx.Request | None) -> Head:
    """``raw``: a whole head, through its blank line (llhttp is strict: CRLF line ends, so
    the first blank line is the end). The body is framed by the caller, not by llhttp."""
    head = Head()
    parser = httptools.HttpResponseParser(head)
    try:
        parser.feed_data(raw)
    except httptools.HttpParserUpgrade as exc:  # a 101: no upgrade was asked for
        close()
        raise MalformedAnswer(f"unexpected {parser.get_status_code()} Switching Protocols",
                              request=request) from exc
    except httptools.HttpParserError as exc:
        close()
        raise MalformedAnswer(f"invalid response head: {exc}", request=request) from exc
    head.status = parser.get_status_code()
    # False when the body runs to the connection's end (no length, not chunked).
    head.keep_alive = parser.should_keep_alive()
    for name, value in head.headers:
        lower = name.lower()
        if lower == b"transfer-encoding":
            if value.lower() != b"chunked":  # h11's rule: the one coding it can frame
                close()
                raise MalformedAnswer(f"unsupported Transfer-Encoding {value!r}",
                                      request=request)
            head.chunked = True
        elif lower == b"content-length":  # llhttp checked digits and duplicates
            head.length = int(value)
        elif lower == b"content-encoding":
            head.coding = add_coding(head.coding, value.decode("latin-1"))
        elif lower == b"content-type":
            text = value.decode("latin-1")
            head.content_type = f"{head.content_type}, {text}" if head.content_type else text
    return head
