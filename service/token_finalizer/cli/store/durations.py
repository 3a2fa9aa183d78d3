"""Durations on the command line: `30s`, `15m`, `12h`, `7d` (and `never` for a TTL)."""

from __future__ import annotations

import argparse
import re

__all__ = ["format_age", "parse_duration", "parse_ttl"]

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])", re.ASCII)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """Seconds in `30s`, `15m`, `12h` or `7d`; ArgumentTypeError for anything else."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration; use a number and a unit: 30s, 15m, 12h or 7d"
        )
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def parse_ttl(text: str) -> float | None:
    """`parse_duration`, or None for `never`; a zero duration is refused."""
    if text.strip() == "never":
        return None
    seconds = parse_duration(text)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a TTL must be longer than 0s (or 'never')")
    return seconds


def format_age(seconds: float) -> str:
    """A short human age: 45s, 12m, 5h, 3d."""
    for unit in ("d", "h", "m"):
        if seconds >= _UNIT_SECONDS[unit]:
            return f"{seconds / _UNIT_SECONDS[unit]:.0f}{unit}"
    return f"{seconds:.0f}s"
