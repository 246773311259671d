"""Bounds on the request fields a caller sizes freely: metadata, attribution ids, tools
(their count and names), ``logit_bias``, ``prompt_cache_key``, ``service_tier``. Each is the
real API's documented limit where it documents one (cited on the constant), else a bound of
ours with its reason. A value past a bound is a 400 naming the
field (:func:`~tokenwire.gateway.apis.params.bad_request`), which each API answers in its own
error shape; nothing is truncated or dropped in silence.

These fields are forwarded unchanged to an upstream that speaks the same API
(``request_fields.py``: ``metadata``, ``user``, ``safety_identifier``, ``prompt_cache_key``
and Chat's and Messages' ``service_tier`` are hints, ``logit_bias`` is passed, a Responses
``service_tier`` is kept for a Responses upstream), so an unbounded one would be sent on as it
came; ``prompt_cache_key`` also picks a replica (``routing/pool.py``). Tool names reach the
embedded engine's prompt as text (never as control tokens: ``upstreams/chat_prompt.py``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sized
from typing import Any

from tokenwire.gateway.apis.params import bad_request, json_type

__all__ = [
    "ANTHROPIC_SERVICE_TIERS",
    "CHAT_SERVICE_TIERS",
    "MAX_ANTHROPIC_TOOL_NAME_CHARS",
    "MAX_ANTHROPIC_USER_ID_CHARS",
    "MAX_LOGIT_BIAS",
    "MAX_LOGIT_BIAS_ENTRIES",
    "MAX_MESSAGES_TOOLS",
    "MAX_METADATA_KEYS",
    "MAX_METADATA_KEY_CHARS",
    "MAX_METADATA_VALUE_CHARS",
    "MAX_OPENAI_TOOLS",
    "MAX_OPENAI_TOOL_NAME_CHARS",
    "MAX_PROMPT_CACHE_KEY_CHARS",
    "MAX_SAFETY_IDENTIFIER_CHARS",
    "MAX_USER_CHARS",
    "RESPONSES_SERVICE_TIERS",
    "check_anthropic_metadata",
    "check_anthropic_service_tier",
    "check_anthropic_tool_name",
    "check_logit_bias",
    "check_openai_attribution",
    "check_openai_metadata",
    "check_openai_service_tier",
    "check_openai_tool_name",
    "check_prompt_cache_key",
    "check_tool_count",
]

#: OpenAI's ``metadata`` (Chat, Responses; the ``openai`` SDK's ``Metadata`` docstring):
#: "Set of 16 key-value pairs ... Keys are strings with a maximum length of 64 characters.
#: Values are strings with a maximum length of 512 characters."
MAX_METADATA_KEYS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
#: OpenAI's ``safety_identifier``: "a maximum length of 128 characters" (SDK docstring).
MAX_SAFETY_IDENTIFIER_CHARS = 128
#: ``user``, which ``safety_identifier`` replaces: OpenAI documents no length of its own, so
#: it gets its successor's.
MAX_USER_CHARS = MAX_SAFETY_IDENTIFIER_CHARS
#: Anthropic's ``metadata.user_id``: at most 256 characters (the Messages API reference); it
#: is the only key Anthropic's ``metadata`` has.
MAX_ANTHROPIC_USER_ID_CHARS = 256
#: OpenAI's bound on ``tools`` (its 400: "array too long. Expected an array with maximum
#: length 128", code ``array_above_max_length``), for Chat and Responses (namespaced tools
#: count one each).
MAX_OPENAI_TOOLS = 128
#: OpenAI's function name: "Must be a-z, A-Z, 0-9, or contain underscores and dashes, with a
#: maximum length of 64" (SDK ``FunctionDefinition.name``); its 400 for another character:
#: "string does not match pattern ... '^[a-zA-Z0-9_-]+$'", code ``invalid_value``. The
#: Responses API's function and custom tools are held to the same.
MAX_OPENAI_TOOL_NAME_CHARS = 64
#: Anthropic's tool name pattern ``^[a-zA-Z0-9_-]{1,128}$`` (its 400: "tools.16.custom.name:
#: String should match pattern ..."; it was ``{1,64}`` until mid-2025).
MAX_ANTHROPIC_TOOL_NAME_CHARS = 128
#: The characters both APIs allow in a tool name: none of them can spell a chat template's
#: markup (``<|im_start|>``), so a name is plain text in any prompt it reaches.
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]+")
#: OpenAI's ``prompt_cache_key``: its 400 "Invalid 'prompt_cache_key': string too long.
#: Expected a string with maximum length 64", code ``string_above_max_length``. It is also
#: the replica-affinity key of a pool (``gateway/affinity.py`` hashes at most 128 characters).
MAX_PROMPT_CACHE_KEY_CHARS = 64
#: OpenAI's ``service_tier`` values (``openai`` SDK 3.57: Chat's ``CompletionCreateParams``,
#: the Responses ``ServiceTier``); ``fast`` is the Fast-mode alias of ``priority``.
CHAT_SERVICE_TIERS = ("auto", "default", "flex", "scale", "priority", "fast")
RESPONSES_SERVICE_TIERS = (*CHAT_SERVICE_TIERS, "ultrafast")
#: Anthropic's ``service_tier`` (``anthropic`` SDK 2.15, ``MessageCreateParams``).
ANTHROPIC_SERVICE_TIERS = ("auto", "standard_only")
#: Anthropic documents no count of tools; ours, far above any client's tool set, bounds the
#: tool prompt every request renders.
MAX_MESSAGES_TOOLS = 512
#: OpenAI's ``logit_bias`` values: "from -100 to 100" (SDK docstring).
MAX_LOGIT_BIAS = 100
#: OpenAI documents no count of ``logit_bias`` entries; ours bounds the per-token work an
#: upstream does for them (a bias on every token of a 200k vocabulary otherwise).
MAX_LOGIT_BIAS_ENTRIES = 1024


def _string(value: Any, where: str, most: int) -> None:
    if not isinstance(value, str):
        raise bad_request(f"{where} must be a string, got {json_type(value)}", param=where,
                          code="invalid_type")
    if len(value) > most:
        raise bad_request(f"{where} is longer than {most} characters ({len(value)})",
                          param=where, code="string_above_max_length")


def _bounded_object(value: Any, where: str, most: int, noun: str) -> None:
    """An object of at most ``most`` members (``noun``: what the message calls them)."""
    if not isinstance(value, dict):
        raise bad_request(f"{where} must be an object, got {json_type(value)}",
                          param=where, code="invalid_type")
    if len(value) > most:
        raise bad_request(f"{where} has {len(value)} {noun}; at most {most} are allowed",
                          param=where, code="object_above_max_properties")


def check_openai_metadata(value: Any) -> None:
    """``metadata``: at most 16 string keys of up to 64 characters, string values of up to
    512 (OpenAI's limits); ``null`` is no metadata."""
    if value is None:
        return
    _bounded_object(value, "metadata", MAX_METADATA_KEYS, "keys")
    for key, item in value.items():
        if len(key) > MAX_METADATA_KEY_CHARS:
            raise bad_request(f"metadata key {key[:MAX_METADATA_KEY_CHARS]!r}... is longer "
                              f"than {MAX_METADATA_KEY_CHARS} characters", param="metadata",
                              code="string_above_max_length")
        _string(item, f"metadata.{key}", MAX_METADATA_VALUE_CHARS)


def check_openai_attribution(body: Mapping[str, Any]) -> None:
    """``user`` and ``safety_identifier``: strings of up to 128 characters when sent."""
    for key, most in (("user", MAX_USER_CHARS),
                      ("safety_identifier", MAX_SAFETY_IDENTIFIER_CHARS)):
        if body.get(key) is not None:
            _string(body[key], key, most)


def check_anthropic_metadata(value: Any) -> None:
    """Messages' ``metadata``: an object whose one key, ``user_id``, is a string of up to
    256 characters or null; any other key is refused, as Anthropic's API does."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise bad_request("metadata: must be an object", param="metadata")
    for key in value:
        if key != "user_id":
            raise bad_request(f"metadata.{key}: Extra inputs are not permitted",
                              param=f"metadata.{key}")
    user = value.get("user_id")
    if user is not None and (not isinstance(user, str)
                             or len(user) > MAX_ANTHROPIC_USER_ID_CHARS):
        raise bad_request(f"metadata.user_id: must be a string of at most "
                          f"{MAX_ANTHROPIC_USER_ID_CHARS} characters",
                          param="metadata.user_id")


def check_tool_count(tools: Sized, most: int) -> None:
    if len(tools) > most:
        raise bad_request(f"tools: {len(tools)} tools; at most {most} are allowed",
                          param="tools", code="array_above_max_length")


def check_openai_tool_name(name: str, param: str) -> None:
    """A function (or custom) tool's name: 1 to 64 of ``a-z A-Z 0-9 _ -`` (OpenAI's rule;
    ``param`` is where it is, ``tools[3].function.name``)."""
    if len(name) > MAX_OPENAI_TOOL_NAME_CHARS:
        raise bad_request(f"{param}: the tool name {name[:24]!r}... is longer than "
                          f"{MAX_OPENAI_TOOL_NAME_CHARS} characters ({len(name)})",
                          param=param, code="string_above_max_length")
    if _TOOL_NAME.fullmatch(name) is None:
        raise bad_request(f"Invalid '{param}': string does not match pattern. Expected a "
                          "string that matches the pattern '^[a-zA-Z0-9_-]+$'.",
                          param=param, code="invalid_value")


def check_anthropic_tool_name(name: str, param: str) -> None:
    """A Messages tool's name: Anthropic's ``^[a-zA-Z0-9_-]{1,128}$``, in its words."""
    if len(name) > MAX_ANTHROPIC_TOOL_NAME_CHARS or _TOOL_NAME.fullmatch(name) is None:
        raise bad_request(f"{param}: String should match pattern "
                          f"'^[a-zA-Z0-9_-]{{1,{MAX_ANTHROPIC_TOOL_NAME_CHARS}}}$'",
                          param=param)


def check_prompt_cache_key(body: Mapping[str, Any]) -> None:
    """``prompt_cache_key`` (Chat, Responses): a string of at most 64 characters."""
    if body.get("prompt_cache_key") is not None:
        _string(body["prompt_cache_key"], "prompt_cache_key", MAX_PROMPT_CACHE_KEY_CHARS)


def check_openai_service_tier(body: Mapping[str, Any], tiers: tuple[str, ...]) -> None:
    """``service_tier``: one of ``tiers`` (the API's own list) or null, as OpenAI answers."""
    value = body.get("service_tier")
    if value is not None and (not isinstance(value, str) or value not in tiers):
        shown = repr(value[:32]) if isinstance(value, str) else json_type(value)
        raise bad_request(f"Invalid value: {shown}. Supported values are: "
                          + ", ".join(repr(t) for t in tiers) + ".",
                          param="service_tier", code="invalid_value")


def check_anthropic_service_tier(body: Mapping[str, Any]) -> None:
    """Messages' ``service_tier``: ``auto`` or ``standard_only`` when sent."""
    value = body.get("service_tier")
    if value is not None and (not isinstance(value, str)
                              or value not in ANTHROPIC_SERVICE_TIERS):
        raise bad_request("service_tier: Input should be "
                          + " or ".join(repr(t) for t in ANTHROPIC_SERVICE_TIERS),
                          param="service_tier")


def check_logit_bias(value: Any) -> None:
    """``logit_bias``: an object of token ids (decimal strings) to numbers in -100..100,
    with at most :data:`MAX_LOGIT_BIAS_ENTRIES` entries."""
    if value is None:
        return
    _bounded_object(value, "logit_bias", MAX_LOGIT_BIAS_ENTRIES, "entries")
    for key, bias in value.items():
        if not (key.isascii() and key.isdigit()):
            raise bad_request(f"logit_bias key {key[:32]!r} is not a token id",
                              param="logit_bias")
        if not isinstance(bias, int | float) or isinstance(bias, bool) \
                or not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
            raise bad_request(f"logit_bias.{key} must be a number between "
                              f"-{MAX_LOGIT_BIAS} and {MAX_LOGIT_BIAS}",
                              param=f"logit_bias.{key}")
