"""Structured logs: every line one JSON object with a timestamp, a level and the message.

Messages may quote what peers sent (a store's error text, a record's id);
encoding each line as JSON escapes newlines and quotes, so a hostile peer can
never forge a log line of its own. Request lines carry their fields
(method, path, status, ...) as keys of the same object, and so do the
client package's retry warnings (method, path, attempt, wait_s, error): both
put them in the record attribute `FIELDS_ATTRIBUTE`.

Two loggers are ours: `token_finalizer` (the service) and
`token_finalizer_client` (the client package, whose retry policy the
service's http sources and the batch commands use). Both write JSON lines on
stderr at the level `TOKEN_FINALIZER_LOG_LEVEL` names (default info), in the
servers (`logging_config`, handed to uvicorn) and in every CLI command
(`cli_logging`); see docs/configuration.md#logs.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

import orjson

from token_finalizer._constants import DEFAULT_LOG_LEVEL
from token_finalizer.core.redaction import redact

# The package root, not `transport`: these two names load no HTTP library.
from token_finalizer_client import LOG_FIELDS_ATTRIBUTE, LOGGER_NAME

__all__ = [
    "CLIENT_LOGGER",
    "CLI_LOGGER",
    "FIELDS_ATTRIBUTE",
    "LOG_LEVEL_ENV_VAR",
    "SERVICE_LOGGER",
    "JsonFormatter",
    "cli_logging",
    "log_level",
    "logging_config",
    "say",
]

# `logger.info(..., extra={FIELDS_ATTRIBUTE: {...}})` merges those keys into the line
# (the client package's attribute, so its retry warnings come out the same way).
FIELDS_ATTRIBUTE = LOG_FIELDS_ATTRIBUTE
SERVICE_LOGGER = "token_finalizer"
CLIENT_LOGGER = LOGGER_NAME
LOG_LEVEL_ENV_VAR = "TOKEN_FINALIZER_LOG_LEVEL"
_LEVELS = ("debug", "info", "warning", "error", "critical")


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


def log_level(environ: Mapping[str, str] | None = None) -> str:
    """The level `TOKEN_FINALIZER_LOG_LEVEL` names (upper case, for logging); ValueError if none."""
    env = os.environ if environ is None else environ
    value = env.get(LOG_LEVEL_ENV_VAR, "").strip().lower() or DEFAULT_LOG_LEVEL
    if value not in _LEVELS:
        raise ValueError(
            f"{LOG_LEVEL_ENV_VAR}={value[:40]!r} is not a log level; "
            f"use one of {', '.join(_LEVELS)}"
        )
    return value.upper()


class CurrentStreamHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to `sys.stderr` or `sys.stdout` as it is at each record, not as it was when the
    servers' logging was configured: a process that swaps them (a test capturing output, an
    embedder) never keeps a handler on a closed stream ("--- Logging error ---" lines)."""

    def __init__(self, which: str = "stderr") -> None:
        if which not in ("stderr", "stdout"):
            raise ValueError(f"which must be stderr or stdout, got {which!r}")
        self._which = which
        super().__init__()

    @property
    def stream(self) -> Any:
        return getattr(sys, self._which)

    @stream.setter
    def stream(self, value: Any) -> None:
        """StreamHandler sets its stream; this handler always looks it up instead."""


def logging_config(*, access_logger: str | None = None) -> dict[str, Any]:
    """uvicorn's logging, every line JSON: requests on stdout, everything else on stderr.

    ValueError when `TOKEN_FINALIZER_LOG_LEVEL` names no level.
    """
    from uvicorn.config import LOGGING_CONFIG

    level = log_level()
    config = copy.deepcopy(LOGGING_CONFIG)
    json_formatter = {"()": f"{__name__}.JsonFormatter"}
    config["formatters"] = {"json": json_formatter}
    current = f"{__name__}.CurrentStreamHandler"
    config["handlers"] = {
        "stderr": {"formatter": "json", "()": current, "which": "stderr"},
        "stdout": {"formatter": "json", "()": current, "which": "stdout"},
    }
    config["loggers"] = {
        "uvicorn": {"handlers": ["stderr"], "level": "INFO", "propagate": False},
        "uvicorn.error": {"level": "INFO"},
        # Our own request lines replace uvicorn's access log (which would log probes too).
        "uvicorn.access": {"handlers": [], "level": "WARNING", "propagate": False},
        SERVICE_LOGGER: {"handlers": ["stderr"], "level": level, "propagate": False},
        # The retry policy's warnings (the http sources' retries) come from here.
        CLIENT_LOGGER: {"handlers": ["stderr"], "level": level, "propagate": False},
    }
    if access_logger is not None:
        config["loggers"][access_logger] = {
            "handlers": ["stdout"],
            "level": "INFO",
            "propagate": False,
        }
    return config


@contextlib.contextmanager
def cli_logging(level: str) -> Iterator[None]:
    """Within the block, our two loggers write JSON lines on stderr at `level` (a CLI command).

    `level` comes from `log_level()`. Each logger is left as it was found
    afterwards (its handlers and level) (a command run in-process, as tests do, changes nothing for
    the next one); the servers replace this with `logging_config` when they
    start. Records still propagate: an application that configured the root
    logger sees them there too.
    """
    handler = logging.StreamHandler()  # sys.stderr as it is when the block starts
    handler.setFormatter(JsonFormatter())
    loggers = [logging.getLogger(name) for name in (SERVICE_LOGGER, CLIENT_LOGGER)]
    found = [(logger.handlers[:], logger.level) for logger in loggers]
    for logger in loggers:
        # Ours alone within the block: a server configured earlier in this process
        # (a test, an embedder) must neither repeat each line nor write to its old stream.
        logger.handlers = [handler]
        logger.setLevel(level)
    try:
        yield
    finally:
        for logger, (handlers, previous) in zip(loggers, found, strict=True):
            logger.handlers = handlers
            logger.setLevel(previous)


CLI_LOGGER = f"{SERVICE_LOGGER}.cli"


def say(level: int, message: str, **fields: Any) -> None:
    """One JSON line on stderr from a command: a warning, an error, a report (+ its fields).

    The commands' words for an operator (`store serve`'s start-up warnings,
    argument errors found after parsing, the batch commands' summaries) go
    through the `token_finalizer.cli` logger, so they are JSON lines like
    every other (docs/configuration.md#logs); stdout stays the command's output.
    """
    extra = {FIELDS_ATTRIBUTE: fields} if fields else None
    logging.getLogger(CLI_LOGGER).log(level, message, extra=extra)
