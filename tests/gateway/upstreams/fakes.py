"""Scripted OpenAI-compatible servers on a real loopback socket (vLLM, Ollama, llama.cpp).

They stand in for engines that cannot run here; every chunk shape follows the engine's
documented or observed format (gateway-research §3.2-3.4, §5.8):

* vLLM: ``choices[0].token_ids`` per chunk and ``prompt_token_ids`` in the first one when the
  request has ``return_token_ids``; ``reasoning_content`` deltas; tool calls streamed as
  ``delta.tool_calls[i]`` fragments (id/name first, then argument pieces); ``stop_reason``;
  a separate final usage chunk with ``choices: []``; ``data: {"error": {..., "code": 500}}``
  mid-stream; 400 context overflow with its release-dependent wordings.
* Ollama: ``system_fingerprint: "fp_ollama"``, ``reasoning`` deltas, whole tool calls in one
  chunk, usage chunk, and silent prompt truncation (usage reports the truncated count).
* llama.cpp ``llama-server``: ``tokens`` on each chunk with ``return_tokens``, usage and
  ``timings`` in the chunk that has ``finish_reason``, ``exceed_context_size_error``.

``start_fake(respond)`` serves ``respond(path, body) -> Reply`` and records requests and
client disconnects (the cancel tests read ``disconnects``).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.requests import Request

__all__ = ["FakeServer", "Reply", "ToolScript", "chat_stream", "completion_stream",
           "error_reply", "sse", "start_fake"]


@dataclass(frozen=True)
class Reply:
    """What the fake answers: a status, headers, body chunks sent ``delay`` s apart; with
    ``hold_open`` the response stays open after the chunks until the client goes away."""

    chunks: tuple[bytes, ...] = ()
    status: int = 200
    headers: tuple[tuple[str, str], ...] = (("content-type", "text/event-stream"),)
    delay: float = 0.0
    hold_open: bool = False


@dataclass
class FakeServer:
    respond: Callable[[str, dict], Reply]
    models: tuple[str, ...] = ("m",)
    owned_by: str = "vllm"
    url: str = ""
    requests: list[tuple[str, dict]] = field(default_factory=list)
    disconnects: int = 0
    _server: uvicorn.Server | None = None
    _thread: threading.Thread | None = None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        body = await Request(scope, receive).body()
        path = scope["path"]
        if scope["method"] == "GET" and path.endswith("/models"):
            data = [{"id": m, "object": "model", "owned_by": self.owned_by} for m in self.models]
            await _send(send, 200, [("content-type", "application/json")],
                        json.dumps({"object": "list", "data": data}).encode())
            return
        parsed = json.loads(body) if body else {}
        self.requests.append((path, parsed))
        await self._stream(self.respond(path, parsed), receive, send)

    async def _stream(self, reply: Reply, receive, send) -> None:
        gone = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            self.disconnects += 1
            gone.set()

        watcher = asyncio.create_task(watch())
        await send({"type": "http.response.start", "status": reply.status,
                    "headers": [(k.encode(), v.encode()) for k, v in reply.headers]})
        try:
            for chunk in reply.chunks:
                if reply.delay:
                    await asyncio.sleep(reply.delay)
                if gone.is_set():
                    return
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if reply.hold_open:
                await gone.wait()
                return
            await send({"type": "http.response.body", "body": b""})
        except OSError:
            return
        finally:
            watcher.cancel()

    def start(self) -> FakeServer:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        config = uvicorn.Config(self, log_level="warning", lifespan="off",
                                timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run,
                                        kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("fake server did not start")
            time.sleep(0.01)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            assert self._thread is not None
            self._thread.join(5)


async def _send(send, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(k.encode(), v.encode()) for k, v in headers]})
    await send({"type": "http.response.body", "body": body})


def start_fake(respond: Callable[[str, dict], Reply], **kw: Any) -> FakeServer:
    return FakeServer(respond, **kw).start()


# -- chunk builders ----------------------------------------------------------------------------


def sse(*items: dict | str) -> tuple[bytes, ...]:
    """``data:`` events; a str item is sent as is (``"[DONE]"``, or raw text)."""
    return tuple(b"data: " + (i.encode() if isinstance(i, str) else
                              json.dumps(i).encode()) + b"\n\n" for i in items)


def error_reply(status: int, error: dict, headers: Sequence[tuple[str, str]] = ()) -> Reply:
    return Reply(chunks=(json.dumps(error).encode(),), status=status,
                 headers=(("content-type", "application/json"), *headers))


@dataclass(frozen=True)
class ToolScript:
    """One tool call: its id, name and the argument fragments it is streamed in."""

    index: int
    id: str
    name: str
    fragments: tuple[str, ...]


def _tool_deltas(flavor: str, calls: Sequence[ToolScript]) -> list[dict]:
    if flavor == "ollama":  # whole calls, one chunk each
        return [{"tool_calls": [{"id": c.id, "index": c.index, "type": "function",
                                 "function": {"name": c.name,
                                              "arguments": "".join(c.fragments)}}]}
                for c in calls]
    out: list[dict] = [{"tool_calls": [{"index": c.index, "id": c.id, "type": "function",
                                        "function": {"name": c.name, "arguments": ""}}]}
                       for c in calls]
    # Interleave the calls' argument fragments, as parallel calls may arrive.
    for i in range(max((len(c.fragments) for c in calls), default=0)):
        for c in calls:
            if i < len(c.fragments):
                out.append({"tool_calls": [{"index": c.index,
                                            "function": {"arguments": c.fragments[i]}}]})
    return out


def chat_stream(flavor: str, pieces: Sequence[str] = (), *,
                ids: Sequence[Sequence[int]] | None = None, reasoning: Sequence[str] = (),
                tools: Sequence[ToolScript] = (), finish: str | None = "stop",
                stop_reason: Any = None, usage: tuple[int, int] | None = (5, 3),
                error: dict | None = None, done: bool = True,
                prompt_ids: Sequence[int] | None = None) -> tuple[bytes, ...]:
    """A ``/chat/completions`` SSE body in ``flavor``'s shape (vllm, ollama, llamacpp)."""
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    if flavor == "ollama":
        base["system_fingerprint"] = "fp_ollama"
    rkey = {"vllm": "reasoning_content", "ollama": "reasoning",
            "llamacpp": "reasoning_content"}[flavor]
    deltas: list[tuple[dict, Sequence[int] | None]] = [({"role": "assistant", "content": ""},
                                                        None)]
    deltas += [({rkey: r}, None) for r in reasoning]
    deltas += [({"content": p}, ids[i] if ids else None) for i, p in enumerate(pieces)]
    deltas += [(d, None) for d in _tool_deltas(flavor, tools)]
    items: list[dict | str] = []
    for n, (delta, tids) in enumerate(deltas):
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": None}
        chunk = {**base, "choices": [choice]}
        _put_ids(flavor, chunk, choice, tids)
        if n == 0 and prompt_ids is not None:
            chunk["prompt_token_ids"] = list(prompt_ids)
        items.append(chunk)
    return _tail(flavor, base, items, {"delta": {}}, finish, stop_reason, usage, error, done)


