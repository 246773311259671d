"""``tokenwire chat``: an interactive, streaming chat in the terminal.

Against a running server (``--url``, any OpenAI Chat Completions server) or, without one,
the embedded model: a gateway over it is started in this process on a free loopback port
and stopped on exit, so both ways run the same HTTP path. Each answer streams as it is
generated; the conversation (history) is sent with every turn.

Keys: Enter sends the line; **Ctrl-C** while an answer streams stops that answer (the
connection is closed, which stops the generation) and keeps the part already shown in the
history; Ctrl-C at the prompt clears the line; **Ctrl-D** or ``/exit`` quits; ``/reset``
forgets the history.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from tokenwire import peer_json
from tokenwire.client._base import MAX_ERROR_BODY
from tokenwire.client.bounded_read import decoder_for, read_error_body
from tokenwire.errors import (
    CodecHTTPError,
    CodecTransportError,
    RemoteProtocolError,
    TokenwireError,
)

__all__ = ["DEFAULT_CHAT_MAX_TOKENS", "register", "stream_reply"]

#: Tokens per answer unless ``--max-tokens`` says otherwise: a few paragraphs.
DEFAULT_CHAT_MAX_TOKENS = 512
PROMPT = ">>> "
#: Seconds to wait for the server between two chunks of an answer (a safety net: the
#: gateway keeps quiet streams alive every 15 s).
READ_TIMEOUT_S = 120.0
#: The most an answer's event stream may decode to: ~250 bytes per token, so ~250k tokens.
#: The server controls it, compressed or not (a 300 KB brotli body decodes to 400 MB).
MAX_ANSWER_BYTES = 64 * 1024 * 1024


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("chat", help="chat with a model in the terminal (streaming)")
    p.add_argument("--url", default=None,
                   help="a server's base URL, e.g. http://127.0.0.1:8080 (default: start "
                        "the embedded model in this process)")
    p.add_argument("--model", default=None,
                   help="model name to ask for (default: the server's default model)")
    p.add_argument("--system", default=None, help="a system message to start with")
    p.add_argument("--max-tokens", type=int, default=DEFAULT_CHAT_MAX_TOKENS,
                   help=f"most tokens per answer (default {DEFAULT_CHAT_MAX_TOKENS})")
    p.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature (default: the server's)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed (default: random)")
    p.add_argument("--api-key-env", metavar="VAR",
                   help="environment variable holding the API key to send")
    p.set_defaults(func=cmd_chat)


def stream_reply(http: httpx.Client, url: str, body: dict[str, Any], *,
                 on_open: Callable[[httpx.Response], None] | None = None) -> Iterator[str]:
    """The text deltas of one streamed Chat Completions answer (``on_open`` receives the
    response as soon as its head arrives, e.g. to abort it from another thread)."""
    from tokenwire.gateway.upstreams.sse import SSEDecoder  # (the gateway: 0.25 s to import)

    target = f"{url.rstrip('/')}/v1/chat/completions"
    try:
        with http.stream("POST", target, json={**body, "stream": True}) as resp:
            if on_open is not None:
                on_open(resp)
            if resp.status_code != 200:
                raise CodecHTTPError(resp.status_code, read_error_body(resp, MAX_ERROR_BODY),
                                     target)
            # Raw bytes through a budgeted decoder and the bounded SSE parser: the server
            # controls the length of the body and of each line (bounded_read.py, sse.py).
            body_decoder = decoder_for(resp.headers.get("content-encoding"), MAX_ANSWER_BYTES)
            events = SSEDecoder()
            for raw in resp.iter_raw():
                for event in events.feed(body_decoder.decompress(raw)):
                    yield from _deltas(event.data, target)
            for event in events.feed(body_decoder.finish()) + events.feed_eof():
                yield from _deltas(event.data, target)
    except httpx.HTTPError as exc:
        raise CodecTransportError(f"POST {target} failed: {exc}") from exc


def _deltas(data: str, target: str) -> list[str]:
    """The text deltas of one chunk; a chunk of another shape is the server's error."""
    if data == "[DONE]":
        return []
    try:
        doc = peer_json.loads(data)
    except ValueError as exc:
        raise RemoteProtocolError(f"{target} sent a chunk that is not JSON: {exc}") from None
    if isinstance(doc, dict) and "error" in doc:  # a failure after the stream started
        raise CodecHTTPError(200, data.encode(), target)
    choices = doc.get("choices", []) if isinstance(doc, dict) else None
    if not isinstance(choices, list):
        raise RemoteProtocolError(f"{target} sent a chunk that is not a chat completion "
                                  f"chunk: {data[:200]!r}")
    texts = []
    for choice in choices:
        delta = choice.get("delta") if isinstance(choice, dict) else None
        text = delta.get("content") if isinstance(delta, dict) else None
        if not (isinstance(delta, dict | None) and isinstance(text, str | None)):
            raise RemoteProtocolError(f"{target} sent a choice without a text delta: "
                                      f"{data[:200]!r}")
        if text:
            texts.append(text)
    return texts


