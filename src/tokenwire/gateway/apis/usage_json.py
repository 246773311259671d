"""One :class:`~tokenwire.gateway.ir.Usage` in each API's own shape (README "Usage").

The IR counts in OpenAI's convention (the prompt includes cached and cache-written
tokens, the completion includes reasoning); Anthropic's ``input_tokens`` excludes both
cache figures, so it is the prompt minus them. ``None`` ("not known") is written as JSON
``null``, never as 0: a details object whose only figure is unknown is ``null`` as a whole
(Codex parses a present ``input_tokens_details`` only with an integer in it).

Every usage object also carries ``tokenwire_source`` (``engine``, ``upstream`` or
``gateway``, :class:`~tokenwire.gateway.ir.UsageSource`), an extension field the SDKs keep
and ignore: it is exact even on a stream, whose ``Tokenwire-Usage-Source`` header could
not be known when it was sent.
"""

from __future__ import annotations

from typing import Any

from tokenwire.gateway.ir import Usage

__all__ = ["SOURCE_FIELD", "anthropic_usage", "openai_usage", "responses_usage"]

#: The extension field naming who counted (README "Usage").
SOURCE_FIELD = "tokenwire_source"


def _minus(total: int | None, *parts: int | None) -> int | None:
    if total is None:
        return None
    return max(0, total - sum(p for p in parts if p is not None))


def openai_usage(usage: Usage | None) -> dict[str, Any] | None:
    """Chat Completions and Completions ``usage``; ``None`` when nothing was reported."""
    if usage is None:
        return None
    out: dict[str, Any] = {
        "prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": None if usage.cached_tokens is None
        else {"cached_tokens": usage.cached_tokens},
        "completion_tokens_details": None if usage.reasoning_tokens is None
        else {"reasoning_tokens": usage.reasoning_tokens},
    }
    out[SOURCE_FIELD] = usage.source.value
    return out


def responses_usage(usage: Usage | None) -> dict[str, Any] | None:
    """Responses ``usage``: ``input_tokens`` / ``output_tokens`` / ``total_tokens`` and
    their details."""
    if usage is None:
        return None
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": None if usage.cached_tokens is None
        else {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": None if usage.reasoning_tokens is None
        else {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.total_tokens,
        SOURCE_FIELD: usage.source.value,
    }


def anthropic_usage(usage: Usage | None, *, output: bool = True) -> dict[str, Any]:
    """Messages ``usage``: ``input_tokens`` without the cache figures, which have their own
    fields. ``output=False`` is ``message_start``'s, before anything was generated (0
    output tokens so far: a count, not a placeholder)."""
    if usage is None:  # nobody reported or counted anything (a stream that failed early)
        return {"input_tokens": None, "cache_creation_input_tokens": None,
                "cache_read_input_tokens": None, "output_tokens": None, SOURCE_FIELD: None}
    return {
        "input_tokens": _minus(usage.prompt_tokens, usage.cached_tokens,
                               usage.cache_creation_tokens),
        "cache_creation_input_tokens": usage.cache_creation_tokens,
        "cache_read_input_tokens": usage.cached_tokens,
        "output_tokens": usage.completion_tokens if output else 0,
        SOURCE_FIELD: usage.source.value,
    }
