"""How a batch command runs: records through a target in input order, and its exit status.

Exit status (docs/configuration.md#batch-exit-status):

    0    every line was handled and none failed (masked records are not failures;
         with --allow-bad-lines, bad lines are not either)
    1    the batch stopped early: a failure every later line would meet too
    2    unusable arguments, files or configuration; nothing was done
    3    every line was handled, but some failed: bad lines, refused records or
         refused retire tickets (each reported on stderr and kept in OUT)
    130  interrupted
"""

from __future__ import annotations

import argparse
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

from token_finalizer._logging import say

if TYPE_CHECKING:
    from token_finalizer.cli.batch.targets import BatchTarget

__all__ = [
    "EXIT_LINES_FAILED",
    "EXIT_OK",
    "EXIT_STOPPED",
    "EXIT_USAGE",
    "UsageError",
    "in_order",
    "run_command",
]

EXIT_OK = 0
EXIT_STOPPED = 1
EXIT_USAGE = 2
EXIT_LINES_FAILED = 3
EXIT_INTERRUPTED = 130  # the shell's convention for SIGINT

_Item = TypeVar("_Item")
_Result = TypeVar("_Result")


class UsageError(Exception):
    """Arguments, files or configuration that cannot work (exit status 2, one line on stderr)."""


async def in_order(
    target: BatchTarget,
    step: Callable[[BatchTarget, _Item], Awaitable[_Result]],
    items: Iterator[_Item],
    concurrency: int,
    consume: Callable[[_Result], None],
) -> str | None:
    """Run `step` over `items` with bounded concurrency, consuming results in input order.

    Returns None when every item was handled, else why the batch stopped.
    The target is closed either way.
    """
    from token_finalizer.cli.batch.targets import BatchAbortedError
    from token_finalizer_client.transport import ordered_map

    try:
        results = ordered_map(lambda item: step(target, item), items, concurrency=concurrency)
        async with contextlib.aclosing(results):
            async for result in results:
                consume(result)
    except BatchAbortedError as exc:
        return str(exc)
    finally:
        await target.close()
    return None


def run_command(
    command: Callable[[argparse.Namespace], int], args: argparse.Namespace, name: str
) -> int:
    """`command`'s exit status, or 2 for a UsageError and 130 for an interrupt (both said).

    A UsageError is said in one line: `token-finalizer NAME: MESSAGE`.
    """
    try:
        return command(args)
    except UsageError as exc:
        say(logging.ERROR, f"token-finalizer {name}: {exc}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        # The lines written so far were fsynced on the way out.
        say(logging.ERROR, f"token-finalizer {name}: interrupted")
        return EXIT_INTERRUPTED
