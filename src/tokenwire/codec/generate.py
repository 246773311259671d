"""Build a tokenizer map (codec-spec 3.1) from a model's own tokenizer description.

Two inputs, both already parsed by the caller (this module does no I/O):

* a Hugging Face ``tokenizer.json`` document (``dict``), via :func:`map_from_tokenizer_json`;
* the tokenizer metadata of a GGUF file (:class:`GGUFTokenizerMeta`, read by
  ``tokenwire.gguf_tokenizer.read_gguf_tokenizer``), via :func:`map_from_gguf_metadata`.

Both return the map document as bytes serialised exactly as the codec-maps repository does
(``json.dumps(obj, indent=2, ensure_ascii=False)``, UTF-8, no trailing newline): a map is
addressed by the sha256 of its raw bytes (codec-spec 3.2), so one serialisation, always.
Keys follow the order of the codec-spec 3.1 table. ``published_at`` is a parameter (omitted
when ``None``) so the output is a pure function of the input.

Decisions (each one is what makes the generated map tokenize like the model):

* ``special_tokens`` holds every token that the model's tokenizer matches atomically in
  text before BPE: GGUF CONTROL, USER_DEFINED and UNKNOWN tokens, and every HF
  ``added_tokens`` entry, ``special`` or not. HF and llama.cpp both split user text on
  non-special added tokens too (Qwen's ``<tool_call>`` is one), and the tool_calling
  markers must be keys of ``special_tokens`` (codec-spec 3.6). The cost: a renderer that
  hides specials also hides those non-special added tokens.
* byte_level pre-tokenization is the faithful program (v1 where one regex is the real
  pre-tokenizer, v2 stages otherwise); ``pre_tokenizer_pattern`` is written only where a
  single regex gives the same pieces (codec-spec 3.5, v0.5 rule "both where expressible"),
  and it is the regex ``tokenwire.codec.pretok`` derives from the program (``single_regex``,
  explicit White_Space classes, portable across regex engines), on both the GGUF and the
  HF path, so one tokenizer gives one map whatever it was read from.
* GGUF ``tokenizer.ggml.pre`` names are llama.cpp's; :data:`GGUF_PRE_PROGRAMS` maps the
  known ones. An unknown name is an error, never a guess. For ``falcon`` the program is the
  HF pre-tokenizer (Punctuation, ByteLevel, Digits, Split); llama.cpp's own ``falcon``
  regex list omits the Digits stage, so its pieces differ (``" 12"`` stays whole), but
  Falcon's vocab has no space+digit token, so the ids agree (tests/test_gguf_smollm2.py).
* SentencePiece GGUFs (``tokenizer.ggml.model == "llama"``) carry scores, not merges; the
  merges are rebuilt from the scores the way HF's ``SentencePieceExtractor`` does
  (:func:`merges_from_scores`).
* Not expressible in a map: a normaliser on a byte_level model (Qwen-2's NFC) and HF
  ``ignore_merges`` (Llama-3). Both change ids on some inputs, so they are refused unless the
  caller passes ``allow_lossy=True`` (``--allow-lossy``), which drops them knowingly.
"""

from __future__ import annotations

import copy
import enum
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tokenwire.codec.maps import load_map_bytes, validate_map_id
from tokenwire.codec.pretok_lower import BYTE_LEVEL_OPS, CONTRACTIONS, lower_hf_pretokenizer
from tokenwire.errors import GenerateError, MapError, PretokError

__all__ = [
    "GGUF_PRE_PROGRAMS",
    "MAP_VERSION",
    "TOOL_CALLING_MARKERS",
    "GGUFTokenizerMeta",
    "GgufTokenType",
    "map_document_bytes",
    "map_from_gguf_metadata",
    "map_from_tokenizer_json",
    "merges_from_scores",
]

MAP_VERSION = "2"  # codec-spec 3.1: current maps are version "2"

# codec-spec 3.1 table order; keys absent from a document are skipped.
_KEY_ORDER = (
    "id", "version", "vocab_size", "vocab", "encoder", "merges", "pre_tokenizer_pattern",
    "pre_tokenizer_program", "byte_fallback_start", "byte_fallback_end",
    "metaspace_prepend_scheme", "special_tokens", "tool_calling", "zstd_dictionaries",
    "published_at",
)  # fmt: skip

_METASPACE = "\u2581"  # "▁", SentencePiece's visible space


