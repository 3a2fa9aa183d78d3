"""The hot-path bench's pieces at tiny sizes: every side completes and yields its numbers.

Nothing here is timed: the driver itself checks every resolve (status, parent,
cumulative ids), so a side that resolves wrongly fails these runs.
"""

from __future__ import annotations

import math
from pathlib import Path

import orjson
import pytest

from bench._hotpath_driver import SideSamples, run_side
from bench._hotpath_sides import StandInSide, served_side
from bench._hotpath_tracing import caller_scope, otlp_receiver_process, tracing_env
from bench._hotpath_workload import Workload
from tests.support.redis import redis_url

ROLLOUTS, CALLS, BURSTS = 2, 3, 2


def _complete(samples: SideSamples) -> bool:
    timed = [*samples.capture, *samples.resolve, *samples.begin, *samples.put]
    return (
        len(samples.capture) == len(samples.resolve) == ROLLOUTS * CALLS
        and sorted(samples.turns) == sorted(list(range(CALLS)) * ROLLOUTS)
        and len(samples.alone) == ROLLOUTS
        and len(samples.burst) == ROLLOUTS * BURSTS
        and all(math.isfinite(ms) and ms >= 0 for ms in [*timed, *samples.alone, *samples.burst])
    )


@pytest.mark.anyio
@pytest.mark.parametrize("delta", [True, False])
async def test_stand_in_side_completes_every_phase(tmp_path: Path, delta: bool) -> None:
    """The in-process baseline captures and resolves every call of every rollout."""
    workload = Workload(rollouts=ROLLOUTS, calls=CALLS, delta=delta)
    samples = await run_side(StandInSide(tmp_path), workload, burst_rounds=BURSTS)
    assert _complete(samples)


@pytest.mark.anyio
async def test_stand_in_stores_resolved_calls_as_deltas(tmp_path: Path) -> None:
    """In the delta layout the baseline's file holds delta prompts for every resolved call."""
    workload = Workload(rollouts=1, calls=CALLS, delta=True)
    await run_side(StandInSide(tmp_path), workload, burst_rounds=0)
    (capture,) = tmp_path.glob("*.tokens.jsonl")
    lines = [orjson.loads(line) for line in capture.read_bytes().splitlines()]
    assert [line["prompt_is_delta"] for line in lines] == [False, True, True]
    assert all(len(line["prompt_token_ids"]) == workload.new_prompt_tokens for line in lines)


@pytest.mark.anyio
async def test_store_serve_side_completes_every_phase() -> None:
    """`store serve --dir` via the client's sink and resolver captures and resolves every call."""
    workload = Workload(rollouts=ROLLOUTS, calls=CALLS, delta=True)
    async with served_side("dir", redis_url()) as side:
        samples = await run_side(side, workload, burst_rounds=BURSTS)
    assert _complete(samples)


@pytest.mark.anyio
async def test_traced_store_serve_side_completes_and_exports_its_spans() -> None:
    """Traced (`--tracing sdk`): every phase completes and the store's spans reach the receiver."""
    workload = Workload(rollouts=ROLLOUTS, calls=CALLS, delta=True)
    with otlp_receiver_process() as receiver:
        env = tracing_env(receiver.endpoint)
        async with served_side("dir", redis_url(), env=env) as side:
            samples = await run_side(side, workload, burst_rounds=BURSTS, scope=caller_scope())
    # A server span per request at least: resolve, begin_call and put per call, the resolves after.
    requests = 3 * ROLLOUTS * CALLS + ROLLOUTS * (1 + BURSTS)
    assert _complete(samples)
    assert (receiver.spans or 0) >= requests
