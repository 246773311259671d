"""Request fields shared by the OpenAI-shaped APIs: ``stream_format``, sampling, stop, n.

Parsing is strict where a silent fallback would mislead (codec-spec §10 item 12: an unknown
``stream_format`` is a 400 that lists the supported values, never a quiet downgrade to
msgpack; ``n > 1`` with a binary format is a 400, §2.3) and lenient where OpenAI is (unknown
body fields are ignored). Errors are :class:`~tokenwire.errors.InvalidRequest` with the
status to answer in ``status_hint``, the field in ``param`` and OpenAI's ``code``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokenwire.codec.frames import StreamFormat
from tokenwire.errors import InvalidRequest
from tokenwire.gateway.stops import validate_stops

__all__ = [
    "JSON_FORMAT",
    "MAX_COMPLETIONS_LOGPROBS",
    "MAX_MAX_TOKENS",
    "MAX_REPEAT_PENALTY",
    "MAX_TOP_K",
    "MAX_TOP_LOGPROBS",
    "SUPPORTED_STREAM_FORMATS",
    "OpenAIFields",
    "Sampling",
    "bad_request",
    "json_type",
    "optional_bool",
    "parse_logprobs",
    "parse_openai_fields",
    "parse_sampling",
    "parse_stream_format",
    "refuse_binary_logprobs",
]

JSON_FORMAT = "json"
#: Every ``stream_format`` we answer, in the order the 400 lists them (§2.3; ``protobuf-delta``
#: is named in v0.5 but specified nowhere, §1.4, so it is not offered).
SUPPORTED_STREAM_FORMATS: tuple[str, ...] = (JSON_FORMAT, *(f.value for f in StreamFormat))
#: Upper bound on ``max_tokens`` in a request; the engine also caps it at its context window.
MAX_MAX_TOKENS = 1 << 20
#: Upper bound on ``top_k``: no vocabulary in use is larger (Gemma's is 256k).
MAX_TOP_K = 1 << 20
#: Upper bound on ``repeat_penalty``: llama.cpp divides a repeated token's logit by it, and
#: past 10 a repeat is as good as banned; vLLM documents no bound.
MAX_REPEAT_PENALTY = 10.0
#: OpenAI's bounds on alternatives per token: Chat / Responses ``top_logprobs`` and
#: Completions ``logprobs`` (an integer there).
MAX_TOP_LOGPROBS = 20
MAX_COMPLETIONS_LOGPROBS = 5


def bad_request(message: str, status: int = 400, *, param: str | None = None,
                code: str | None = None) -> InvalidRequest:
    """The error for a request field that is wrong: ``param`` names the field, ``code`` is
    OpenAI's word for the problem (``invalid_value`` unless given; README "Error codes")."""
    return InvalidRequest(message, status_hint=status, code=code, param=param)


