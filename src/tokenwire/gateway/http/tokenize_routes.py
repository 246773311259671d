"""``POST /tokenize`` and ``POST /detokenize`` in vLLM's request and response shapes.

Both use the tokenizer map the server publishes (``Codec-Tokenizer-Map``), not the engine,
so what a user sees here is what any Codec client holding that map computes:

* ``{"prompt": str, "add_special_tokens": bool}`` -> ``{"count", "max_model_len", "tokens",
  "token_strs": null}``. Special-token strings inside ``prompt`` are encoded as plain text,
  exactly as the engine encodes a text prompt on ``/v1/completions`` (codec-spec §10 item 8:
  untrusted text never becomes control tokens). SmolLM2's tokenizer adds no BOS/EOS, so
  ``add_special_tokens`` changes nothing for it; it is accepted for vLLM compatibility.
* ``{"tokens": [int, ...]}`` -> ``{"prompt": str}``, special tokens rendered as their text.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tokenwire.codec.detokenizer import Detokenizer
from tokenwire.codec.maps import TokenizerMap
from tokenwire.codec.tokenizer import Tokenizer
from tokenwire.codec.versioning import VARY, filter_headers
from tokenwire.gateway.apis.params import bad_request
from tokenwire.gateway.http.requests import client_version, read_json

if TYPE_CHECKING:
    from tokenwire.gateway.http.state import GatewayState

__all__ = ["detokenize", "tokenize"]

_lock = threading.Lock()
_tokenizers: dict[str, Tokenizer] = {}


def _tokenizer(tmap: TokenizerMap) -> Tokenizer:
    # Built once per map: rebuilding BPE ranks per request would dominate the call.
    with _lock:
        tok = _tokenizers.get(tmap.hash)
        if tok is None:
            tok = _tokenizers[tmap.hash] = Tokenizer.from_map(tmap)
        return tok


def _respond(request: Request, state: GatewayState, payload: dict[str, Any]) -> Response:
    headers = filter_headers(
        [("Vary", VARY), ("Codec-Tokenizer-Map", state.tmap.hash)], client_version(request))
    return JSONResponse(payload, headers=dict(headers))


async def tokenize(request: Request) -> Response:
    state: GatewayState = request.app.state.gateway
    body = await read_json(request, state.settings.max_body_bytes)
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise bad_request("prompt must be a string (chat messages are not tokenized here)")
    ids = _tokenizer(state.tmap).encode(prompt)
    return _respond(request, state, {"count": len(ids), "max_model_len": state.max_model_len,
                                     "tokens": ids, "token_strs": None})


async def detokenize(request: Request) -> Response:
    state: GatewayState = request.app.state.gateway
    body = await read_json(request, state.settings.max_body_bytes)
    tokens = body.get("tokens") if isinstance(body, dict) else None
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in tokens
    ):
        raise bad_request("tokens must be a list of integers")
    top = state.tmap.max_id
    bad = next((t for t in tokens if not 0 <= t <= top), None)
    if bad is not None:
        raise bad_request(f"token id {bad} is outside the map's vocabulary 0..{top}")
    text = Detokenizer(state.tmap).decode(tokens, render_special=True)
    return _respond(request, state, {"prompt": text})
