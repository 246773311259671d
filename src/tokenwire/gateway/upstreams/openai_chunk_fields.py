"""The fields of one Chat Completions / Completions chunk, read and checked: its
``finish_reason``, its text fields, its tool calls and the index each call has for the
client. Sans-IO; :class:`~.openai_compat.ChunkParser` reads chunks with them.

A field of a type the API does not give it raises :class:`Malformed`, which the parser makes
the stream's failure (502, final): never the gateway's own 500, never a guess.
"""

from __future__ import annotations

from typing import Any

import msgspec

from tokenwire.gateway.ir import Failure, FailureClass, Finish, FinishKind, ToolCallDelta
from tokenwire.gateway.upstreams.base import new_call_id

__all__ = ["FINISH_WORDS", "CallIndexes", "Malformed", "broken", "finish_of", "text_of",
           "tool_call_of"]

#: The ``finish_reason`` words of a complete answer: OpenAI's, and those of the servers that
#: speak its API with their own words (TGI's ``eos_token`` / ``stop_sequence``; Mistral's
#: ``model_length``, an answer cut by the context window as ``length`` is by max_tokens).
FINISH_WORDS = {"stop": FinishKind.EOS, "length": FinishKind.LENGTH,
                "tool_calls": FinishKind.TOOL_CALLS, "function_call": FinishKind.TOOL_CALLS,
                "content_filter": FinishKind.CONTENT_FILTER, "eos_token": FinishKind.EOS,
                "eos": FinishKind.EOS, "stop_sequence": FinishKind.STOP_SEQUENCE,
                "max_tokens": FinishKind.LENGTH, "model_length": FinishKind.LENGTH}


def broken(message: str, code: str | None = None) -> Failure:
    return Failure(failure_class=FailureClass.UPSTREAM, status=502, message=message, code=code)


class Malformed(Exception):
    """A field of a chunk has a type the API does not give it (``ChunkParser.on_data``
    makes it the stream's failure: 502, final, never the gateway's own 500)."""


def finish_of(reason: Any, stop_reason: Any) -> Finish | Failure:
    """The terminal a ``finish_reason`` makes. A word that is not one of a complete answer
    (vLLM's and SGLang's ``abort``, an ``error``, one this gateway does not know) fails the
    stream: a cut answer must not reach the client as a finished one."""
    if not isinstance(reason, str):
        raise Malformed("finish_reason is not a string")
    kind = FINISH_WORDS.get(reason)
    if kind is None:
        return broken(f"upstream ended the generation with finish_reason {reason[:100]!r}")
    # vLLM names the stop string that fired (a str) or the stop token id (an int).
    if kind is FinishKind.EOS and isinstance(stop_reason, str):
        return Finish(reason=FinishKind.STOP_SEQUENCE, matched_stop=stop_reason)
    return Finish(reason=kind)


def text_of(value: Any, field: str) -> str:
    """A text field of a delta: a string, or a list of ``{"type": "text", "text": ...}``
    parts (as some servers send ``content``)."""
    if value is None or isinstance(value, str):
        return value or ""
    if isinstance(value, list) and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in value):
        return "".join(p["text"] for p in value)
    raise Malformed(f"{field} is neither a string nor a list of text parts")


class CallIndexes:
    """The index each tool call has for the client. A server numbers its calls 0, 1, ... and
    names a call (``id`` and ``function.name``) in its first delta only; its numbers are kept.
    Some start another call at an index already taken: Ollama's whole calls sent without an
    ``index`` (each read as 0), a server that counts per chunk. Such a delta names an id and
    a name other than the call there has: it is a new call, numbered after every call so far.
    Appended to the first, it made one call with both names' arguments run together
    (``{}{"y":1}``) on every API that assembles calls (Chat without streaming, Responses,
    Messages), and the second call was lost. A delta with a new id but no name continues
    the call (a server may repeat or vary ids on every fragment). A call the server gives
    no id gets one (:func:`.base.new_call_id`), as the other adapters' calls do: Chat showed
    ``"id": null``, which no client can answer, where Responses and Messages made up ids
    of their own."""

    def __init__(self) -> None:
        self._at: dict[int, tuple[int, str | None]] = {}  # server's index -> (ours, its id)
        self._used: set[int] = set()

    def place(self, delta: ToolCallDelta) -> ToolCallDelta:
        known = self._at.get(delta.index)
        if known is None or (delta.id and delta.name and known[1] and delta.id != known[1]):
            ours = max(self._used) + 1 if delta.index in self._used else delta.index
            self._used.add(ours)
            self._at[delta.index] = (ours, delta.id)
            if delta.id is None:
                return msgspec.structs.replace(delta, index=ours, id=new_call_id())
        else:
            ours = known[0]
            if known[1] is None and delta.id:
                self._at[delta.index] = (ours, delta.id)
        return delta if ours == delta.index else msgspec.structs.replace(delta, index=ours)


def tool_call_of(call: Any) -> ToolCallDelta:
    if not isinstance(call, dict):
        raise Malformed("a tool call is not an object")
    kind = "custom" if call.get("type") == "custom" else "function"
    fn = call.get(kind) or call.get("function") or {}
    if not isinstance(fn, dict):
        raise Malformed(f"a tool call's {kind} is not an object")
    index, call_id, name = call.get("index") or 0, call.get("id") or None, fn.get("name") or None
    if type(index) is not int or index < 0 or not isinstance(call_id, str | None) \
            or not isinstance(name, str | None):
        raise Malformed("a tool call's index, id or name has the wrong type")
    args = fn.get("input" if kind == "custom" else "arguments") or ""
    if isinstance(args, dict | list):  # an object where the API has its JSON text
        args = msgspec.json.encode(args).decode()
    elif not isinstance(args, str):
        raise Malformed("a tool call's arguments are neither text nor an object")
    return ToolCallDelta(index=index, id=call_id, name=name, arguments=args, kind=kind)
