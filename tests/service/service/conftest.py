"""Fixtures of the service-layer tests: a memory store holding one clean rollout."""

from __future__ import annotations

import pytest

from tests.support.captures import agent_rollout
from token_finalizer import MemoryTokenStore


@pytest.fixture
async def store() -> MemoryTokenStore:
    """A store holding one clean three-call rollout, `r-1`."""
    memory = MemoryTokenStore()
    for entry in agent_rollout("r-1", calls=3, new_tokens_per_turn=4):
        await memory.put(entry)
    return memory
