"""``POST /tokenize`` and ``POST /detokenize`` in vLLM's request and response shapes.

Both use the tokenizer map the server publishes (``Codec-Tokenizer-Map``), not the engine,
so what a user sees here is what any Codec client holding that map computes:

* ``{"prompt": str, "add_special_tokens": bool}`` -> ``{"count", "max_model_len", "tokens",
  "token_strs"}``. Special-token strings inside ``prompt`` are encoded as plain text,
  exactly as the engine encodes a text prompt on ``/v1/completions`` (codec-spec §10 item 8:
  untrusted text never becomes control tokens). SmolLM2's tokenizer adds no BOS/EOS, so
  ``add_special_tokens`` changes nothing for it; it is accepted for vLLM compatibility.
* vLLM's chat form, ``{"messages": [...], "add_generation_prompt": true,
  "continue_final_message": false, "tools": [...], "model": ...}``: the messages with the
  model's chat template applied, tokenized exactly as the engine will evaluate them (the
  engine itself renders and tokenizes: the map has no chat template). Only a model whose
  upstream can render its template (the embedded engine) answers; others get a 400.
* ``return_token_strs: true`` adds each id's vocabulary entry (``token_strs``), as vLLM does.
* ``{"tokens": [int, ...]}`` -> ``{"prompt": str}``, special tokens rendered as their text.

What costs time in proportion to the body (encoding, decoding, checking every id, rendering
a response of millions of ids) runs on a worker thread with ``asyncio.to_thread``, as
``count_tokens`` and the embedded engine's chat rendering do: on the event loop, one body
near the 8 MiB limit held every other client (``GET /health`` included) for seconds. The
loop's default executor is the bound: at most its worker count of these run at once, the
rest wait in its queue. Like ``count_tokens``, these routes take no admission ticket (they
never queue behind generations). A thread frees the loop only while the work lets the GIL
go; tiktoken's single-piece merge did not (a run of spaces is one piece), so the tokenizer
hands long pieces to a call that does (``codec/tokenizer.py``, ``_single``).
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tokenwire.codec.detokenizer import Detokenizer
from tokenwire.codec.maps import TokenizerMap
from tokenwire.codec.tokenizer import Tokenizer
from tokenwire.codec.versioning import VARY, filter_headers
from tokenwire.gateway.apis.chat import parse_chat_request
from tokenwire.gateway.apis.params import bad_request, json_type, optional_bool
from tokenwire.gateway.http.generation import check_inputs, route_model
from tokenwire.gateway.http.requests import client_version, decode_json, read_parsed
from tokenwire.gateway.ir import ChatPrompt
from tokenwire.gateway.retokenize import encode_text

if TYPE_CHECKING:
    from tokenwire.gateway.http.state import GatewayState

__all__ = ["detokenize", "tokenize"]

_lock = threading.Lock()
_tokenizers: dict[str, Tokenizer] = {}
_token_strs: dict[str, dict[int, str]] = {}


def _tokenizer(tmap: TokenizerMap) -> Tokenizer:
    # Built once per map: rebuilding BPE ranks per request would dominate the call.
    with _lock:
        tok = _tokenizers.get(tmap.hash)
        if tok is None:
            tok = _tokenizers[tmap.hash] = Tokenizer.from_map(tmap)
        return tok


def _strings(tmap: TokenizerMap, ids: list[int]) -> list[str]:
    with _lock:
        by_id = _token_strs.get(tmap.hash)
        if by_id is None:
            by_id = _token_strs[tmap.hash] = {i: t for t, i in tmap.vocab.items()}
    return [by_id.get(i, "") for i in ids]


def _served_map(state: GatewayState) -> TokenizerMap:
    """The map the server-wide routes use; a gateway whose models have none (text-only
    upstreams configured without ``map_id``) cannot tokenize: a 400, not a crash."""
    if state.tmap is None:
        raise bad_request("no served model has a tokenizer map, so this server cannot "
                          "tokenize or detokenize; configure map_id for a model",
                          code="unsupported_value")
    return state.tmap


def _respond(request: Request, tmap: TokenizerMap, payload: dict[str, Any]) -> Response:
    headers = filter_headers(
        [("Vary", VARY), ("Codec-Tokenizer-Map", tmap.hash)], client_version(request))
    return JSONResponse(payload, headers=dict(headers))


def _flag(body: dict[str, Any], key: str, default: bool) -> bool:
    value = optional_bool(body, key)
    return default if value is None else value


def _tokens_response(request: Request, tmap: TokenizerMap, ids: list[int],
                     max_model_len: int | None, token_strs: bool) -> Response:
    """The answer for ``ids`` (any thread: it only reads the request's headers; the JSON of
    millions of ids takes long enough that it is rendered off the loop)."""
    strs = _strings(tmap, ids) if token_strs else None
    return _respond(request, tmap, {"count": len(ids), "max_model_len": max_model_len,
                                    "tokens": ids, "token_strs": strs})


def _encode_response(request: Request, tmap: TokenizerMap, prompt: str,
                     max_model_len: int | None, token_strs: bool) -> Response:
    """``prompt`` encoded and answered: on a worker thread, never on the loop (module doc)."""
    ids = encode_text(_tokenizer(tmap), prompt, param="prompt")
    return _tokens_response(request, tmap, ids, max_model_len, token_strs)


async def tokenize(request: Request) -> Response:
    state: GatewayState = request.app.state.gateway
    body = await read_parsed(request, state.settings.max_body_bytes, decode_json)
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {json_type(body)}",
                          code="invalid_type")
    if "messages" in body:
        return await _tokenize_chat(request, state, body)
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise bad_request("send prompt (a string) or messages (vLLM's chat form)",
                          param="prompt", code="missing_required_parameter" if prompt is None
                          else "invalid_type")
    _flag(body, "add_special_tokens", True)
    token_strs = _flag(body, "return_token_strs", False)  # refused before the encode
    return await asyncio.to_thread(_encode_response, request, _served_map(state), prompt,
                                   state.max_model_len, token_strs)


async def _tokenize_chat(request: Request, state: GatewayState,
                         body: dict[str, Any]) -> Response:
    """vLLM's ``TokenizeChatRequest``: the prompt the model would be given for ``messages``."""
    call = parse_chat_request({k: body[k] for k in ("messages", "tools", "model") if k in body})
    generation_prompt = _flag(body, "add_generation_prompt", True)
    continue_final = _flag(body, "continue_final_message", False)
    _flag(body, "add_special_tokens", False)
    token_strs = _flag(body, "return_token_strs", False)
    if generation_prompt and continue_final:  # vLLM refuses the pair the same way
        raise bad_request("continue_final_message and add_generation_prompt cannot both be "
                          "true", param="continue_final_message")
    served = route_model(state, call.model, None)
    render = getattr(served.upstream, "chat_prompt_ids", None)
    if render is None or served.tmap is None:
        raise bad_request(f"model {served.name!r} cannot tokenize chat messages here: its "
                          "upstream applies its own chat template, which tokenwire does not "
                          "hold; send prompt text", param="messages", code="unsupported_value")
    check_inputs(served, call.request)
    assert isinstance(call.request.prompt, ChatPrompt)
    try:
        ids = await render(call.request.prompt.messages,
                           add_generation_prompt=generation_prompt,
                           continue_final_message=continue_final)
    except ValueError as exc:  # the template refused the conversation
        raise bad_request(str(exc), param="messages") from None
    # render() tokenized on a worker thread already; the answer's JSON is rendered on one too
    return await asyncio.to_thread(_tokens_response, request, served.tmap, ids,
                                   served.max_model_len, token_strs)


async def detokenize(request: Request) -> Response:
    state: GatewayState = request.app.state.gateway
    body = await read_parsed(request, state.settings.max_body_bytes, decode_json)
    tokens = body.get("tokens") if isinstance(body, dict) else None
    if not isinstance(tokens, list):
        raise bad_request("tokens must be an array of integers", param="tokens",
                          code="missing_required_parameter" if tokens is None
                          else "invalid_type")
    # A body near the limit holds over a million ids: checking and decoding them held
    # the loop ~0.3 s (more on a slower machine), kept off it (module doc).
    return await asyncio.to_thread(_decode_response, request, _served_map(state), tokens)


def _decode_response(request: Request, tmap: TokenizerMap, tokens: list[Any]) -> Response:
    """``tokens`` checked and decoded: on a worker thread, never on the loop (module doc)."""
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise bad_request("tokens must be an array of integers", param="tokens",
                          code="invalid_type")
    top = tmap.max_id
    bad = next((t for t in tokens if not 0 <= t <= top), None)
    if bad is not None:
        raise bad_request(f"token id {bad} is outside the map's vocabulary 0..{top}",
                          param="tokens")
    text = Detokenizer(tmap).decode(tokens, render_special=True)
    return _respond(request, tmap, {"prompt": text})