class GgufTokenType(enum.IntEnum):
    """``tokenizer.ggml.token_type`` values (llama.cpp ``llama_token_type``)."""

    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


# Token types matched atomically in text by the model's tokenizer -> special_tokens.
_ATOMIC_TYPES = frozenset(
    {GgufTokenType.UNKNOWN, GgufTokenType.CONTROL, GgufTokenType.USER_DEFINED}
)


@dataclass(frozen=True, slots=True)
class GGUFTokenizerMeta:
    """The tokenizer part of a GGUF file's metadata (keys ``tokenizer.ggml.*``)."""

    model: str  # "gpt2" = byte-level BPE, "llama" = SentencePiece
    pre: str | None  # llama.cpp pre-tokenizer name, e.g. "smollm"
    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    merges: tuple[str, ...] = ()
    scores: tuple[float, ...] | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    add_space_prefix: bool | None = None
    chat_template: str | None = None
    name: str | None = None
    license: str | None = None


# --- pre-tokenizer programs (codec-spec 3.5) -------------------------------------------



def _llama3_ops(max_run: int) -> list[dict[str, Any]]:
    return [
        {"op": "literals_ci", "patterns": CONTRACTIONS},
        {"op": "letters", "lead_other": True},
        {"op": "numbers", "max_run": max_run},
        {"op": "punct_run", "lead_space": True, "trailing_newlines": True},
        {"op": "newline_block"},
        {"op": "trailing_ws"},
        {"op": "ws_run"},
    ]


def _cased_ops(max_run: int, trailing: list[str] | None) -> list[dict[str, Any]]:
    extra = {"trailing_ci": trailing} if trailing else {}
    return [
        {"op": "letters_cased", "kind": "title", "lead_other": True, **extra},
        {"op": "letters_cased", "kind": "upper", "lead_other": True, **extra},
        {"op": "numbers", "max_run": max_run},
        {"op": "punct_run", "lead_space": True, "trailing_chars": "\r\n/"},
        {"op": "newline_block"},
        {"op": "trailing_ws"},
        {"op": "ws_run"},
    ]


_GPT2: dict[str, Any] = {"version": 1, "ops": BYTE_LEVEL_OPS}
_LLAMA3: dict[str, Any] = {"version": 1, "ops": _llama3_ops(3)}
_QWEN2: dict[str, Any] = {"version": 1, "ops": _llama3_ops(1)}
# HF Sequence[Digits(individual), ByteLevel]: a v2 program (codec-spec 3.5, SmolLM2).
_SMOLLM: dict[str, Any] = {"version": 2, "stages": [
    {"stage": "digits_isolate", "mode": "individual"},
    {"stage": "alternation", "ops": BYTE_LEVEL_OPS},
]}  # fmt: skip
_FALCON: dict[str, Any] = {"version": 2, "stages": [
    {"stage": "punctuation_contiguous"},
    {"stage": "alternation", "ops": BYTE_LEVEL_OPS},
    {"stage": "digits_isolate", "mode": "grouped"},
    {"stage": "digit_triples_isolate"},
]}  # fmt: skip
_DEEPSEEK_V3: dict[str, Any] = {"version": 2, "stages": [
    {"stage": "digits_isolate", "mode": "grouped", "max_run": 3},
    {"stage": "cjk_isolate"},
    {"stage": "alternation", "ops": [
        {"op": "punct_ascii_letters"},
        {"op": "letters", "lead_other": True, "lead_other_class": "l_p_s", "body": "L_M"},
        {"op": "punct_run", "lead_space": True, "trailing_newlines": True, "charset": "p_s"},
        {"op": "newline_block"},
        {"op": "trailing_ws"},
        {"op": "ws_run"},
    ]},
]}  # fmt: skip
_O200K: dict[str, Any] = {"version": 1, "ops": _cased_ops(3, CONTRACTIONS)}
_TEKKEN: dict[str, Any] = {"version": 1, "ops": _cased_ops(1, None)}

