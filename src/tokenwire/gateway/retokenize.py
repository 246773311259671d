"""Streaming text -> ids for upstreams that send text only (``Codec-Ids-Source: retokenized``).

A text-only upstream (most OpenAI-compatible servers, hosted APIs) streams text deltas; a
Codec client wants ids (codec-spec §2.1). We tokenize the text with the model's map so the
ids are the ones :meth:`Tokenizer.encode` gives for the whole answer, whatever the split of
the text into deltas:

    concat(feed(d) for d in deltas) + flush() == Tokenizer.from_map(tmap).encode("".join(deltas))

byte_level BPE works per pre-tokenizer piece (codec-spec §3.4 steps 2-3), so ids can be sent
for every piece that more text can no longer change. More text changes only the tail of a
split: the last piece always (a word or a whitespace run may grow), and a few characters
before it where the pre-tokenizer looks ahead: a contraction literal (``'re``) is up to 3
characters and may be split as ``'`` + ``r`` until its last letter arrives; a whitespace run
gives its last space to a following word (``(?!\\S)``). And a whitespace run at the end is
not settled at any length: cl100k's newline block (``\\s*[\\r\\n]+``) spans a run up to its
last newline, so ``"\\n   "`` splits as ``"\\n"`` + ``"   "`` until a ``"\\n"`` makes it one
piece (a blank line of indented code). So we hold back the last piece, every piece ending
within :data:`HOLD_BACK_CHARS` of the end and every piece ending inside the trailing run of
White_Space, and commit a prefix only if it splits on its own into the same pieces (the end
of text is itself a lookahead). The hypothesis tests in ``tests/gateway/test_retokenize.py``
check the equation over random splits of the corpus and of adversarial strings, for SmolLM2
(both maps) and cl100k.

Splitting and encoding are pure functions of the text, and the texts are short and repeat
(a commit is mostly one word: ``" the"``, ``",\n"``), so both are memoized, shared by every
stream of a map and bounded (:data:`MEMO_ENTRIES` texts of at most :data:`MEMO_MAX_CHARS`):
a remembered answer is the answer, so the memos change no id, only the cost.

Metaspace and identity maps (and a pre-tokenizer whose pieces are not substrings) have no
such piece structure that we can rely on, so their text is held and encoded once at
:meth:`Retokenizer.flush`: exact, but the ids come at the end.

:class:`RetokenizingStream` wraps an upstream's event stream and fills ``TokenDelta.ids``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from weakref import WeakKeyDictionary

import msgspec

from tokenwire.codec import pretok
from tokenwire.codec.maps import TokenizerMap
from tokenwire.codec.tokenizer import Tokenizer
from tokenwire.codec.unicode_classes import WHITE_SPACE
from tokenwire.errors import RemoteProtocolError, TokenwireError
from tokenwire.gateway.ir import (
    Event,
    EventStream,
    Failure,
    FailureClass,
    TokenDelta,
    Usage,
    is_terminal,
    push_through,
    start_early,
)

__all__ = [
    "HOLD_BACK_CHARS",
    "MEMO_ENTRIES",
    "MEMO_MAX_CHARS",
    "RETOKENIZE_FAILED",
    "RetokenizeFailed",
    "Retokenizer",
    "RetokenizingStream",
    "UntokenizableText",
    "encode_text",
    "retokenize_failure",
    "tokenizer_for",
]

#: Characters before the end of the buffered text whose pieces are never committed. The
#: longest look-ahead in the shipped pre-tokenizers is a 3-character contraction literal
#: (``'re``, ``'ve``, ``'ll``), so 3 covers it; whitespace look-ahead is 1 character.
HOLD_BACK_CHARS = 3
#: The ops' whitespace (Unicode White_Space, tokenwire.codec.unicode_classes), for rstrip.
_WHITE_SPACE = "".join(map(chr, WHITE_SPACE))

#: Texts each memo (splits per pre-tokenizer, ids per tokenizer) holds before it starts
#: over. A 2,048-token answer commits ~1,400 texts, ~700 of them distinct (bench/
#: bench_retokenize.py), so 4,096 keeps a map's common words across streams; starting over
#: (not LRU) keeps a hit at one dict lookup.
MEMO_ENTRIES = 4096
#: Longest text memoized: pending text and commits are a word or two; a longer one (a run
#: of spaces or digits still growing, a long word) is computed each time, so an entry is
#: small whatever a stream sends (4,096 x 64 characters at most).
MEMO_MAX_CHARS = 64


@lru_cache(maxsize=8)  # building a tokenizer costs ~0.1 s; streams of one model share it
def tokenizer_for(tmap: TokenizerMap) -> Tokenizer:
    """The shared :class:`Tokenizer` of ``tmap`` (its ``calls`` count covers every stream)."""
    return Tokenizer.from_map(tmap)


#: What may never be swallowed while tokenizing: an interpreter exit or interrupt (a
#: cancellation cannot arrive inside this synchronous call).
_PASS_THROUGH = (KeyboardInterrupt, SystemExit, GeneratorExit)
#: The code of a stream that ended because its text could not be retokenized.
RETOKENIZE_FAILED = "retokenize_failed"


class UntokenizableText(RemoteProtocolError):
    """Caller text the model's tokenizer cannot encode: a 400 naming the field."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message, status_hint=400)
        self.param = param


