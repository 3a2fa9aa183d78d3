"""What the commands said on stderr: every line a JSON log line, read back as its messages."""

from __future__ import annotations

from typing import Any

import orjson

__all__ = ["log_lines", "messages"]


def log_lines(stream: str) -> list[dict[str, Any]]:
    """Every line of `stream` parsed as one JSON object (ValueError for a line that is not)."""
    lines = []
    for line in stream.splitlines():
        parsed = orjson.loads(line)
        if not isinstance(parsed, dict):
            raise ValueError(f"not a JSON object: {line!r}")
        lines.append(parsed)
    return lines


def messages(stream: str) -> str:
    """The `message` of each JSON line of `stream`, one a line, as the words read before."""
    return "".join(f"{line['message']}\n" for line in log_lines(stream))
