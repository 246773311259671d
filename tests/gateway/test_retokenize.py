"""Streaming retokenization gives the ids of the whole text, for any split into deltas."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import corpus
from tokenwire.codec.detokenizer import Detokenizer
from tokenwire.codec.maps import TokenizerMap, bundled_map_path, load_map_file
from tokenwire.codec.tokenizer import Tokenizer
from tokenwire.gateway import retokenize
from tokenwire.gateway.ir import Failure, FailureClass, Finish, FinishKind, TokenDelta, Usage
from tokenwire.gateway.retokenize import (
    MEMO_ENTRIES,
    MEMO_MAX_CHARS,
    RetokenizeFailed,
    Retokenizer,
    RetokenizingStream,
)

MAPS = Path(__file__).resolve().parents[1] / "fixtures" / "maps"
#: The bundled SmolLM2 map is the one the gateway serves (a v2 program: digits stage and
#: byte-level alternation); the fixture's is codec-maps' v1 program.
MAP_IDS = ["huggingfacetb/smollm2", "openai/cl100k_base", "bundled:huggingfacetb/smollm2"]
_SAMPLES = [s for samples in corpus().values() for s in samples if s]
# Characters around the pre-tokenizers' look-aheads: contractions, whitespace before words
# and digits, newlines, digit runs, punctuation runs, multi-byte letters.
_TRICKY = st.text(alphabet=list("'resvltdm \t\n\r1234a!?.é😀中"), max_size=40)
#: Longer runs of what the memos and the one-regex split meet: digit runs (ASCII and
#: other Nd/No, and a Unicode 17 digit the regex module and the pinned tables dispute),
#: contractions, whitespace runs (ASCII and Unicode), CJK, emoji with modifiers, marks.
_RUNS = st.lists(st.sampled_from([
    "0", "12", "4567", "²", "٣٣", "\U00011de0", "'s", "'re", "'LL", "n't", " ", "   ", "\t",
    "\n", "\r\n", "\u00a0", "\u3000", "中文", "日本語", "😀", "👍🏽", "e\u0301", "word", " the",
    "Hello", ",", ".", "!?", "$", "HTTP", "ß",
]), max_size=25).map("".join)
#: Whitespace runs with newlines inside, as in indented code with blank lines: cl100k's
#: newline block spans a whole run up to its last newline.
_WS_RUNS = st.lists(st.sampled_from([
    "\n", " ", "   ", "\t", "\r\n", "\r", "\x0c", "\u00a0", "\u2029", ".", ".\n", ":", "x", "1",
    "'", ")", "def", "    return",
]), max_size=30).map("".join)


@pytest.fixture(scope="module", params=MAP_IDS)
def tmap(request) -> TokenizerMap:
    bundled = request.param.removeprefix("bundled:")
    if bundled != request.param:
        return load_map_file(bundled_map_path(bundled))
    return load_map_file(MAPS / f"{request.param}.json")


def stream(tmap: TokenizerMap, deltas: list[str]) -> list[int]:
    r = Retokenizer(tmap)
    out: list[int] = []
    for d in deltas:
        out += r.feed(d)
    return out + list(r.flush())


def split_at(text: str, cuts: list[int]) -> list[str]:
    bounds = [0, *sorted(set(cuts)), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


@st.composite
def text_and_cuts(draw):
    text = draw(st.one_of(st.sampled_from(_SAMPLES), _TRICKY, _RUNS, _WS_RUNS))
    cuts = draw(st.lists(st.integers(0, len(text)), max_size=min(len(text), 60)))
    return text, cuts


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=text_and_cuts())
def test_streamed_ids_equal_whole_text_ids_for_any_split(tmap, case):
    text, cuts = case
    assert stream(tmap, split_at(text, cuts)) == _whole(tmap, text)


# Keyed by the map, not its id: the bundled and the fixture SmolLM2 maps share one id.
_WHOLE: dict[TokenizerMap, Tokenizer] = {}


def _whole(tmap: TokenizerMap, text: str) -> list[int]:
    tok = _WHOLE.get(tmap)
    if tok is None:
        tok = _WHOLE[tmap] = Tokenizer.from_map(tmap)
    return tok.encode(text)


@pytest.mark.parametrize("text", ["x're", "a      b", "don't 12345 stop", "a  \t\nb",
                                  "it'll  9 lives'", "x \r\n y", "\n   \n", "x:\n    \n    y",
                                  "def f():\n    \n\t\n    return 1\n", ".\n  \r\n  x"])
def test_character_by_character_equals_whole_text(tmap, text):
    assert stream(tmap, list(text)) == _whole(tmap, text)


def test_every_corpus_sample_character_by_character(tmap):
    for text in _SAMPLES[:40]:
        assert stream(tmap, list(text)) == _whole(tmap, text)


def test_a_trailing_whitespace_run_is_held_until_it_ends(tmap):
    """``"\\n   "`` is ``"\\n"`` + ``"   "`` at the end of cl100k's text, and one piece once
    a newline follows (its newline block spans the run): nothing inside the run commits."""
    r = Retokenizer(tmap)
    head = r.feed("x = 1\n    ")
    assert "\n" not in Detokenizer(tmap).decode(head)
    ids = list(head) + list(r.feed("\n    y")) + list(r.flush())
    assert ids == _whole(tmap, "x = 1\n    \n    y")


def test_finished_pieces_are_emitted_before_flush(tmap):
    r = Retokenizer(tmap)
    ids = r.feed("Hello world, this is a streamed answer")
    # Everything but the held-back tail is out already (ids stream, they are not batched).
    assert ids and len(ids) >= 5
    assert list(ids) + list(r.flush()) == _whole(tmap, "Hello world, this is a streamed answer")


class _Events:
    def __init__(self, events):
        self.events = list(events)
        self.cancelled = False

    async def next_event(self):
        return self.events.pop(0)

    def cancel(self):
        self.cancelled = True


def _drain(s) -> list:
    async def run():
        out = []
        while True:
            ev = await s.next_event()
            out.append(ev)
            if isinstance(ev, Finish | Failure):
                return out
    return asyncio.run(run())


def test_stream_fills_ids_and_releases_the_tail_before_usage(tmap):
    text = ["Hel", "lo wor", "ld, again"]
    events = [TokenDelta(text=t) for t in text] + [
        Usage(prompt_tokens=3, completion_tokens=4), Finish(reason=FinishKind.EOS)]
    out = _drain(RetokenizingStream(_Events(events), Retokenizer(tmap)))
    ids = [i for e in out if isinstance(e, TokenDelta) for i in e.ids]
    assert ids == _whole(tmap, "".join(text))
    assert "".join(e.text for e in out if isinstance(e, TokenDelta)) == "".join(text)
    tail = out.index(next(e for e in out if isinstance(e, Usage)))
    assert isinstance(out[tail - 1], TokenDelta) and out[tail - 1].text == ""


def test_stream_releases_the_tail_before_a_failure(tmap):
    events = [TokenDelta(text="partial answ"),
              Failure(failure_class=FailureClass.UPSTREAM, message="x")]
    out = _drain(RetokenizingStream(_Events(events), Retokenizer(tmap)))
    assert [i for e in out if isinstance(e, TokenDelta) for i in e.ids] == _whole(
        tmap, "partial answ")
    assert isinstance(out[-1], Failure)


def test_deltas_with_upstream_ids_are_never_tokenized(tmap):
    tok = Tokenizer.from_map(tmap)
    events = [TokenDelta(ids=(1, 2), text="ab"), TokenDelta(ids=(3,), text="c"),
              Usage(prompt_tokens=1, completion_tokens=3), Finish(reason=FinishKind.EOS)]
    r = Retokenizer(tmap, tokenizer=tok)
    out = _drain(RetokenizingStream(_Events(events), r))
    assert out == events
    assert tok.calls == 0 and r.calls == 0


def test_cancel_reaches_the_upstream_stream(tmap):
    inner = _Events([])
    RetokenizingStream(inner, Retokenizer(tmap)).cancel()
    assert inner.cancelled


def test_streams_of_one_map_share_its_compiled_pre_tokenizer(tmap):
    """Compiled once per map, not once per stream (a compile per request was a hot-path
    cost, BENCHMARKS.md); sharing it changes no stream's ids (the tests above)."""
    first, second = Retokenizer(tmap), Retokenizer(tmap)
    assert first._split is not None and first._split is second._split


