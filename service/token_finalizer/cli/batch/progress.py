"""The progress bar of a batch on stderr (tqdm), and the line messages that interrupt it.

The bar advances by the bytes of each finished input line, so its share,
byte rate and ETA hold for records of any size; it also shows how many lines
are done and how many per second. It is drawn only when stderr is a terminal:
redirected to a file or a pipe, stderr holds the line messages and the
summary (JSON lines), nothing else.
"""

from __future__ import annotations

import logging
import sys
from collections import deque
from contextlib import nullcontext
from typing import TextIO

from tqdm import tqdm

from token_finalizer._constants import BATCH_PROGRESS_INTERVAL_S
from token_finalizer._logging import say

__all__ = ["Progress"]

_BAR_FORMAT = (
    "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} "
    "[{elapsed}<{remaining}, {rate_fmt}{postfix}]"
)


class Progress:
    """Count a batch's lines and show its progress on stderr, when stderr is a terminal.

    `advance` is called as each input line is read, `done_line` as each line
    is finished; lines finish in input order, so the oldest line read and not
    yet finished is the one `done_line` counts.
    """

    def __init__(self, verb: str, total_bytes: int, *, stream: TextIO | None = None) -> None:
        self.verb = verb
        self.lines = 0
        self.bytes_read = 0
        self._stream = stream if stream is not None else sys.stderr
        self._pending: deque[int] = deque()  # sizes of the lines read and not yet finished
        self._bar = tqdm(
            total=total_bytes,
            desc=verb,
            file=self._stream,
            disable=not self._stream.isatty(),
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            mininterval=BATCH_PROGRESS_INTERVAL_S,
            bar_format=_BAR_FORMAT,
            dynamic_ncols=True,
        )
        self.enabled = not self._bar.disable

    def advance(self, raw_size: int) -> None:
        """Count one input line read, of `raw_size` bytes."""
        self.bytes_read += raw_size
        self._pending.append(raw_size)

    def done_line(self) -> None:
        """Count one finished line: the bar moves by its bytes."""
        self.lines += 1
        size = self._pending.popleft() if self._pending else 0
        if self.enabled:
            elapsed = self._bar.format_dict["elapsed"]
            rate = f", {self.lines / elapsed:.1f} lines/s" if elapsed > 0 else ""
            self._bar.set_postfix_str(f"{self.lines} lines{rate}", refresh=False)
            self._bar.update(size)

    def report(self, number: int, message: str) -> None:
        """Say what went wrong with input line `number`, on a line of its own above the bar."""
        text = f"line {number}: {message}"
        # A JSON line like every other (docs/configuration.md#logs), the bar cleared around it.
        with tqdm.external_write_mode(file=self._stream) if self.enabled else nullcontext():
            say(logging.WARNING, text, line=number)

    def finish(self) -> None:
        """Leave the bar's final state on its own line (nothing when no bar is drawn)."""
        self._bar.close()
