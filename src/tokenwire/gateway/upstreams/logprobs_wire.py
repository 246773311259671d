"""Log probabilities as OpenAI-shaped upstreams send them -> IR :class:`TokenLogprob` values.

Chat Completions (``choices[].logprobs.content``) and Responses (``output_text.delta``'s
``logprobs``) send entries ``{"token", "logprob", "bytes", "top_logprobs": [...]}``;
Completions sends parallel arrays (``tokens``, ``token_logprobs``, ``top_logprobs`` as
``{token: logprob}`` objects). Malformed entries are skipped, never guessed at: a missing
``bytes`` is the token's UTF-8, a missing number drops the entry, and so does a
``top_logprobs`` that is not a list; arrays that are not lists are no logprobs. (Each of
these once raised in the parser: the gateway's own 500 for an upstream's odd field.)
"""

from __future__ import annotations

from typing import Any

from tokenwire.gateway.ir import TokenLogprob, TopLogprob

__all__ = ["completions_logprobs", "entry_logprobs"]


def _bytes(entry: dict[str, Any], token: str) -> tuple[int, ...]:
    raw = entry.get("bytes")
    if isinstance(raw, list) and all(isinstance(b, int) and 0 <= b < 256 for b in raw):
        return tuple(raw)
    return tuple(token.encode("utf-8"))


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else None


def entry_logprobs(entries: Any) -> tuple[TokenLogprob, ...]:
    """Chat / Responses entries."""
    out: list[TokenLogprob] = []
    for e in entries if isinstance(entries, list) else ():
        if not isinstance(e, dict) or not isinstance(e.get("token"), str):
            continue
        lp, tops = _number(e.get("logprob")), e.get("top_logprobs") or []
        if lp is None or not isinstance(tops, list):
            continue
        top = tuple(TopLogprob(token=t["token"], bytes=_bytes(t, t["token"]), logprob=tl)
                    for t in tops if isinstance(t, dict)
                    and isinstance(t.get("token"), str)
                    and (tl := _number(t.get("logprob"))) is not None)
        out.append(TokenLogprob(token=e["token"], bytes=_bytes(e, e["token"]), logprob=lp,
                                top=top))
    return tuple(out)


def completions_logprobs(arrays: Any) -> tuple[TokenLogprob, ...]:
    """Completions' parallel arrays."""
    if not isinstance(arrays, dict):
        return ()
    tokens, values = arrays.get("tokens") or [], arrays.get("token_logprobs") or []
    tops = arrays.get("top_logprobs") or []
    if not all(isinstance(a, list) for a in (tokens, values, tops)):
        return ()
    out: list[TokenLogprob] = []
    for i, (token, value) in enumerate(zip(tokens, values, strict=False)):
        lp = _number(value)
        if not isinstance(token, str) or lp is None:
            continue
        alts = tops[i] if i < len(tops) and isinstance(tops[i], dict) else {}
        ranked = sorted(((t, v) for t, v in alts.items() if _number(v) is not None),
                        key=lambda kv: -kv[1])
        out.append(TokenLogprob(token=token, bytes=tuple(token.encode("utf-8")), logprob=lp,
                                top=tuple(TopLogprob(token=t, bytes=tuple(t.encode("utf-8")),
                                                     logprob=float(v)) for t, v in ranked)))
    return tuple(out)