# llama.cpp `tokenizer.ggml.pre` name -> byte_level pre-tokenizer program (llama-vocab.cpp's
# regex lists, transcribed to codec-spec 3.5 programs; the regex, where one exists, is
# derived from the program by `pretok`, the same way the HF path gets it).
GGUF_PRE_PROGRAMS: dict[str, dict[str, Any]] = {
    "gpt-2": _GPT2,
    "phi-2": _GPT2,
    "llama3": _LLAMA3,
    "llama-v3": _LLAMA3,
    "llama-bpe": _LLAMA3,
    "falcon3": _LLAMA3,
    "qwen2": _QWEN2,
    "deepseek-r1-qwen": _QWEN2,
    "smollm": _SMOLLM,
    "falcon": _FALCON,
    "deepseek-v3": _DEEPSEEK_V3,
    "gpt-4o": _O200K,
    "tekken": _TEKKEN,
}

# codec-spec 3.6 prose table, first match wins (a DeepSeek-R1 vocab has both pairs).
TOOL_CALLING_MARKERS: tuple[tuple[str, str, str], ...] = (
    ("llama3", "<|python_tag|>", "<|eom_id|>"),
    ("qwen25", "<tool_call>", "</tool_call>"),
    ("phi4", "<|tool|>", "<|/tool|>"),
    ("mistral_nemo", "[TOOL_CALLS]", "[/TOOL_CALLS]"),
    ("deepseek_v3", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"),
    ("deepseek_r1", "<think>", "</think>"),
)


# --- shared assembly ---------------------------------------------------------------------


def map_document_bytes(doc: dict[str, Any]) -> bytes:
    """Serialise a map document the way codec-maps does (codec-spec 3.2: hash = raw bytes).

    Keys are reordered to the codec-spec 3.1 order; unknown keys keep their order at the end.
    """
    ordered = {k: doc[k] for k in _KEY_ORDER if k in doc}
    ordered.update((k, v) for k, v in doc.items() if k not in ordered)
    return json.dumps(ordered, indent=2, ensure_ascii=False).encode("utf-8")


def _tool_calling(special: dict[str, int]) -> dict[str, Any] | None:
    for convention, start, end in TOOL_CALLING_MARKERS:
        if start in special and end in special:
            return {
                "convention": convention,
                "markers": {"start": start, "end": end},
                "args_format": "json",
                "result_format": "text",
            }
    return None


def _finish(doc: dict[str, Any], published_at: str | None) -> bytes:
    """Add the common tail fields, serialise, and check the result loads as a valid map."""
    tool = _tool_calling(doc["special_tokens"])
    if tool is not None:
        doc["tool_calling"] = tool
    if published_at is not None:
        doc["published_at"] = published_at
    data = map_document_bytes(doc)
    try:
        load_map_bytes(data)
    except MapError as exc:  # a generator bug or an input the checks above missed
        raise GenerateError(f"generated map does not validate: {exc}") from exc
    return data


def _check_id(map_id: str) -> str:
    try:
        return validate_map_id(map_id)
    except MapError as exc:
        raise GenerateError(f"bad map id: {exc}") from exc


def _check_merges(merges: Sequence[str], vocab: dict[str, int]) -> None:
    """Every merge must be "left right" with left, right and left+right in the vocab."""
    for rank, merge in enumerate(merges):
        parts = merge.split(" ")
        if len(parts) != 2 or not all(parts):
            raise GenerateError(f"merge #{rank} {merge!r} is not 'left right'")
        for piece in (parts[0], parts[1], parts[0] + parts[1]):
            if piece not in vocab:
                raise GenerateError(f"merge #{rank} {merge!r}: {piece!r} is not in the vocab")


def _byte_fallback_range(vocab: dict[str, int]) -> tuple[int, int] | None:
    """The id range of ``<0x00>``..``<0xFF>``; all 256 or none, consecutive ids."""
    ids = [vocab.get(f"<0x{b:02X}>") for b in range(256)]
    if all(i is None for i in ids):
        return None
    if any(i is None for i in ids):
        missing = next(b for b, i in enumerate(ids) if i is None)
        raise GenerateError(f"byte-fallback token <0x{missing:02X}> is missing")
    start = ids[0]
    assert start is not None
    if ids != list(range(start, start + 256)):
        raise GenerateError("byte-fallback tokens <0x00>..<0xFF> do not have consecutive ids")
    return (start, start + 255)


# --- GGUF ----------------------------------------------------------------------------------


def map_from_gguf_metadata(
    meta: GGUFTokenizerMeta, *, map_id: str, published_at: str | None = None
) -> bytes:
    """The map document for a GGUF file's tokenizer (see the module docstring)."""
    _check_id(map_id)
    if len(meta.token_types) != len(meta.tokens):
        raise GenerateError(
            f"tokenizer.ggml.token_type has {len(meta.token_types)} entries "
            f"for {len(meta.tokens)} tokens"
        )
    vocab: dict[str, int] = {}
    for i, tok in enumerate(meta.tokens):
        vocab.setdefault(tok, i)  # a duplicated string keeps its first id
    special = {
        tok: i for i, (tok, kind) in enumerate(zip(meta.tokens, meta.token_types, strict=True))
        if kind in _ATOMIC_TYPES and vocab[tok] == i
    }  # fmt: skip
    doc: dict[str, Any] = {"id": map_id, "version": MAP_VERSION, "vocab_size": len(vocab)}
    doc["vocab"] = vocab
    if meta.model == "gpt2":
        _gguf_byte_level(meta, vocab, doc)
    elif meta.model == "llama":
        _gguf_metaspace(meta, vocab, doc)
    else:
        raise GenerateError(
            f"GGUF tokenizer model {meta.model!r} is not supported "
            "(only 'gpt2' byte-level BPE and 'llama' SentencePiece BPE)"
        )
    doc["special_tokens"] = special
    return _finish(doc, published_at)


def _gguf_byte_level(meta: GGUFTokenizerMeta, vocab: dict[str, int], doc: dict[str, Any]) -> None:
    if meta.pre is None:
        raise GenerateError("GGUF has no tokenizer.ggml.pre; cannot tell its pre-tokenizer")
    program = GGUF_PRE_PROGRAMS.get(meta.pre)
    if program is None:
        known = ", ".join(sorted(GGUF_PRE_PROGRAMS))
        raise GenerateError(
            f"unknown llama.cpp pre-tokenizer {meta.pre!r} (tokenizer.ggml.pre); known: {known}"
        )
    if not meta.merges:
        raise GenerateError("byte-level GGUF without tokenizer.ggml.merges")
    _check_merges(meta.merges, vocab)
    _set_byte_level(doc, list(meta.merges), copy.deepcopy(program), _single_regex(program))


def _single_regex(program: dict[str, Any]) -> str | None:
    """The one regex with the program's pieces (codec-spec 3.5), or None if none is honest."""
    from tokenwire.codec.pretok import compile_program

    try:
        return compile_program(program).single_regex
    except PretokError as exc:  # a bad table entry, not a bad input
        raise GenerateError(f"pre-tokenizer program does not compile: {exc}") from exc


def _set_byte_level(
    doc: dict[str, Any], merges: list[str], program: dict[str, Any] | None, pattern: str | None
) -> None:
    if program is None and pattern is None:
        raise GenerateError("byte-level tokenizer without a pre-tokenizer cannot be mapped")
    doc["encoder"] = "byte_level"
    doc["merges"] = merges
    if pattern is not None:
        doc["pre_tokenizer_pattern"] = pattern
    if program is not None:
        doc["pre_tokenizer_program"] = program


def _gguf_metaspace(meta: GGUFTokenizerMeta, vocab: dict[str, int], doc: dict[str, Any]) -> None:
    if meta.merges:
        merges = list(meta.merges)
    elif meta.scores is not None and len(meta.scores) == len(meta.tokens):
        merges = merges_from_scores(meta.tokens, meta.scores, meta.token_types)
    else:
        raise GenerateError("SentencePiece GGUF has neither tokenizer.ggml.merges nor scores")
    _check_merges(merges, vocab)
    doc["encoder"] = "metaspace"
    doc["merges"] = merges
    fallback = _byte_fallback_range(vocab)
    if fallback is not None:
        doc["byte_fallback_start"], doc["byte_fallback_end"] = fallback
    # llama.cpp prepends "▁" to the text and to every fragment after a special token when
    # add_space_prefix is set (its default): the Llama-2 normaliser, "always".
    doc["metaspace_prepend_scheme"] = "never" if meta.add_space_prefix is False else "always"


def merges_from_scores(
    tokens: Sequence[str], scores: Sequence[float], token_types: Sequence[int]
) -> list[str]:
    """SentencePiece BPE merges from piece scores, as HF's ``SentencePieceExtractor``.

    Every split of a normal piece into two normal pieces is a merge; merges are ranked by
    the score of the merged piece, highest first, ties kept in piece-id order and, within a
    piece, ordered by the ids of the two halves. Greedy highest-score merging (llama.cpp's
    SPM) then picks the same pair as lowest-rank BPE.
    """
    vocab = {
        tok: i for i, (tok, kind) in enumerate(zip(tokens, token_types, strict=True))
        if kind == GgufTokenType.NORMAL
    }  # fmt: skip
    ranked: list[tuple[float, str, str]] = []
    for piece, pid in vocab.items():
        local = [
            (piece[:k], piece[k:]) for k in range(1, len(piece))
            if piece[:k] in vocab and piece[k:] in vocab
        ]  # fmt: skip
        local.sort(key=lambda lr: (vocab[lr[0]], vocab[lr[1]]))
        ranked.extend((scores[pid], left, right) for left, right in local)
    ranked.sort(key=lambda entry: -entry[0])  # stable: equal scores keep id order
    return [f"{left} {right}" for _, left, right in ranked]


# --- HF tokenizer.json -------------------------------------------------------------------


def map_from_tokenizer_json(
    doc: dict[str, Any],
    *,
    map_id: str,
    published_at: str | None = None,
    allow_lossy: bool = False,
) -> bytes:
    """The map document for a Hugging Face ``tokenizer.json`` (already JSON-decoded).

    ``allow_lossy`` drops what a map cannot express (a byte_level normaliser,
    ``ignore_merges``) instead of refusing; the map then differs from the model on some text.
    """
    _check_id(map_id)
    if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict):
        raise GenerateError("tokenizer.json has no `model` object")
    model = doc["model"]
    if model.get("ignore_merges") and not allow_lossy:
        raise GenerateError(
            "BPE `ignore_merges` cannot be expressed in a map (ids would differ on some text); "
            "pass allow_lossy / --allow-lossy to drop it knowingly"
        )
    if model.get("type", "BPE") != "BPE":
        raise GenerateError(f"model type {model.get('type')!r} is not supported (only BPE)")
    for key in ("continuing_subword_prefix", "end_of_word_suffix", "dropout"):
        if model.get(key):
            raise GenerateError(f"BPE `{key}` = {model[key]!r} cannot be expressed in a map")
    vocab = _hf_vocab(model)
    special = _hf_added_tokens(doc.get("added_tokens") or [], vocab)
    merges = _hf_merges(model.get("merges"))
    _check_merges(merges, vocab)
    out: dict[str, Any] = {"id": map_id, "version": MAP_VERSION, "vocab_size": len(vocab)}
    out["vocab"] = vocab
    pre, norm = doc.get("pre_tokenizer"), doc.get("normalizer")
    if _has_type(pre, "ByteLevel") or _has_type(doc.get("decoder"), "ByteLevel"):
        if norm is not None and not allow_lossy:
            raise GenerateError(
                f"normaliser {_type_of(norm)!r} on a byte_level model cannot be expressed in a "
                "map; pass allow_lossy / --allow-lossy to drop it knowingly"
            )
        _hf_byte_level(pre, None, merges, out)
    elif model.get("byte_fallback") or _has_type(pre, "Metaspace") or _has_type(norm, "Prepend"):
        _hf_metaspace(pre, norm, merges, vocab, out)
    else:
        raise GenerateError(
            "tokenizer.json is neither byte-level (ByteLevel pre-tokenizer/decoder) nor "
            "SentencePiece-style (byte_fallback, Metaspace or Prepend normaliser)"
        )
    out["special_tokens"] = special
    return _finish(out, published_at)