# -- the memos: shared, bounded, and never a different id ---------------------------------


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=text_and_cuts(), second=text_and_cuts())
def test_streams_after_other_streams_still_equal_whole_text_ids(tmap, first, second):
    """The memos outlive a stream: a stream that meets texts another stream left (its own
    prefixes and pending texts, other cuts of the same text) gets the same ids."""
    for text, cuts in (first, second, first, (first[0], second[1][: len(first[0])])):
        assert stream(tmap, split_at(text, cuts)) == _whole(tmap, text)


def test_a_repeated_answer_is_served_from_the_memo(tmap):
    tok = Tokenizer.from_map(tmap)
    deltas = split_at("The cat sat on the mat, and the cat sat again. " * 3, list(range(0, 144, 4)))
    first = Retokenizer(tmap, tokenizer=tok)
    ids = [i for d in deltas for i in first.feed(d)] + list(first.flush())
    encodes = tok.calls
    assert ids == _whole(tmap, "".join(deltas)) and 0 < encodes < first.calls
    again = Retokenizer(tmap, tokenizer=tok)
    assert [i for d in deltas for i in again.feed(d)] + list(again.flush()) == ids
    assert tok.calls == encodes  # every commit of the second stream was remembered
    assert again.calls == first.calls  # calls counts tokenized texts, memo or not


