"""Structured log lines: key=value and JSON, with fields from `extra`."""

from __future__ import annotations

import json
import logging

from cronoq.wire.logs import JsonFormatter, KeyValueFormatter


def record(message: str, **extra) -> logging.LogRecord:
    rec = logging.LogRecord("cronoq.broker", logging.WARNING, __file__, 1, message, None, None)
    for key, value in extra.items():
        setattr(rec, key, value)
    return rec


def test_key_value_lines_quote_what_needs_quoting():
    line = KeyValueFormatter().format(record("worker lost", worker="ab12", tasks=3, note='a "b"'))
    assert line.startswith("ts=")
    assert ' level=warning logger=cronoq.broker msg="worker lost" worker=ab12 tasks=3 note="a \\"b\\""' in line


def test_json_lines_carry_the_same_fields():
    fields = json.loads(JsonFormatter().format(record("worker lost", worker="ab12", tasks=3)))
    assert {k: fields[k] for k in ("level", "logger", "msg", "worker", "tasks")} == {
        "level": "warning", "logger": "cronoq.broker", "msg": "worker lost", "worker": "ab12", "tasks": 3}
