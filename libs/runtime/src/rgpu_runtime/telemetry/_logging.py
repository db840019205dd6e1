"""Logs are read by machines first, so every service logs alike.

``configure_logging`` is called once, from ``main()`` only (libraries and ``create_app`` never
touch handlers). ``json`` writes one object per line with ``time`` (RFC 3339 UTC),
``severity``, ``logger``, ``message``, every ``extra=`` field (``node``, ``pod``, ...), the
active trace and span ids, and the traceback when there is one; ``text`` is for humans.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

import orjson
from opentelemetry import trace

__all__ = ["JsonFormatter", "configure_logging"]

_RESERVED = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys()
    | {"message", "asctime", "color_message", "taskName"}
)

TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """Render a record as one JSON object: fixed keys first, then its ``extra`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "severity": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(_trace_ids())
        entry.update((k, v) for k, v in vars(record).items() if k not in _RESERVED)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def _trace_ids() -> dict[str, str]:
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return {}
    return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}


def configure_logging(level: str, fmt: str, *, stream: TextIO | None = None) -> None:
    """Send every log record at ``level`` or above to ``stream`` (stderr) as ``fmt`` (json|text).

    Replaces the root logger's handlers, so calling it twice does not duplicate lines.
    """
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    formatter = JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