class RetokenizeFailed(TokenwireError):
    """An upstream's text could not be tokenized with the model's map (our side: a 500)."""


def encode_text(tokenizer: Tokenizer, text: str, *, param: str | None = None) -> list[int]:
    """``tokenizer.encode(text)`` for text a caller sent; any failure is a typed 400.

    Native libraries can fail with exceptions that are not ``Exception``s: tiktoken's Rust
    regex overflows its stack on a long run of spaces and pyo3 raises ``PanicException``, a
    ``BaseException``. That must never take a route down, so everything but an interpreter
    exit becomes :class:`UntokenizableText` (named by type only: seed privacy rules)."""
    try:
        return tokenizer.encode(text)
    except _PASS_THROUGH:
        raise
    except BaseException as exc:
        where = f"{param}: " if param else ""
        raise UntokenizableText(f"{where}the text cannot be tokenized with the model's map "
                                f"({type(exc).__name__})", param=param) from None


def retokenize_failure(exc: BaseException) -> Failure:
    """The terminal of a stream whose upstream text could not be tokenized: our failure, a
    500 that is never retried (another attempt would produce the same text)."""
    return Failure(failure_class=FailureClass.INTERNAL, status=500, code=RETOKENIZE_FAILED,
                   message="the upstream's text could not be tokenized with the model's map "
                           f"({type(exc).__name__})")


@lru_cache(maxsize=8)  # compiled once per map, not per stream: a compile per request was
# 3 % of the gateway's samples at 64 Codec streams (BENCHMARKS.md "The hot path")
def _splitter(tmap: TokenizerMap) -> pretok.PreTokenizer | None:
    """The map's pre-tokenizer when pieces are substrings we can hold back, else None (a
    compiled pre-tokenizer keeps no state between calls: streams share it)."""
    if tmap.encoder != "byte_level":
        return None
    program = tmap.pre_tokenizer_program
    if program is not None and ("ops" in program or "stages" in program):
        ops = program.get("ops", []) + [
            op for st in program.get("stages", []) for op in st.get("ops", [])
        ]
        if any(op.get("op") == "metaspace_split" for op in ops):
            return None
        return pretok.compile_program(program)
    if tmap.pre_tokenizer_pattern is not None:
        return pretok.compile_pattern(tmap.pre_tokenizer_pattern)
    return None


Memo = dict[str, tuple]


@lru_cache(maxsize=8)  # as _splitter: one per map's pre-tokenizer, shared by its streams
def _split_memo(split: pretok.PreTokenizer) -> Memo:
    """text -> ``tuple(split.split(text))``, filled by :meth:`Retokenizer._pieces`."""
    return {}


#: tokenizer -> {text -> ids}: the memo lives as long as its tokenizer (tests and callers
#: may build their own; a weak key lets them go).
_IDS_MEMOS: WeakKeyDictionary[Tokenizer, Memo] = WeakKeyDictionary()


def _ids_memo(tokenizer: Tokenizer) -> Memo:
    memo = _IDS_MEMOS.get(tokenizer)
    if memo is None:
        memo = _IDS_MEMOS[tokenizer] = {}
    return memo


def _remember(memo: Memo, text: str, value: tuple) -> tuple:
    if len(text) <= MEMO_MAX_CHARS:
        if len(memo) >= MEMO_ENTRIES:
            memo.clear()
        memo[text] = value
    return value


