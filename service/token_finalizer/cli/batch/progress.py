"""The one-line progress bar of a batch on stderr, and the line messages that interrupt it."""

from __future__ import annotations

import sys
import time

from token_finalizer._constants import BATCH_PROGRESS_INTERVAL_S

__all__ = ["Progress"]

_BAR_WIDTH = 30


class Progress:
    """A one-line progress bar on stderr, drawn only when stderr is a terminal."""

    def __init__(self, verb: str, total_bytes: int) -> None:
        self.verb = verb
        self.total_bytes = total_bytes
        self.enabled = sys.stderr.isatty()
        self.lines = 0
        self.bytes_read = 0
        self._started = time.monotonic()
        self._drawn = 0.0

    def advance(self, raw_size: int) -> None:
        """Count bytes read from the input (the bar's position)."""
        self.bytes_read += raw_size

    def done_line(self) -> None:
        """Count one finished line; redraw when the last drawing is old enough."""
        self.lines += 1
        now = time.monotonic()
        if self.enabled and now - self._drawn >= BATCH_PROGRESS_INTERVAL_S:
            self._drawn = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        share = min(self.bytes_read / self.total_bytes, 1.0) if self.total_bytes else 1.0
        filled = int(share * _BAR_WIDTH)
        rate = self.lines / max(now - self._started, 1e-9)
        sys.stderr.write(
            f"\r{self.verb} [{'#' * filled}{'.' * (_BAR_WIDTH - filled)}] {share:4.0%} "
            f"{self.lines} lines {rate:.1f}/s"
        )
        sys.stderr.flush()

    def report(self, number: int, message: str) -> None:
        """Say what went wrong with input line `number`, on a line of its own."""
        self.clear()
        sys.stderr.write(f"line {number}: {message}\n")

    def clear(self) -> None:
        """Erase the bar so that a message can take its line (the next draw restores it)."""
        if self.enabled and self._drawn:
            sys.stderr.write("\r\x1b[K")

    def finish(self) -> None:
        """Leave the bar's final state on its own line."""
        if self.enabled and self._drawn:
            self._draw(time.monotonic())
            sys.stderr.write("\n")
            sys.stderr.flush()
