"""Does a prompt fit the model's context window? The decision before sending. Sans-IO.

A served model may know its context length (``ServedModel.max_model_len``), from, in this
order (the first that gives one wins; :func:`first_known`):

1. **configuration**: ``context_length`` of the model in the config file, else of its
   upstream (``--upstream-context-length`` for ``--upstream`` URLs);
2. **the upstream's own report**, read when it is probed: ``max_model_len`` in its
   ``/v1/models`` entry (vLLM), ``default_generation_settings.n_ctx`` of ``/props``
   (llama.cpp ``llama-server``), ``model_info.<arch>.context_length`` of ``/api/show``
   (Ollama); :func:`context_length_from_listing`, ``..._from_props``, ``..._from_show``;
3. **the embedded engine**: its own ``n_ctx``.

``python -m llama_cpp.server`` reports none, so behind it the window is known only when
configured; its overflow is then recognised after sending (``upstreams/overflow_probe.py``).

**The rule.** A request is refused before anything is sent only when the count is certain
to reach the window: :func:`certain_prompt_tokens` is a *lower bound* of what the upstream
will count, and the request is refused when that bound alone fills the window (no room for
one generated token), or, for an upstream that refuses ``prompt + max_tokens`` over its
window instead of shortening the answer (vLLM), when the bound plus ``max_tokens`` does.
Everything else is sent, and the upstream's own answer decides. The bound, with the model's
map:

* token ids: their number (an upstream may add a BOS, never remove an id);
* text: its encoding, where each special-token string (``<|im_end|>``) counts as one token
  (an upstream that parses specials in text counts it so; one that does not counts more),
  minus :data:`TEXT_SLACK` (two tokenizer implementations of one vocabulary can split a
  rare piece differently);
* chat: the same count for each message's text, minus :data:`CHAT_BOUNDARY_SLACK` per
  message (the template's own text next to a message can absorb the message's first and
  last token into a merged one), and zero for the template, tool definitions, tool calls
  and images (unknown here; they only add tokens).

A model without a map has a certain count only for token ids. The map must be the model's
own vocabulary (``tokenwire maps verify``): a wrong map gives wrong counts. Upstreams that
count their own prompt exactly and refuse an overflow before streaming (the embedded engine,
Codec engines: ``checks_context_itself``) are left to do so: the gateway does not tokenize
their prompts a second time.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Any

from tokenwire.codec.maps import TokenizerMap
from tokenwire.codec.tokenizer import Tokenizer
from tokenwire.gateway.ir import (
    ChatPrompt,
    Failure,
    FailureClass,
    GenerationRequest,
    Prompt,
    PromptIds,
    PromptText,
)
from tokenwire.gateway.retokenize import tokenizer_for

__all__ = [
    "CHAT_BOUNDARY_SLACK",
    "INLINE_COUNT_CHARS",
    "MAX_CONTEXT_LENGTH",
    "TEXT_SLACK",
    "ContextSource",
    "certain_prompt_tokens",
    "certain_request_tokens",
    "context_length_from_listing",
    "context_length_from_props",
    "context_length_from_show",
    "first_known",
    "overflow_before_sending",
    "prompt_chars",
]

#: Tokens a chat template's own text can take from one message's count: at most one merged
#: token at each end (byte-level BPE splits on pre-tokenizer pieces, and only the piece at
#: each edge of the message can join the template's text). Two per side, to be safe.
CHAT_BOUNDARY_SLACK = 4
#: Tokens a text prompt's count gives up: the map's tokenizer and the engine's (llama.cpp's,
#: vLLM's HF tokenizer) agree on ordinary text, and may not on a rare piece (bytes the
#: vocabulary lacks are dropped before or after merging); at the window's edge that matters.
TEXT_SLACK = 2
#: Listing keys servers use for the served window (vLLM ``max_model_len``; others).
_LISTING_KEYS = ("max_model_len", "context_length", "context_window", "max_context_length")
#: Prompts of more characters than this are counted (encoded with the map) on a worker
#: thread, wherever the gateway counts them: the preflight here, the truncation check of
#: the OpenAI-compatible adapter, the usage meter. A count on the event loop holds every
#: other client of the server for its whole length: ~0.11 µs a character with SmolLM2's
#: map, so ~1.8 ms at this bound, ~7-9 ms for an agent's 65,536 (the bound until
#: 2026-12-06), seconds near the 8 MiB body limit. On a thread the loop keeps running (the
#: encoder releases the GIL) and the request waits ~0.1-0.5 ms more, next to an upstream's
#: prefill of 4,000 tokens and more. Shorter prompts are counted inline, where the thread's
#: round trip would cost more than the count on the first token's path.
INLINE_COUNT_CHARS = 16_384
#: A context length outside this range is not believed (a typo, a sentinel like -1), from
#: an upstream, and is refused from the configuration.
MAX_CONTEXT_LENGTH = (1 << 24) - 1


class ContextSource(enum.StrEnum):
    """Where a model's context length came from (``/v1/models`` shows it)."""

    CONFIG = "config"
    UPSTREAM = "upstream"  # the upstream reported it (listing, /props, /api/show)
    ENGINE = "engine"  # the embedded engine's n_ctx


