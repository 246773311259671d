"""Map load-to-ready: from raw bytes to a tokenizer that has encoded and decoded one string.

"Ready" includes the first encode and decode on purpose, so lazily built tables are paid for
here rather than hidden in the first request. Peer: codecai 0.4.1 (TokenizerMap.from_json +
BPETokenizer + Detokenizer, the objects its load_map path builds).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAPS = {
    "smollm2 (1.9 MB)": ROOT / "tests/fixtures/maps/huggingfacetb/smollm2.json",
    "cl100k (3.8 MB)": ROOT / "tests/fixtures/maps/openai/cl100k_base.json",
    "phi-3 (1.7 MB)": ROOT / "tests/fixtures/maps/microsoft/phi-3.json",
}
PROBE = "Hello, world! 12345 ünïcödé"
REPEATS = 5


def _ours(raw: bytes) -> None:
    from tokenwire.codec.detokenizer import Detokenizer
    from tokenwire.codec.maps import load_map_bytes
    from tokenwire.codec.tokenizer import Tokenizer

    tmap = load_map_bytes(raw)
    ids = Tokenizer.from_map(tmap).encode(PROBE)
    Detokenizer(tmap).decode(ids)


def _codecai(raw: bytes) -> None:
    import hashlib

    from codecai.detokenize import Detokenizer
    from codecai.tokenize import BPETokenizer
    from codecai.types import TokenizerMap

    hashlib.sha256(raw).hexdigest()  # load_map hashes the body too
    tmap = TokenizerMap.from_json(raw)
    ids = BPETokenizer(tmap).encode(PROBE)
    Detokenizer(tmap).render(ids)


def _median_ms(fn, raw: bytes) -> float:
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        fn(raw)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def run() -> list[dict]:
    rows = []
    for name, path in MAPS.items():
        raw = path.read_bytes()
        for impl, fn in (("tokenwire", _ours), ("codecai 0.4.1", _codecai)):
            rows.append({"op": "map load-to-ready", "map": name, "implementation": impl,
                         "value": round(_median_ms(fn, raw), 1), "unit": "ms"})
    return rows


if __name__ == "__main__":
    for row in run():
        print(row)
