"""Structured log lines for the broker and workers: key=value by default, JSON on request.

Fields come from the message and from `extra={...}` on the logging call, so
callers write `log.info("worker lost", extra={"worker": wid, "tasks": 3})`.
Tokens and payloads are never passed to a log call at info level or above;
the formatter does not try to scrub them, the callers must not log them.
"""

from __future__ import annotations

import datetime
import json
import logging
from typing import Any

FORMATS = ("text", "json")

# Attributes every LogRecord has; anything else on a record came from `extra`.
_STANDARD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "ts": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc).isoformat(timespec="milliseconds"),
        "level": record.levelname.lower(),
        "logger": record.name,
        "msg": record.getMessage(),
    }
    for key, value in vars(record).items():
        if key not in _STANDARD_ATTRIBUTES and not key.startswith("_"):
            fields[key] = value
    if record.exc_info:
        fields["exc"] = logging.Formatter().formatException(record.exc_info)
    return fields


def _text_value(value: Any) -> str:
    text = str(value)
    if text and not any(ch in text for ch in ' "=\n\t'):
        return text
    return json.dumps(text)


class KeyValueFormatter(logging.Formatter):
    """`ts=... level=info logger=cronoq.broker msg="worker lost" worker=ab12`."""

    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{key}={_text_value(value)}" for key, value in _fields(record).items())


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log shippers."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_fields(record), default=str)


def configure(level: str = "INFO", fmt: str = "text") -> None:
    """Send cronoq's logs to stderr in `fmt` ("text" key=value or "json") at `level`."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
