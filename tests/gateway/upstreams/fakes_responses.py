"""A scripted Responses API server on a real loopback socket, and the event sequences it sends.

The sequences follow the documented and recorded formats (gateway-research §5.3-§5.6:
prism-php and vercel/ai fixtures, the ``openai`` SDK's event types): every event has
``event: <type>`` equal to its JSON ``type`` and a ``sequence_number`` counting from 0.

:class:`ScriptedServer` is shared with the Anthropic fake: each request gets the next
:class:`Script` (SSE events, or an HTTP error), and the server records what it was sent and
whether the client went away before the script ended.

With ``websocket=True`` the server also answers ``GET`` + WebSocket upgrade on the stream path
(a Responses upstream that offers the socket transport): each upgrade gets the next
:class:`SocketScript` (refuse with a status, or per ``response.create`` the next
:class:`Turn`: JSON text messages, then keep the socket, close it, or break it).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

__all__ = ["RecordedSocket", "ResponsesStream", "Script", "ScriptedServer", "SocketScript",
           "Turn", "sse", "ws_messages"]


def sse(event: str, data: Any) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data)
    return f"event: {event}\ndata: {payload}\n\n".encode()


@dataclass
class Script:
    """What one request gets: ``chunks`` as an SSE body, or ``status`` with ``body``;
    ``headers`` go on either answer (e.g. ``x-codex-turn-state`` on a stream).

    ``hold`` keeps the response open after the chunks (until the client disconnects), to
    test cancellation; ``delay`` paces the chunks so they arrive as separate reads.
    """

    chunks: list[bytes] = field(default_factory=list)
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    hold: bool = False
    delay: float = 0.0


def ws_messages(chunks: list[bytes]) -> list[str]:
    """The JSON data of SSE ``chunks``, one WebSocket text message each (no ``[DONE]``)."""
    out = []
    for chunk in chunks:
        for line in chunk.decode().splitlines():
            if line.startswith("data: ") and line[6:] != "[DONE]":
                out.append(line[6:])
    return out


@dataclass
class Turn:
    """The answer to one ``response.create``: ``messages``, then ``then``: ``keep`` the
    socket, ``close`` it cleanly (1000: an upstream closing an idle socket), ``break`` it
    (the app fails: the server closes with 1011, a cut), or close it as ``too_big`` (1009:
    the request was over the upstream's message limit)."""

    messages: list[str] = field(default_factory=list)
    then: str = "keep"


@dataclass
class SocketScript:
    """One upgrade: ``refuse`` with that HTTP status, or accept and play ``turns``."""

    refuse: int | None = None
    turns: list[Turn] = field(default_factory=list)


@dataclass
class RecordedSocket:
    headers: dict[str, str]
    received: list[Any] = field(default_factory=list)
    accepted: bool = False
    closed: threading.Event = field(default_factory=threading.Event)  # by the server


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: Any


class ScriptedServer:
    """Starlette + uvicorn in a thread on 127.0.0.1 (a real socket: streaming is real)."""

    def __init__(self, *, stream_path: str, models_path: str,
                 models: tuple[str, ...] = ("gpt-test",), websocket: bool = False) -> None:
        self.scripts: list[Script] = []
        self.requests: list[Recorded] = []
        self.socket_scripts: list[SocketScript] = []
        self.sockets: list[RecordedSocket] = []
        self.models = list(models)
        self.models_status = 200
        self.disconnected = threading.Event()
        routes = [Route(stream_path, self._stream, methods=["POST"]),
                  Route(models_path, self._models, methods=["GET"])]
        if websocket:
            routes.append(WebSocketRoute(stream_path, self._socket))
        app = Starlette(routes=routes)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off",
                                                     timeout_graceful_shutdown=1))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the fake upstream did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)

    def push(self, *scripts: Script) -> None:
        self.scripts.extend(scripts)

    async def _socket(self, ws: WebSocket) -> None:
        record = RecordedSocket(headers={k.lower(): v for k, v in ws.headers.items()})
        self.sockets.append(record)
        script = self.socket_scripts.pop(0)
        if script.refuse is not None:
            await ws.send_denial_response(JSONResponse(
                {"error": {"message": "no sockets here", "type": "invalid_request_error"}},
                status_code=script.refuse))
            return
        await ws.accept()
        record.accepted = True
        try:
            for turn in script.turns:
                record.received.append(json.loads(await ws.receive_text()))
                for message in turn.messages:
                    await ws.send_text(message)
                if turn.then == "close":
                    await ws.close(1000)
                    record.closed.set()
                    return
                if turn.then == "too_big":
                    await ws.close(1009)
                    record.closed.set()
                    return
                if turn.then == "break":
                    raise RuntimeError("scripted cut")
            while True:  # no more turns: wait for the client to leave
                record.received.append(json.loads(await ws.receive_text()))
        except WebSocketDisconnect:
            self.disconnected.set()

    async def _models(self, request: Request) -> Response:
        self.requests.append(Recorded(request.url.path, dict(request.headers), None))
        if self.models_status != 200:
            return JSONResponse({"error": {"message": "no", "type": "authentication_error"}},
                                status_code=self.models_status)
        return JSONResponse({"object": "list", "data": [{"id": m, "object": "model"}
                                                        for m in self.models]})

    async def _stream(self, request: Request) -> Response:
        body = json.loads(await request.body())
        self.requests.append(Recorded(request.url.path, dict(request.headers), body))
        script = self.scripts.pop(0)
        if script.status != 200:
            return Response(json.dumps(script.body).encode() if script.body is not None
                            else b"", status_code=script.status, headers=script.headers,
                            media_type="application/json")

        async def gen():
            try:
                for chunk in script.chunks:
                    if script.delay:
                        await asyncio.sleep(script.delay)
                    yield chunk
                while script.hold:
                    await asyncio.sleep(0.05)
                    yield b": keep-alive\n\n"
            except BaseException:
                self.disconnected.set()
                raise

        return StreamingResponse(gen(), media_type="text/event-stream",
                                 headers=script.headers)


