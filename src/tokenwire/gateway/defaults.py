"""What a request gets for the fields it leaves out, in one place (README "Defaults").

**Output length** (``max_tokens`` / ``max_output_tokens``), per API:

* Completions: :data:`COMPLETIONS_MAX_TOKENS` (16), OpenAI's documented default, and vLLM's.
* Chat Completions and Responses: neither API documents a default (OpenAI generates to the
  end of the context). Omitted, the field stays omitted for an upstream, which applies its
  own; the embedded engine stops at :data:`DEFAULT_MAX_TOKENS`, and always at the end of
  its context window.
* Messages: required by the API (a 400 without it, as Anthropic answers).
* Path C (``CodecRequest``): :data:`PATH_C_MAX_TOKENS` (256), the engine forks' default
  for an absent field (codec-spec §2.7b).
* Upstream protocols that require a number when the client gave none (Anthropic's
  ``max_tokens``, a Codec engine's request) get :data:`DEFAULT_MAX_TOKENS`.

**Sampling** (``temperature``, ``top_p``, ``top_k``, ``min_p``): an upstream gets only what
the client sent (its own defaults apply otherwise: vLLM reads the model's
``generation_config.json``, llama.cpp its GGUF). The embedded engine uses the model's
recommended sampling from the GGUF's ``general.sampling.*`` keys (llama.cpp's own names,
:data:`GGUF_SAMPLING_KEYS`), and llama.cpp's defaults (:data:`LLAMA_CPP_SAMPLING`, the
defaults of the installed llama-cpp-python's ``Llama.generate``) for what the file does not
carry. A value in the request always wins.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

from tokenwire.codec.requests import DEFAULT_MAX_TOKENS as _CODEC_DEFAULT_MAX_TOKENS

__all__ = [
    "COMPLETIONS_MAX_TOKENS",
    "DEFAULT_MAX_TOKENS",
    "GGUF_SAMPLING_KEYS",
    "LLAMA_CPP_SAMPLING",
    "PATH_C_MAX_TOKENS",
    "Sampling",
    "SamplingDefaults",
    "sampling_from_gguf",
]

#: OpenAI's documented default for Completions ``max_tokens`` (vLLM uses the same).
COMPLETIONS_MAX_TOKENS = 16
#: The output bound when a request sets none and a number is needed (the embedded engine, an
#: upstream protocol that requires one). An agent turn (a patch, a plan) runs to thousands
#: of tokens, so less would cut real answers; a runaway generation still stops at the
#: context window (the embedded engine's is 4,096 tokens) and at the gateway's deadlines.
DEFAULT_MAX_TOKENS = 4096
#: Path C's ``max_tokens`` when the ``CodecRequest`` omits it (the engine forks' default).
PATH_C_MAX_TOKENS = _CODEC_DEFAULT_MAX_TOKENS


@dataclass(frozen=True, slots=True)
class Sampling:
    """The sampler settings the embedded engine applies when the request leaves them out."""

    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repeat_penalty: float

    def describe(self) -> str:
        return (f"temperature {self.temperature:g}, top_p {self.top_p:g}, top_k {self.top_k}, "
                f"min_p {self.min_p:g}, repeat_penalty {self.repeat_penalty:g}")


#: llama.cpp's defaults as llama-cpp-python 0.3.36's ``Llama.generate`` declares them (a
#: test compares them with the installed library's signature).
LLAMA_CPP_SAMPLING = Sampling(temperature=0.8, top_p=0.95, top_k=40, min_p=0.05,
                              repeat_penalty=1.0)
#: The GGUF metadata keys llama.cpp reads a model's recommended sampling from (gguf-py's
#: ``Keys.General.SAMPLING_*``), by :class:`Sampling` field.
GGUF_SAMPLING_KEYS: dict[str, str] = {
    "temperature": "general.sampling.temp",
    "top_p": "general.sampling.top_p",
    "top_k": "general.sampling.top_k",
    "min_p": "general.sampling.min_p",
    "repeat_penalty": "general.sampling.penalty_repeat",
}
#: The range each field must be in for a GGUF value to be used (others are ignored).
_RANGES: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 2.0), "top_p": (0.0, 1.0), "top_k": (0, 1 << 20),
    "min_p": (0.0, 1.0), "repeat_penalty": (0.0, 10.0),
}
LLAMA_CPP = "llama.cpp's default"


@dataclass(frozen=True, slots=True)
class SamplingDefaults:
    """The values and, per field, where each came from (a GGUF key or llama.cpp)."""

    values: Sampling
    sources: tuple[tuple[str, str], ...]

    def describe(self) -> str:
        """One line for a banner or ``--help``: the values, then their origins."""
        from_gguf = [f"{name} from {src}" for name, src in self.sources if src != LLAMA_CPP]
        origin = "; ".join(from_gguf) if from_gguf else "the GGUF recommends none"
        return f"{self.values.describe()} (llama.cpp's defaults unless noted: {origin})"


def sampling_from_gguf(metadata: Mapping[str, object]) -> SamplingDefaults:
    """The model's recommended sampling from GGUF metadata (llama-cpp-python's
    ``Llama.metadata``: every value a string), llama.cpp's default for each field the file
    does not carry or carries in an unusable form."""
    values = LLAMA_CPP_SAMPLING
    sources: list[tuple[str, str]] = []
    for f in fields(Sampling):
        key = GGUF_SAMPLING_KEYS[f.name]
        parsed = _parse(metadata.get(key), f.name)
        if parsed is None:
            sources.append((f.name, LLAMA_CPP))
            continue
        values = replace(values, **{f.name: parsed})
        sources.append((f.name, key))
    return SamplingDefaults(values=values, sources=tuple(sources))


def _parse(raw: object, name: str) -> float | int | None:
    if raw is None or isinstance(raw, bool):
        return None
    try:
        number = float(str(raw))
    except ValueError:
        return None
    lo, hi = _RANGES[name]
    if not math.isfinite(number) or not lo <= number <= hi:
        return None
    if name == "top_k":
        return int(number) if number.is_integer() else None
    return number
