"""How the batch commands' reports count things: `1 line`, `2 lines`."""

from __future__ import annotations

__all__ = ["counted"]


def counted(number: int, noun: str) -> str:
    """`number` with `noun`, plural unless it is exactly one (`0 lines`, `1 line`)."""
    return f"{number} {noun}{'' if number == 1 else 's'}"
