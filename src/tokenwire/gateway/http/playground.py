"""``GET /``: the playground page, three static files under ``tokenwire/data/playground/``.

No build step and no external asset: ``index.html``, ``playground.js`` (the page's own
msgpack and protobuf frame decoders, the map check with ``crypto.subtle``, the detokenizer,
the status view and its charts) and ``playground.css``. Everything the page shows comes from
the API itself (``/v1/models``, ``/v1/chat/completions``, ``/.well-known/codec/``,
``/health``, ``/metrics``), called with the key the user types in, which the page keeps in
``sessionStorage`` and sends as ``Authorization: Bearer``, never in a URL.

The files hold no data, so :mod:`.security` serves them without a key (a browser cannot send
a bearer header when it navigates); every call the page makes needs one, as any client's.
A strict Content-Security-Policy (:data:`CSP`) allows only the page's own script, style and
same-origin calls: no inline script, no framing, no other origin.

The coding of a stream is chosen with ``Tokenwire-Accept-Encoding``
(:data:`~.generation.ACCEPT_ENCODING_HEADER`): page scripts cannot set ``Accept-Encoding``.
For gzip the page also sends ``Tokenwire-Raw-Body: 1`` and gets the coding named in
``Tokenwire-Content-Encoding`` instead of ``Content-Encoding``: the browser would otherwise
inflate the body before the page sees a byte. The page counts the bytes as sent and inflates
them with ``DecompressionStream``. Brotli has no ``DecompressionStream`` format in Chromium
(150 refuses ``"brotli"``), so ``br`` goes the standard way (``Content-Encoding: br``,
decoded by the browser; browsers accept it only in a secure context) and the page takes its
wire size from Resource Timing's ``encodedBodySize`` when the response has ended.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

__all__ = ["CSP", "PAGE_PATHS", "playground_routes"]

#: Only this origin's own files and calls; ``data:`` images are not used today but keep a
#: future inline icon from needing a policy change. ``frame-ancestors 'none'``: never framed.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
       "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
#: Served path -> (file under data/playground/, media type).
_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/playground/playground.js": ("playground.js", "text/javascript; charset=utf-8"),
    "/playground/playground.css": ("playground.css", "text/css; charset=utf-8"),
}
#: The paths :mod:`.security` serves without a key (GET and HEAD only).
PAGE_PATHS = frozenset(_FILES)


@cache
def _read(name: str) -> bytes:
    return (resources.files("tokenwire") / "data" / "playground" / name).read_bytes()


async def _page_file(request: Request) -> Response:
    name, media = _FILES[request.url.path]
    return Response(_read(name), media_type=media, headers={
        "Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache",
        "Cross-Origin-Opener-Policy": "same-origin"})


def playground_routes() -> list[BaseRoute]:
    return [Route(path, _page_file, methods=["GET", "HEAD"]) for path in _FILES]
