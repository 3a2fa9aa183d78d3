"""Structured logs: every line one JSON object with a timestamp, a level and the message.

Messages may quote what peers sent (a store's error text, a record's id);
encoding each line as JSON escapes newlines and quotes, so a hostile peer can
never forge a log line of its own. Request lines carry their fields
(method, path, status, ...) as keys of the same object.
"""

from __future__ import annotations

import copy
import logging
from datetime import UTC, datetime
from typing import Any

import orjson

from token_finalizer.core.redaction import redact

__all__ = ["FIELDS_ATTRIBUTE", "JsonFormatter", "logging_config"]

# `logger.info(..., extra={FIELDS_ATTRIBUTE: {...}})` merges those keys into the line.
FIELDS_ATTRIBUTE = "json_fields"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, message (+ fields, + exception)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": redact(record.getMessage()),
        }
        fields = getattr(record, FIELDS_ATTRIBUTE, None)
        if isinstance(fields, dict):
            line.update(fields)
        if record.exc_info:
            line["exception"] = redact(self.formatException(record.exc_info))
        return orjson.dumps(line, default=str).decode()


def logging_config(*, access_logger: str | None = None) -> dict[str, Any]:
    """uvicorn's logging, every line JSON: requests on stdout, everything else on stderr."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    json_formatter = {"()": f"{__name__}.JsonFormatter"}
    config["formatters"] = {"json": json_formatter}
    config["handlers"] = {
        "stderr": {
            "formatter": "json",
            "class": "logging.StreamHandler",
            "stream": "ext://sys.stderr",
        },
        "stdout": {
            "formatter": "json",
            "class": "logging.StreamHandler",
            "stream": "ext://sys.stdout",
        },
    }
    config["loggers"] = {
        "uvicorn": {"handlers": ["stderr"], "level": "INFO", "propagate": False},
        "uvicorn.error": {"level": "INFO"},
        # Our own request lines replace uvicorn's access log (which would log probes too).
        "uvicorn.access": {"handlers": [], "level": "WARNING", "propagate": False},
        "token_finalizer": {"handlers": ["stderr"], "level": "INFO", "propagate": False},
    }
    if access_logger is not None:
        config["loggers"][access_logger] = {
            "handlers": ["stdout"],
            "level": "INFO",
            "propagate": False,
        }
    return config