class Retokenizer:
    """Feed text deltas, get the ids that became final; ``flush()`` at the end of the text.

    ``calls`` is the number of texts this stream had tokenized, whether
    :meth:`Tokenizer.encode` ran or the map's memo had the ids (``tokenizer.calls`` counts
    the encodes that ran).
    """

    def __init__(self, tmap: TokenizerMap, *, tokenizer: Tokenizer | None = None) -> None:
        self.tokenizer = tokenizer if tokenizer is not None else tokenizer_for(tmap)
        self._split = _splitter(tmap)
        self._splits = _split_memo(self._split) if self._split is not None else {}
        self._ids = _ids_memo(self.tokenizer)
        self._pending = ""
        self.calls = 0

    def feed(self, text: str) -> tuple[int, ...]:
        """Ids of the pieces ``text`` made final (often none for a one-character delta)."""
        if not text:
            return ()
        pending = self._pending = self._pending + text
        if self._split is None:
            return ()
        pieces = self._pieces(pending)
        k = _committable(pieces, len(pending), len(pending.rstrip(_WHITE_SPACE)))
        while k > 0:
            head = pieces[:k]
            prefix = "".join(head)
            if self._pieces(prefix) == head:
                self._pending = pending[len(prefix):]
                return self._encode(prefix)
            k -= 1  # the end of text changed a look-ahead: commit less
        return ()

    def flush(self) -> tuple[int, ...]:
        """Ids of everything still held back; the retokenizer is then empty."""
        text, self._pending = self._pending, ""
        return self._encode(text) if text else ()

    def _pieces(self, text: str) -> tuple[str, ...]:
        pieces = self._splits.get(text)
        if pieces is None:
            split = self._split.split  # type: ignore[union-attr]  # feed() checked it
            pieces = _remember(self._splits, text, tuple(split(text)))
        return pieces

    def _encode(self, text: str) -> tuple[int, ...]:
        self.calls += 1
        ids = self._ids.get(text)
        if ids is not None:
            return ids
        try:
            return _remember(self._ids, text, tuple(self.tokenizer.encode(text)))
        except _PASS_THROUGH:
            raise
        except BaseException as exc:
            raise RetokenizeFailed(type(exc).__name__) from None


def _committable(pieces: tuple[str, ...], total: int, settled: int) -> int:
    """How many leading pieces end before the last piece, the look-ahead window and the
    trailing whitespace run (which starts at ``settled``)."""
    limit = min(total - HOLD_BACK_CHARS, settled)
    end = 0
    k = 0
    for piece in pieces[:-1]:
        end += len(piece)
        if end > limit:
            break
        k += 1
    return k


class RetokenizingStream:
    """An :class:`~tokenwire.gateway.ir.EventStream` that adds ids to text-only deltas.

    A ``TokenDelta`` with text and no ids gets the ids its text made final; held-back ids
    are released in an id-only ``TokenDelta`` just before ``Usage`` or the terminal event
    (a ``Failure`` too: the client keeps what was generated). Deltas that already carry ids
    pass through untouched and are never tokenized.
    """

    def __init__(self, inner: EventStream, retokenizer: Retokenizer) -> None:
        self._inner = inner
        self.retokenizer = retokenizer
        self._queued: list[Event] = []
        self._failed: Failure | None = None
        self._sink: Callable[[Event], bool] | None = None
        #: A pushed delta already fed to the retokenizer, and what it made, that the sink
        #: refused: the inner stream gives the delta to next_event, which gives out this.
        self._refused: tuple[Event, Event] | None = None

    def start(self) -> None:
        start_early(self._inner)

    def push_to(self, sink: Callable[[Event], bool]) -> bool:
        """Deltas get their ids (if they have none) as the inner stream parses them and go
        to ``sink`` (``sse_http.SSEUpstreamStream.push_to``); False when the inner stream
        cannot push."""
        self._sink = sink
        return push_through(self._inner, self._offer)

    def _offer(self, event: Event) -> bool:
        if self._queued or self._failed is not None or self._refused is not None \
                or type(event) is not TokenDelta:
            return False  # next_event's to handle, in order
        try:
            out = self._with_ids(event)  # the retokenizer moves on: never fed twice
        except RetokenizeFailed as exc:
            self._fail(exc)  # the inner stream ends: next_event gives out the failure
            return True
        if self._sink(out):  # type: ignore[misc]
            return True
        self._refused = (event, out)
        return False

    async def next_event(self) -> Event:
        if self._queued:
            return self._queued.pop(0)
        if self._failed is not None:
            return self._failed
        event = await self._inner.next_event()
        if self._failed is not None:  # failed on a pushed delta while we waited
            return self._failed
        refused = self._refused
        if refused is not None and event is refused[0]:
            self._refused = None
            return refused[1]
        try:
            return self._with_ids(event)
        except RetokenizeFailed as exc:  # the stream ends with our failure, the upstream stops
            return self._fail(exc)

    def _fail(self, exc: RetokenizeFailed) -> Failure:
        self._failed = retokenize_failure(exc)
        self._inner.cancel()
        return self._failed

    def _with_ids(self, event: Event) -> Event:
        if isinstance(event, TokenDelta) and not event.ids and event.text:
            return msgspec.structs.replace(event, ids=self.retokenizer.feed(event.text))
        if isinstance(event, Usage) or is_terminal(event):
            rest = self.retokenizer.flush()
            if rest:
                self._queued.append(event)
                return TokenDelta(ids=rest)
        return event

    def cancel(self) -> None:
        self._inner.cancel()
