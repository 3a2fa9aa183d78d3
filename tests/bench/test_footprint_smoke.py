"""The footprint bench at a tiny size: every side is measured, and the report names them."""

from __future__ import annotations

import math
import struct

import pytest

from bench._hotpath_workload import Workload
from bench.footprint import floor_bytes, measure, report, staged_footprints, wire_bytes
from tests.support.redis import redis_url

pytestmark = pytest.mark.anyio


async def test_every_side_is_measured_against_the_floor() -> None:
    """Gym's stand-in and our directory are measured; a full-prompt rollout costs us less."""
    workload = Workload(rollouts=1, calls=4, delta=False)
    rows = await measure(workload, ("dir",), redis_url(), None)
    assert [row.side for row in rows] == ["gym stand-in", "ours dir"]
    assert all(math.isfinite(row.ratio) and row.ratio > 0 for row in rows)
    assert rows[1].bytes_per_rollout < rows[0].bytes_per_rollout
    assert rows[0].floor_per_rollout == floor_bytes(workload)


async def test_the_report_shows_the_wire_bytes_of_both_prompt_forms() -> None:
    """Our sink's delta put of a full-prompt call is smaller than the full put, and the
    report says both."""
    workload = Workload(rollouts=1, calls=3, delta=False)
    full, sent, delta = wire_bytes(workload)
    assert full > sent > 0 and delta > 0
    rows = await measure(workload, (), redis_url(), None)
    assert f"{full / 1e3:.1f} KB full prompt" in report(rows, (full, sent, delta), workload)


def test_staged_calls_are_measured_against_the_same_floor() -> None:
    """The staged layout is staged through the sink into a directory and weighed there."""
    workload = Workload(rollouts=1, calls=3, delta=False)
    (row,) = staged_footprints(workload, ("dir",), redis_url(), None)
    assert (row.side, row.layout, row.log_probs) == ("ours dir", "staged", "f32")
    assert row.floor_per_rollout == floor_bytes(workload) and row.ratio > 0


def test_float32_log_probs_are_exact_float32_values() -> None:
    """The default workload's log probs round-trip through float32 (as an engine's do)."""
    call = Workload(rollouts=1, calls=1, delta=False).scripts()[0].next_call()
    values = call.generation_log_probs
    assert values == list(
        struct.unpack(f"<{len(values)}f", struct.pack(f"<{len(values)}f", *values))
    )
