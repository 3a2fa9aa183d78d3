"""bench.load, the captures: written before the clock starts, checked after the run.

Every rollout of the run is captured with `FileTokenStore.put` (fsynced per
call, as model servers write them) by several writer processes. At the end,
each rollout's stored state is read back: only a capture its client retired
may be gone.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from bench.service import LARGE_CALLS, LARGE_TOKENS_PER_TURN, SMALL_CALLS, SMALL_TOKENS_PER_TURN
from tests.support.captures import agent_rollout
from token_finalizer import FileTokenStore

__all__ = ["CaptureCheck", "check_captures", "write_pool", "write_rollouts"]

WRITE_CHUNK = 200  # small rollouts per writer task
WRITE_CONCURRENCY = 8  # puts in flight per writer process: each one waits on fsync


async def _put_rollouts(directory: str, rollout_ids: list[str], calls: int, tokens: int) -> None:
    store = FileTokenStore(directory)
    pending = iter(rollout_ids)

    async def writer() -> None:
        for rollout_id in pending:
            for entry in agent_rollout(rollout_id, calls=calls, new_tokens_per_turn=tokens):
                await store.put(entry)

    await asyncio.gather(*(writer() for _ in range(WRITE_CONCURRENCY)))


def write_rollouts(directory: str, rollout_ids: list[str], calls: int, tokens: int) -> None:
    """Capture every rollout of `rollout_ids` with `FileTokenStore.put` (in a writer process)."""
    asyncio.run(_put_rollouts(directory, rollout_ids, calls, tokens))


def write_pool(directory: Path, small_ids: list[str], large_ids: list[str], writers: int) -> float:
    """Write all captures of the run with `writers` processes; the seconds it took."""
    started = time.perf_counter()
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(writers, mp_context=context) as pool:
        jobs = [
            pool.submit(
                write_rollouts, str(directory), [rollout_id], LARGE_CALLS, LARGE_TOKENS_PER_TURN
            )
            for rollout_id in large_ids
        ]
        jobs += [
            pool.submit(
                write_rollouts,
                str(directory),
                small_ids[first : first + WRITE_CHUNK],
                SMALL_CALLS,
                SMALL_TOKENS_PER_TURN,
            )
            for first in range(0, len(small_ids), WRITE_CHUNK)
        ]
        for job in concurrent.futures.as_completed(jobs):
            job.result()
    return time.perf_counter() - started


@dataclass
class CaptureCheck:
    """Every rollout's outcome, and the captures that should exist but do not."""

    outcomes: Counter[str]
    lost: Counter[str]
    retired_but_present: int


def check_captures(
    directory: Path, rollout_ids: list[str], outcomes: dict[str, str]
) -> CaptureCheck:
    """Read each rollout's state: only a capture its client retired may be gone.

    A finalized-but-kept, masked, failed or untouched capture must still be
    there (state not retired, JSONL present); one whose retire got no answer
    may be either way.
    """
    store = FileTokenStore(directory)
    check = CaptureCheck(Counter(), Counter(), 0)
    for rollout_id in rollout_ids:
        outcome = outcomes.get(rollout_id, "untouched")
        check.outcomes[outcome] += 1
        state = asyncio.run(store.admin.status(rollout_id))
        present = (
            state is not None
            and not state.retired
            and (directory / f"{rollout_id}.tokens.jsonl").exists()
        )
        if outcome == "retired":
            check.retired_but_present += present
        elif outcome != "retire unknown" and not present:
            check.lost[outcome] += 1
    return check