class ResponsesStream:
    """Builds one Responses stream event by event, in the documented order."""

    def __init__(self, response_id: str = "resp_1", model: str = "gpt-test") -> None:
        self.events: list[dict[str, Any]] = []
        self.output: list[dict[str, Any]] = []
        self._resp = {"id": response_id, "object": "response", "model": model}
        self.emit("response.created", response={**self._resp, "status": "in_progress",
                                                "output": []})
        self.emit("response.in_progress", response={**self._resp, "status": "in_progress",
                                                    "output": []})

    def emit(self, type_: str, **fields: Any) -> ResponsesStream:
        self.events.append({"type": type_, "sequence_number": len(self.events), **fields})
        return self

    def chunks(self, *, done: bool = False) -> list[bytes]:
        out = [sse(e["type"], e) for e in self.events]
        return [*out, b"data: [DONE]\n\n"] if done else out

    def reasoning(self, summary: list[str], encrypted: str | None = None) -> ResponsesStream:
        oi, rid = len(self.output), f"rs_{len(self.output)}"
        item = {"type": "reasoning", "id": rid, "summary": []}
        self.emit("response.output_item.added", output_index=oi, item=item)
        self.emit("response.reasoning_summary_part.added", item_id=rid, output_index=oi,
                  summary_index=0, part={"type": "summary_text", "text": ""})
        for piece in summary:
            self.emit("response.reasoning_summary_text.delta", item_id=rid, output_index=oi,
                      summary_index=0, delta=piece)
        text = "".join(summary)
        self.emit("response.reasoning_summary_text.done", item_id=rid, output_index=oi,
                  summary_index=0, text=text)
        done = {**item, "summary": [{"type": "summary_text", "text": text}]}
        if encrypted is not None:
            done["encrypted_content"] = encrypted
        self.emit("response.output_item.done", output_index=oi, item=done)
        self.output.append(done)
        return self

    def message(self, pieces: list[str], phase: str | None = None) -> ResponsesStream:
        """``phase`` (``commentary``, ``final_answer``...) goes on every snapshot of it."""
        oi, mid = len(self.output), f"msg_{len(self.output)}"
        item = {"type": "message", "id": mid, "status": "in_progress", "role": "assistant",
                "content": []}
        if phase is not None:
            item["phase"] = phase
        self.emit("response.output_item.added", output_index=oi, item=item)
        part = {"type": "output_text", "text": "", "annotations": []}
        self.emit("response.content_part.added", item_id=mid, output_index=oi,
                  content_index=0, part=part)
        for piece in pieces:
            self.emit("response.output_text.delta", item_id=mid, output_index=oi,
                      content_index=0, delta=piece, logprobs=[])
        text = "".join(pieces)
        self.emit("response.output_text.done", item_id=mid, output_index=oi, content_index=0,
                  text=text, logprobs=[])
        self.emit("response.content_part.done", item_id=mid, output_index=oi,
                  content_index=0, part={**part, "text": text})
        done = {**item, "status": "completed", "content": [{**part, "text": text}]}
        self.emit("response.output_item.done", output_index=oi, item=done)
        self.output.append(done)
        return self

    def function_call(self, call_id: str, name: str, pieces: list[str]) -> ResponsesStream:
        oi, fid = len(self.output), f"fc_{len(self.output)}"
        item = {"type": "function_call", "id": fid, "call_id": call_id, "name": name,
                "arguments": "", "status": "in_progress"}
        self.emit("response.output_item.added", output_index=oi, item=item)
        for piece in pieces:
            self.emit("response.function_call_arguments.delta", item_id=fid, output_index=oi,
                      delta=piece)
        args = "".join(pieces)
        self.emit("response.function_call_arguments.done", item_id=fid, output_index=oi,
                  arguments=args)
        done = {**item, "arguments": args, "status": "completed"}
        self.emit("response.output_item.done", output_index=oi, item=done)
        self.output.append(done)
        return self

    def custom_call(self, call_id: str, name: str, pieces: list[str]) -> ResponsesStream:
        oi, cid = len(self.output), f"ctc_{len(self.output)}"
        item = {"type": "custom_tool_call", "id": cid, "call_id": call_id, "name": name,
                "input": "", "status": "in_progress"}
        self.emit("response.output_item.added", output_index=oi, item=item)
        for piece in pieces:
            self.emit("response.custom_tool_call_input.delta", item_id=cid, output_index=oi,
                      delta=piece)
        text = "".join(pieces)
        self.emit("response.custom_tool_call_input.done", item_id=cid, output_index=oi,
                  input=text)
        done = {**item, "input": text, "status": "completed"}
        self.emit("response.output_item.done", output_index=oi, item=done)
        self.output.append(done)
        return self

    def _usage(self, input_tokens: int, output_tokens: int) -> dict[str, Any]:
        return {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": input_tokens + output_tokens}

    def completed(self, input_tokens: int = 11, output_tokens: int = 7,
                  **extra: Any) -> ResponsesStream:
        """``extra``: more snapshot fields (``service_tier``, ``end_turn``)."""
        return self.emit("response.completed", response={
            **self._resp, "status": "completed", "output": self.output,
            "usage": self._usage(input_tokens, output_tokens), **extra})

    def incomplete(self, reason: str) -> ResponsesStream:
        return self.emit("response.incomplete", response={
            **self._resp, "status": "incomplete", "output": self.output,
            "incomplete_details": {"reason": reason}, "usage": self._usage(11, 16)})

    def failed(self, code: str, message: str) -> ResponsesStream:
        self.emit("error", code=code, message=message, param=None)
        return self.emit("response.failed", response={
            **self._resp, "status": "failed", "output": self.output,
            "error": {"code": code, "message": message}})
