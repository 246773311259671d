"""Log probabilities of the embedded engine's tokens, read from llama.cpp's logits.

While ``Llama.generate`` is suspended at a yield, the context still holds the logits of its
last decode: the row that sampled the token just yielded (the engine runs without
``logits_all``, so that row is the only one). Its log-softmax is the model's distribution
before sampling (penalties, top-k and grammars left out), which is what OpenAI reports and
what llama-cpp-python's own ``create_completion(logprobs=...)`` computes.
"""

from __future__ import annotations

from typing import Any

from tokenwire.gateway.ir import TokenLogprob, TopLogprob

__all__ = ["LogprobReader"]


class LogprobReader:
    """``read(tok, top)`` for one ``Llama``; token bytes are cached (logprobs look up the
    same few thousand tokens again and again)."""

    def __init__(self, llm: Any) -> None:
        self._llm = llm
        self._pieces: dict[int, bytes] = {}

    def read(self, tok: int, top: int) -> TokenLogprob:
        """``tok``'s log probability and the ``top`` most likely tokens, most likely first."""
        import numpy as np

        logits = np.ctypeslib.as_array(self._llm._ctx.get_logits(),
                                       shape=(self._llm.n_vocab(),))
        peak = float(logits.max())
        log_total = peak + float(np.log(np.exp(logits - peak).sum()))
        alternatives: tuple[TopLogprob, ...] = ()
        if top > 0:
            best = np.argpartition(-logits, top)[:top]
            best = best[np.argsort(-logits[best], kind="stable")]
            alternatives = tuple(self._top(int(i), float(logits[i]) - log_total) for i in best)
        piece = self._piece(tok)
        return TokenLogprob(token=piece.decode("utf-8", "replace"), bytes=tuple(piece),
                            logprob=float(logits[tok]) - log_total, top=alternatives)

    def _top(self, tok: int, logprob: float) -> TopLogprob:
        piece = self._piece(tok)
        return TopLogprob(token=piece.decode("utf-8", "replace"), bytes=tuple(piece),
                          logprob=logprob)

    def _piece(self, tok: int) -> bytes:
        piece = self._pieces.get(tok)
        if piece is None:  # control tokens as their text
            piece = self._pieces[tok] = bytes(self._llm.detokenize([tok], special=True))
        return piece
