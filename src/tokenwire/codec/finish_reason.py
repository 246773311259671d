"""``finish_reason`` on the terminal frame: server mapping and client normalisation (§5.7).

The spec's values are ``eos_token``, ``stop_sequence``, ``length``, ``error`` and (v0.4)
``policy_violation``; engines really send ``stop`` (EOS or a stop string, undistinguished),
``length`` and sometimes ``abort`` (§9.1 item 8). The server maps engine reasons to the spec
set, with a legacy mode that writes ``stop`` like the engine forks (§10 item 13). The client
accepts both vocabularies; anything else is treated as ``error`` (open enum, §2.7).
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "POLICY_VIOLATION_VERSION",
    "ClientFinishReason",
    "FinishReason",
    "normalize_finish_reason",
    "wire_finish_reason",
]

#: ``policy_violation`` appeared in v0.4 (§5.7); older clients get ``error`` (§5.3).
POLICY_VIOLATION_VERSION: tuple[int, int] = (0, 4)


class FinishReason(StrEnum):
    """What the server writes (spec set, §5.7)."""

    EOS_TOKEN = "eos_token"
    STOP_SEQUENCE = "stop_sequence"
    LENGTH = "length"
    ERROR = "error"
    POLICY_VIOLATION = "policy_violation"


class ClientFinishReason(StrEnum):
    """What a client may receive and report (§5.7: it MUST accept at least these)."""

    STOP = "stop"  # legacy engines: EOS or a stop string, they do not say which
    EOS_TOKEN = "eos_token"
    STOP_SEQUENCE = "stop_sequence"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"
    POLICY_VIOLATION = "policy_violation"

    @property
    def is_natural_stop(self) -> bool:
        """The model finished on its own (EOS or a stop string), not cut off or failed."""
        return self in (self.STOP, self.EOS_TOKEN, self.STOP_SEQUENCE)


# Engine vocabularies (llama.cpp "stop"/"length", sglang/vLLM "stop"/"length"/"abort",
# OpenAI-style "content_filter"/"tool_calls") to the spec set. "stop" is resolved by
# whether a stop string matched; see wire_finish_reason.
_ENGINE_MAP: dict[str, FinishReason] = {
    "eos": FinishReason.EOS_TOKEN,
    "eos_token": FinishReason.EOS_TOKEN,
    "tool_calls": FinishReason.EOS_TOKEN,
    "stop_sequence": FinishReason.STOP_SEQUENCE,
    "stop_string": FinishReason.STOP_SEQUENCE,
    "length": FinishReason.LENGTH,
    "max_tokens": FinishReason.LENGTH,
    "policy_violation": FinishReason.POLICY_VIOLATION,
    "content_filter": FinishReason.POLICY_VIOLATION,
    "abort": FinishReason.ERROR,
    "cancelled": FinishReason.ERROR,
    "error": FinishReason.ERROR,
}


def wire_finish_reason(
    engine_reason: str | None,
    *,
    matched_stop: str | int | None = None,
    legacy: bool = False,
    client_version: tuple[int, int] = POLICY_VIOLATION_VERSION,
) -> str:
    """Map an engine's finish reason to the value written on the wire.

    ``"stop"`` becomes ``stop_sequence`` when the engine reports a matched stop *string*
    (``matched_stop``), else ``eos_token`` (sglang reports the EOS id as an int). Unknown or
    missing reasons become ``error``. ``legacy=True`` writes ``stop`` for both natural stops,
    as the engine forks do. ``policy_violation`` goes to v0.4+ clients only; older ones get
    ``error``, which is what they would make of an unknown value anyway (§5.3, §5.7).
    """
    key = (engine_reason or "").strip().lower()
    if key == "stop":
        reason = (
            FinishReason.STOP_SEQUENCE if isinstance(matched_stop, str) else FinishReason.EOS_TOKEN
        )
    else:
        reason = _ENGINE_MAP.get(key, FinishReason.ERROR)
    if reason is FinishReason.POLICY_VIOLATION and client_version < POLICY_VIOLATION_VERSION:
        reason = FinishReason.ERROR
    if legacy and reason in (FinishReason.EOS_TOKEN, FinishReason.STOP_SEQUENCE):
        return "stop"
    return reason.value


def normalize_finish_reason(value: str | None) -> ClientFinishReason | None:
    """Client side: a received value, or ``None`` when the frame carries none.

    Known values map to themselves; anything else is ``error`` (§2.7: unknown finish_reason
    is treated as error). Matching is exact: the wire values are lower-case.
    """
    if value is None:
        return None
    try:
        return ClientFinishReason(value)
    except ValueError:
        return ClientFinishReason.ERROR
