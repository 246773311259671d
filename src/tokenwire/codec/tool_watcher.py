"""Find tool-call regions in a stream of token ids without decoding it (codec-spec §3.6).

Chat models mark a tool call (or a reasoning block) with two single-token specials.
:class:`ToolWatcher` compares ids against those two and reports, in stream order:

* ``passthrough`` — ids outside any region (a stray end marker is one of them);
* ``region`` — the body between start and end, markers excluded, reported even if empty;
* ``nested_start`` — a start marker inside a region: dropped from the body, still visible;
* ``overflow`` — the body reached ``region_cap`` and one more id came: fires once with the
  capped body, later ids up to the end marker are dropped, and the end marker resyncs;
* ``truncated`` — the stream ended (``end()``) inside a region, with the body so far.

The contract is the cross-language fixture ``tool-watcher-events.json`` (15 cases). One
``feed`` reports the passthrough ids it got as one event, so splitting a feed may split a
passthrough event in two; nothing else depends on how ids are chunked. Regions are hints:
fine-tuned models can emit markers anywhere (§9.1 item 20), so ``region`` ids are also
still yours to forward; this module never rewrites the id stream.

The state machine is the table :data:`_TRANSITIONS` (STYLE §6.6): an input that has no
entry moves to ``ERROR`` and raises; ``ERROR`` is permanent, and so is ``ENDED``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from tokenwire.codec.maps import TokenizerMap
from tokenwire.errors import LocalProtocolError, MapValidationError

__all__ = [
    "KNOWN_MARKERS",
    "EventKind",
    "Input",
    "State",
    "ToolWatcher",
    "WatcherEvent",
]


class EventKind(enum.StrEnum):
    PASSTHROUGH = "passthrough"
    REGION = "region"
    TRUNCATED = "truncated"
    OVERFLOW = "overflow"
    NESTED_START = "nested_start"


@dataclass(frozen=True, slots=True)
class WatcherEvent:
    """One watcher event. ``finish_reason`` is set only on ``truncated``."""

    kind: EventKind
    ids: tuple[int, ...]
    finish_reason: str | None = None


class State(enum.Enum):
    OUTSIDE = "outside"
    INSIDE = "inside"  # body below the cap
    OVERFLOWED = "overflowed"  # body hit the cap; dropping ids until the end marker
    ENDED = "ended"
    ERROR = "error"


class Input(enum.Enum):
    START = "start"  # the start marker id
    END = "end"  # the end marker id
    ID = "id"  # any other id, with room in the body (or outside a region)
    ID_OVER_CAP = "id_over_cap"  # any other id inside a region whose body is full
    EOS = "eos"  # end() was called


class _Act(enum.Enum):
    KEEP = enum.auto()  # add the id to the current passthrough run
    OPEN = enum.auto()  # close the passthrough run, start an empty body
    NESTED = enum.auto()  # emit nested_start
    BODY = enum.auto()  # append the id to the body
    CLOSE = enum.auto()  # emit region(body)
    OVERFLOW = enum.auto()  # emit overflow(body)
    DROP = enum.auto()  # ignore the id
    TRUNCATE = enum.auto()  # emit truncated(body, finish_reason)
    NONE = enum.auto()


# (state, input) -> (next state, action). Anything missing is illegal.
_TRANSITIONS: dict[tuple[State, Input], tuple[State, _Act]] = {
    (State.OUTSIDE, Input.START): (State.INSIDE, _Act.OPEN),
    (State.OUTSIDE, Input.END): (State.OUTSIDE, _Act.KEEP),  # a stray end passes through
    (State.OUTSIDE, Input.ID): (State.OUTSIDE, _Act.KEEP),
    (State.OUTSIDE, Input.EOS): (State.ENDED, _Act.NONE),
    (State.INSIDE, Input.START): (State.INSIDE, _Act.NESTED),
    (State.INSIDE, Input.END): (State.OUTSIDE, _Act.CLOSE),
    (State.INSIDE, Input.ID): (State.INSIDE, _Act.BODY),
    (State.INSIDE, Input.ID_OVER_CAP): (State.OVERFLOWED, _Act.OVERFLOW),
    (State.INSIDE, Input.EOS): (State.ENDED, _Act.TRUNCATE),
    (State.OVERFLOWED, Input.START): (State.OVERFLOWED, _Act.NESTED),
    (State.OVERFLOWED, Input.END): (State.OUTSIDE, _Act.NONE),  # resync, region not reported
    (State.OVERFLOWED, Input.ID): (State.OVERFLOWED, _Act.DROP),
    (State.OVERFLOWED, Input.EOS): (State.ENDED, _Act.TRUNCATE),
}

#: Marker pairs for maps without a ``tool_calling`` block (codec-spec §3.6 prose table),
#: by ``tool_calling.convention`` name, in the order :meth:`ToolWatcher.from_map` tries them.
KNOWN_MARKERS: dict[str, tuple[str, str]] = {
    "llama3": ("<|python_tag|>", "<|eom_id|>"),
    "qwen25": ("<tool_call>", "</tool_call>"),
    "phi4": ("<|tool|>", "<|/tool|>"),
    "mistral_nemo": ("[TOOL_CALLS]", "[/TOOL_CALLS]"),
    "deepseek_v3": ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"),
    "deepseek_r1": ("<think>", "</think>"),
}


class ToolWatcher:
    """Region detector over token ids. ``region_cap`` bounds the buffered body (``None``:
    unbounded, as the fixture's null cap); set it when the stream is untrusted, since a
    start marker without an end would otherwise buffer the rest of the stream."""

    __slots__ = ("_body", "_cap", "_end", "_start", "state")

    def __init__(self, start_id: int, end_id: int, region_cap: int | None = None) -> None:
        if start_id == end_id:
            raise LocalProtocolError(f"start and end markers must differ, both are {start_id}")
        if region_cap is not None and region_cap < 0:
            raise LocalProtocolError(f"region_cap must be >= 0 or None, got {region_cap}")
        self._start = start_id
        self._end = end_id
        self._cap = region_cap
        self._body: list[int] = []
        self.state = State.OUTSIDE

    @property
    def start_id(self) -> int:
        return self._start

    @property
    def end_id(self) -> int:
        return self._end

    @classmethod
    def from_map(
        cls, tmap: TokenizerMap, *, region_cap: int | None = None, convention: str | None = None
    ) -> ToolWatcher:
        """Markers from the map's ``tool_calling`` block, else from :data:`KNOWN_MARKERS`
        (``convention`` picks one; by default the first pair whose both strings are
        special tokens of the map). Marker ids always come from ``special_tokens``."""
        special = tmap.special_tokens
        if convention is None and tmap.tool_calling is not None:
            markers = tmap.tool_calling["markers"]  # validated against special_tokens
            return cls(special[markers["start"]], special[markers["end"]], region_cap)
        names = [convention] if convention is not None else list(KNOWN_MARKERS)
        for name in names:
            if name not in KNOWN_MARKERS:
                raise MapValidationError("tool_calling.convention", f"{name!r} is not known")
            start, end = KNOWN_MARKERS[name]
            if start in special and end in special:
                return cls(special[start], special[end], region_cap)
        raise MapValidationError(
            "tool_calling",
            f"is absent and no known marker pair of {names} is in special_tokens of {tmap.id}",
        )

    def _step(self, inp: Input) -> _Act:
        key = (self.state, inp)
        found = _TRANSITIONS.get(key)
        if found is None:
            self.state = State.ERROR
            raise LocalProtocolError(f"{inp.name} not allowed in state {key[0].name}")
        self.state, act = found
        return act

    def _classify(self, tok: int) -> Input:
        if tok == self._start:
            return Input.START
        if tok == self._end:
            return Input.END
        if self.state is State.INSIDE and self._cap is not None and len(self._body) >= self._cap:
            return Input.ID_OVER_CAP
        return Input.ID

    def feed(self, ids: Iterable[int]) -> list[WatcherEvent]:
        """Events completed by ``ids``, in stream order."""
        if not isinstance(ids, list | tuple):
            ids = list(ids)
        if self.state is State.OUTSIDE and self._start not in ids:
            # Fast path, the common frame: no region starts here (stray ends pass through).
            return [WatcherEvent(EventKind.PASSTHROUGH, tuple(ids))] if ids else []
        if self.state in (State.ENDED, State.ERROR) and not ids:
            self._step(Input.ID)  # feeding after end is illegal even when empty
        events: list[WatcherEvent] = []
        run: list[int] = []
        for tok in ids:
            act = self._step(self._classify(tok))
            if act is _Act.KEEP:
                run.append(tok)
            elif act is _Act.BODY:
                self._body.append(tok)
            elif act is not _Act.DROP:
                self._apply(act, tok, run, events, None)
        if run:
            events.append(WatcherEvent(EventKind.PASSTHROUGH, tuple(run)))
        return events

    def end(self, finish_reason: str | None = None) -> list[WatcherEvent]:
        """The stream ended: ``truncated`` if a region is open, else nothing. Permanent."""
        events: list[WatcherEvent] = []
        self._apply(self._step(Input.EOS), None, [], events, finish_reason)
        return events

    def _apply(
        self,
        act: _Act,
        tok: int | None,
        run: list[int],
        events: list[WatcherEvent],
        finish_reason: str | None,
    ) -> None:
        if act is _Act.OPEN:
            if run:
                events.append(WatcherEvent(EventKind.PASSTHROUGH, tuple(run)))
                run.clear()
            self._body = []
        elif act is _Act.NESTED:
            events.append(WatcherEvent(EventKind.NESTED_START, (tok,)))  # type: ignore[arg-type]
        elif act is _Act.CLOSE:
            events.append(WatcherEvent(EventKind.REGION, tuple(self._body)))
            self._body = []
        elif act is _Act.OVERFLOW:
            events.append(WatcherEvent(EventKind.OVERFLOW, tuple(self._body)))
        elif act is _Act.TRUNCATE:
            events.append(WatcherEvent(EventKind.TRUNCATED, tuple(self._body), finish_reason))
            self._body = []
        elif act is _Act.NONE:
            self._body = []
