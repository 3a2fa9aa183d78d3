"""Gym's own `run_conformance` on our sink, resolver and HttpTokenSource, no adapter."""

from __future__ import annotations

import uuid

from nemo_gym.token_id_capture.conformance import run_conformance

from token_finalizer_client import HttpLineageResolver, HttpTokenSink, HttpTokenSource

# Every check Gym 0.7.0 runs when the sink has `begin_call` and a resolver is given.
ALL_CHECKS = 10


async def test_run_conformance_passes_every_check(store_url: str) -> None:
    """All ten of Gym's contract checks pass against a real `store serve`."""
    passed = await run_conformance(
        lambda: HttpTokenSink(url=store_url),
        lambda: HttpTokenSource(store_url),
        lambda: HttpLineageResolver(url=store_url),
        rollout_id=f"conformance-{uuid.uuid4().hex[:8]}",
    )
    assert len(passed) == ALL_CHECKS, passed
