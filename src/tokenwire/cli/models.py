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

from tokenwire.errors import CodecHTTPError, CodecTransportError

__all__ = ["format_models", "register"]

DEFAULT_URL = "http://127.0.0.1:8080"
#: Seconds to wait for the list (a gateway answers it from memory).
TIMEOUT_S = 30.0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("models", help="list the models a server serves")
    p.add_argument("--url", default=DEFAULT_URL,
                   help=f"server base URL (default {DEFAULT_URL})")
    p.add_argument("--api-key-env", metavar="VAR",
                   help="environment variable holding the API key to send")
    p.add_argument("--json", action="store_true", help="print the server's JSON document")
    p.set_defaults(func=cmd_models)


def _fetch(url: str, key: str | None) -> dict:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    target = f"{url.rstrip('/')}/v1/models"
    try:
        resp = httpx.get(target, headers=headers, timeout=TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise CodecTransportError(f"GET {target} failed: {exc}") from exc
    if resp.status_code != 200:
        raise CodecHTTPError(resp.status_code, resp.content, target)
    return resp.json()


def format_models(doc: dict) -> list[str]:
    """The human lines for a ``/v1/models`` document."""
    lines = []
    for m in doc.get("data", []):
        parts = [str(m.get("id"))]
        if m.get("aliases"):
            parts.append("also: " + ", ".join(m["aliases"]))
        tmap = m.get("codec_tokenizer_map")
        parts.append(f"map {tmap['id']} {tmap['hash']}" if tmap else "no map")
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
    doc = _fetch(args.url, key)
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
