"""The process's log writer: ``--log-level`` and ``--log-format text|json`` (one line per record).

``text``: ``2026-11-25 12:00:00,123 INFO gateway.app: message``.  ``json``: one object per
line with ``time`` (RFC 3339, UTC), ``level``, ``logger``, ``message`` and the record's
structured extras (``service``, ``replicas``, ``replica``, ``stream``, ...), plus
``exception`` when there is one.  Everything goes to stderr; stdout carries only the
``sluice listening ...`` line.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

LogFormat = Literal["text", "json"]
LEVELS = ("debug", "info", "warning", "error")
FORMATS: tuple[LogFormat, ...] = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Attributes every LogRecord has: anything else was passed in ``extra=`` and is structured data.
_STANDARD = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys() | {"message", "asctime"}
)


class JsonFormatter(logging.Formatter):
    """One JSON object per record (no newline inside: messages are escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                finite = not isinstance(value, float) or math.isfinite(value)
                out[key] = value if finite else None
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, allow_nan=False)


def configure(level: str = "info", fmt: LogFormat = "text", stream: TextIO | None = None) -> None:
    """Install the one handler on the root logger (replacing any), at ``level``."""
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
