"""Lower a Hugging Face ``tokenizer.json`` ``pre_tokenizer`` to a pre-tokenizer program.

codec-spec.md §3.5 "Lowering of real HF pre-tokenizers"::

    program, pattern = lower_hf_pretokenizer(tokenizer_json["pre_tokenizer"])

* ``ByteLevel(use_regex=true)`` -> the fixed six-op GPT-2 list; ``use_regex=false`` adds no
  stage (byte mapping is unconditional for byte_level maps).
* ``Split(Regex(p), Isolated)`` -> the op list or stage of a *known* pattern, recognised by
  its exact string (:data:`KNOWN_SPLIT_PATTERNS`), never by parsing the regex.
* ``Digits`` -> ``digits_isolate``; ``Punctuation(Contiguous)`` -> ``punctuation_contiguous``.
* ``Sequence`` -> the children's stages in order; a lone op-list stage becomes a v1 program.
* ``Metaspace`` (alone) -> no program: the tokenizer's metaspace path handles it.
* Anything else -> :class:`UnsupportedProgram` naming the child. Never guess.

``pattern`` is the compiled program's ``single_regex`` (one regex with the same pieces,
for ``pre_tokenizer_pattern`` and tiktoken), or ``None`` when no honest one exists.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from tokenwire.codec.pretok import compile_program
from tokenwire.errors import UnsupportedProgram

__all__ = [
    "BYTE_LEVEL_OPS",
    "CONTRACTIONS",
    "KNOWN_SPLIT_PATTERNS",
    "lower_hf_pretokenizer",
]

CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"]

#: ``ByteLevel(use_regex=true)``'s built-in regex,
#: ``'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+``.
BYTE_LEVEL_OPS: list[dict[str, Any]] = [
    {"op": "literals", "patterns": CONTRACTIONS},
    {"op": "letters", "lead_space": True},
    {"op": "numbers", "lead_space": True},
    {"op": "punct_run", "lead_space": True},
    {"op": "trailing_ws"},
    {"op": "ws_run"},
]


def _cl100k_like(numbers: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"op": "literals_ci", "patterns": CONTRACTIONS},
        {"op": "letters", "lead_other": True},
        numbers,
        {"op": "punct_run", "lead_space": True, "trailing_newlines": True},
        {"op": "newline_block"},
        {"op": "trailing_ws"},
        {"op": "ws_run"},
    ]


_O200K_OPS: list[dict[str, Any]] = [
    {"op": "letters_cased", "kind": "title", "lead_other": True, "trailing_ci": CONTRACTIONS},
    {"op": "letters_cased", "kind": "upper", "lead_other": True, "trailing_ci": CONTRACTIONS},
    {"op": "numbers", "max_run": 3},
    {"op": "punct_run", "lead_space": True, "trailing_chars": "\r\n/"},
    {"op": "newline_block"},
    {"op": "trailing_ws"},
    {"op": "ws_run"},
]

_DEEPSEEK_OPS: list[dict[str, Any]] = [
    {"op": "punct_ascii_letters"},
    {"op": "letters", "lead_other": True, "lead_other_class": "l_p_s", "body": "L_M"},
    {"op": "punct_run", "lead_space": True, "trailing_newlines": True, "charset": "p_s"},
    {"op": "newline_block"},
    {"op": "trailing_ws"},
    {"op": "ws_run"},
]

_O200K_PATTERN = "|".join([
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])

_CL100K_TEMPLATE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|NUMBERS"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

#: Exact ``Split`` regex strings we know, each with the stage it lowers to. An op-list
#: stage is ``{"stage": "alternation", "ops": [...]}``.
KNOWN_SPLIT_PATTERNS: dict[str, tuple[str, dict[str, Any]]] = {
    # GPT-2 / r50k / p50k: the same regex ByteLevel(use_regex=true) runs.
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+": (
        "gpt2/r50k", {"stage": "alternation", "ops": BYTE_LEVEL_OPS}),
    # cl100k as published in tokenizer.json form; also Llama-3, Phi-4.
    _CL100K_TEMPLATE.replace("NUMBERS", r"\p{N}{1,3}"): (
        "cl100k/llama-3",
        {"stage": "alternation", "ops": _cl100k_like({"op": "numbers", "max_run": 3})}),
    # Qwen-2: one digit per piece. The spec's worked example says unbounded `numbers`;
    # the real regex and the Qwen golden ids say max_run 1 (codec-spec.md §3.5 caveats).
    _CL100K_TEMPLATE.replace("NUMBERS", r"\p{N}"): (
        "qwen2", {"stage": "alternation", "ops": _cl100k_like({"op": "numbers", "max_run": 1})}),
    _O200K_PATTERN: ("o200k", {"stage": "alternation", "ops": _O200K_OPS}),
    # DeepSeek-V3/R1: three Splits, lowered stage by stage.
    r"\p{N}{1,3}": ("deepseek digits", {"stage": "digits_isolate", "mode": "grouped",
                                        "max_run": 3}),
    "[一-龥぀-ゟ゠-ヿ]+": ("deepseek cjk", {"stage": "cjk_isolate"}),
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": (
        "deepseek-v3", {"stage": "alternation", "ops": _DEEPSEEK_OPS}),
    # Falcon's fourth stage.
    "[0-9][0-9][0-9]": ("digit triples", {"stage": "digit_triples_isolate"}),
    "[0-9]{3}": ("digit triples", {"stage": "digit_triples_isolate"}),
}

# Oniguruma's \d is Unicode Nd (Arabic-Indic digits too), so `\d{3}` equals the ASCII-only
# digit_triples_isolate only on GPT-2 byte-characters, i.e. after ByteLevel(use_regex=true),
# where the only Nd characters left are 0-9.
_BYTE_DOMAIN_ONLY = {r"\d{3}": ("digit triples (\\d)", {"stage": "digit_triples_isolate"})}


def _describe(node: Any) -> str:
    if isinstance(node, Mapping):
        return f"{node.get('type')!s} {dict(node)!r}"
    return repr(node)


def _lower_split(node: Mapping[str, Any], byte_domain: bool) -> dict[str, Any]:
    pattern = node.get("pattern")
    regex_src = pattern.get("Regex") if isinstance(pattern, Mapping) else None
    if node.get("behavior") != "Isolated" or node.get("invert", False) is not False:
        raise UnsupportedProgram(
            f"Split with behavior {node.get('behavior')!r}, invert {node.get('invert')!r} "
            f"is not expressible (only Isolated, not inverted): {_describe(node)}"
        )
    if isinstance(regex_src, str) and regex_src in KNOWN_SPLIT_PATTERNS:
        return KNOWN_SPLIT_PATTERNS[regex_src][1]
    if byte_domain and isinstance(regex_src, str) and regex_src in _BYTE_DOMAIN_ONLY:
        return _BYTE_DOMAIN_ONLY[regex_src][1]
    raise UnsupportedProgram(f"unrecognised Split pattern {pattern!r}: {_describe(node)}")


def _lower_child(node: Any, byte_domain: bool) -> list[dict[str, Any]]:
    """The stages one pre-tokenizer contributes (``byte_domain``: a ByteLevel ran before)."""
    kind = node.get("type") if isinstance(node, Mapping) else None
    match kind:
        case "ByteLevel":
            if node.get("add_prefix_space"):
                # It would change the text (a leading space), which no program can say.
                raise UnsupportedProgram(f"ByteLevel(add_prefix_space=true): {_describe(node)}")
            if node.get("use_regex", True):
                return [{"stage": "alternation", "ops": BYTE_LEVEL_OPS}]
            return []
        case "Split":
            return [_lower_split(node, byte_domain)]
        case "Digits":
            if node.get("individual_digits"):
                return [{"stage": "digits_isolate", "mode": "individual"}]
            return [{"stage": "digits_isolate", "mode": "grouped"}]
        case "Punctuation":
            if node.get("behavior", "Isolated") != "Contiguous":
                raise UnsupportedProgram(f"Punctuation behavior: {_describe(node)}")
            return [{"stage": "punctuation_contiguous"}]
    raise UnsupportedProgram(f"unsupported pre-tokenizer {_describe(node)}")


def _program(stages: list[dict[str, Any]]) -> dict[str, Any]:
    if len(stages) == 1 and stages[0]["stage"] == "alternation":
        return {"version": 1, "ops": stages[0]["ops"]}
    return {"version": 2, "stages": stages}


def lower_hf_pretokenizer(
    pre_tokenizer: Mapping[str, Any] | None,
    normalizer: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any] | None, str | None]:
    """``(program, single_regex_or_None)`` for a tokenizer.json ``pre_tokenizer`` object.

    ``normalizer`` is accepted so callers can pass the whole tokenizer.json context; the
    program describes how the *normalised* text is split, so it does not depend on it.
    ``(None, None)`` means "no program": a null pre-tokenizer or a lone ``Metaspace``.
    """
    if normalizer is not None and not isinstance(normalizer, Mapping):
        raise UnsupportedProgram(f"normalizer must be an object or null, got {normalizer!r}")
    if pre_tokenizer is None:
        return None, None
    if not isinstance(pre_tokenizer, Mapping):
        raise UnsupportedProgram(f"pre_tokenizer must be an object, got {pre_tokenizer!r}")
    children: Any = [pre_tokenizer]
    if pre_tokenizer.get("type") == "Sequence":
        children = pre_tokenizer.get("pretokenizers")
        if not isinstance(children, list):
            raise UnsupportedProgram(f"Sequence without a list: {_describe(pre_tokenizer)}")
    if len(children) == 1 and isinstance(children[0], Mapping) and (
        children[0].get("type") == "Metaspace"
    ):
        return None, None
    stages: list[dict[str, Any]] = []
    byte_domain = False
    for child in children:
        stages.extend(_lower_child(child, byte_domain))
        if isinstance(child, Mapping) and child.get("type") == "ByteLevel":
            byte_domain = byte_domain or bool(child.get("use_regex", True))
    program = copy.deepcopy(_program(stages))  # callers may mutate; the tables stay intact
    return program, compile_program(program).single_regex