def test_memos_are_bounded_in_entries_and_text_length(tmap):
    tok = Tokenizer.from_map(tmap)
    r = Retokenizer(tmap, tokenizer=tok)
    for i in range(MEMO_ENTRIES + 50):
        r.feed(f" w{i}")
    r.feed(" " + "x" * (MEMO_MAX_CHARS + 10) + " y")
    r.flush()
    for memo in (r._ids, r._splits):
        assert 0 < len(memo) <= MEMO_ENTRIES
        assert max(map(len, memo)) <= MEMO_MAX_CHARS


def test_memo_is_per_tokenizer(tmap):
    """Two tokenizers never share remembered ids (a caller's own tokenizer may differ)."""
    a, b = Tokenizer.from_map(tmap), Tokenizer.from_map(tmap)
    ra, rb = Retokenizer(tmap, tokenizer=a), Retokenizer(tmap, tokenizer=b)
    for r in (ra, rb):
        r.feed("shared words here ")
    assert a.calls == b.calls > 0  # b encoded for itself: a's ids were not handed over


def test_a_failed_encode_is_not_remembered(tmap):
    tok = Tokenizer.from_map(tmap)
    for _ in range(2):  # the second time too: a failure never becomes a memo entry
        r = Retokenizer(tmap, tokenizer=tok)
        with pytest.raises(RetokenizeFailed):
            r.feed("bad \ud800 text here ")
            r.flush()
    assert tok.calls >= 2 and not any("\ud800" in text for text in retokenize._ids_memo(tok))


class _PushEvents(_Events):
    """An inner stream that pushes (``sse_http.SSEUpstreamStream.push_to``'s contract):
    each arriving event is offered to the sink while nothing is ready, else kept."""

    def __init__(self):
        super().__init__([])
        self.sink = None

    def push_to(self, sink):
        self.sink = sink
        return True

    def arrive(self, event) -> bool:
        if not self.events and not isinstance(event, Finish) and self.sink(event):
            return True
        self.events.append(event)
        return False


def test_pushed_deltas_get_their_ids_once_even_when_the_sink_refuses_one(tmap):
    """The third delta is fed to the retokenizer and refused by the sink: the inner stream
    keeps it, and next_event gives out what it was turned into, not a second feed."""
    texts = ["Hel", "lo wor", "ld, again", " and on"]
    inner = _PushEvents()
    r = Retokenizer(tmap)
    stream = RetokenizingStream(inner, r)
    sunk: list = []
    stream.push_to(lambda e: len(sunk) < 2 and not sunk.append(e))
    taken = [inner.arrive(TokenDelta(text=t)) for t in texts]
    inner.arrive(Usage(prompt_tokens=3, completion_tokens=4))
    inner.arrive(Finish(reason=FinishKind.EOS))
    assert taken == [True, True, False, False]  # after a refusal nothing more is offered
    out = sunk + _drain(stream)
    assert [i for e in out if isinstance(e, TokenDelta) for i in e.ids] == _whole(
        tmap, "".join(texts))
    assert "".join(e.text for e in out if isinstance(e, TokenDelta)) == "".join(texts)
    assert isinstance(out[-2], Usage) and isinstance(out[-1], Finish)


def test_pushed_deltas_with_upstream_ids_pass_untouched(tmap):
    tok = Tokenizer.from_map(tmap)
    inner = _PushEvents()
    r = Retokenizer(tmap, tokenizer=tok)
    stream = RetokenizingStream(inner, r)
    sunk: list = []
    stream.push_to(lambda e: not sunk.append(e))
    delta = TokenDelta(ids=(1, 2), text="ab")
    assert inner.arrive(delta)
    assert sunk == [delta] and tok.calls == 0 and r.calls == 0
