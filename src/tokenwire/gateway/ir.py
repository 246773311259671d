"""The internal event stream: what every upstream produces and every API renders.

The gateway's one idea (DESIGN.md, STYLE §6 item 9): N upstreams + M APIs, not N x M
translators. An upstream adapter turns its engine's output into these events; an API renderer
turns them into its wire format. Neither knows the other exists.

A generation is a sequence of zero or more deltas followed by exactly one terminal event:
:class:`Finish` (the model stopped, for a normalised reason) or :class:`Failure` (it could
not produce an answer, classified so that retry budgets and status codes can be chosen from
structured fields, never from message text).

Everything here is a frozen ``msgspec.Struct`` tagged union (STYLE §6 item 5), so events can
be logged, recorded and replayed as msgpack or JSON without a hand-written schema.
"""

from __future__ import annotations

import enum
from typing import Protocol

import msgspec

__all__ = [
    "ChatMessage",
    "ChatPrompt",
    "Event",
    "EventStream",
    "Failure",
    "FailureClass",
    "Finish",
    "FinishKind",
    "GenerationRequest",
    "Prompt",
    "PromptIds",
    "PromptText",
    "ReasoningDelta",
    "TokenDelta",
    "ToolCallDelta",
    "Upstream",
    "Usage",
    "is_terminal",
]


class FinishKind(enum.StrEnum):
    """Why a generation ended, in one vocabulary for every upstream.

    APIs map these to their own words: Codec writes ``eos_token`` / ``stop_sequence`` /
    ``length`` / ``policy_violation`` (codec-spec §5.7), OpenAI writes ``stop`` / ``length``
    / ``content_filter`` / ``tool_calls``.
    """

    EOS = "eos"
    STOP_SEQUENCE = "stop_sequence"
    LENGTH = "length"
    POLICY_VIOLATION = "policy_violation"
    TOOL_CALLS = "tool_calls"
    ABORT = "abort"


class FailureClass(enum.StrEnum):
    """What kind of failure, read by retry budgets and status mapping (STYLE §6 item 3)."""

    INVALID_REQUEST = "invalid_request"  # the request cannot succeed as sent: do not retry
    CAPACITY = "capacity"  # the upstream is full: retry later, elsewhere
    TIMEOUT = "timeout"  # the upstream did not answer in time
    UPSTREAM = "upstream"  # the upstream failed while generating
    INTERNAL = "internal"  # a bug on our side


# -- events ----------------------------------------------------------------------------------


class TokenDelta(msgspec.Struct, frozen=True, kw_only=True, tag="token"):
    """Newly generated tokens: their ids and the text they complete.

    ``ids`` may be empty when an upstream speaks text only, or when held-back text is
    released at the end; ``text`` may be empty while a multi-byte character or a possible
    stop sequence is still incomplete. The two are not aligned token by token: ``text`` is
    what a text API should show next, ``ids`` what a Codec API should send next.
    """

    ids: tuple[int, ...] = ()
    text: str = ""


class ToolCallDelta(msgspec.Struct, frozen=True, kw_only=True, tag="tool_call"):
    """A fragment of tool call ``index``: the first carries ``id``/``name``, later ones args."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


class ReasoningDelta(msgspec.Struct, frozen=True, kw_only=True, tag="reasoning"):
    """Reasoning ("thinking") text, shown separately from the answer by APIs that can."""

    text: str


class Usage(msgspec.Struct, frozen=True, kw_only=True, tag="usage"):
    """Token counts; sent once, just before the terminal event."""

    prompt_tokens: int
    completion_tokens: int


class Finish(msgspec.Struct, frozen=True, kw_only=True, tag="finish"):
    """The generation ended normally. ``matched_stop`` names the stop string that fired."""

    reason: FinishKind
    matched_stop: str | None = None


class Failure(msgspec.Struct, frozen=True, kw_only=True, tag="failure"):
    """The generation could not complete. ``status`` is the HTTP status to answer with when
    no response headers have been sent yet; afterwards the API reports it in-stream."""

    failure_class: FailureClass
    message: str
    status: int = 500


Event = TokenDelta | ToolCallDelta | ReasoningDelta | Usage | Finish | Failure


def is_terminal(event: Event) -> bool:
    """True for the one event that ends every generation."""
    return isinstance(event, Finish | Failure)


# -- requests --------------------------------------------------------------------------------


class PromptIds(msgspec.Struct, frozen=True, kw_only=True, tag="ids"):
    """A prompt already tokenized (codec-spec §2.1 pattern B / Path C): used as is."""

    ids: tuple[int, ...]


class PromptText(msgspec.Struct, frozen=True, kw_only=True, tag="text"):
    """A completion prompt as text. Special-token strings in it stay plain text."""

    text: str


class ChatMessage(msgspec.Struct, frozen=True, kw_only=True):
    role: str
    content: str


class ChatPrompt(msgspec.Struct, frozen=True, kw_only=True, tag="chat"):
    """Chat messages; the upstream applies its model's chat template."""

    messages: tuple[ChatMessage, ...]


Prompt = PromptIds | PromptText | ChatPrompt


class GenerationRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One generation, independent of the API it arrived through.

    Sampling defaults are OpenAI's (temperature 1, top_p 1). ``ignore_eos`` is vLLM's
    extension: keep generating through end-of-sequence tokens (benchmarks need fixed
    lengths). ``banned_ids`` end the generation with ``POLICY_VIOLATION`` before a banned
    id is sent. ``request_id`` ties upstream records to the HTTP response that asked.
    """

    prompt: Prompt
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    n: int = 1
    ignore_eos: bool = False
    #: The deployment's safety policy, enforced by the upstream on sampled ids (§5.5).
    banned_ids: frozenset[int] = frozenset()
    request_id: str = ""


# -- the upstream interface ------------------------------------------------------------------


class EventStream(Protocol):
    """One running generation, as seen from the event loop."""

    async def next_event(self) -> Event:
        """The next event; cancelling the wait loses nothing (the event stays queued)."""
        ...

    def cancel(self) -> None:
        """Stop generating (the client went away); the stream then ends with ``ABORT``."""
        ...


class Upstream(Protocol):
    """Something that turns :class:`GenerationRequest` values into event streams."""

    model_id: str

    def submit(self, request: GenerationRequest) -> EventStream:
        """Admit a request, or raise :class:`~tokenwire.errors.ServerBusy` when full."""
        ...
