"""The Codec path's retokenizer alone: CPU µs per text delta, as a text-only upstream sends them.

    PYTHONPATH=src .venv/bin/python -m bench.bench_retokenize            # this tree
    PYTHONPATH=/work/main/src .venv/bin/python -m bench.bench_retokenize # another tree
    PYTHONPATH=src .venv/bin/python -m bench.bench_retokenize --profile /tmp/retok.txt

The answer is real text: corpus samples (tests/fixtures/corpus, ``prose`` and ``code``)
joined until they make 2,048 tokens of the map. Its deltas are what an upstream streams:
one token's text per delta, a token that ends inside a UTF-8 character held until the
character is whole (as servers do). Each row feeds every delta of the answer to a fresh
:class:`~tokenwire.gateway.retokenize.Retokenizer` and flushes it, with the map's shared
tokenizer (built first, as in a serving gateway); the figure is the best of ``REPEATS``
rounds of process CPU time over the number of deltas. "cold" empties the retokenizer's
shared memos before each answer (only the answer's own repeated words hit), "warm" keeps
them from the same answer before (an upper bound). The rows check that the streamed ids
equal ``Tokenizer.encode`` of the whole answer ("same ids") and count the
``Tokenizer.encode`` calls of one answer with the memos empty at its start.

``--profile PATH`` runs the SmolLM2 prose row (memos cold) under py-spy (``-f raw``, from
the venv or PATH) into PATH instead, and prints the top frames by function and by line of
``gateway/retokenize.py``.
"""

from __future__ import annotations

import argparse
import codecs
import collections
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAPS = ROOT / "tests/fixtures/maps"
CORPUS = ROOT / "tests/fixtures/corpus/corpus.json"
ANSWER_TOKENS = 2048
REPEATS = 9
ROUNDS_PER_REPEAT = 2  # answers per timed round: ~4k deltas; short rounds, best of many
#: (row name, map file): the bundled SmolLM2 map (a v2 program: digits stage + byte-level
#: alternation) is the one the gateway serves for the HF alias the A/B bench asks for.
MAP_FILES = (
    ("smollm2 (bundled, v2 program)", "bundled:huggingfacetb/smollm2"),
    ("cl100k_base (v1 program)", "openai/cl100k_base"),
)
KINDS = ("prose", "code")


def answer_deltas(tokenizer, kind: str) -> list[str]:
    """A ``kind`` answer of :data:`ANSWER_TOKENS` tokens, as one text delta per token."""
    samples = json.loads(CORPUS.read_text("utf-8"))[kind]
    ids: list[int] = []
    for sample in samples:
        ids += tokenizer.encode(sample + "\n\n")
        if len(ids) >= ANSWER_TOKENS:
            break
    ids = ids[:ANSWER_TOKENS]
    from tokenwire.codec.detokenizer import Detokenizer

    det, utf8 = Detokenizer(tokenizer.map), codecs.getincrementaldecoder("utf-8")()
    deltas = [utf8.decode(det.token_bytes(token)) for token in ids]  # "" mid-character
    return [d for d in deltas if d]


def run_once(tmap, tokenizer, deltas: list[str]) -> tuple[list[int], int]:
    from tokenwire.gateway.retokenize import Retokenizer

    r = Retokenizer(tmap, tokenizer=tokenizer)
    out: list[int] = []
    for d in deltas:
        out += r.feed(d)
    out += r.flush()
    return out, r.calls


def forget() -> None:
    """Empty the retokenizer's shared memos (a tree without them has nothing to empty)."""
    from tokenwire.gateway import retokenize

    if hasattr(retokenize, "_split_memo"):
        retokenize._split_memo.cache_clear()
        retokenize._IDS_MEMOS.clear()


