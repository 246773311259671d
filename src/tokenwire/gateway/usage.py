"""Token usage when the upstream does not report it: counted with the model's map.

Usage is what people bill, budget and rate-limit on, so every generation ends with a real
:class:`~tokenwire.gateway.ir.Usage` (README "Usage"). The embedded engine counts its own
(``source = engine``). An upstream's own counts are kept as they are (``upstream``).
Upstreams that report nothing (``python -m llama_cpp.server`` never sends a usage chunk
on a stream, and a Codec frame has no place for one, codec-spec §1.1) are counted here,
with the model's map (``gateway``):

* the prompt as the upstream sees it: ids as sent; text encoded with the map (and the
  model's BOS when its tokenizer adds one); a chat rendered with the model's chat template
  and encoded with its control tokens parsed, as llama.cpp and vLLM tokenize a rendered
  chat. Without a template (route option ``chat_template``) a chat prompt's count is
  unknown and stays ``None``: an estimate would be a wrong bill.
* the completion: the ids the stream carried (Codec upstreams, retokenized streams), else
  its text, reasoning and tool-call text encoded with the map.

A figure the upstream did report always wins; when any figure is ours the source is
``gateway``. :class:`UsageMeter` is sans-IO (fed events, returns events);
:class:`MeteredStream` wraps an upstream's event stream with one.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from tokenwire.codec.maps import TokenizerMap
from tokenwire.errors import ConfigError
from tokenwire.gateway.context_window import INLINE_COUNT_CHARS, prompt_chars
from tokenwire.gateway.ir import (
    ChatPrompt,
    Event,
    EventStream,
    Finish,
    GenerationRequest,
    PromptIds,
    PromptText,
    ReasoningDelta,
    TokenDelta,
    ToolCallDelta,
    Usage,
    UsageSource,
    is_terminal,
    push_through,
    start_early,
)
from tokenwire.gateway.retokenize import tokenizer_for

__all__ = ["MeteredStream", "PromptCounter", "PromptFormat", "UsageMeter",
           "load_prompt_format"]

#: Never swallowed while counting: an interpreter exit or interrupt.
_PASS_THROUGH = (KeyboardInterrupt, SystemExit, GeneratorExit)


@dataclass(frozen=True)
class PromptFormat:
    """How a model's server turns a prompt into ids: its chat template (Jinja, the one in
    its GGUF or ``tokenizer_config.json``), the BOS/EOS strings the template may use, and
    whether its tokenizer puts a BOS before a text prompt."""

    chat_template: str | None
    bos_token: str = ""
    eos_token: str = ""
    add_bos: bool = False

    @functools.cached_property
    def _compiled(self) -> Any:
        """The template, compiled once (HF's and llama.cpp's Jinja settings: a sandbox,
        ``trim_blocks``, ``lstrip_blocks``, ``loopcontrols``, a non-ASCII ``tojson``)."""
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
        return env.from_string(self.chat_template or "")

    def render(self, request: GenerationRequest) -> str:
        """The chat prompt as the model's server renders it."""
        if self.chat_template is None or not isinstance(request.prompt, ChatPrompt):
            raise ValueError("no chat template")

        def raise_exception(message: str) -> None:
            raise ValueError(message)

        messages = [{"role": m.role, "content": m.text} for m in request.prompt.messages]
        tools = [{"type": "function", "function": {
            "name": t.name, "description": t.description,
            "parameters": t.parameters or {"type": "object", "properties": {}}}}
            for t in request.tools] or None
        return self._compiled.render(
            messages=messages, tools=tools, add_generation_prompt=True,
            bos_token=self.bos_token, eos_token=self.eos_token,
            raise_exception=raise_exception)


