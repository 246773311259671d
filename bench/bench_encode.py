"""Encode throughput, single thread: ~2 MB of corpus text, MB/s of UTF-8 input.

    TOKENIZERS_PARALLELISM=false RAYON_NUM_THREADS=1 .venv/bin/python -m bench.bench_encode [MAP]

The corpus (tests/fixtures/corpus) is repeated to ~2 MB and encoded sample by sample, so
word caches warm up after the first repetition for every implementation alike ("warm").
Metaspace maps also get a "cold" row: each of the corpus texts once, so almost every word is
new to the tokenizer (its map's one-time tiktoken engine, built in round 1, is shared by the
later rounds' tokenizers, as in a server that keeps the map loaded). Each figure is the
best of ``REPEATS`` rounds of CPU time (see :func:`_measure_all`).
The Llama-2 map is not shipped (its licence, tests/fixtures/README.md): set
``TOKENWIRE_BENCH_LLAMA2`` to a copy of codec-maps' ``meta-llama/llama-2.json`` to add its
rows. ``MAP`` arguments (row names such as ``phi-3``) run only those maps.
Rows: tokenwire (tiktoken and python backends), codecai 0.4.1 ``BPETokenizer`` (its phi-3
ids are wrong, peer-bench §2; its smollm2 uses the map's v1 pattern), HF `tokenizers`, and
tiktoken itself built from the cl100k map with tiktoken's own pattern. "same ids" compares
each row with HF on every corpus text; "x HF" is the row's speed over HF's in the same run.
For metaspace maps "tokenwire tiktoken" is the default engine (tiktoken pieces where the
map passes its check, tokenwire.codec.metaspace_tiktoken), "tokenwire python" pure Python.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parent.parent
MAPS = ROOT / "tests/fixtures/maps"
TARGET_BYTES = 2_000_000
REPEATS = 3

_BYTE_LEVEL_OPS = [
    {"op": "literals", "patterns": ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"]},
    {"op": "letters", "lead_space": True},
    {"op": "numbers", "lead_space": True},
    {"op": "punct_run", "lead_space": True},
    {"op": "trailing_ws"},
    {"op": "ws_run"},
]
# SmolLM2's real pre-tokenizer as a v2 program (codec-spec §3.5).
SMOLLM2_V2 = {"version": 2, "stages": [
    {"stage": "digits_isolate", "mode": "individual"},
    {"stage": "alternation", "ops": _BYTE_LEVEL_OPS},
]}  # fmt: skip
CL100K_PAT_STR = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)


BENCH_MAPS = [
    ("smollm2 (v2 program)", "huggingfacetb/smollm2"),
    ("cl100k", "openai/cl100k_base"),
    ("phi-3", "microsoft/phi-3"),
    ("llama-2", "meta-llama/llama-2"),
]
LLAMA2_ENV = "TOKENWIRE_BENCH_LLAMA2"


def _map_path(map_id: str) -> Path | None:
    if map_id == "meta-llama/llama-2":
        where = os.environ.get(LLAMA2_ENV)
        return Path(where) if where else None
    return MAPS / f"{map_id}.json"


def _texts() -> list[str]:
    doc = json.loads((ROOT / "tests/fixtures/corpus/corpus.json").read_text("utf-8"))
    base = [s for samples in doc.values() for s in samples]
    size = sum(len(s.encode()) for s in base)
    return base * max(1, round(TARGET_BYTES / size))


def _distinct_texts() -> list[str]:
    doc = json.loads((ROOT / "tests/fixtures/corpus/corpus.json").read_text("utf-8"))
    return [s for samples in doc.values() for s in samples]


def _measure_all(builds: list[Callable[[], Callable[[str], list[int]]]],
                 texts: list[str]) -> list[float]:
    """MB/s of each build on ``texts``: the best of ``REPEATS`` rounds, each round running
    every implementation once, in turn, on a fresh instance, so a burst of load from other
    jobs hits all rows alike. Time is the process's CPU time (time.process_time), not wall
    time: on a shared machine waiting for a core is not the encoder's cost. Every
    implementation encodes in this thread (RAYON_NUM_THREADS=1)."""
    nbytes = sum(len(t.encode()) for t in texts)
    best = [float("inf")] * len(builds)
    for _ in range(REPEATS):
        for k, build in enumerate(builds):
            encode = build()
            t0 = time.process_time()
            for t in texts:
                encode(t)
            best[k] = min(best[k], time.process_time() - t0)
    return [nbytes / b / 1e6 for b in best]


def _impls(map_id: str) -> list[tuple[str, Callable[[], Callable[[str], list[int]]]]]:
    from codecai.tokenize import BPETokenizer
    from codecai.types import TokenizerMap as CodecaiMap

    from tests.hf_oracle import hf_tokenizer, real_pre_tokenizer
    from tokenwire.codec.maps import load_map_file
    from tokenwire.codec.tokenizer import Tokenizer

    path = _map_path(map_id)
    assert path is not None
    tmap = load_map_file(path)
    real = None
    if map_id == "huggingfacetb/smollm2":
        tmap = dataclasses.replace(tmap, pre_tokenizer_program=SMOLLM2_V2)
        real = real_pre_tokenizer(map_id)
    hf = hf_tokenizer(tmap, pre_tokenizer=real)
    raw = path.read_bytes()
    rows: list[tuple[str, Callable[[], Callable[[str], list[int]]]]] = []
    for backend in ["tiktoken", "python"]:  # metaspace: tiktoken where the map passes its check
        rows.append((f"tokenwire {backend}", lambda b=backend: Tokenizer.from_map(tmap, b).encode))
    rows.append(("codecai BPETokenizer (cold)",
                 lambda: BPETokenizer(CodecaiMap.from_json(raw)).encode))  # fmt: skip
    rows.append(("HF tokenizers encode",
                 lambda: lambda t: hf.encode(t, add_special_tokens=False).ids))  # fmt: skip
    if map_id == "openai/cl100k_base":
        rows.append(("tiktoken direct (encode_ordinary)", lambda: _tiktoken_cl100k(tmap)))
    return rows


def _tiktoken_cl100k(tmap: Any) -> Callable[[str], list[int]]:
    import tiktoken

    from tokenwire.codec.byte_level import chars_to_bytes

    ranks = {chars_to_bytes(k): v for k, v in tmap.vocab.items() if k not in tmap.special_tokens}
    enc = tiktoken.Encoding("cl100k", pat_str=CL100K_PAT_STR, mergeable_ranks=ranks,
                            special_tokens={})  # fmt: skip
    return enc.encode_ordinary


def run(only: list[str] | None = None) -> list[dict]:
    texts = _texts()
    distinct = _distinct_texts()
    rows = []
    for name, map_id in BENCH_MAPS:
        if (only and name not in only) or _map_path(map_id) is None:
            continue
        impls = _impls(map_id)
        hf_encode = impls[-2 if map_id == "openai/cl100k_base" else -1][1]()
        truth = [hf_encode(t) for t in distinct]  # every corpus text, once
        same = []
        for _, build in impls:
            encode = build()
            same.append(all(encode(t) == ids for t, ids in zip(distinct, truth, strict=True)))
        passes = [("encode", texts)]
        if name in ("phi-3", "llama-2"):  # issue 18: every word new, caches cold
            passes.append(("encode, each text once (cold)", distinct))
        for op, batch in passes:
            speeds = _measure_all([build for _, build in impls], batch)
            batch_mb = round(sum(len(t.encode()) for t in batch) / 1e6, 2)
            hf_speed = speeds[[impl for impl, _ in impls].index("HF tokenizers encode")]
            for (impl, _), speed, ok in zip(impls, speeds, same, strict=True):
                rows.append({"op": op, "map": name, "implementation": impl,
                             "value": round(speed, 2), "unit": "MB/s",
                             "x HF": round(speed / hf_speed, 2),
                             "same ids as HF": "yes" if ok else "no",
                             "input MB": batch_mb})  # fmt: skip
    return rows


if __name__ == "__main__":
    import sys

    from bench.run import table

    print(table(run(sys.argv[1:] or None)))
