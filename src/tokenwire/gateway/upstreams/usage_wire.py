"""The usage objects upstreams send, read into :class:`~tokenwire.gateway.ir.Usage` (pure).

One reader per wire shape, so each adapter keeps every figure its upstream reports and
invents none: a field that is absent or not a count is ``None`` ("not said"), never 0
(README "Usage").

* OpenAI Chat / Completions: ``prompt_tokens``, ``completion_tokens``,
  ``prompt_tokens_details.cached_tokens``, ``completion_tokens_details.reasoning_tokens``.
* Responses: ``input_tokens``, ``output_tokens`` and the same two details.
* Anthropic Messages: ``input_tokens`` *excludes* ``cache_read_input_tokens`` and
  ``cache_creation_input_tokens``, so the IR's prompt is the sum of the three.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokenwire.gateway.ir import Usage, UsageSource
from tokenwire.gateway.observability.bounds import MAX_COUNT

__all__ = ["anthropic_usage", "openai_usage", "responses_usage"]


def _count(value: Any) -> int | None:
    """A token count as sent: an int (not a bool) in [0, 2**53], else not a count. Past
    2**53 no model's count, nor exact in a JSON double: passed on, JavaScript clients
    rounded it, and past 2**64 Codex could not parse the response that held it."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT:
        return value
    return None


def _detail(usage: Mapping[str, Any], field: str, key: str) -> int | None:
    details = usage.get(field)
    return _count(details.get(key)) if isinstance(details, Mapping) else None


def openai_usage(usage: Any) -> Usage | None:
    """A Chat Completions / Completions ``usage`` object, or ``None`` if it is not one (it
    names neither count). One that names only the completion's keeps it: it was dropped
    whole, and the client got no usage where the upstream had reported a figure."""
    if not isinstance(usage, Mapping) or (
            "prompt_tokens" not in usage and "completion_tokens" not in usage):
        return None
    return Usage(prompt_tokens=_count(usage.get("prompt_tokens")),
                 completion_tokens=_count(usage.get("completion_tokens")),
                 cached_tokens=_detail(usage, "prompt_tokens_details", "cached_tokens"),
                 reasoning_tokens=_detail(usage, "completion_tokens_details",
                                          "reasoning_tokens"),
                 source=UsageSource.UPSTREAM)


def responses_usage(usage: Any) -> Usage | None:
    """A Responses ``usage`` object, or ``None`` if it is not one."""
    if not isinstance(usage, Mapping):
        return None
    return Usage(prompt_tokens=_count(usage.get("input_tokens")),
                 completion_tokens=_count(usage.get("output_tokens")),
                 cached_tokens=_detail(usage, "input_tokens_details", "cached_tokens"),
                 reasoning_tokens=_detail(usage, "output_tokens_details", "reasoning_tokens"),
                 source=UsageSource.UPSTREAM)


def anthropic_usage(usage: Mapping[str, Any], *, final: bool = True) -> Usage | None:
    """Anthropic's ``usage`` (the fields of ``message_start`` merged with the cumulative
    ones of ``message_delta``); ``final=False`` gives ``message_start``'s prompt-only
    count. ``None`` when it names neither count (early: no input count). One that names only
    the output's keeps it, as :func:`openai_usage` does: it was dropped whole, and every
    client got no usage where the upstream had reported a figure."""
    read = _count(usage.get("cache_read_input_tokens"))
    written = _count(usage.get("cache_creation_input_tokens"))
    uncached = _count(usage.get("input_tokens"))
    output = _count(usage.get("output_tokens")) if final else None
    if uncached is None and output is None:
        return None
    prompt = None if uncached is None else _count(uncached + (read or 0) + (written or 0))
    return Usage(prompt_tokens=prompt, completion_tokens=output, cached_tokens=read,
                 cache_creation_tokens=written, source=UsageSource.UPSTREAM)
