"""How a batch command runs: records through a target in input order, and its exit status.

Exit status: 0 when every line was handled (bad lines included), 1 when the
batch stopped early, 2 for unusable arguments or configuration, 130 when
interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from token_finalizer.cli.batch.targets import BatchTarget

__all__ = ["EXIT_OK", "EXIT_STOPPED", "EXIT_USAGE", "UsageError", "in_order", "run_command"]

EXIT_OK = 0
EXIT_STOPPED = 1
EXIT_USAGE = 2
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
        sys.stderr.write(f"token-finalizer {name}: {exc}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        # The lines written so far were fsynced on the way out.
        sys.stderr.write(f"\ntoken-finalizer {name}: interrupted\n")
        return EXIT_INTERRUPTED
