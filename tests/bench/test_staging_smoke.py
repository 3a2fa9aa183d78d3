"""The staging bench's pieces at tiny sizes: every stage succeeds, the finalize verifies.

Nothing here is timed; the runs check what the bench reports on.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench._staging_finalize import finalize_servers, run_ours, stage_rollout
from bench._staging_stage import run_stage_bench, staging_store


@pytest.mark.parametrize("backend", ["dir", "redis"])
def test_every_stage_of_every_thread_succeeds(backend: str, tmp_path: Path) -> None:
    """Two threads, two chains of two calls each: four stages timed, none failed."""
    with staging_store(backend, tmp_path) as url:
        run = run_stage_bench(
            url, backend, threads=2, rollouts_per_thread=1, calls=2, prompt=8, generated=8
        )
    assert (len(run.latencies), run.failures) == (4, 0)


def test_the_finalize_side_answers_the_verified_row(tmp_path: Path) -> None:
    """A five-call staged rollout finalizes through the client into its whole row."""
    captures = tmp_path / "capture"
    record = stage_rollout(captures, calls=5, carry=4, generated=2)
    with finalize_servers(captures) as (_, finalizer):
        run = run_ours(finalizer, record, rounds=1)
    assert (run.tokens, len(run.times["total"])) == (30, 1)