def _hf_vocab(model: dict[str, Any]) -> dict[str, int]:
    vocab = model.get("vocab")
    if not isinstance(vocab, dict) or not vocab:
        raise GenerateError("model.vocab must be a non-empty object token -> id")
    for tok, i in vocab.items():
        if not isinstance(i, int) or isinstance(i, bool) or i < 0:
            raise GenerateError(f"model.vocab[{tok!r}] is not a non-negative integer id")
    return dict(vocab)


def _hf_added_tokens(added: Iterable[Any], vocab: dict[str, int]) -> dict[str, int]:
    """Added tokens (special or not) -> special_tokens; each also goes into the vocab."""
    special: dict[str, int] = {}
    for entry in added:
        if not isinstance(entry, dict) or not isinstance(entry.get("content"), str):
            raise GenerateError(f"added_tokens entry {entry!r} has no string `content`")
        tok, tid = entry["content"], entry.get("id")
        if not isinstance(tid, int) or isinstance(tid, bool) or tid < 0:
            raise GenerateError(f"added token {tok!r} has no non-negative integer id")
        if vocab.setdefault(tok, tid) != tid:
            raise GenerateError(f"added token {tok!r} has id {tid} but the vocab says {vocab[tok]}")
        special[tok] = tid
    return special


def _hf_merges(merges: Any) -> list[str]:
    """Both tokenizer.json merge shapes: ``"a b"`` strings and (tokenizers >= 0.20) pairs."""
    if not isinstance(merges, list) or not merges:
        raise GenerateError("model.merges must be a non-empty list")
    out: list[str] = []
    for rank, merge in enumerate(merges):
        if isinstance(merge, str):
            out.append(merge)
        elif isinstance(merge, list) and len(merge) == 2 and all(isinstance(p, str) for p in merge):
            if " " in merge[0] or " " in merge[1]:
                raise GenerateError(f"merge #{rank} {merge!r} has a space inside a part")
            out.append(f"{merge[0]} {merge[1]}")
        else:
            raise GenerateError(f"merge #{rank} {merge!r} is neither 'a b' nor [a, b]")
    return out