def json_type(value: Any) -> str:
    """A decoded JSON value's type in JSON's words (``array``, not ``list``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return _JSON_TYPES.get(type(value), "value")


_JSON_TYPES = {dict: "object", list: "array", str: "string", int: "integer", float: "number"}


def optional_bool(body: Mapping[str, Any], key: str, param: str | None = None) -> bool | None:
    """``body[key]``: true, false, or None when absent or null; anything else is a 400
    (``"false"`` is not false: read by truthiness, it asked for a stream)."""
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise bad_request(f"{param or key} must be a boolean, got {json_type(value)}",
                          param=param or key, code="invalid_type")
    return value


def parse_stream_format(value: Any, *, n: int) -> StreamFormat | None:
    """The binary format asked for, or ``None`` for JSON (the default)."""
    if value is None or value == JSON_FORMAT:
        return None
    try:
        fmt = StreamFormat(value)
    except ValueError:
        raise bad_request(
            f"unsupported stream_format {value!r}; supported: "
            + ", ".join(SUPPORTED_STREAM_FORMATS), param="stream_format") from None
    if n != 1:
        raise bad_request(f"n must be 1 with stream_format {fmt.value!r} (frames carry no "
                          "choice index, codec-spec §2.3)", param="n", code="unsupported_value")
    return fmt


class Sampling:
    """Validated sampling fields, ready for a ``GenerationRequest``; ``None`` = not sent
    (``gateway/defaults.py`` says who fills it in)."""

    __slots__ = ("frequency_penalty", "ignore_eos", "max_tokens", "min_p", "n",
                 "presence_penalty", "repeat_penalty", "seed", "stop", "temperature", "top_k",
                 "top_p")

    def __init__(self, body: Mapping[str, Any], *, default_max_tokens: int | None) -> None:
        self.max_tokens = _int(body, "max_tokens", 1, MAX_MAX_TOKENS) or default_max_tokens
        if body.get("max_completion_tokens") is not None:  # the newer Chat name wins
            self.max_tokens = _int(body, "max_completion_tokens", 1, MAX_MAX_TOKENS)
        self.temperature = _num(body, "temperature", 0.0, 2.0)
        self.top_p = _num(body, "top_p", 0.0, 1.0)
        # vLLM's and llama.cpp's extensions; -1 and 0 mean "off" to both.
        self.top_k = _int(body, "top_k", -1, MAX_TOP_K)
        self.min_p = _num(body, "min_p", 0.0, 1.0)
        # OpenAI's documented range; llama.cpp and vLLM take the same numbers.
        self.presence_penalty = _num(body, "presence_penalty", -2.0, 2.0)
        self.frequency_penalty = _num(body, "frequency_penalty", -2.0, 2.0)
        # llama.cpp's name, then vLLM's; 1.0 is "off" to both, and above MAX_REPEAT_PENALTY
        # every token of the prompt is all but banned.
        self.repeat_penalty = _num(body, "repeat_penalty", 0.0, MAX_REPEAT_PENALTY)
        if body.get("repetition_penalty") is not None:
            self.repeat_penalty = _num(body, "repetition_penalty", 0.0, MAX_REPEAT_PENALTY)
        seed = body.get("seed")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise bad_request(f"seed must be an integer, got {json_type(seed)}", param="seed",
                              code="invalid_type")
        self.seed = None if seed is None else seed & 0x7FFF_FFFF
        self.n = _int(body, "n", 1, 128) or 1
        self.ignore_eos = bool(body.get("ignore_eos", False))
        self.stop = _stops(body.get("stop"))


    def request_fields(self) -> dict[str, Any]:
        """The ``GenerationRequest`` keyword arguments these fields become."""
        return {key: getattr(self, key) for key in (
            "max_tokens", "temperature", "top_p", "top_k", "min_p", "presence_penalty",
            "frequency_penalty", "repeat_penalty", "seed", "stop", "ignore_eos")}


def parse_sampling(body: Mapping[str, Any], *, default_max_tokens: int | None) -> Sampling:
    return Sampling(body, default_max_tokens=default_max_tokens)


class OpenAIFields:
    """What Completions and Chat Completions bodies share, validated in one place."""

    __slots__ = ("include_usage", "model", "sampling", "stream", "stream_format")

    def __init__(self, body: Any, *, default_max_tokens: int | None) -> None:
        if not isinstance(body, dict):
            raise bad_request(f"the request body must be a JSON object, got {json_type(body)}",
                              code="invalid_type")
        self.sampling = parse_sampling(body, default_max_tokens=default_max_tokens)
        self.stream_format = parse_stream_format(body.get("stream_format"),
                                                 n=self.sampling.n)
        if self.sampling.n != 1:
            raise bad_request("this server generates one choice per request; n must be 1",
                              param="n", code="unsupported_value")
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise bad_request(f"model must be a string, got {json_type(model)}", param="model",
                              code="invalid_type")
        self.model: str | None = model
        # A binary stream_format is always streamed (codec-spec §2.3).
        self.stream = bool(optional_bool(body, "stream")) or self.stream_format is not None
        options = body.get("stream_options") or {}
        if not isinstance(options, dict):
            raise bad_request(f"stream_options must be an object, got {json_type(options)}",
                              param="stream_options", code="invalid_type")
        self.include_usage = bool(optional_bool(options, "include_usage",
                                                "stream_options.include_usage"))


def parse_openai_fields(body: Any, *, default_max_tokens: int | None) -> OpenAIFields:
    return OpenAIFields(body, default_max_tokens=default_max_tokens)


def parse_logprobs(body: Mapping[str, Any], *, chat: bool) -> tuple[bool, int | None]:
    """``(logprobs, top_logprobs)``. Chat: ``logprobs`` a boolean, ``top_logprobs`` 0..20
    that needs ``logprobs: true`` (OpenAI's 400 says the same). Completions: ``logprobs``
    an integer 0..5, the number of alternatives."""
    if not chat:
        n = _int(body, "logprobs", 0, MAX_COMPLETIONS_LOGPROBS)
        return n is not None, n
    wanted = optional_bool(body, "logprobs")
    top = _int(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top is not None and not wanted:
        raise bad_request("top_logprobs needs logprobs: true", param="top_logprobs")
    return bool(wanted), top


def refuse_binary_logprobs(fmt: StreamFormat | None, logprobs: bool) -> None:
    """Codec frames carry ids and nothing else (codec-spec §2.3): logprobs asked for with a
    binary ``stream_format`` would be lost, so the pair is a 400 naming ``logprobs``."""
    if fmt is not None and logprobs:
        raise bad_request(f"logprobs cannot be sent with stream_format {fmt.value!r}: Codec "
                          "frames carry token ids only; use stream_format 'json'",
                          param="logprobs", code="unsupported_parameter")


def _int(body: Mapping[str, Any], key: str, lo: int, hi: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise bad_request(f"{key} must be an integer, got {json_type(value)}", param=key,
                          code="invalid_type")
    if not lo <= value <= hi:
        raise bad_request(f"{key} must be an integer between {lo} and {hi}, got {value!r}",
                          param=key, code="integer_below_min_value" if value < lo
                          else "integer_above_max_value")
    return value


def _num(body: Mapping[str, Any], key: str, lo: float, hi: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise bad_request(f"{key} must be a number, got {json_type(value)}", param=key,
                          code="invalid_type")
    if not lo <= value <= hi:
        raise bad_request(f"{key} must be a number between {lo:g} and {hi:g}, got {value!r}",
                          param=key, code="decimal_below_min_value" if value < lo
                          else "decimal_above_max_value")
    return float(value)


def _stops(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise bad_request("stop must be a string or a list of strings", param="stop",
                          code="invalid_type")
    try:
        return validate_stops(items)
    except ValueError as exc:
        raise bad_request(str(exc), param="stop") from None
