"""What logprobs cost the embedded engine per token: CPU time of reading them from llama.cpp's
logits (``upstreams/embedded_logprobs.py``) beside the CPU time of decoding one token.

CPU time (``time.process_time``), not wall time, so a busy machine changes the figures less;
run it on an idle one for numbers to compare:

    PYTHONPATH=src .venv/bin/python -m bench.bench_logprobs
"""

from __future__ import annotations

import time

#: Reads per setting: enough for a stable mean, a fraction of a second each.
READS = 500
#: Decoded tokens timed for the comparison.
DECODES = 20


def main() -> None:
    from llama_cpp import Llama

    from tokenwire.gateway.upstreams.embedded_logprobs import LogprobReader
    from tokenwire.gguf_tokenizer import smollm2_gguf_path

    llm = Llama(model_path=str(smollm2_gguf_path()), n_ctx=256, n_threads=1, verbose=False)
    gen = llm.generate(llm.tokenize(b"Once upon a time", add_bos=False), temp=0.0)
    tok = next(gen)
    reader = LogprobReader(llm)
    for top in (0, 5, 20):
        reader.read(tok, top)  # the token-bytes cache warm, as in a running answer
        start = time.process_time()
        for _ in range(READS):
            reader.read(tok, top)
        ms = 1e3 * (time.process_time() - start) / READS
        print(f"logprobs, top_logprobs={top:2d}: {ms:.3f} ms CPU per token")
    start = time.process_time()
    for _ in range(DECODES):
        next(gen)
    print(f"decoding one token:         {1e3 * (time.process_time() - start) / DECODES:.1f} "
          "ms CPU per token")
    gen.close()


if __name__ == "__main__":
    main()
