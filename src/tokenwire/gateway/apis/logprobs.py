"""Log probabilities (:class:`~tokenwire.gateway.ir.TokenLogprob`) in each API's shape.

* Chat Completions and Responses: one entry per token, ``{"token", "logprob", "bytes",
  "top_logprobs": [{"token", "logprob", "bytes"}]}`` (Chat under
  ``choices[].logprobs.content``, Responses under an ``output_text`` part's ``logprobs``
  and each ``response.output_text.delta``).
* Completions (the legacy shape): parallel arrays ``tokens``, ``token_logprobs``,
  ``top_logprobs`` (one ``{token: logprob}`` object per position) and ``text_offset`` (the
  character offset of each token in the answer's text). Each ``top_logprobs`` object holds
  the chosen token too, as OpenAI documents ("the API will always return the logprob of the
  sampled token, so there may be up to logprobs+1 elements"); Chat's list does not.

A token can end inside a UTF-8 character: its ``token`` text then holds U+FFFD and ``bytes``
is exact, as OpenAI does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenwire.gateway.ir import TokenLogprob

__all__ = ["CompletionsLogprobs", "chat_entries"]


def chat_entries(logprobs: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
    """Chat / Responses entries, one per token."""
    return [{"token": lp.token, "logprob": lp.logprob, "bytes": list(lp.bytes),
             "top_logprobs": [{"token": t.token, "logprob": t.logprob, "bytes": list(t.bytes)}
                              for t in lp.top]} for lp in logprobs]


class CompletionsLogprobs:
    """Completions' arrays, chunk by chunk: ``text_offset`` counts characters of the whole
    answer, so the offsets of a stream's chunks continue where the last one ended."""

    def __init__(self) -> None:
        self._offset = 0

    def render(self, logprobs: Sequence[TokenLogprob]) -> dict[str, Any]:
        offsets = []
        for lp in logprobs:
            offsets.append(self._offset)
            self._offset += len(lp.token)
        return {"tokens": [lp.token for lp in logprobs],
                "token_logprobs": [lp.logprob for lp in logprobs],
                "top_logprobs": [_top_with_chosen(lp) for lp in logprobs],
                "text_offset": offsets}


def _top_with_chosen(lp: TokenLogprob) -> dict[str, float]:
    """Completions' ``{token: logprob}`` of the alternatives, with the chosen token when a
    sampler picked one outside them (or ``logprobs`` is 0)."""
    top = {t.token: t.logprob for t in lp.top}
    top.setdefault(lp.token, lp.logprob)
    return top
