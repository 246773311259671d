"""The inference routes, dispatched without Starlette's router and its exception layers.

Every inference request (:func:`~.admission.is_inference`: a POST to one of the five
:data:`~.admission.INFERENCE_PATHS`) used to cross Starlette's ``ServerErrorMiddleware``,
the per-key limits, admission, ``ExceptionMiddleware``, the router (a regular expression per
route until one matched) and two more wrappers of the route, about a dozen calls deep, on
its way to the first token. :class:`GatewayApp` sends those requests straight to the
limits and admission (the two layers that have a job there) and calls the endpoint; the
rest of the app (GETs, ``/tokenize``, discovery, the WebSocket, a GET to an inference path,
which gets its 405) still goes through Starlette's own stack. Measured in BENCHMARKS.md,
"Session of 2026-12-05 (3)".

The endpoints are the router's own (:func:`inference_endpoints` reads them from its
routes), so each is declared once. What the folded layers did is kept:

* a :class:`~tokenwire.errors.TokenwireError` or Starlette ``HTTPException`` raised before
  the response starts is rendered by :func:`~.errors.exception_response`, as
  ``ExceptionMiddleware`` rendered it;
* any other exception goes up to :class:`~.security.CrashBarrier`, which sends the same
  500 body Starlette's ``ServerErrorMiddleware`` sent (``internal_error``) and logs it;
* what the returned response raises goes up there too. Starlette would have rendered a
  ``TokenwireError`` raised by it before its head; none is: the generations' responses
  (``streaming.py``, the Responses SSE) turn a failure before output into an error
  response with its status themselves, and the store hook they await never raises.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.routing import BaseRoute, Route

from tokenwire.errors import TokenwireError
from tokenwire.gateway.http.admission import INFERENCE_PATHS, AdmissionMiddleware, is_inference
from tokenwire.gateway.http.asgi import ASGIApp, Receive, Scope, Send
from tokenwire.gateway.http.errors import exception_response
from tokenwire.gateway.http.limits import KeyLimitsMiddleware

__all__ = ["Endpoint", "GatewayApp", "InferenceRequest", "inference_endpoints"]

#: A route's endpoint: a request in, a response (an ASGI app) out.
Endpoint = Callable[[Request], Awaitable[ASGIApp]]


def inference_endpoints(routes: Sequence[BaseRoute]) -> dict[str, Endpoint]:
    """The POST endpoint of each inference path, from the router's routes."""
    found = {r.path: r.endpoint for r in routes
             if isinstance(r, Route) and r.path in INFERENCE_PATHS and "POST" in (r.methods or ())}
    missing = INFERENCE_PATHS - found.keys()
    if missing:  # a route dropped from create_app: say so at start-up, not as a 404
        raise RuntimeError(f"no POST route for {sorted(missing)}")
    return found


class GatewayApp(Starlette):
    """Starlette, with the inference routes in front of its middleware stack.

    ``limits`` and ``admission`` wrap an app and return it wrapped (the per-key limits and
    admission middlewares, with their settings bound); only inference requests cross them:
    this is where ``is_inference`` is asked, once per request."""

    def __init__(self, *, routes: Sequence[BaseRoute],
                 limits: Callable[[ASGIApp], KeyLimitsMiddleware],
                 admission: Callable[[ASGIApp], AdmissionMiddleware],
                 **kwargs: object) -> None:
        super().__init__(routes=routes, **kwargs)  # type: ignore[arg-type]
        self._endpoints: Mapping[str, Endpoint] = inference_endpoints(routes)
        self._inference = limits(admission(self._endpoint))

    def build_middleware_stack(self) -> ASGIApp:
        stack = super().build_middleware_stack()
        inference = self._inference

        async def dispatch(scope: Scope, receive: Receive, send: Send) -> None:
            if is_inference(scope):  # (``inference_endpoints`` found a route for each)
                await inference(scope, receive, send)
            else:
                await stack(scope, receive, send)

        return dispatch

    async def _endpoint(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = InferenceRequest(scope, receive, send)
        try:
            response = await self._endpoints[scope["path"]](request)
        except (TokenwireError, HTTPException) as exc:
            response = await exception_response(request, exc)
        await response(scope, receive, send)


class _IndexedHeaders(Headers):
    """Starlette's ``Headers``, looked up by name through an index made once. Its own
    lookups scan the whole header list for every name, and an inference request asks for
    about eight (version, length, coding, encodings...) on the way to its first token. The
    first value of a repeated name wins, as in Starlette's scan."""

    def __init__(self, scope: Scope) -> None:
        super().__init__(scope=scope)
        index: dict[bytes, bytes] = {}
        for name, value in self.raw:  # names arrive lower-case (ASGI)
            index.setdefault(name, value)
        self._index = index

    def get(self, key: str, default: Any = None) -> Any:
        value = self._index.get(key.lower().encode("latin-1"))
        return default if value is None else value.decode("latin-1")

    def __getitem__(self, key: str) -> str:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __contains__(self, key: Any) -> bool:
        return isinstance(key, str) and key.lower().encode("latin-1") in self._index


class InferenceRequest(Request):
    """The request an inference endpoint gets: its headers indexed (:class:`_IndexedHeaders`)."""

    @property
    def headers(self) -> Headers:
        if not hasattr(self, "_headers"):
            self._headers = _IndexedHeaders(self.scope)
        return self._headers
