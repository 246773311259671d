"""Anthropic Messages SSE streams, built in the documented order (gateway-research §5.8,
platform.claude.com "Streaming messages"; field shapes from the ``anthropic`` SDK's
``RawMessageStreamEvent`` types). Served by the shared :class:`ScriptedServer`."""

from __future__ import annotations

import json
from typing import Any

from .fakes_responses import Script, ScriptedServer, sse

__all__ = ["MessagesStream", "Script", "ScriptedServer", "anthropic_server"]


def anthropic_server() -> ScriptedServer:
    return ScriptedServer(stream_path="/v1/messages", models_path="/v1/models",
                          models=("claude-test",))


class MessagesStream:
    """One Messages stream: ``message_start``, content blocks, ``message_delta``, stop."""

    def __init__(self, input_tokens: int = 12, model: str = "claude-test") -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self._index = 0
        self.emit("message_start", message={
            "id": "msg_1", "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 1,
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}})

    def emit(self, type_: str, **fields: Any) -> MessagesStream:
        self.events.append((type_, {"type": type_, **fields}))
        return self

    def chunks(self) -> list[bytes]:
        return [sse(name, data) for name, data in self.events]

    def ping(self) -> MessagesStream:
        return self.emit("ping")

    def _block(self, start: dict[str, Any], deltas: list[dict[str, Any]]) -> MessagesStream:
        i = self._index
        self._index += 1
        self.emit("content_block_start", index=i, content_block=start)
        for d in deltas:
            self.emit("content_block_delta", index=i, delta=d)
        return self.emit("content_block_stop", index=i)

    def text(self, pieces: list[str]) -> MessagesStream:
        return self._block({"type": "text", "text": ""},
                           [{"type": "text_delta", "text": p} for p in pieces])

    def tool_use(self, id_: str, name: str, pieces: list[str]) -> MessagesStream:
        return self._block({"type": "tool_use", "id": id_, "name": name, "input": {}},
                           [{"type": "input_json_delta", "partial_json": p} for p in pieces])

    def thinking(self, pieces: list[str], signature: str) -> MessagesStream:
        deltas = [{"type": "thinking_delta", "thinking": p} for p in pieces]
        deltas.append({"type": "signature_delta", "signature": signature})
        return self._block({"type": "thinking", "thinking": "", "signature": ""}, deltas)

    def redacted(self, data: str) -> MessagesStream:
        return self._block({"type": "redacted_thinking", "data": data}, [])

    def end(self, stop_reason: str = "end_turn", output_tokens: int = 5,
            stop_sequence: str | None = None) -> MessagesStream:
        self.emit("message_delta", delta={"stop_reason": stop_reason,
                                          "stop_sequence": stop_sequence},
                  usage={"output_tokens": output_tokens})
        return self.emit("message_stop")

    def error(self, type_: str, message: str) -> MessagesStream:
        return self.emit("error", error={"type": type_, "message": message})


def error_body(type_: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": type_, "message": message}}


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))
