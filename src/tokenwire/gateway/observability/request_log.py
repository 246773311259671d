"""The request log's rendering: one JSON object per line, private by construction.

The records themselves (which fields, bounded how) are built by
:class:`~tokenwire.gateway.observability.records.RequestRecord`; this module only turns a record
into a line and attaches the handler ``tokenwire serve --request-log json`` uses.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from typing import IO, Any, Final

from tokenwire.gateway.observability.bounds import bounded_id
from tokenwire.gateway.observability.records import LOGGER_NAME, MAX_LINE_CHARS

__all__ = ["JsonLineFormatter", "configure_request_logging"]


def _utc_timestamp(created: float) -> str:
    """ISO 8601 in UTC with milliseconds and ``Z``: sortable, and no local zone to guess.

    The second's text is kept for the next line (lines come many to a second, and
    ``datetime`` + ``strftime`` were a sixth of writing one); the sub-second part is
    rounded to the microsecond first, as ``datetime.fromtimestamp`` does."""
    global _last_second
    second = math.floor(created)
    micros = round((created - second) * 1_000_000)
    if micros >= 1_000_000:
        second, micros = second + 1, micros - 1_000_000
    if _last_second[0] != second:
        _last_second = (second, time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(second)))
    return f"{_last_second[1]}{micros // 1000:03d}Z"


#: The last second :func:`_utc_timestamp` spelled, and its text.
_last_second: tuple[int, str] = (-1, "")


def _payload(record: logging.LogRecord) -> dict[str, Any]:
    """The fields of a record: its ``event`` dict, or for any other record on this logger only
    the level, the logger and the message *template* (never its arguments, which could be
    anything, and never ``exc_info``/``stack_info``)."""
    try:
        ts = _utc_timestamp(record.created)
    except (OverflowError, OSError, ValueError):
        ts = "1970-01-01T00:00:00.000Z"
    event = record.__dict__.get("event")
    if isinstance(event, dict):
        return {"ts": ts, **event}
    template = record.msg if isinstance(record.msg, str) else ""
    return {"ts": ts, "event": "log", "level": bounded_id(record.levelname, 16),
            "logger": bounded_id(record.name), "msg": bounded_id(template, 200)}


class JsonLineFormatter(logging.Formatter):
    """One JSON object per line: ``{"ts": ..., "event": ..., ...fields}``.

    ``ensure_ascii`` escapes every control character, so a line never contains a newline;
    ``allow_nan=False`` plus the clamping in :class:`RequestRecord` keep it valid JSON. A
    record that cannot be rendered, or renders too long, becomes a short
    ``log_format_error`` line rather than an exception in the logging machinery.
    """

    def format(self, record: logging.LogRecord) -> str:
        payload = _payload(record)
        try:
            line = json.dumps(payload, ensure_ascii=True, allow_nan=False,
                              separators=(",", ":"))
        except (TypeError, ValueError):
            line = ""
        if not line or len(line) > MAX_LINE_CHARS:
            line = json.dumps({"ts": payload["ts"], "event": "log_format_error",
                               "original_event": bounded_id(payload.get("event"), 64)},
                              separators=(",", ":"))
        return line


_HANDLER_MARK: Final = "_tokenwire_request_log"


def configure_request_logging(
    stream: IO[str] | None = None,
    level: int | str = logging.INFO,
) -> logging.Handler:
    """Send request records to ``stream`` (default: ``sys.stderr`` at call time), one line
    each; calling again replaces the previous handler instead of doubling lines.

    The logger stops propagating, so uvicorn's or the root logger's handlers never see these
    records (and never re-render them with a formatter that would include ``exc_info``).
    """
    logger = logging.getLogger(LOGGER_NAME)
    for old in list(logger.handlers):
        if getattr(old, _HANDLER_MARK, False):
            logger.removeHandler(old)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonLineFormatter())
    setattr(handler, _HANDLER_MARK, True)
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    return handler