def load_prompt_format(path: str | Path) -> PromptFormat:
    """A :class:`PromptFormat` from a GGUF file, a Hugging Face ``tokenizer_config.json``,
    or a Jinja template file (no BOS/EOS strings, no BOS added)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"chat_template {path} does not exist")
    if path.suffix == ".gguf":
        from tokenwire.errors import GenerateError
        from tokenwire.gguf_tokenizer import read_gguf_prompt_format

        try:
            return PromptFormat(*read_gguf_prompt_format(path))
        except GenerateError as exc:
            raise ConfigError(f"chat_template {path}: {exc}") from exc
    text = path.read_text("utf-8")
    if path.name.endswith(".json"):
        return _hf_format(json.loads(text), path)
    return PromptFormat(text)


def _hf_format(doc: dict[str, Any], path: Path) -> PromptFormat:
    template = doc.get("chat_template")
    if isinstance(template, list):  # named templates: "default" is the chat one
        template = next((t.get("template") for t in template
                         if isinstance(t, dict) and t.get("name") == "default"), None)
    if not isinstance(template, str):
        raise ConfigError(f"chat_template {path}: no chat_template string in it")

    def token(key: str) -> str:
        value = doc.get(key)
        value = value.get("content") if isinstance(value, dict) else value
        return value if isinstance(value, str) else ""
    return PromptFormat(template, token("bos_token"), token("eos_token"),
                        bool(doc.get("add_bos_token", False)))


class PromptCounter:
    """The prompt's token count with the model's map, or ``None`` when it cannot be known."""

    def __init__(self, tmap: TokenizerMap, fmt: PromptFormat | None = None) -> None:
        self.tmap = tmap
        self.format = fmt

    def tokenizes(self, request: GenerationRequest) -> bool:
        """Whether :meth:`count` would tokenize text (else it answers at once)."""
        prompt = request.prompt
        return isinstance(prompt, PromptText) or (
            not isinstance(prompt, PromptIds) and self.format is not None
            and self.format.chat_template is not None)

    def count(self, request: GenerationRequest) -> int | None:
        prompt = request.prompt
        if isinstance(prompt, PromptIds):
            return len(prompt.ids)
        if isinstance(prompt, PromptText):
            # Servers parse control tokens in a completion prompt (llama.cpp's
            # special=True), so its count does too.
            n = self._count(prompt.text, special=True)
            add_bos = self.format is not None and self.format.add_bos
            return None if n is None else n + int(add_bos)
        if self.format is None or self.format.chat_template is None:
            return None
        try:
            rendered = self.format.render(request)
        except Exception:  # the template refused these messages: the count is not known
            return None
        return self._count(rendered, special=True)

    def completion(self, text: str) -> int | None:
        """Tokens of generated text (special-token strings in it are text)."""
        return self._count(text, special=False) if text else 0

    def _count(self, text: str, *, special: bool) -> int | None:
        try:
            return len(tokenizer_for(self.tmap).encode(
                text, allowed_special="all" if special else frozenset()))
        except _PASS_THROUGH:
            raise
        except BaseException:  # native tokenizers can panic (see retokenize.encode_text)
            return None


class UsageMeter:
    """Events in, events out: :meth:`start` gives the prompt's count before anything else;
    the final ``Usage`` is completed (or added) before ``Finish``."""

    def __init__(self, request: GenerationRequest, counter: PromptCounter) -> None:
        self._request = request
        self._counter = counter
        self._reported: Usage | None = None
        self._prompt: int | None = None
        self._prompt_counted = False
        self._ids = 0
        self._text: list[str] = []
        self._reasoning: list[str] = []

    def on_event(self, event: Event) -> list[Event]:
        match event:
            case Usage():
                self._reported = event
                return [event] if event.completion_tokens is None else []
            case TokenDelta():
                self.on_delta(event)
            case ReasoningDelta(text=text):
                self._reasoning.append(text)
            case ToolCallDelta(name=name, arguments=arguments):
                self._text.append((name or "") + arguments)
        out: list[Event] = []
        if isinstance(event, Finish):
            out.append(self.final())
        elif self._reported is not None and is_terminal(event):
            out.append(self._reported)  # a failure keeps what the upstream reported
        return [*out, event]

    def on_delta(self, event: TokenDelta) -> None:
        """A token delta, counted (it is passed on unchanged: :meth:`on_event`)."""
        self._ids += len(event.ids)
        self._text.append(event.text)

    def final(self) -> Usage:
        """The counts to report: the upstream's figures, ours for the ones it left out."""
        rep = self._reported
        if rep is not None and rep.prompt_tokens is not None \
                and rep.completion_tokens is not None:
            return rep
        reasoning = self._counter.completion("".join(self._reasoning))
        answer = self._ids if self._ids else self._counter.completion("".join(self._text))
        completion = None if answer is None or reasoning is None else answer + reasoning
        ours = Usage(prompt_tokens=self._prompt_count(), completion_tokens=completion,
                     reasoning_tokens=reasoning, source=UsageSource.GATEWAY)
        if rep is None:
            return ours
        return msgspec.structs.replace(
            rep, source=UsageSource.GATEWAY,
            prompt_tokens=rep.prompt_tokens if rep.prompt_tokens is not None
            else ours.prompt_tokens,
            completion_tokens=rep.completion_tokens if rep.completion_tokens is not None
            else ours.completion_tokens,
            reasoning_tokens=rep.reasoning_tokens if rep.reasoning_tokens is not None
            else (ours.reasoning_tokens if rep.completion_tokens is None else None))

    def counts_text(self) -> bool:
        """Whether :meth:`start` will tokenize the prompt (not yet counted, and text)."""
        return not self._prompt_counted and self._counter.tokenizes(self._request)

    def counts_long_text(self) -> bool:
        """Whether that text is long enough to be counted on a worker thread
        (``context_window.INLINE_COUNT_CHARS``)."""
        return self.counts_text() and prompt_chars(self._request.prompt) > INLINE_COUNT_CHARS

    def start(self) -> list[Event]:
        """Before the upstream's first event: the prompt's count, when it can be known
        (Anthropic's ``message_start`` shows it; the final ``Usage`` repeats it)."""
        prompt = self._prompt_count()
        if prompt is None:
            return []
        return [Usage(prompt_tokens=prompt, completion_tokens=None, source=UsageSource.GATEWAY)]

    def _prompt_count(self) -> int | None:
        if not self._prompt_counted:
            self._prompt_counted = True
            self._prompt = self._counter.count(self._request)
        return self._prompt


