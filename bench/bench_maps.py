"""Map load-to-ready: from raw bytes to a tokenizer that has encoded and decoded one string.

"Ready" includes the first encode and decode on purpose, so lazily built tables are paid for
here rather than hidden in the first request. Ours loads with ``defer=in_background``
(``Tokenizer.from_map`` and ``Detokenizer``), so the fast paths are built on the thread of
tokenwire/background.py after ready. The detokenizer keeps its tables in a per-process
cache keyed by map hash, so "tokenwire" clears it, untimed, before every repeat (a process
loading the map for the first time); "tokenwire, tables cached" is a reload of a map this process
already decoded with (what repeats measured before 2026-12-01). Peer: codecai 0.4.1
(TokenizerMap.from_json + BPETokenizer + Detokenizer, the objects its load_map path builds).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAPS = {
    "smollm2 (1.9 MB)": ROOT / "tests/fixtures/maps/huggingfacetb/smollm2.json",
    "cl100k (3.8 MB)": ROOT / "tests/fixtures/maps/openai/cl100k_base.json",
    "phi-3 (1.7 MB)": ROOT / "tests/fixtures/maps/microsoft/phi-3.json",
}
PROBE = "Hello, world! 12345 ünïcödé"
REPEATS = 9


def _forget_tables() -> None:
    """Untimed, before "tokenwire": a process loading the map for the first time has no
    tables to free (freeing the last repeat's took ~1 ms, counted until 2026-12-02)."""
    from tokenwire.codec import detokenizer

    detokenizer._cache.clear()  # cold: see the module docstring


def _ours(raw: bytes) -> object:
    from tokenwire.background import in_background
    from tokenwire.codec.detokenizer import Detokenizer
    from tokenwire.codec.maps import load_map_bytes
    from tokenwire.codec.tokenizer import Tokenizer

    tmap = load_map_bytes(raw)
    tok = Tokenizer.from_map(tmap, defer=in_background)
    Detokenizer(tmap, defer=in_background).decode(tok.encode(PROBE))
    return tok  # ready; its tiktoken core may still be building (see run)


def _codecai(raw: bytes) -> None:
    import hashlib

    from codecai.detokenize import Detokenizer
    from codecai.tokenize import BPETokenizer
    from codecai.types import TokenizerMap

    hashlib.sha256(raw).hexdigest()  # load_map hashes the body too
    tmap = TokenizerMap.from_json(raw)
    ids = BPETokenizer(tmap).encode(PROBE)
    Detokenizer(tmap).render(ids)


def _drain_builder() -> None:
    """Wait until the builds a load queued (tokenwire/background.py) are done."""
    from tokenwire.background import drain

    drain()


IMPLS = (("tokenwire", _ours), ("tokenwire, tables cached", _ours),
         ("codecai 0.4.1", _codecai))
SETUP = {"tokenwire": _forget_tables}


def run(maps: Sequence[str] = (), impls: Sequence[str] = ()) -> list[dict]:
    """Medians of REPEATS, the implementations taking turns within each repeat, so a change
    in the machine's load falls on all of them alike (the VM is shared). Ours is timed to
    ready; the background build it started is then waited for, untimed, so that it never
    runs during another measurement (during its own, it competes and is counted).
    ``maps`` keeps the maps whose names start with one of them, ``impls`` the
    implementations it names (all by default): for A/B runs in separate processes."""
    rows = []
    chosen = [(impl, fn) for impl, fn in IMPLS if not impls or impl in impls]
    for name, path in MAPS.items():
        if maps and not name.startswith(tuple(maps)):
            continue
        raw = path.read_bytes()
        times: dict[str, list[float]] = {impl: [] for impl, _ in chosen}
        for _ in range(REPEATS):
            for impl, fn in chosen:
                if impl in SETUP:
                    SETUP[impl]()
                t0 = time.perf_counter()
                made = fn(raw)
                times[impl].append((time.perf_counter() - t0) * 1000)
                if made is not None:  # untimed: the next run starts with the builder idle
                    _drain_builder()
                made = None  # untimed too: freeing it is no one's load-to-ready
        for impl, _ in chosen:
            rows.append({"op": "map load-to-ready", "map": name, "implementation": impl,
                         "value": round(statistics.median(times[impl]), 1), "unit": "ms"})
    return rows


FIRST_IMPLS = {"tokenwire": _ours, "codecai 0.4.1": _codecai}
FRESH_PROCESSES = 5


def _first_load(impl: str, map_name: str) -> float:
    """In this (fresh) process: every module imported untimed, then the first load, in ms.
    What a CLI or a client that starts, loads a map and encodes one string pays."""
    import tokenwire.background
    import tokenwire.codec.detokenizer
    import tokenwire.codec.maps
    import tokenwire.codec.pretok
    import tokenwire.codec.tokenizer  # noqa: F401
    if impl != "tokenwire":
        import codecai.detokenize
        import codecai.tokenize
        import codecai.types  # noqa: F401
    raw = MAPS[map_name].read_bytes()
    t0 = time.perf_counter()
    FIRST_IMPLS[impl](raw)
    return (time.perf_counter() - t0) * 1000


def run_fresh(maps: Sequence[str] = (), processes: int = FRESH_PROCESSES) -> list[dict]:
    """The first load of a map in each of ``processes`` fresh interpreters per
    implementation, ours and codecai alternating (the machine's load falls on both alike);
    the child is this module (``--first``), with this process's PYTHONPATH."""
    import os
    import subprocess
    import sys

    rows = []
    for name in MAPS:
        if maps and not name.startswith(tuple(maps)):
            continue
        times: dict[str, list[float]] = {impl: [] for impl in FIRST_IMPLS}
        for _ in range(processes):
            for impl in FIRST_IMPLS:
                out = subprocess.run(
                    [sys.executable, "-m", "bench.bench_maps", "--first", impl, name],
                    cwd=ROOT, env=os.environ, capture_output=True, text=True, check=True,
                )
                times[impl].append(float(out.stdout.split()[-1]))
        for impl, ms in times.items():
            rows.append({"op": "first map load-to-ready (fresh process)", "map": name,
                         "implementation": impl, "value": round(statistics.median(ms), 1),
                         "unit": "ms", "all": [round(t, 1) for t in ms]})
    return rows


if __name__ == "__main__":
    # python -m bench.bench_maps [--impl NAME ...] [MAP PREFIX ...], e.g.
    # `--impl tokenwire --impl "codecai 0.4.1" smollm2 cl100k`: ours cold against codecai.
    # python -m bench.bench_maps --fresh [MAP PREFIX ...]: the first load of fresh processes.
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("maps", nargs="*")
    parser.add_argument("--impl", action="append", default=[])
    parser.add_argument("--fresh", action="store_true")
    parser.add_argument("--processes", type=int, default=FRESH_PROCESSES)
    parser.add_argument("--first", metavar="IMPL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.first:
        print(round(_first_load(args.first, args.maps[0]), 2))
    else:
        rows = run_fresh(args.maps, args.processes) if args.fresh else run(args.maps, args.impl)
        for row in rows:
            print(row)