def _has_type(node: Any, type_name: str) -> bool:
    """Whether a pre_tokenizer/normalizer/decoder tree contains a node of this type."""
    if not isinstance(node, dict):
        return False
    if node.get("type") == type_name:
        return True
    children = node.get("pretokenizers") or node.get("normalizers") or node.get("decoders") or []
    return any(_has_type(child, type_name) for child in children)


def _hf_byte_level(pre: Any, norm: Any, merges: list[str], out: dict[str, Any]) -> None:
    try:
        program, pattern = lower_hf_pretokenizer(pre, norm)
    except PretokError as exc:
        raise GenerateError(f"cannot lower the pre-tokenizer: {exc}") from exc
    _set_byte_level(out, merges, program, pattern)


def _hf_metaspace(
    pre: Any, norm: Any, merges: list[str], vocab: dict[str, int], out: dict[str, Any]
) -> None:
    scheme = _prepend_scheme(pre, norm)
    out["encoder"] = "metaspace"
    out["merges"] = merges
    fallback = _byte_fallback_range(vocab)
    if fallback is not None:
        out["byte_fallback_start"], out["byte_fallback_end"] = fallback
    out["metaspace_prepend_scheme"] = scheme


def _prepend_scheme(pre: Any, norm: Any) -> str:
    """``metaspace_prepend_scheme`` from a Metaspace pre-tokenizer or a Prepend normaliser."""
    if isinstance(pre, dict) and pre.get("type") == "Metaspace":
        if norm is not None:
            raise GenerateError(f"normaliser {_type_of(norm)!r} next to Metaspace is unsupported")
        if pre.get("replacement", _METASPACE) != _METASPACE:
            raise GenerateError(f"Metaspace replacement {pre.get('replacement')!r} is not '▁'")
        if pre.get("split", True) is not False:
            raise GenerateError("Metaspace(split=true) cannot be expressed in a map")
        scheme = pre.get("prepend_scheme")
        if scheme is None:  # tokenizers < 0.15 spelled it as a bool
            scheme = "always" if pre.get("add_prefix_space", True) else "never"
        if scheme not in ("always", "first", "never"):
            raise GenerateError(f"Metaspace prepend_scheme {scheme!r} is unknown")
        return scheme
    if pre is not None:
        raise GenerateError(f"pre-tokenizer {_type_of(pre)!r} on a metaspace model is unsupported")
    steps = norm.get("normalizers") if _type_of(norm) == "Sequence" else [norm]
    kinds = [_normaliser_step(step) for step in steps]
    if kinds == ["prepend", "replace"]:
        return "always"
    raise GenerateError(
        "metaspace normaliser must be Sequence[Prepend('▁'), Replace(' ', '▁')], "
        f"got {[_type_of(s) for s in steps]}"
    )


def _type_of(node: Any) -> Any:
    return node.get("type") if isinstance(node, dict) else node


def _normaliser_step(step: Any) -> str:
    kind = _type_of(step)
    if kind == "Prepend" and step.get("prepend") == _METASPACE:
        return "prepend"
    if kind == "Replace" and step.get("pattern") == {"String": " "}:
        if step.get("content") == _METASPACE:
            return "replace"
    return "other"