class MeteredStream:
    """An :class:`~tokenwire.gateway.ir.EventStream` whose usage :class:`UsageMeter` keeps."""

    def __init__(self, inner: EventStream, meter: UsageMeter) -> None:
        self._inner = inner
        self._meter = meter
        self._queued: list[Event] = []
        self._begun = False
        self._started = False
        self._sink: Callable[[Event], bool] | None = None
        self._counting: asyncio.Future[list[Event]] | None = None  # a long prompt's count

    def start(self) -> None:
        start_early(self._inner)

    async def next_event(self) -> Event:
        if not self._begun:  # the prompt's count first: a heartbeat may open the stream
            if not self._started:
                # The request goes out first (one loop turn runs its task up to the write),
                # and the prompt is counted while the upstream works: counting tokenizes the
                # rendered prompt, milliseconds on an agent's long context (BENCHMARKS.md,
                # "Session of 2026-12-04 (2)"), which the first token no longer waits for.
                self._started = True
                if self._meter.counts_text() and start_early(self._inner):
                    await asyncio.sleep(0)
            if self._counting is None and self._meter.counts_long_text():
                # seconds near the body limit: on a worker thread, the loop free meanwhile
                # (nothing here touches the meter until it is done: _offer waits for _begun)
                self._counting = asyncio.get_running_loop().run_in_executor(
                    None, self._meter.start)
            self._queued = (await asyncio.shield(self._counting) if self._counting is not None
                            else self._meter.start())
            self._begun = True
        while not self._queued:
            event = await self._inner.next_event()
            if type(event) is TokenDelta:  # nearly every event: counted and passed on as is
                self._meter.on_delta(event)
                return event
            self._queued = self._meter.on_event(event)
        return self._queued.pop(0)

    def push_to(self, sink: Callable[[Event], bool]) -> bool:
        """Text and id deltas go to ``sink`` as the inner stream parses them, counted here
        (``sse_http.SSEUpstreamStream.push_to``); False when the inner stream cannot push."""
        self._sink = sink
        return push_through(self._inner, self._offer)

    def _offer(self, event: Event) -> bool:
        # Only once the prompt's count went out, and only deltas: every other event is the
        # meter's to see in next_event (it may add events of its own).
        if type(event) is not TokenDelta or not self._begun or self._queued \
                or not self._sink(event):  # type: ignore[misc]
            return False
        self._meter.on_delta(event)
        return True

    def cancel(self) -> None:
        self._inner.cancel()
