"""Decode throughput: tokenwire's Detokenizer against codecai, HF ``tokenizers`` and tiktoken.

~1 MB of the differential corpus (repeated) is turned into ids per map (HF encode for
smollm2 and phi-3, a tiktoken Encoding built from the map for cl100k, whose ids are ranks).
"bulk" is one call for all ids (Mtok/s); "stream" is one call per id (Ktok/s): our
``StreamDecoder.feed([id])``, codecai ``render([id], partial=True)``, HF ``DecodeStream.step``,
tiktoken ``decode_single_token_bytes`` plus an incremental UTF-8 decoder. ``== HF`` says
whether the output equals HF's decode of the same ids (the oracle, peer-bench §3).

Run single-threaded: ``TOKENIZERS_PARALLELISM=false RAYON_NUM_THREADS=1
.venv/bin/python bench/bench_decode.py``. The VM is shared; compare rows of one run.
"""

from __future__ import annotations

import codecs
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")

import codecai
import tiktoken
from tokenizers import (
    AddedToken,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
)

from tokenwire.codec.byte_level import chars_to_bytes
from tokenwire.codec.detokenizer import Detokenizer
from tokenwire.codec.maps import TokenizerMap, load_map_file

__all__ = ["MAPS", "run"]

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
MAPS = ["huggingfacetb/smollm2", "openai/cl100k_base", "microsoft/phi-3"]
TARGET_BYTES = 1_000_000


def _text() -> str:
    data = json.loads((FIXTURES / "corpus" / "corpus.json").read_text("utf-8"))
    one = "\n".join(s for samples in data.values() for s in samples)
    return (one + "\n") * max(1, TARGET_BYTES // len(one.encode()))


def _hf(tmap: TokenizerMap) -> Tokenizer:
    merges = [tuple(m.split(" ", 1)) for m in tmap.merges]
    if tmap.encoder == "byte_level":
        tok = Tokenizer(models.BPE(tmap.vocab, merges))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
    else:
        model = models.BPE(tmap.vocab, merges, byte_fallback=True, unk_token="<unk>")
        tok = Tokenizer(model)
        tok.normalizer = normalizers.Sequence(
            [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
        )
        tok.decoder = decoders.Sequence(
            [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
             decoders.Strip(" ", 1, 0)]
        )  # fmt: skip
    tok.add_special_tokens([AddedToken(k, special=True) for k in tmap.special_tokens])
    return tok


def _tiktoken(tmap: TokenizerMap) -> tiktoken.Encoding:
    ranks = {chars_to_bytes(k): i for k, i in tmap.vocab.items() if i not in tmap.special_ids}
    return tiktoken.Encoding(
        name="cl100k_from_map", pat_str=tmap.pre_tokenizer_pattern or "",
        mergeable_ranks=ranks, special_tokens=dict(tmap.special_tokens),  # type: ignore[arg-type]
    )  # fmt: skip


def _best(fn: Callable[[list[int]], str], ids: list[int], repeat: int) -> tuple[float, str]:
    best, out = float("inf"), ""
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn(ids)
        best = min(best, time.perf_counter() - t0)
    return best, out


def _stream_ours(det: Detokenizer, ids: list[int]) -> str:
    s = det.stream()
    feed = s.feed
    return "".join([feed([i]) for i in ids]) + s.flush()


def _stream_codecai(det: Any, ids: list[int]) -> str:
    render = det.render
    return "".join([render([i], partial=True) for i in ids]) + render([], partial=False)


def _stream_hf(tok: Tokenizer, ids: list[int]) -> str:
    ds = decoders.DecodeStream(skip_special_tokens=True)
    step = ds.step
    return "".join([step(tok, i) or "" for i in ids])


def _stream_tiktoken(enc: tiktoken.Encoding, ids: list[int]) -> str:
    dec = codecs.getincrementaldecoder("utf-8")("replace").decode
    one = enc.decode_single_token_bytes
    return "".join([dec(one(i)) for i in ids]) + dec(b"", True)


def _backends(
    tmap: TokenizerMap, hf: Tokenizer
) -> list[tuple[str, Callable[[list[int]], str], Callable[[list[int]], str]]]:
    ours = Detokenizer(tmap)
    peer_map = codecai.TokenizerMap.from_json(tmap.raw)
    peer = codecai.Detokenizer(peer_map)  # tables built once, outside the timing
    rows = [
        ("tokenwire Detokenizer", ours.decode, lambda ids: _stream_ours(ours, ids)),
        ("codecai Detokenizer.render", peer.render, lambda ids: _stream_codecai(peer, ids)),
        ("HF decode / DecodeStream", hf.decode, lambda ids: _stream_hf(hf, ids)),
    ]
    if tmap.id == "openai/cl100k_base":
        enc = _tiktoken(tmap)
        rows.append(("tiktoken decode", enc.decode, lambda ids: _stream_tiktoken(enc, ids)))
    return rows


def run(maps: list[str] | None = None, repeat: int = 3) -> list[dict[str, Any]]:
    """One row per (map, backend): bulk Mtok/s, one-id streaming Ktok/s, output checks."""
    text = _text()
    rows: list[dict[str, Any]] = []
    for map_id in maps or MAPS:
        tmap = load_map_file(FIXTURES / "maps" / f"{map_id}.json")
        hf = _hf(tmap)
        if tmap.id == "openai/cl100k_base":
            ids = _tiktoken(tmap).encode(text, disallowed_special=())
        else:
            ids = hf.encode(text, add_special_tokens=False).ids
        oracle = hf.decode(ids)
        for name, bulk, stream in _backends(tmap, hf):
            bulk_s, bulk_out = _best(bulk, ids, repeat)
            stream_s, stream_out = _best(stream, ids, 1)
            rows.append({
                "map": map_id,
                "backend": name,
                "tokens": len(ids),
                "bulk_mtok_s": len(ids) / bulk_s / 1e6,
                "stream_ktok_s": len(ids) / stream_s / 1e3,
                "bulk_equals_hf": bulk_out == oracle,
                "stream_equals_bulk": stream_out == bulk_out,
            })  # fmt: skip
    return rows


def _print(rows: list[dict[str, Any]]) -> None:
    head = "| map | backend | tokens | bulk Mtok/s | stream Ktok/s | bulk == HF | stream == bulk |"
    print(head)
    print("|---|---|---:|---:|---:|---|---|")
    for r in rows:
        print(
            f"| {r['map']} | {r['backend']} | {r['tokens']:,} | {r['bulk_mtok_s']:.2f} "
            f"| {r['stream_ktok_s']:,.0f} | {'yes' if r['bulk_equals_hf'] else 'NO'} "
            f"| {'yes' if r['stream_equals_bulk'] else 'NO'} |"
        )
    by_map: dict[str, dict[str, float]] = {}
    for r in rows:
        by_map.setdefault(r["map"], {})[r["backend"]] = r["bulk_mtok_s"]
    for map_id, speeds in by_map.items():
        ratio = speeds["tokenwire Detokenizer"] / speeds["codecai Detokenizer.render"]
        print(f"{map_id}: tokenwire bulk = {ratio:.1f}x codecai")


if __name__ == "__main__":
    _print(run())