def completion_stream(flavor: str, pieces: Sequence[str], *,
                      ids: Sequence[Sequence[int]] | None = None, finish: str | None = "stop",
                      usage: tuple[int, int] | None = (5, 3), error: dict | None = None,
                      done: bool = True) -> tuple[bytes, ...]:
    """A ``/completions`` SSE body (``text_completion`` chunks)."""
    base = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m"}
    items: list[dict | str] = []
    for i, p in enumerate(pieces):
        choice: dict[str, Any] = {"index": 0, "text": p, "logprobs": None,
                                  "finish_reason": None}
        chunk = {**base, "choices": [choice]}
        _put_ids(flavor, chunk, choice, ids[i] if ids else None)
        items.append(chunk)
    return _tail(flavor, base, items, {"text": ""}, finish, None, usage, error, done)


def _put_ids(flavor: str, chunk: dict, choice: dict, tids: Sequence[int] | None) -> None:
    if tids is None:
        return
    if flavor == "llamacpp":
        chunk["tokens"] = list(tids)
    else:
        choice["token_ids"] = list(tids)


def _tail(flavor: str, base: dict, items: list[dict | str], empty: dict, finish: str | None,
          stop_reason: Any, usage: tuple[int, int] | None, error: dict | None,
          done: bool) -> tuple[bytes, ...]:
    if error is not None:
        return sse(*items, {"error": error}, *(["[DONE]"] if done else []))
    usage_obj = None if usage is None else {
        "prompt_tokens": usage[0], "completion_tokens": usage[1],
        "total_tokens": usage[0] + usage[1]}
    if finish is not None:
        choice = {"index": 0, **empty, "finish_reason": finish}
        if flavor == "vllm":
            choice["stop_reason"] = stop_reason
        last = {**base, "choices": [choice]}
        if flavor == "llamacpp" and usage_obj is not None:
            last["usage"] = usage_obj  # llama-server: usage rides on the finish chunk
            last["timings"] = {"prompt_n": usage[0], "predicted_n": usage[1]}
            usage_obj = None
        items.append(last)
    if usage_obj is not None:
        items.append({**base, "choices": [], "usage": usage_obj})
    if done:
        items.append("[DONE]")
    return sse(*items)
