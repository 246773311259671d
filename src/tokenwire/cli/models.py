"""``tokenwire models``: what a server serves (``GET /v1/models``), for a person.

One line per model: its name, the other names it answers to, its tokenizer map (id and
hash), its context length and where its Codec ids come from. ``--json`` prints the server's
document as it came. Works against any OpenAI-compatible server; the Codec fields are
tokenwire's own and simply absent elsewhere.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import httpx

from tokenwire import peer_json
from tokenwire.client._base import MAX_ERROR_BODY
from tokenwire.client.bounded_read import BodyOverBudget, read_bounded
from tokenwire.client.deadline import Deadline
from tokenwire.errors import (
    CodecHTTPError,
    CodecTransportError,
    DecompressionError,
    RemoteProtocolError,
)

__all__ = ["MAX_MODELS_BYTES", "fetch_models", "format_models", "register"]

DEFAULT_URL = "http://127.0.0.1:8080"
#: Seconds to wait for the whole list (a gateway answers it from memory).
TIMEOUT_S = 30.0
#: The largest model list read (decoded). A gateway's is a few KB and a public provider's
#: hundreds of models ~1 MB; the server controls the length (and can send a gzip bomb).
MAX_MODELS_BYTES = 8 * 1024 * 1024


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("models", help="list the models a server serves")
    p.add_argument("--url", default=DEFAULT_URL,
                   help=f"server base URL (default {DEFAULT_URL})")
    p.add_argument("--api-key-env", metavar="VAR",
                   help="environment variable holding the API key to send")
    p.add_argument("--json", action="store_true", help="print the server's JSON document")
    p.set_defaults(func=cmd_models)


def fetch_models(url: str, key: str | None = None, *, timeout: float = TIMEOUT_S) -> dict:
    """``GET /v1/models``: an object whose ``data`` is a list of objects, read within
    :data:`MAX_MODELS_BYTES` and ``timeout`` seconds in all (a server dripping bytes is cut
    there); anything else is a typed error (the server is not ours)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    target = f"{url.rstrip('/')}/v1/models"
    deadline = Deadline(timeout)
    try:
        with httpx.stream("GET", target, headers=headers,
                          timeout=deadline.timeout(httpx.Timeout(timeout))) as resp:
            ok = resp.status_code == 200
            try:
                body = read_bounded(resp, MAX_MODELS_BYTES if ok else MAX_ERROR_BODY, deadline)
            except BodyOverBudget as exc:
                if ok:
                    raise RemoteProtocolError(
                        f"{target}: the model list is over {MAX_MODELS_BYTES:,} bytes") from None
                body = exc.partial  # an error body only explains the error
    except httpx.HTTPError as exc:
        deadline.check()
        raise CodecTransportError(f"GET {target} failed: {exc}") from exc
    except DecompressionError as exc:
        raise RemoteProtocolError(f"{target}: the body does not decode: {exc}") from None
    if not ok:
        raise CodecHTTPError(resp.status_code, body, target)
    try:
        doc = peer_json.loads(body)
    except ValueError as exc:
        raise RemoteProtocolError(f"{target} is not JSON: {exc}") from None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not (isinstance(data, list) and all(isinstance(m, dict) for m in data)):
        raise RemoteProtocolError(f"{target} is not a model list (an object whose `data` "
                                  f"is a list of objects): {body[:200]!r}")
    return doc


def format_models(doc: dict) -> list[str]:
    """The human lines for a ``/v1/models`` document (as :func:`fetch_models` checked it:
    the fields inside each model are the server's, of any type)."""
    lines = []
    for m in doc.get("data", []):
        parts = [str(m.get("id"))]
        aliases = m.get("aliases")
        if isinstance(aliases, list) and aliases:
            parts.append("also: " + ", ".join(map(str, aliases)))
        tmap = m.get("codec_tokenizer_map")
        parts.append(f"map {tmap.get('id')} {tmap.get('hash')}" if isinstance(tmap, dict)
                     else "no map")
        if m.get("max_model_len"):
            parts.append(f"context {m['max_model_len']} tokens")
        if m.get("codec_ids_source"):
            parts.append(f"ids {m['codec_ids_source']}")
        if m.get("owned_by"):
            parts.append(f"upstream {m['owned_by']}")
        lines.append("  ".join(parts[:1]) + ("  (" + "; ".join(parts[1:]) + ")"
                                            if parts[1:] else ""))
    return lines


def cmd_models(args: argparse.Namespace) -> int:
    key = os.environ.get(args.api_key_env) if args.api_key_env else None
    if args.api_key_env and not key:
        print(f"tokenwire: error: {args.api_key_env} is not set", file=sys.stderr)
        return 1
    doc = fetch_models(args.url, key)
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    lines = format_models(doc)
    for line in lines:
        print(line)
    if not lines:
        print("tokenwire: the server lists no models", file=sys.stderr)
        return 1
    return 0