@contextlib.contextmanager
def _embedded_server() -> Iterator[str]:
    """The embedded model behind a gateway on a free loopback port, for this session."""
    import uvicorn

    from tokenwire.gateway.http.app import create_app
    from tokenwire.gateway.server import build_embedded_state, listen_socket
    from tokenwire.gateway.settings import ServerSettings

    print("loading the model...", file=sys.stderr, flush=True)
    plan = build_embedded_state(ServerSettings())
    sock = listen_socket("127.0.0.1", 0)
    plan.engine.start()
    server = uvicorn.Server(uvicorn.Config(create_app(plan.state), log_level="error",
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        plan.engine.close()
        sock.close()


def _turn(http: httpx.Client, url: str, body: dict[str, Any]) -> str:
    """Stream one answer to the terminal; Ctrl-C stops it. Returns what was shown.

    The HTTP stream is read in a worker thread and the main thread only waits on a queue,
    so Ctrl-C's KeyboardInterrupt always lands here, never inside the HTTP client's
    internals (a blocked read there did not always give it back). Stopping shuts the
    connection's socket down, which ends the worker's read and, at the gateway, the
    generation."""
    shown: list[str] = []
    events: queue.Queue[str | BaseException | None] = queue.Queue()
    opened: list[httpx.Response] = []

    def pump() -> None:
        try:
            for text in stream_reply(http, url, body, on_open=opened.append):
                events.put(text)
        except BaseException as exc:  # the main thread raises it (or ignores it once stopped)
            events.put(exc)
        else:
            events.put(None)

    threading.Thread(target=pump, name="tokenwire-chat-stream", daemon=True).start()
    try:
        while (item := events.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            shown.append(item)
            sys.stdout.write(item)
            sys.stdout.flush()
    except KeyboardInterrupt:
        if opened:
            _abort(opened[0])
        sys.stdout.write(" [stopped]")
    sys.stdout.write("\n")
    sys.stdout.flush()
    return "".join(shown)


def _abort(resp: httpx.Response) -> None:
    """End a response another thread is reading: shutting the socket down wakes its read
    (closing the file descriptor alone would not)."""
    stream = resp.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _read_line() -> str | None:
    """One line from the user; None on Ctrl-D; "" after Ctrl-C (the line is dropped)."""
    try:
        return input(PROMPT)
    except EOFError:
        return None
    except KeyboardInterrupt:
        sys.stdout.write("\n")
        return ""


def _loop(http: httpx.Client, url: str, args: argparse.Namespace) -> int:
    history: list[dict[str, str]] = []
    if args.system:
        history.append({"role": "system", "content": args.system})
    base: dict[str, Any] = {"max_tokens": args.max_tokens}
    for key in ("model", "temperature", "seed"):
        if getattr(args, key) is not None:
            base[key] = getattr(args, key)
    print("tokenwire chat: Ctrl-C stops an answer, Ctrl-D or /exit quits, /reset forgets",
          file=sys.stderr)
    while (line := _read_line()) is not None:
        if line.strip() == "/exit":
            break
        if line.strip() == "/reset":
            history = history[:1] if args.system else []
            continue
        if not line.strip():
            continue
        history.append({"role": "user", "content": line})
        try:
            answer = _turn(http, url, {**base, "messages": history})
        except TokenwireError as exc:  # the server's error or fault: this question only
            print(f"tokenwire: error: {exc}", file=sys.stderr)
            history.pop()  # the question got no answer: ask again or change it
            continue
        history.append({"role": "assistant", "content": answer})
    sys.stdout.write("\n")
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    # Ctrl-C is this command's way to stop an answer, so it must raise KeyboardInterrupt
    # even when the parent left SIGINT ignored (a background job of a non-interactive
    # shell, as CI scripts start them, passes SIG_IGN on; Python then installs no handler).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:  # pragma: no cover (not on every platform)
        pass
    headers = {}
    if args.api_key_env:
        key = os.environ.get(args.api_key_env)
        if not key:
            print(f"tokenwire: error: {args.api_key_env} is not set", file=sys.stderr)
            return 1
        headers["Authorization"] = f"Bearer {key}"
    timeout = httpx.Timeout(READ_TIMEOUT_S, connect=10.0)
    with httpx.Client(timeout=timeout, headers=headers) as http:
        if args.url:
            return _loop(http, args.url, args)
        with _embedded_server() as url:
            return _loop(http, url, args)
