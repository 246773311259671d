"""llama.cpp's own grammar machinery as an oracle: does a GBNF grammar accept a text?

The text is tokenized with SmolLM2's vocabulary (vocab only, no weights) and fed token by
token to a grammar sampler, as decoding would: each token must survive the sampler's
``apply`` (llama.cpp sets a token the grammar refuses to -inf) before it is accepted, and at
the end the end-of-generation token must be allowed (the grammar is complete). Accepting a
refused token would abort the process (llama.cpp throws), so that is never done.
"""

from __future__ import annotations

import ctypes
import math

import llama_cpp

from tokenwire.gguf_tokenizer import smollm2_gguf_path


class GbnfOracle:
    def __init__(self) -> None:
        self.llm = llama_cpp.Llama(model_path=str(smollm2_gguf_path()), vocab_only=True,
                                   verbose=False)
        self.vocab = self.llm._model.vocab
        self.eos = llama_cpp.llama_vocab_eos(self.vocab)

    def parses(self, grammar: str) -> bool:
        sampler = llama_cpp.llama_sampler_init_grammar(self.vocab, grammar.encode(), b"root")
        if sampler:
            llama_cpp.llama_sampler_free(sampler)
        return bool(sampler)

    def representable(self, text: str) -> bool:
        """The vocabulary spells ``text`` (SmolLM2's lacks a few bytes: 0xF1 0x80 0x80 0x80,
        U+40000, tokenizes to three copies of one stand-in token)."""
        ids = self.llm.tokenize(text.encode(), add_bos=False, special=False)
        return self.llm.detokenize(ids) == text.encode()

    def accepts(self, grammar: str, text: str) -> bool:
        """Whether ``text`` is a sentence of ``grammar`` (``text`` :meth:`representable`)."""
        assert self.representable(text), text
        sampler = llama_cpp.llama_sampler_init_grammar(self.vocab, grammar.encode(), b"root")
        assert sampler, "llama.cpp could not parse the grammar"
        try:
            for tok in self.llm.tokenize(text.encode(), add_bos=False, special=False):
                if not self._allowed(sampler, tok):
                    return False
                llama_cpp.llama_sampler_accept(sampler, tok)
            return self._allowed(sampler, self.eos)
        finally:
            llama_cpp.llama_sampler_free(sampler)

    @staticmethod
    def _allowed(sampler, tok: int) -> bool:
        data = (llama_cpp.llama_token_data * 1)(llama_cpp.llama_token_data(tok, 0.0, 0.0))
        array = llama_cpp.llama_token_data_array(
            data=ctypes.cast(data, llama_cpp.llama_token_data_p), size=1, selected=-1,
            sorted=False)
        llama_cpp.llama_sampler_apply(sampler, ctypes.byref(array))
        return not math.isinf(data[0].logit)
