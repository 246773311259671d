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
from collections.abc import Callable
from typing import Any, Protocol

import msgspec

__all__ = [
    "GATEWAY_FAILURE_CODES",
    "ChatMessage",
    "ChatPrompt",
    "ClientConnection",
    "ContentPart",
    "Event",
    "EventStream",
    "Failure",
    "FailureClass",
    "Finish",
    "FinishKind",
    "GenerationRequest",
    "Heartbeat",
    "IdsSource",
    "ImagePart",
    "MessageStart",
    "MessageToolCall",
    "Prompt",
    "PromptCounts",
    "PromptIds",
    "PromptText",
    "ReasoningDelta",
    "ResponseFormat",
    "ResponseMeta",
    "TextPart",
    "TokenDelta",
    "TokenLogprob",
    "ToolCallDelta",
    "ToolSpec",
    "TopLogprob",
    "Upstream",
    "Usage",
    "UsageSource",
    "fail_attempt",
    "fails_over",
    "free_slot",
    "is_terminal",
    "kind_of",
    "push_through",
    "replica_of",
    "start_early",
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
    CONTENT_FILTER = "content_filter"  # the upstream's own filter stopped the answer
    ABORT = "abort"


class FailureClass(enum.StrEnum):
    """What kind of failure, read by retry budgets and status mapping (STYLE §6 item 3).

    Upstream adapters classify from structured fields (HTTP status, error ``type``/``code``,
    counts), at their boundary; nothing downstream parses message text.
    """

    INVALID_REQUEST = "invalid_request"  # the request cannot succeed as sent: do not retry
    CONTEXT_LENGTH = "context_length_exceeded"  # prompt + max_tokens over the model's window
    AUTHENTICATION = "authentication"  # the upstream refused our credentials (401/403)
    RATE_LIMITED = "rate_limited"  # a temporary throttle (429); ``retry_after`` when known
    QUOTA = "quota"  # quota, billing or plan limits: final
    CONTENT_FILTER = "content_filter"  # the upstream refused the content
    CAPACITY = "capacity"  # the upstream is full: retry later, elsewhere
    CONNECTION = "connection"  # could not connect / connection reset before any answer
    TIMEOUT = "timeout"  # the upstream did not answer in time
    UPSTREAM = "upstream"  # the upstream failed while generating (5xx, broken stream)
    INTERNAL = "internal"  # a bug on our side


#: ``Failure.code`` values the gateway itself assigns (it shut down, one of its own deadlines
#: passed): every API shows them as they are, so a client, the request log and the README
#: use one word for one event (README "Error codes"). Upstream codes are not among them: an
#: upstream's word can mean something else to our client (its ``invalid_api_key`` is about
#: *our* key).
GATEWAY_FAILURE_CODES = frozenset({"server_shutting_down", "idle_timeout", "request_timeout",
                                   "answer_too_large"})


# -- events ----------------------------------------------------------------------------------


class TopLogprob(msgspec.Struct, frozen=True, kw_only=True):
    """One of the most likely tokens at a position: its text, its UTF-8 bytes (a token can
    end inside a character, so ``token`` may hold U+FFFD where ``bytes`` is exact) and its
    log probability under the model's distribution before sampling."""

    token: str
    bytes: tuple[int, ...]
    logprob: float


class TokenLogprob(msgspec.Struct, frozen=True, kw_only=True):
    """The log probability of one generated token, with the ``top`` alternatives (most
    likely first) when the client asked for them (``top_logprobs``)."""

    token: str
    bytes: tuple[int, ...]
    logprob: float
    top: tuple[TopLogprob, ...] = ()


class TokenDelta(msgspec.Struct, frozen=True, kw_only=True, tag="token"):
    """Newly generated tokens: their ids and the text they complete.

    ``ids`` may be empty when an upstream speaks text only, or when held-back text is
    released at the end; ``text`` may be empty while a multi-byte character or a possible
    stop sequence is still incomplete. The two are not aligned token by token: ``text`` is
    what a text API should show next, ``ids`` what a Codec API should send next.
    ``logprobs`` holds one entry per generated token of this delta, only when the request
    asked for them (:attr:`GenerationRequest.logprobs`).
    """

    ids: tuple[int, ...] = ()
    text: str = ""
    logprobs: tuple[TokenLogprob, ...] = ()


class ToolCallDelta(msgspec.Struct, frozen=True, kw_only=True, tag="tool_call"):
    """A fragment of tool call ``index``: the first carries ``id``/``name``, later ones args.

    ``kind`` is ``"function"`` (JSON arguments) or ``"custom"`` (freeform input, e.g. the
    Codex ``apply_patch`` tool); ``arguments`` holds either, fragment by fragment.
    """

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""
    kind: str = "function"


class ReasoningDelta(msgspec.Struct, frozen=True, kw_only=True, tag="reasoning"):
    """Reasoning ("thinking") text, shown separately from the answer by APIs that can.

    ``encrypted`` holds opaque reasoning state as (upstream name, blob) pairs (a Responses
    ``encrypted_content`` item, an Anthropic signed thinking block): an API that can hand it
    to the client keeps the pair so the next turn's :attr:`ChatMessage.reasoning_encrypted`
    returns it to the upstream that produced it, and to no other.
    """

    text: str
    encrypted: tuple[tuple[str, str], ...] = ()


class UsageSource(enum.StrEnum):
    """Who counted a :class:`Usage` (README "Usage": ``Tokenwire-Usage-Source``)."""

    ENGINE = "engine"  # the embedded engine: the ids it evaluated and sampled
    UPSTREAM = "upstream"  # the upstream reported the counts itself
    GATEWAY = "gateway"  # tokenwire counted with the model's map (the upstream said nothing)


class Usage(msgspec.Struct, frozen=True, kw_only=True, tag="usage"):
    """Token counts, in OpenAI's convention: ``prompt_tokens`` is the whole prompt,
    cached and cache-written tokens included; ``completion_tokens`` includes reasoning.

    Sent just before the terminal event; an upstream that knows the prompt's count early
    may also send one before any output with ``completion_tokens=None`` (Anthropic's
    ``message_start`` shows it). Renderers keep the last. ``None`` always means "not
    known", never zero: ``cached_tokens`` (prompt tokens read from a cache),
    ``cache_creation_tokens`` (written to it, Anthropic's), ``reasoning_tokens`` (of the
    completion) are ``None`` when the upstream did not say.
    """

    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None = None
    cache_creation_tokens: int | None = None
    reasoning_tokens: int | None = None
    source: UsageSource = UsageSource.UPSTREAM

    @property
    def total_tokens(self) -> int | None:
        if self.prompt_tokens is None or self.completion_tokens is None:
            return None
        return self.prompt_tokens + self.completion_tokens


class Finish(msgspec.Struct, frozen=True, kw_only=True, tag="finish"):
    """The generation ended normally. ``matched_stop`` names the stop string that fired."""

    reason: FinishKind
    matched_stop: str | None = None


class Failure(msgspec.Struct, frozen=True, kw_only=True, tag="failure"):
    """The generation could not complete. ``status`` is the HTTP status to answer with when
    no response headers have been sent yet; afterwards the API reports it in-stream.

    ``retry_after`` (seconds) is the upstream's ``Retry-After`` when it sent one; ``code`` is
    the upstream's own machine-readable code, kept for logs and for APIs that pass it on.
    For ``CONTEXT_LENGTH``, ``prompt_tokens`` and ``context_tokens`` are the counts when the
    upstream reported them (the only parts of its message worth keeping). ``param`` names
    the request field the failure is about, when it is one (OpenAI's ``error.param``).
    """

    failure_class: FailureClass
    message: str
    status: int = 500
    retry_after: float | None = None
    code: str | None = None
    prompt_tokens: int | None = None
    context_tokens: int | None = None
    param: str | None = None


class ResponseMeta(msgspec.Struct, frozen=True, kw_only=True, tag="meta"):
    """Facts the upstream reported about the response itself, not content; ``None`` = not said.

    ``service_tier`` is the tier the upstream says it *served* (a recognised public value,
    never the requested tier echoed back); ``end_turn`` is the upstream's actual boolean (a
    continuation vs the end of a turn); ``turn_state`` is the upstream's
    ``x-codex-turn-state`` already wrapped with the scope naming that upstream
    (``gateway/affinity.py``), opaque to every API and never logged. Seed, "Service tiers on
    Responses upstreams", "Replayed items and turn terminals", "Response ids, cache
    affinity, and turn state". APIs without a place for these ignore the event; several may
    arrive (the turn state with the response head, the rest just before the terminal).

    ``model`` is never from an upstream: the supervisor sends it when a fallback model
    (``gateway/routing/fallbacks.py``) serves the request instead of the routed one, and
    every API with a ``model`` field then names that model.
    """

    service_tier: str | None = None
    end_turn: bool | None = None
    turn_state: str | None = None
    model: str | None = None


class MessageStart(msgspec.Struct, frozen=True, kw_only=True, tag="message_start"):
    """A new assistant message begins here: the text that follows is a separate message.

    ``phase`` is the upstream's own label for it (``commentary``, ``final_answer`` or
    ``partial_answer``), ``None`` when it gave none or an unknown one. Only a Responses
    upstream says this and only the Responses API shows it (one ``message`` item each, its
    phase kept); every other API ignores the event (seed, "Replayed items and turn
    terminals": message boundaries and phases are retained).
    """

    phase: str | None = None


class Heartbeat(msgspec.Struct, frozen=True, kw_only=True, tag="heartbeat"):
    """Nothing happened for a while: the request is queued, waiting to retry, or the
    upstream is quiet. Never from an upstream: the supervisor between upstreams and APIs
    (``gateway/supervision/supervisor.py``) sends it every 15 s of silence, and each streaming API
    renders its own keep-alive (seed, "Streaming, reasoning summaries, and heartbeats"):
    ``response.in_progress`` on Responses, Anthropic's ``ping`` on Messages, an SSE comment
    on Chat and Completions, an empty-ids frame on Codec streams. Not output: it never
    counts as published and carries no text."""


Event = (TokenDelta | ToolCallDelta | ReasoningDelta | Usage | ResponseMeta | MessageStart
         | Heartbeat | Finish | Failure)


#: The two terminal event types. Events are final values (never subclassed), so a type test
#: is exact; it is called several times per token, and ``isinstance`` against a union of
#: msgspec Struct types cost ~7% of the gateway's busy samples at 64 streams (BENCHMARKS.md).
_TERMINAL_TYPES = (Finish, Failure)


def is_terminal(event: Event) -> bool:
    """True for the one event that ends every generation."""
    return type(event) in _TERMINAL_TYPES


# -- requests --------------------------------------------------------------------------------


class PromptIds(msgspec.Struct, frozen=True, kw_only=True, tag="ids"):
    """A prompt already tokenized (codec-spec §2.1 pattern B / Path C): used as is."""

    ids: tuple[int, ...]


class PromptText(msgspec.Struct, frozen=True, kw_only=True, tag="text"):
    """A completion prompt as text. Special-token strings in it stay plain text."""

    text: str


class TextPart(msgspec.Struct, frozen=True, kw_only=True, tag="text"):
    text: str


class ImagePart(msgspec.Struct, frozen=True, kw_only=True, tag="image"):
    """An inline image: ``url`` is an ``https:`` URL or a ``data:`` URL with the bytes.

    ``param`` is where the client put it, in its API's own path form
    (``messages[0].content[1]``, ``messages.0.content.1``, ``input[2].content[0]``): a model
    that cannot take images names that field in its refusal."""

    url: str
    detail: str | None = None
    param: str | None = None


ContentPart = TextPart | ImagePart


class MessageToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """A complete tool call in the conversation history (an assistant turn that called)."""

    id: str
    name: str
    arguments: str
    kind: str = "function"


class ChatMessage(msgspec.Struct, frozen=True, kw_only=True):
    """One turn. ``role`` is system, developer, user, assistant or tool.

    ``content`` is plain text or parts (text and images). An assistant turn may carry
    ``tool_calls``; a tool turn answers one call, named by ``tool_call_id`` (kept exactly as
    the client sent it). ``reasoning`` is reasoning text an assistant turn produced.
    """

    role: str
    content: str | tuple[ContentPart, ...] = ""
    tool_calls: tuple[MessageToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    reasoning: str | None = None
    #: Opaque reasoning state from earlier turns, (upstream name, blob) pairs: an adapter
    #: sends back only the blobs its own upstream produced (see :class:`ReasoningDelta`).
    reasoning_encrypted: tuple[tuple[str, str], ...] = ()

    @property
    def text(self) -> str:
        """The text of ``content`` (image parts left out)."""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content if isinstance(p, TextPart))


class ToolSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A tool the model may call: ``function`` (JSON-schema ``parameters``) or ``custom``
    (freeform input, optionally constrained by ``format``, as the Responses API defines)."""

    name: str
    description: str = ""
    parameters: dict | None = None
    kind: str = "function"
    format: dict | None = None
    strict: bool | None = None


class ResponseFormat(msgspec.Struct, frozen=True, kw_only=True):
    """Structured output the client asked for: Chat ``response_format``, Responses
    ``text.format`` (a ``text`` format is no format: the parsers leave it ``None``).

    ``type`` is ``json_object`` (any JSON object) or ``json_schema`` (``schema`` must
    match); ``name`` and ``strict`` are the client's, kept for upstreams that take them.
    ``param`` is where the client put it (``response_format``, ``text.format``), so an
    engine that cannot enforce the schema names that field in its 400.
    """

    type: str
    schema: dict | None = None
    name: str | None = None
    strict: bool | None = None
    param: str | None = None


class ChatPrompt(msgspec.Struct, frozen=True, kw_only=True, tag="chat"):
    """Chat messages; the upstream applies its model's chat template."""

    messages: tuple[ChatMessage, ...]


Prompt = PromptIds | PromptText | ChatPrompt


class PromptCounts(msgspec.Struct, dict=True):
    """A request's memo of its prompt's counts, one per tokenizer map
    (``context_window.certain_request_tokens``), so that the preflight before sending, the
    truncation check after it and a fallback on the same map encode the prompt once (an
    agent's context of 60,000 characters is ~7 ms of encoding).

    Not part of the request's value: a Struct with no fields (its state is in its
    ``__dict__``), so every memo equals every other, requests still compare and hash by what
    they ask, and one encodes as ``{}`` (a request stays a loggable, replayable Struct).
    ``msgspec.structs.replace`` shares the memo between a request and its copies; a copy
    with another prompt is told apart by the prompt's identity and counted afresh. A count
    may be made on a worker thread: one dictionary store, and at worst a count made twice."""

    def count(self, prompt: object, key: str, make: Callable[[], int | None]) -> int | None:
        """The count of ``prompt`` under ``key`` (a map's hash), made by ``make()`` once."""
        state = self.__dict__
        if state.get("prompt") is not prompt:
            state["prompt"], state["by_map"] = prompt, {}
        by_map: dict[str, int | None] = state["by_map"]
        if key not in by_map:
            by_map[key] = make()
        return by_map[key]

    def has(self, prompt: object, key: str) -> bool:
        """True when ``prompt`` has been counted under ``key``."""
        state = self.__dict__
        return state.get("prompt") is prompt and key in state["by_map"]

    def __hash__(self) -> int:
        return 0


class GenerationRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One generation, independent of the API it arrived through.

    ``None`` means the client did not say: ``max_tokens`` and the sampling fields
    (``temperature``, ``top_p``, ``top_k``, ``min_p``) are then left to whoever generates.
    An upstream adapter omits them, so the upstream applies its own defaults; the embedded
    engine uses the model's recommended sampling and ``gateway/defaults.py``. A value the
    client sent always wins. ``ignore_eos`` is vLLM's extension: keep generating through
    end-of-sequence tokens (benchmarks need fixed lengths). ``banned_ids`` end the
    generation with ``POLICY_VIOLATION`` before a banned id is sent. ``request_id`` ties
    upstream records to the HTTP response that asked.
    """

    prompt: Prompt
    #: The model name the client asked for, as routed (upstreams may rename it).
    model: str = ""
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    #: vLLM's, llama.cpp's and Anthropic's extensions to OpenAI's sampling fields.
    top_k: int | None = None
    min_p: float | None = None
    #: OpenAI's penalties (-2..2) and llama.cpp's ``repeat_penalty`` (1.0 = off).
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repeat_penalty: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    n: int = 1
    ignore_eos: bool = False
    #: The deployment's safety policy, enforced by the upstream on sampled ids (§5.5).
    banned_ids: frozenset[int] = frozenset()
    request_id: str = ""
    tools: tuple[ToolSpec, ...] = ()
    #: "auto", "none", "required", or {"name": ...} for one tool.
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None
    #: JSON output the answer must be (``None``: text); see :class:`ResponseFormat`.
    response_format: ResponseFormat | None = None
    #: "low" / "medium" / "high" where the upstream supports reasoning effort.
    reasoning_effort: str | None = None
    #: The service tier the client asked for; only Responses upstreams receive it (the
    #: tier actually served comes back in :class:`ResponseMeta`, never assumed).
    service_tier: str | None = None
    #: The client wants token ids (a Codec stream_format, or ``return_token_ids``): upstreams
    #: that can return their ids should be asked for them.
    want_ids: bool = False
    #: The client shows text (every JSON API). False when the response is Codec frames, which
    #: carry ids only (codec-spec §2.3): an upstream that returns ids then need not detokenize.
    want_text: bool = True
    #: The client's exact Responses request bytes, set only when the gateway changed nothing
    #: in them (seed: "forwarded as the same object"): a Responses upstream sends them as is
    #: when it serves the model under the client's name. ``None`` for every other request.
    passthrough_body: bytes | None = None
    #: The client's decoded Messages body, when an Anthropic upstream serves it: that
    #: upstream builds its request from it (with the gateway's model name, ``max_tokens``
    #: and streaming), so what the IR has no place for reaches it unchanged: block-level
    #: ``cache_control``, the thinking budget, ``is_error``. ``None`` for every other
    #: request, and cleared for a fallback (``routing/fallbacks.py``).
    client_body: dict[str, Any] | None = None
    #: Cache-affinity hints from the client, ``(name, value)`` pairs already checked for
    #: form; which reach an upstream is decided per upstream kind (``gateway/affinity.py``).
    affinity: tuple[tuple[str, str], ...] = ()
    #: Log probabilities of the generated tokens, with ``top_logprobs`` alternatives each
    #: (``None`` = none asked; 0 = only the chosen token's).
    logprobs: bool = False
    top_logprobs: int | None = None
    #: The API the request came through (``chat``, ``completions``, ``responses``,
    #: ``messages``, ``codec``): a refusal names the field in that API's words.
    api: str = ""
    #: Fields of that API the IR has no place for, sent only to an upstream that speaks the
    #: same API, unchanged, as ``(name, value)`` (``gateway/request_fields.py`` lists them;
    #: any other upstream kind refuses the request with a 400 naming the field).
    extensions: tuple[tuple[str, Any], ...] = ()
    #: The long-lived client connection the request came on (a Responses WebSocket), or
    #: None: an upstream may keep per-connection state there (:class:`ClientConnection`).
    connection: ClientConnection | None = None
    #: What has been counted of ``prompt``, by whoever counted first (:class:`PromptCounts`).
    counts: PromptCounts = msgspec.field(default_factory=PromptCounts)


class ClientConnection:
    """What one long-lived client connection (a Responses WebSocket) lends the upstreams its
    requests reach: a place for state that lives exactly as long as the connection, such as
    an upstream WebSocket held for it (``upstreams/responses_socket.py``). The transport
    that owns the connection calls :meth:`aclose` when it ends; ``note(upstream, outcome)``
    counts what happened to held state (the gateway's metrics)."""

    def __init__(self, note: Callable[[str, str], None] | None = None) -> None:
        self._held: dict[str, Any] = {}
        self.note: Callable[[str, str], None] = note or (lambda upstream, outcome: None)
        self.closed = False

    def held(self, key: str, make: Callable[[], Any]) -> Any:
        """The state kept under ``key``, made by ``make()`` on first use. Each value has an
        ``async aclose()``."""
        if key not in self._held:
            self._held[key] = make()
        return self._held[key]

    async def aclose(self) -> None:
        """End every held value (each ``aclose`` is the holder's own: it must not raise)."""
        self.closed = True
        held, self._held = list(self._held.values()), {}
        for value in held:
            await value.aclose()


# -- the upstream interface ------------------------------------------------------------------


class IdsSource(enum.StrEnum):
    """Where the ids of a stream come from; told to clients in ``Codec-Ids-Source``."""

    ENGINE = "engine"  # the embedded engine: the ids it sampled
    UPSTREAM = "upstream"  # the upstream returned its ids (Codec-native, vLLM, llama.cpp)
    RETOKENIZED = "retokenized"  # the upstream sent text; we tokenized it with the model's map
    NONE = "none"  # no ids and no map: Codec stream formats are refused for this model


class EventStream(Protocol):
    """One running generation, as seen from the event loop.

    Optional: ``replica``, the replica of a pool (``routing/pool.py``) running it (default
    None); read it with :func:`replica_of`. ``start()``: begin the work at once, before the
    first :meth:`next_event` (an HTTP upstream sends its request); call it with
    :func:`start_early`. ``fail(failure)``: stop, ending the attempt with a failure its
    owner decided (a pool's replica that stayed silent is counted against it); call it
    with :func:`fail_attempt` (default: :meth:`cancel`)."""

    replica: Any = None

    async def next_event(self) -> Event:
        """The next event; cancelling the wait loses nothing (the event stays queued)."""
        ...

    def cancel(self) -> None:
        """Stop generating (the client went away); the stream then ends with ``ABORT``."""
        ...


class Upstream(Protocol):
    """Something that turns :class:`GenerationRequest` values into event streams.

    ``kind``, ``has_free_slot`` and ``can_fail_over`` are optional: an in-process engine or
    a test's scripted upstream may leave them out, and the defaults here are what that
    means. Read them with :func:`kind_of`, :func:`free_slot` and :func:`fails_over` (one
    default each, never a caller's own guess)."""

    model_id: str
    #: The adapter kind (``upstreams/base.py``); without one, an in-process engine.
    kind: str = "embedded"

    def submit(self, request: GenerationRequest) -> EventStream:
        """Admit a request, or raise :class:`~tokenwire.errors.ServerBusy` when full."""
        ...

    def has_free_slot(self, avoid: frozenset[str] = frozenset(), running: int = 0) -> bool:
        """May admission start one more request here (a pool: on a replica not in
        ``avoid``), with ``running`` requests it already started here? By default yes:
        admission's own limits decide."""
        return True

    def can_fail_over(self, failure: Failure, avoid: frozenset[str],
                      request: GenerationRequest) -> bool:
        """Should another replica get ``failure``'s request now? Only a pool has another."""
        return False


def kind_of(upstream: object) -> str:
    """``upstream.kind``, or the protocol's default."""
    return getattr(upstream, "kind", Upstream.kind)


def free_slot(upstream: object, avoid: frozenset[str] = frozenset(), running: int = 0) -> bool:
    """``upstream.has_free_slot(avoid, running=running)``, or the protocol's default (yes)."""
    free = getattr(upstream, "has_free_slot", None)
    return True if free is None else bool(free(avoid, running=running))


def fails_over(upstream: object, failure: Failure, avoid: frozenset[str],
               request: GenerationRequest) -> bool:
    """``upstream.can_fail_over(...)``, or the protocol's default (no)."""
    check = getattr(upstream, "can_fail_over", None)
    return bool(check is not None and check(failure, avoid, request))


def replica_of(stream: object) -> Any:
    """``stream.replica``, or the protocol's default (None: not a pool's)."""
    return getattr(stream, "replica", EventStream.replica)


def fail_attempt(stream: EventStream, failure: Failure) -> None:
    """``stream.fail(failure)``, or the protocol's default (:meth:`EventStream.cancel`)."""
    fail = getattr(stream, "fail", None)
    if fail is None:
        stream.cancel()
    else:
        fail(failure)


def push_through(stream: object, offer: Callable[[Event], bool]) -> bool:
    """Have ``stream`` offer its events to ``offer`` as they arrive (its optional
    ``push_to``: ``upstreams/sse_http.SSEUpstreamStream.push_to`` says how); False if it
    cannot (it gives every event through ``next_event``, the protocol's default)."""
    push_to = getattr(stream, "push_to", None)
    return push_to is not None and bool(push_to(offer))


def start_early(stream: object) -> bool:
    """Have ``stream`` begin its work now (its optional ``start()``); False if it has none
    (it begins at its first ``next_event``, the protocol's default)."""
    start = getattr(stream, "start", None)
    if start is None:
        return False
    start()
    return True
