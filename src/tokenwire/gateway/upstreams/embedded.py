"""The embedded engine: llama-cpp-python running the SmolLM2 GGUF we ship, as IR events.

``Llama`` is not thread-safe, and generation is CPU-bound C code that must not run on the
event loop. So one worker thread owns the model and serves requests one at a time from a
bounded FIFO queue: fairness is arrival order, and a full queue is refused at admission
(:class:`~tokenwire.errors.ServerBusy`, a 503) instead of growing without bound.

Each generated token is handed to the event loop with ``loop.call_soon_threadsafe`` into
the request's ``asyncio.Queue``. Ids are llama.cpp's own token ids (the SmolLM2 vocabulary,
the same ids as the map we serve); text comes from our :class:`Detokenizer` on that map, so
the ids on a Codec stream and the text on a JSON stream always agree. A client disconnect
sets the request's cancel flag, which the worker checks before every token: generation
stops within one token and the next queued request starts (codec-spec §10 item 17).

Sampling: what the request leaves out comes from the model's recommended settings (the
GGUF's ``general.sampling.*`` keys, else llama.cpp's defaults: ``gateway/defaults.py``);
``max_tokens`` left out is :data:`~tokenwire.gateway.defaults.DEFAULT_MAX_TOKENS`, and every
answer stops at the context window. The engine reads text only: a prompt holding an image is
refused with the field it came from (the HTTP layer refuses it earlier, before queueing).

End of generation: an end-of-generation id (``llm.token_eos()``, ``<|im_end|>``,
``<|endoftext|>``; not sent, unless ``ignore_eos``), a stop string on the detokenized text
(:mod:`~tokenwire.gateway.stops`), ``max_tokens`` or the context window (``length``), or a
banned id of the request's safety policy (``policy_violation``, the banned id is not sent,
codec-spec §5.5).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import queue
import random
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from tokenwire.codec.detokenizer import Detokenizer
from tokenwire.codec.maps import TokenizerMap
from tokenwire.errors import ConfigError, ServerBusy
from tokenwire.gateway.defaults import DEFAULT_MAX_TOKENS, SamplingDefaults, sampling_from_gguf
from tokenwire.gateway.ir import (
    ChatMessage,
    ChatPrompt,
    Event,
    Failure,
    FailureClass,
    Finish,
    FinishKind,
    GenerationRequest,
    ImagePart,
    Prompt,
    PromptIds,
    PromptText,
    TokenDelta,
    TokenLogprob,
    ToolSpec,
    Usage,
    UsageSource,
)
from tokenwire.gateway.stops import StopMatcher
from tokenwire.gateway.upstreams.chat_prompt import (
    Markers,
    control_pattern,
    fragments,
    split_render,
)
from tokenwire.gateway.upstreams.embedded_logprobs import LogprobReader
from tokenwire.gateway.upstreams.embedded_model import (
    chat_formatter,
    control_tokens,
    default_model_path,
    load_llama,
    model_aliases,
)
from tokenwire.gateway.upstreams.embedded_tools import (
    NO_TOOLS,
    GrammarCache,
    ToolPlan,
    ToolRequestError,
    ToolTurn,
    plan_tools,
)
from tokenwire.gateway.upstreams.tool_prompt import (
    fallback_messages,
    function_json,
    native_message,
    template_takes_tools,
    wrap_strings,
)

__all__ = [
    "DEFAULT_N_CTX",
    "DEFAULT_QUEUE_SIZE",
    "EmbeddedEngine",
    "JobRecord",
]

log = logging.getLogger(__name__)

#: SmolLM2 was trained with 8k context; 4k keeps the KV cache near 100 MB and still fits a
#: 2,048-token answer after a long prompt.
DEFAULT_N_CTX = 4096
#: Requests waiting behind the running one. One model on a few cores serves ~70 tokens/s,
#: so 16 queued 256-token answers is already a minute of waiting; more is better refused.
DEFAULT_QUEUE_SIZE = 16
#: Finished-request records kept for tests and diagnostics (ids and per-token timestamps).
MAX_RECORDS = 256
#: Chat-template end tokens that stop a generation besides ``llm.token_eos()``.
_END_TOKENS = ("<|im_end|>", "<|endoftext|>")


@dataclass(frozen=True, slots=True)
class JobRecord:
    """What the worker did with one request (a test hook and a diagnostic).

    ``outcome`` is ``finished``, ``aborted`` or ``failed``; ``token_times`` are
    ``time.monotonic()`` readings taken when each id in ``ids`` was generated.
    """

    request_id: str
    outcome: str
    reason: str
    prompt_tokens: int
    ids: tuple[int, ...]
    token_times: tuple[float, ...]
    queued_at: float
    started_at: float
    ended_at: float


class _Job:
    def __init__(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop) -> None:
        self.request = request
        self.loop = loop
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.cancelled = threading.Event()
        self.queued_at = time.monotonic()
        self.plan: ToolPlan = NO_TOOLS

    def emit(self, event: Event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self.cancelled.set()


class _JobStream:
    """The event-loop side of one job (:class:`~tokenwire.gateway.ir.EventStream`)."""

    def __init__(self, job: _Job) -> None:
        self._job = job

    async def next_event(self) -> Event:
        return await self._job.events.get()

    def cancel(self) -> None:
        self._job.cancelled.set()



class _ImageInput(ValueError):
    """The prompt holds an image; ``param`` is where the client put it."""

    def __init__(self, param: str | None) -> None:
        super().__init__("this model does not accept images (the embedded engine reads text "
                         "only); send the request without the image")
        self.param = param


class _ContextOverflow(ValueError):
    """The prompt alone fills the context window (no room for one generated token)."""

    def __init__(self, prompt_tokens: int, context_tokens: int,
                 ids: list[int] | None = None, *, at_least: bool = False) -> None:
        super().__init__(f"the prompt is {'at least ' if at_least else ''}{prompt_tokens} "
                         f"tokens; the context window is {context_tokens}")
        self.prompt_tokens = prompt_tokens
        self.context_tokens = context_tokens
        self.ids = ids or []

class EmbeddedEngine:
    """One ``Llama`` behind a worker thread and a bounded FIFO queue (an ``Upstream``)."""

    #: One generation at a time (one worker thread owns the model): the gateway's admission
    #: queue holds the others, with heartbeats, instead of this engine's own queue.
    max_concurrent = 1
    #: Text only: the router refuses image parts before they are queued (``check_inputs``).
    accepts_images = False
    #: It counts the rendered prompt exactly and refuses an overflow at once, so the router
    #: does not count it again (``gateway/context_window.py``).
    checks_context_itself = True

    def __init__(
        self,
        llm: Any,
        tmap: TokenizerMap,
        *,
        model_id: str,
        queue_size: int = DEFAULT_QUEUE_SIZE,
        clock: Callable[[], float] = time.monotonic,
        aliases: tuple[str, ...] = (),
    ) -> None:
        if llm.n_vocab() > tmap.vocab_size:
            raise ConfigError(
                f"the model has {llm.n_vocab()} tokens but map {tmap.id} has {tmap.vocab_size}: "
                "frames would carry ids the map cannot decode"
            )
        self.model_id = model_id
        #: Other names clients may use for the model (see :func:`model_aliases`).
        self.aliases = tuple(a for a in aliases if a != model_id)
        self.tmap = tmap
        self._llm = llm
        self._clock = clock
        self._detok = Detokenizer(tmap)
        ends = {llm.token_eos(), *(tmap.special_tokens[t] for t in _END_TOKENS
                                   if t in tmap.special_tokens)}
        self._end_ids = frozenset(i for i in ends if i >= 0)
        self._chat = chat_formatter(llm, tmap)
        self._chat_open = chat_formatter(llm, tmap, add_generation_prompt=False)
        self._control_ids = control_tokens(llm)
        self._controls = control_pattern(self._control_ids)
        self._add_bos = bool(llm._model.add_bos_token())
        #: The GGUF's template renders ``tools`` itself; else the fallback (:mod:`.tool_prompt`).
        self._native_tools = template_takes_tools((llm.metadata or {}).get(
            "tokenizer.chat_template"))
        self._grammars = GrammarCache(self._grammar_parses)
        self._logprobs = LogprobReader(llm)
        #: What a request that sets no sampling field is sampled with.
        self.sampling: SamplingDefaults = sampling_from_gguf(llm.metadata or {})
        self._jobs: queue.Queue[_Job | None] = queue.Queue(maxsize=queue_size)
        self._records: deque[JobRecord] = deque(maxlen=MAX_RECORDS)
        self._records_cv = threading.Condition()
        self._thread = threading.Thread(target=self._worker, name="tokenwire-llama", daemon=True)

    @classmethod
    def load(
        cls,
        tmap: TokenizerMap,
        model_path: str | Path | None = None,
        *,
        n_ctx: int = DEFAULT_N_CTX,
        n_threads: int | None = None,
        **kwargs: Any,
    ) -> EmbeddedEngine:
        """Load the GGUF (the shipped SmolLM2 by default) and build the engine, not started."""
        path = Path(model_path) if model_path is not None else default_model_path()
        llm = load_llama(path, n_ctx=n_ctx, n_threads=n_threads)
        stem = path.stem.split(".")[0]
        kwargs.setdefault("model_id", stem)
        kwargs.setdefault("aliases", model_aliases(path, llm.metadata or {}))
        return cls(llm, tmap, **kwargs)

    @property
    def n_ctx(self) -> int:
        return int(self._llm.n_ctx())

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        """Refuse queued work, stop the worker after the running token, join it."""
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.cancelled.set()
                self._abandon(job, "engine shut down")
        self._jobs.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout)

    def submit(self, request: GenerationRequest) -> _JobStream:
        """Queue a request (call from the event loop); raise :class:`ServerBusy` when full."""
        job = _Job(request, asyncio.get_running_loop())
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            raise ServerBusy(
                f"{self._jobs.maxsize} requests are already waiting for the model; retry later"
            ) from None
        return _JobStream(job)

    def records(self) -> list[JobRecord]:
        with self._records_cv:
            return list(self._records)

    def wait_for_record(self, request_id: str, timeout: float = 30.0) -> JobRecord:
        """Block until the worker has finished ``request_id`` (tests and benchmarks)."""
        deadline = time.monotonic() + timeout
        with self._records_cv:
            while True:
                for rec in self._records:
                    if rec.request_id == request_id:
                        return rec
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no record for request {request_id!r}")
                self._records_cv.wait(left)

    # -- worker thread -------------------------------------------------------------------

    def _worker(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                self._run(job)
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:
                log.error("embedded engine failed on request %s: %s", job.request.request_id,
                          type(exc).__name__)
                self._abandon(job, "the engine failed on this request; see the server log")

    def _abandon(self, job: _Job, message: str) -> None:
        job.emit(Failure(failure_class=FailureClass.UPSTREAM, message=message, status=503))
        now = self._clock()
        self._record(job, "failed", "error", 0, [], [], now)

    def _run(self, job: _Job) -> None:
        started = self._clock()
        req = job.request
        if job.cancelled.is_set():  # the client left while queued
            job.emit(Finish(reason=FinishKind.ABORT))
            self._record(job, "aborted", FinishKind.ABORT, 0, [], [], started)
            return
        try:  # on this thread: a caller's 60 KB grammar or schema is ~0.3 s to check and
            # convert, which on the event loop held every other client meanwhile (the
            # gateway's admission lets one request at a time in, so none waits here for it)
            job.plan = plan_tools(req, self._grammars)
        except ToolRequestError as exc:
            job.emit(Failure(failure_class=FailureClass.INVALID_REQUEST, message=str(exc),
                             status=400, code="unsupported_value", param=exc.param))
            return
        try:
            prompt = self._prompt_ids(req.prompt, tools=job.plan.prompt_tools)
        except _ContextOverflow as exc:  # a client that compacts history acts on this class
            job.emit(Failure(failure_class=FailureClass.CONTEXT_LENGTH, message=str(exc),
                             status=400, code="context_length_exceeded",
                             prompt_tokens=exc.prompt_tokens, context_tokens=exc.context_tokens))
            self._record(job, "failed", "context_length_exceeded", 0, [], [], started)
            return
        except _ImageInput as exc:
            job.emit(Failure(failure_class=FailureClass.INVALID_REQUEST, message=str(exc),
                             status=400, code="unsupported_value", param=exc.param))
            self._record(job, "failed", "invalid_request", 0, [], [], started)
            return
        except ValueError as exc:
            job.emit(Failure(failure_class=FailureClass.INVALID_REQUEST, message=str(exc),
                             status=400))
            self._record(job, "failed", "invalid_request", 0, [], [], started)
            return
        ids: list[int] = []
        times: list[float] = []
        # The prompt's count before any token (Anthropic's message_start shows it).
        job.emit(Usage(prompt_tokens=len(prompt), completion_tokens=None,
                       source=UsageSource.ENGINE))
        reason, matched = self._generate(job, prompt, ids, times)
        job.emit(_usage(len(prompt), len(ids)))
        job.emit(Finish(reason=reason, matched_stop=matched))
        outcome = "aborted" if reason is FinishKind.ABORT else "finished"
        self._record(job, outcome, reason, len(prompt), ids, times, started)

    def _generate(
        self, job: _Job, prompt: list[int], ids: list[int], times: list[float]
    ) -> tuple[FinishKind, str | None]:
        req = job.request
        wanted = req.max_tokens if req.max_tokens is not None else DEFAULT_MAX_TOKENS
        budget = min(wanted, self.n_ctx - len(prompt))
        self._llm.set_seed(req.seed if req.seed is not None else random.randrange(2**31))
        text_stream = self._detok.stream()
        stops = StopMatcher(req.stop)
        turn = ToolTurn(job.plan) if job.plan.active else None
        banned = req.banned_ids
        reason = FinishKind.LENGTH
        tokens = self._tokens(job, prompt, ids, times, turn)
        try:
            for tok in tokens if budget > 0 else ():
                if job.cancelled.is_set():
                    reason = FinishKind.ABORT
                    break
                if tok in self._end_ids and not req.ignore_eos:
                    reason = FinishKind.EOS
                    break
                if tok in banned:  # codec-spec §5.5: stop before sending the banned id
                    reason = FinishKind.POLICY_VIOLATION
                    break
                ids.append(tok)
                times.append(self._clock())
                piece = text_stream.feed((tok,))
                events = list(turn.feed(tok, piece)) if turn is not None else [
                    TokenDelta(ids=(tok,), text=piece)]
                if req.logprobs:
                    events = _with_logprobs(events, tok, self._logprobs.read(
                        tok, req.top_logprobs or 0))
                for event in events:
                    job.emit(_with_stops(event, stops))  # a delta with no text still goes
                if stops.matched is not None:
                    return FinishKind.STOP_SEQUENCE, stops.matched
                if turn is not None and turn.repeated:
                    reason = FinishKind.EOS
                    break
                if len(ids) >= budget:
                    break
            else:  # no token came: the client left while the prompt was evaluated
                if job.cancelled.is_set():
                    reason = FinishKind.ABORT
        finally:
            tokens.close()
        if reason is not FinishKind.ABORT:
            tail = text_stream.flush()
            events = [_with_stops(e, stops) for e in (
                turn.feed(None, tail) if turn is not None else [TokenDelta(text=tail)])]
            held, held_logprobs = stops.flush_delta()  # after the tail: it may complete one
            for event in [*events, TokenDelta(text=held, logprobs=tuple(held_logprobs))]:
                if not isinstance(event, TokenDelta) or event.text or event.ids \
                        or event.logprobs:
                    job.emit(event)
        if turn is not None and turn.calls and reason is FinishKind.EOS:
            reason = FinishKind.TOOL_CALLS
        return reason, None

    def _tokens(self, job: _Job, prompt: list[int], ids: list[int], times: list[float],
                turn: ToolTurn | None) -> Iterator[int]:
        """The sampled ids, under the plan's grammar; in auto mode, restarted once from where
        the answer began a tool call, under the call grammar (:mod:`.embedded_tools`)."""
        from llama_cpp import LlamaGrammar

        grammar = job.plan.grammar
        # No KV prefix reuse across requests: a prompt evaluated in one batch and one
        # re-evaluated from a cached prefix can differ in the last float bits, and greedy
        # decoding must give the same ids for the same request (clients compare streams
        # across formats). A restart within a request reuses its own prefix, deterministic.
        self._llm.reset()
        context = list(prompt)
        done = self._eval_prompt_head(job, prompt)  # the rest is generate's first batch
        if done is None:
            return
        while True:
            gen = self._llm.generate(
                context[done:], reset=not done, **self._sampler_args(job.request),
                grammar=LlamaGrammar.from_string(grammar, verbose=False) if grammar else None)
            try:
                for tok in gen:
                    yield tok
                    if turn is not None and turn.restart is not None:
                        break
                else:
                    return
            finally:
                gen.close()
            assert turn is not None and turn.restart is not None
            restart, turn.restart = turn.restart, None
            del ids[restart.kept:], times[restart.kept:]
            ids += self._tokenize_text(restart.text)
            times += [self._clock()] * (len(ids) - len(times))
            context, grammar, done = [*prompt, *ids], job.plan.tail_grammar, 0

    def _eval_prompt_head(self, job: _Job, prompt: list[int]) -> int | None:
        """Evaluate the prompt but its last batch, in ``Llama.eval``'s own batches (so the
        same logits), checking the cancel flag between them: how many ids were evaluated,
        None when the client left. ``generate`` checks nothing until the first token, so a
        client that left during a 3,500-token prompt held the engine ~35 s on a busy CPU;
        now it is freed after the running batch."""
        done, n_batch = 0, self._llm.n_batch
        while len(prompt) - done > n_batch:
            if job.cancelled.is_set():
                return None
            self._llm.eval(prompt[done:done + n_batch])
            done += n_batch
        return None if job.cancelled.is_set() else done

    def _sampler_args(self, req: GenerationRequest) -> dict[str, Any]:
        """llama.cpp's sampler settings: the request's fields, the model's defaults for the
        rest (at temperature 0 llama.cpp samples greedily and ignores the others)."""
        d = self.sampling.values
        return {
            "temp": max(req.temperature if req.temperature is not None else d.temperature, 0.0),
            "top_p": req.top_p if req.top_p is not None else d.top_p,
            "top_k": req.top_k if req.top_k is not None else d.top_k,
            "min_p": req.min_p if req.min_p is not None else d.min_p,
            "repeat_penalty": req.repeat_penalty if req.repeat_penalty is not None
            else d.repeat_penalty,
            # OpenAI's penalties are off unless asked for (llama.cpp's defaults are 0 too).
            "presence_penalty": req.presence_penalty or 0.0,
            "frequency_penalty": req.frequency_penalty or 0.0,
        }

    # -- what the prompt becomes, for count_tokens and /tokenize (any thread) --------------

    def prompt_ids(self, prompt: Prompt, *, add_generation_prompt: bool = True,
                   continue_final_message: bool = False,
                   tools: tuple[ToolSpec, ...] = ()) -> list[int]:
        """The ids this engine evaluates for ``prompt`` (chat template and ``tools``
        applied), however long. Safe beside a running generation: rendering and tokenizing
        read only the template and the vocabulary."""
        try:
            return self._prompt_ids(prompt, add_generation_prompt=add_generation_prompt,
                                    continue_final_message=continue_final_message,
                                    tools=tools, counting=True)
        except _ContextOverflow as exc:
            return exc.ids

    async def count_tokens(self, request: GenerationRequest) -> int:
        """``POST /v1/messages/count_tokens``: the prompt's length as this engine sees it."""
        tools = request.tools if request.tool_choice != "none" else ()
        return len(await asyncio.to_thread(self.prompt_ids, request.prompt, tools=tools))

    async def chat_prompt_ids(self, messages: tuple[ChatMessage, ...], *,
                              add_generation_prompt: bool = True,
                              continue_final_message: bool = False) -> list[int]:
        """vLLM's chat ``/tokenize``: ``messages`` as this engine would evaluate them."""
        return await asyncio.to_thread(
            self.prompt_ids, ChatPrompt(messages=messages),
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message)

    def _prompt_ids(self, prompt: Prompt, *, add_generation_prompt: bool = True,
                    continue_final_message: bool = False,
                    tools: tuple[ToolSpec, ...] = (), counting: bool = False) -> list[int]:
        """``counting``: for a count (:meth:`prompt_ids`, off the engine's thread), so a
        prompt too long to fit is tokenized whole, not refused early (a count of 0)."""
        n_vocab = self._llm.n_vocab()
        match prompt:
            case PromptIds(ids=ids):
                bad = next((i for i in ids if not 0 <= i < n_vocab), None)
                if bad is not None:
                    raise ValueError(
                        f"prompt token id {bad} is outside the vocabulary 0..{n_vocab - 1}")
                out = list(ids)
            case PromptText(text=text):
                if not counting:
                    self._refuse_certain_overflow(text)
                # special=False: "<|im_end|>" typed by a user is text, not a control token.
                out = self._tokenize_text(text, add_bos=self._add_bos)
            case ChatPrompt(messages=messages):
                out = self._chat_ids(messages, add_generation_prompt, continue_final_message,
                                     tools, counting=counting)
        if not out:
            raise ValueError("the prompt is empty")
        if len(out) >= self.n_ctx:
            raise _ContextOverflow(len(out), self.n_ctx, out)
        return out

    def _chat_ids(self, messages: tuple[Any, ...], add_generation_prompt: bool = True,
                  continue_final_message: bool = False,
                  tools: tuple[ToolSpec, ...] = (), *, counting: bool = False) -> list[int]:
        """The rendered chat prompt's ids: only the template's own markers become control
        ids; every caller string (tool schemas and results too) is tokenized as text
        (:mod:`.chat_prompt`)."""
        markers = Markers(secrets.token_hex(8))
        if not self._native_tools:  # the fallback turns tools and calls into messages
            messages = tuple(fallback_messages(messages, tools))
            tools = ()
        plain = self._render_chat(messages, add_generation_prompt, continue_final_message,
                                  tools=tools)
        if not counting:
            self._refuse_certain_overflow(plain)
        wrapped = self._render_chat(messages, add_generation_prompt, continue_final_message,
                                    markers=markers, tools=tools)
        ids: list[int] = []
        pieces = split_render(wrapped, plain, markers)
        for fragment in fragments(pieces, self._controls, self._control_ids):
            if isinstance(fragment, int):
                ids.append(fragment)
            else:
                ids += self._tokenize_text(fragment)
        return ids

    @functools.cached_property
    def _longest_piece(self) -> int:
        """Bytes of the vocabulary's longest token: no token covers more of a text."""
        return max(1, *(len(self._detok.token_bytes(i)) for i in range(self.tmap.max_id + 1)))

    def _refuse_certain_overflow(self, text: str) -> None:
        """A text of more characters than the context window's tokens can cover (each
        covers at most :attr:`_longest_piece` bytes, a character at least one) cannot fit:
        refused before it is tokenized, which for 8 MB held the only engine ~19 s."""
        least = -(-len(text) // self._longest_piece)
        if least >= self.n_ctx:
            raise _ContextOverflow(least, self.n_ctx, at_least=True)

    def _tokenize_text(self, text: str, *, add_bos: bool = False) -> list[int]:
        try:
            return list(self._llm.tokenize(text.encode("utf-8"), add_bos=add_bos,
                                           special=False))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            raise ValueError(f"the prompt cannot be tokenized ({type(exc).__name__})") from None

    def _render_chat(self, messages: tuple[Any, ...], add_generation_prompt: bool = True,
                     continue_final_message: bool = False, *,
                     markers: Markers | None = None, tools: tuple[ToolSpec, ...] = ()) -> str:
        image = next((p for m in messages if not isinstance(m.content, str)
                      for p in m.content if isinstance(p, ImagePart)), None)
        if image is not None:  # the template would fail on it with a Jinja type error
            raise _ImageInput(image.param)
        chat = self._chat if add_generation_prompt and not continue_final_message \
            else self._chat_open
        wrap = markers.wrap if markers is not None else str
        if chat is None:
            raise ValueError("this model has no chat template; use /v1/completions")
        if self._native_tools:
            listed = [native_message(m, wrap) for m in messages]
            extra = {"tools": wrap_strings([function_json(t) for t in tools], wrap)} \
                if tools else {}
        else:
            listed = [{"role": m.role, "content": wrap(m.content)
                       if isinstance(m.content, str) else m.content} for m in messages]
            extra = {}
        try:
            rendered = str(chat(messages=listed, **extra).prompt)
        except Exception as exc:  # jinja2 errors and the template's raise_exception
            raise ValueError(f"the chat template rejected the messages: {exc}") from exc
        return _open_final(rendered, messages, wrap) if continue_final_message else rendered

    def _grammar_parses(self, text: str) -> bool:
        """llama.cpp's own grammar parser accepts ``text`` (it would crash the sampler
        chain otherwise); a grammar sampler is built against the vocabulary and freed."""
        import llama_cpp

        sampler = llama_cpp.llama_sampler_init_grammar(self._llm._model.vocab,
                                                       text.encode("utf-8"), b"root")
        if not sampler:
            return False
        llama_cpp.llama_sampler_free(sampler)
        return True

    def _record(
        self, job: _Job, outcome: str, reason: str, n_prompt: int,
        ids: list[int], times: list[float], started: float,
    ) -> None:
        rec = JobRecord(
            request_id=job.request.request_id, outcome=outcome, reason=str(reason),
            prompt_tokens=n_prompt, ids=tuple(ids), token_times=tuple(times),
            queued_at=job.queued_at, started_at=started, ended_at=self._clock(),
        )
        with self._records_cv:
            self._records.append(rec)
            self._records_cv.notify_all()


def _with_stops(event: Event, stops: StopMatcher) -> Event:
    """Text and its tokens' logprobs go through the stop matcher (which may hold some back:
    a stop string's tokens reach the client neither as text nor as logprobs); calls do
    not."""
    if isinstance(event, TokenDelta) and (event.text or event.logprobs):
        text, logprobs = stops.feed_delta(event.text, event.logprobs)
        return TokenDelta(ids=event.ids, text=text, logprobs=tuple(logprobs))
    return event


def _usage(prompt: int, completion: int) -> Usage:
    """The engine's own counts: every prompt id was evaluated (the KV cache is reset per
    request, so none was cached) and the model has no separate reasoning output."""
    return Usage(prompt_tokens=prompt, completion_tokens=completion, cached_tokens=0,
                 reasoning_tokens=0, source=UsageSource.ENGINE)


def _with_logprobs(events: list[Any], tok: int, logprob: TokenLogprob) -> list[Any]:
    """``tok``'s logprob on the delta that carries its id (the first), or on a delta of its
    own when the tool-call scanner holds the id back (logprobs are never dropped)."""
    for i, event in enumerate(events):
        if isinstance(event, TokenDelta) and tok in event.ids:
            events[i] = msgspec.structs.replace(event, logprobs=(*event.logprobs, logprob))
            return events
    return [*events, TokenDelta(logprobs=(logprob,))]


def _open_final(rendered: str, messages: tuple[Any, ...],
                wrap: Callable[[str], str] = str) -> str:
    """The rendering cut just after the final message's text, so the model continues it
    (vLLM's ``continue_final_message``, done as Hugging Face's ``apply_chat_template``
    does: up to the last occurrence of that text, as ``wrap`` rendered it)."""
    final = wrap(messages[-1].text) if messages and messages[-1].text else ""
    at = rendered.rfind(final) if final else -1
    if at < 0:
        raise ValueError("continue_final_message needs a final message with text that the "
                         "chat template renders")
    return rendered[: at + len(final)]