def first_known(*candidates: tuple[int | None, ContextSource],
                ) -> tuple[int | None, ContextSource | None]:
    """The first candidate with a value, in the documented order of precedence."""
    for value, source in candidates:
        if value is not None:
            return value, source
    return None, None


def _believable(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_CONTEXT_LENGTH:
        return value
    return None


def context_length_from_listing(entry: Mapping[str, Any]) -> int | None:
    """The served window in a ``/v1/models`` entry (vLLM's ``max_model_len``), if any.
    llama.cpp's ``meta.n_ctx_train`` is the *trained* length, not what it serves: ignored."""
    for key in _LISTING_KEYS:
        if (value := _believable(entry.get(key))) is not None:
            return value
    return None


def context_length_from_props(doc: Mapping[str, Any]) -> int | None:
    """llama.cpp ``llama-server`` ``GET /props``: ``default_generation_settings.n_ctx``
    (the per-slot window, what one request gets)."""
    settings = doc.get("default_generation_settings")
    if isinstance(settings, Mapping):
        return _believable(settings.get("n_ctx"))
    return None


def context_length_from_show(doc: Mapping[str, Any]) -> int | None:
    """Ollama ``POST /api/show``: ``model_info["<arch>.context_length"]``, the model's trained
    window. Ollama serves ``num_ctx`` (4096 by default), often less: a prompt between the two
    is truncated, which the adapter detects after the fact (``truncation``)."""
    info = doc.get("model_info")
    if not isinstance(info, Mapping):
        return None
    arch = info.get("general.architecture")
    if isinstance(arch, str):
        return _believable(info.get(f"{arch}.context_length"))
    return None


def certain_prompt_tokens(prompt: Prompt, tmap: TokenizerMap | None) -> int | None:
    """A lower bound of the tokens any upstream will count for ``prompt`` (module
    docstring), or None when there is none worth having (no map, text it cannot encode)."""
    if isinstance(prompt, PromptIds):
        return len(prompt.ids)
    if tmap is None:
        return None
    tok = tokenizer_for(tmap)
    if isinstance(prompt, PromptText):
        n = _text_lower_bound(tok, prompt.text, tmap.special_tokens)
        return None if n is None else max(0, n - TEXT_SLACK)
    if isinstance(prompt, ChatPrompt):
        total = 0
        for message in prompt.messages:
            n = _text_lower_bound(tok, message.text, tmap.special_tokens) if message.text else 0
            if n is None:
                return None
            total += max(0, n - CHAT_BOUNDARY_SLACK)
        return total
    return None


def certain_request_tokens(request: GenerationRequest, tmap: TokenizerMap | None) -> int | None:
    """:func:`certain_prompt_tokens` of ``request``'s prompt, encoded once per map for the
    request however many checks ask (its :class:`~tokenwire.gateway.ir.PromptCounts`)."""
    prompt = request.prompt
    if tmap is None or isinstance(prompt, PromptIds):
        return certain_prompt_tokens(prompt, tmap)
    return request.counts.count(prompt, tmap.hash,
                                lambda: certain_prompt_tokens(prompt, tmap))


def prompt_chars(prompt: Prompt) -> int:
    """Characters of text a count of ``prompt`` encodes (ids: none; compare with
    :data:`INLINE_COUNT_CHARS`)."""
    if isinstance(prompt, PromptText):
        return len(prompt.text)
    if isinstance(prompt, ChatPrompt):
        return sum(len(m.text) for m in prompt.messages)
    return 0


def _text_lower_bound(tok: Tokenizer, text: str, specials: Iterable[str]) -> int | None:
    try:
        plain = len(tok.encode(text))
        if any(s in text for s in specials):
            return min(plain, len(tok.encode(text, allowed_special="all")))
        return plain
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:
        return None


def overflow_before_sending(
    prompt_tokens: int | None, context_length: int | None, *, max_tokens: int | None = None,
    max_tokens_binding: bool = False, source: str = "",
) -> Failure | None:
    """The ``context_length_exceeded`` refusal when the certain count does not fit, else
    None (send it; the upstream decides). See the module docstring for the rule."""
    if prompt_tokens is None or context_length is None:
        return None
    wanted = max_tokens if max_tokens_binding and max_tokens else 1
    if prompt_tokens + wanted <= context_length:
        return None
    where = f" ({source})" if source else ""
    if wanted > 1:
        message = (f"the prompt is at least {prompt_tokens} tokens and max_tokens is "
                   f"{wanted}: more than the model's context window of {context_length} "
                   f"tokens{where}")
    else:
        message = (f"the prompt is at least {prompt_tokens} tokens: it does not fit the "
                   f"model's context window of {context_length} tokens{where}")
    return Failure(failure_class=FailureClass.CONTEXT_LENGTH, status=400,
                   code="context_length_exceeded", message=message,
                   prompt_tokens=prompt_tokens, context_tokens=context_length)