def measure(tmap, tokenizer, deltas: list[str], *, cold: bool) -> float:
    """Best µs per delta; ``cold`` empties the memos before each answer, so only the
    answer's own repeats hit (a new answer of other words), else the memos stay warm from
    the answer before (the same words again: an upper bound)."""
    best = float("inf")
    for _ in range(REPEATS):
        elapsed = 0.0
        for _ in range(ROUNDS_PER_REPEAT):
            if cold:
                forget()
            start = time.process_time()
            run_once(tmap, tokenizer, deltas)
            elapsed += time.process_time() - start
        best = min(best, elapsed)
    return best / (ROUNDS_PER_REPEAT * len(deltas)) * 1e6


def setup(source: str):
    from tokenwire.codec.maps import bundled_map_path, load_map_file
    from tokenwire.gateway.retokenize import tokenizer_for

    bundled = source.removeprefix("bundled:")
    path = bundled_map_path(bundled) if bundled != source else MAPS / f"{source}.json"
    tmap = load_map_file(path)
    tokenizer = tokenizer_for(tmap)
    tokenizer.build()  # the tiktoken engine, as a gateway has it after its first streams
    return tmap, tokenizer


def table() -> int:
    import tokenwire

    print(f"tree: {Path(tokenwire.__file__).parent.parent}")
    print("| map | answer | deltas | µs per delta, memos cold | warm | encode calls | same ids |")
    print("|---|---|---|---|---|---|---|")
    ok = True
    for name, source in MAP_FILES:
        tmap, tokenizer = setup(source)
        for kind in KINDS:
            deltas = answer_deltas(tokenizer, kind)
            forget()
            before = tokenizer.calls
            ids, _ = run_once(tmap, tokenizer, deltas)
            calls = tokenizer.calls - before
            same = ids == tokenizer.encode("".join(deltas))
            ok &= same
            cold = measure(tmap, tokenizer, deltas, cold=True)
            warm = measure(tmap, tokenizer, deltas, cold=False)
            print(f"| {name} | {kind} | {len(deltas)} | {cold:.1f} | {warm:.1f} | {calls} | "
                  f"{'yes' if same else 'NO'} |")
    return 0 if ok else 1


def profile(out: Path) -> int:
    """Record the SmolLM2 prose loop (memos cold) under py-spy and print its top frames."""
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which(
        "py-spy") or "py-spy"
    code = ("from bench import bench_retokenize as b\n"
            "tmap, tok = b.setup(b.MAP_FILES[0][1])\n"
            "deltas = b.answer_deltas(tok, 'prose')\n"
            "for _ in range(200):\n"
            "    b.forget()\n"
            "    b.run_once(tmap, tok, deltas)\n")
    subprocess.run([spy, "record", "-r", "1000", "-f", "raw", "-o", str(out), "--",
                    sys.executable, "-c", code], check=True, env=os.environ.copy(),
                   stdout=subprocess.DEVNULL)
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    lines: collections.Counter[str] = collections.Counter()
    total = 0
    for line in out.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames, count = stack.split(";"), int(n)
        total += count
        own[_function(frames[-1])] += count
        for f in {_function(f) for f in frames}:
            incl[f] += count
        for f in {f for f in frames if "gateway/retokenize.py" in f}:
            lines[f] += count  # which line of feed() the time is under
    for title, counter, keep in (
        ("self, by function", own, lambda f: True),
        ("inclusive, tokenwire functions", incl, lambda f: "tokenwire/" in f),
        ("inclusive, by line of the retokenizer", lines, lambda f: True),
    ):
        print(f"{title} ({total} samples):")
        for f, n in [(f, n) for f, n in counter.most_common() if keep(f)][:12]:
            print(f"  {100 * n / total:5.1f}%  {f}")
    return 0


def _function(frame: str) -> str:
    """A py-spy raw frame without its line number: ``name (path)``."""
    head, _, tail = frame.rpartition(":")
    return f"{head})" if tail.rstrip(")").isdigit() else frame


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", type=Path, help="py-spy raw output path (SmolLM2 prose)")
    args = parser.parse_args()
    return profile(args.profile) if args.profile else table()


if __name__ == "__main__":
    raise SystemExit(main())
