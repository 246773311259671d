"""IR events -> Codec binary frames (msgpack, protobuf, msgpack-delta), sans-IO.

One frame per token delta that carries ids (codec-spec §1.1: "chunking is an
implementation detail"); text is never written (a binary ``stream_format`` forces
``detokenize=false``, §2.3). The HTTP layer batches frames into compression windows; the
frames themselves stay small so that a client decodes each token as soon as its window is
flushed.

The terminal frame is ``{"ids": [], "done": true, "finish_reason": ...}`` with the reason
mapped by :func:`~tokenwire.codec.finish_reason.wire_finish_reason` (§5.7, §10 item 13):
``eos`` -> ``eos_token``, ``stop_sequence``, ``length``, ``policy_violation`` (``error`` for
clients below v0.4, §5.3), ``tool_calls`` -> ``eos_token`` (the model stopped on its own),
``abort`` -> ``error``; ``legacy=True`` writes ``stop`` like the engine forks. A failure,
or an exception after the headers went out, is a terminal frame with ``finish_reason:
"error"`` (§2.6): the stream always ends with ``done=true``, never with a 500.

Tool calls (fork behaviour, §2.3): fragments are assembled by index and attached, complete,
to the terminal frame.
"""

from __future__ import annotations

from tokenwire.codec import frames_delta, frames_msgpack, frames_protobuf
from tokenwire.codec.finish_reason import POLICY_VIOLATION_VERSION, wire_finish_reason
from tokenwire.codec.frames import Frame, StreamFormat, ToolCall
from tokenwire.errors import LocalProtocolError
from tokenwire.gateway.ir import Event, Failure, Finish, Heartbeat, TokenDelta, ToolCallDelta

__all__ = ["CodecStreamRenderer", "new_frame_encoder"]


def new_frame_encoder(
    fmt: StreamFormat,
) -> frames_msgpack.FrameEncoder | frames_protobuf.FrameEncoder | frames_delta.FrameEncoder:
    """The encoder for a binary ``stream_format`` (one module per wire format, §6 item 7)."""
    if fmt is StreamFormat.MSGPACK:
        return frames_msgpack.FrameEncoder()
    if fmt is StreamFormat.PROTOBUF:
        return frames_protobuf.FrameEncoder()
    if fmt is StreamFormat.MSGPACK_DELTA:
        return frames_delta.FrameEncoder()
    raise LocalProtocolError(f"no frame encoder for stream_format {fmt!r}")


class CodecStreamRenderer:
    """``on_event(ir) -> list[bytes]`` of encoded frames; ``done`` after the terminal one."""

    def __init__(
        self,
        fmt: StreamFormat,
        *,
        client_version: tuple[int, int] = POLICY_VIOLATION_VERSION,
        legacy_finish_reason: bool = False,
    ) -> None:
        self.format = fmt
        self.content_type = fmt.content_type
        self._encoder = new_frame_encoder(fmt)
        self._client_version = client_version
        self._legacy = legacy_finish_reason
        self._tools: dict[int, list[str | None]] = {}  # index -> [id, name, arguments]
        self.done = False

    def on_event(self, event: Event) -> list[bytes]:
        if self.done:
            raise LocalProtocolError(f"{type(event).__name__} after the terminal frame")
        match event:
            case TokenDelta(ids=ids) if ids:
                return [self._encoder.encode(Frame(ids=ids, done=False))]
            case ToolCallDelta():
                self._add_tool_fragment(event)
            case Finish(reason=reason, matched_stop=matched):
                finish = wire_finish_reason(
                    reason.value, matched_stop=matched, legacy=self._legacy,
                    client_version=self._client_version,
                )
                return [self._terminal(finish)]
            case Failure():
                return [self._terminal("error")]
            case Heartbeat():  # a frame with no ids: decoders skip it, sockets stay warm
                return [self._encoder.encode(Frame(ids=(), done=False))]
        return []

    def on_error(self, exc: BaseException) -> list[bytes]:
        """An exception after the headers were sent: end the stream with ``error`` (§2.6)."""
        del exc  # the message stays in the server log; frames carry no text
        return [] if self.done else [self._terminal("error")]

    def _terminal(self, finish_reason: str) -> bytes:
        self.done = True
        tools = tuple(
            ToolCall(id=tc_id, name=name, arguments_json=args or "")
            for _, (tc_id, name, args) in sorted(self._tools.items())
        )
        self._tools.clear()
        return self._encoder.encode(
            Frame(ids=(), done=True, finish_reason=finish_reason, tool_calls=tools)
        )

    def _add_tool_fragment(self, delta: ToolCallDelta) -> None:
        slot = self._tools.setdefault(delta.index, [None, None, ""])
        slot[0] = slot[0] or delta.id
        slot[1] = slot[1] or delta.name
        slot[2] = (slot[2] or "") + delta.arguments
