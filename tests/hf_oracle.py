"""Build a Hugging Face `tokenizers.Tokenizer` from a TokenizerMap: the correctness oracle.

HF `tokenizers` is a test-only dependency; nothing in ``src/`` imports it. The oracle uses
the map's vocab and merges with a pre-tokenizer / normaliser chosen by the caller, so one
map can be checked against its own pattern (is our BPE exact?) and against the model's
real pre-tokenizer (is the map faithful?). The real configurations below are those of the
models' ``tokenizer.json`` files (peer-bench §2, codec-spec §3.5 "Lowering").
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers

from tokenwire.codec.maps import TokenizerMap

__all__ = [
    "GPT2_PATTERN",
    "hf_encode",
    "hf_tokenizer",
    "map_pattern_pre_tokenizer",
    "metaspace_first",
    "metaspace_normalizer_always",
    "real_pre_tokenizer",
]

# The regex HF's ByteLevel(use_regex=True) applies.
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


def map_pattern_pre_tokenizer(pattern: str) -> Any:
    """The map's own regex, then the byte mapping (``ByteLevel(use_regex=False)``)."""
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])  # fmt: skip


def _byte_level() -> Any:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def real_pre_tokenizer(map_id: str) -> Any:
    """The pre-tokenizer the model really uses, for the maps whose pattern approximates it."""
    if map_id == "huggingfacetb/smollm2":
        return pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            _byte_level(),
        ])  # fmt: skip
    if map_id == "tiiuae/falcon":
        return pre_tokenizers.Sequence([
            pre_tokenizers.Punctuation(behavior="contiguous"),
            _byte_level(),
            pre_tokenizers.Digits(individual_digits=False),
            pre_tokenizers.Split(Regex("[0-9][0-9][0-9]"), behavior="isolated"),
        ])  # fmt: skip
    raise KeyError(f"no real pre-tokenizer recorded for {map_id}")


def metaspace_normalizer_always() -> Any:
    """Llama-2 / Phi-3: ``Prepend("▁")`` then ``Replace(" ", "▁")`` on every segment."""
    return normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])


def metaspace_first() -> Any:
    """Mistral-v3: the Metaspace pre-tokenizer, prepending only at the start of the text."""
    return pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)


def hf_tokenizer(
    tmap: TokenizerMap,
    *,
    pre_tokenizer: Any | None = None,
    normalizer: Any | None = None,
    specials: Iterable[str] = (),
) -> Tokenizer:
    """An HF tokenizer over ``tmap``'s vocab and merges.

    Defaults: byte_level maps use their own ``pre_tokenizer_pattern``; metaspace maps use
    the HF configuration of their ``metaspace_prepend_scheme`` (``"always"``: Prepend +
    Replace normaliser; ``"first"``: Metaspace pre-tokenizer). ``specials`` become added
    special tokens (not normalised), as when the caller allows them; leave it empty to
    check that special-token strings are encoded as text.
    """
    merges = [tuple(m.split(" ", 1)) for m in tmap.merges]
    if tmap.encoder == "metaspace":
        model = models.BPE(vocab=dict(tmap.vocab), merges=merges, byte_fallback=True)
    else:
        model = models.BPE(vocab=dict(tmap.vocab), merges=merges)
    tok = Tokenizer(model)
    if tmap.encoder == "byte_level":
        if pre_tokenizer is None:
            if tmap.pre_tokenizer_pattern is None:
                raise ValueError(f"{tmap.id} has no pattern; pass pre_tokenizer=")
            pre_tokenizer = map_pattern_pre_tokenizer(tmap.pre_tokenizer_pattern)
    elif tmap.encoder == "metaspace" and pre_tokenizer is None and normalizer is None:
        if tmap.metaspace_prepend_scheme == "always":
            normalizer = metaspace_normalizer_always()
        elif tmap.metaspace_prepend_scheme == "first":
            pre_tokenizer = metaspace_first()
        else:
            normalizer = normalizers.Replace(" ", "▁")
    if pre_tokenizer is not None:
        tok.pre_tokenizer = pre_tokenizer
    if normalizer is not None:
        tok.normalizer = normalizer
    names = list(specials)
    if names:
        tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in names])
    return tok


def hf_encode(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids
