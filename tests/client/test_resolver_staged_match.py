"""How HttpLineageResolver reads a match over capture-ledger rows (NeMo Gym 0.7's external staging).

Such a match carries no token ids: `prev_len` is the parent's `cum_len`,
`staging_chain` names the staged calls of its prefix and `chain_hash` is
what the child chains onto. Anything inconsistent is a lookup error.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from token_finalizer_client import HttpLineageResolver, LineageMatch

pytestmark = pytest.mark.anyio

ITEMS = [
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "3+3?"},
]
CHAIN_HASH = "4b135e463cdfe0acbd5d85cc7fffb21685bf01dd2a14b5059f94f21cf6844eb8"
STAGED = {
    "model_call_id": "c2",
    "cumulative_token_ids": [],
    "digest": "0b5801917cef4ce7ee2f47d03560e95b0ef7835787b5270bf632e10462de0194",
    "prev_len": 8,
    "staging_chain": ["r1/c1", "r1/c2"],
    "chain_hash": CHAIN_HASH,
}


async def _resolve(match: dict[str, Any]) -> Any:
    body = {"status": "resolved", "reason": "", "match": match}
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json=body))
    resolver = HttpLineageResolver(url="http://store.test", transport=transport)
    try:
        return await resolver.resolve("r1", ITEMS)
    finally:
        await resolver.close()


async def test_a_staged_match_carries_its_chain() -> None:
    """A ledger match resolves with no ids, prev_len = cum_len, its staging chain and chain hash."""
    resolution = await _resolve(STAGED)
    assert resolution.match == LineageMatch(
        model_call_id="c2",
        cumulative_token_ids=(),
        digest=STAGED["digest"],
        prev_len=8,
        staging_chain=("r1/c1", "r1/c2"),
        chain_hash=CHAIN_HASH,
    )


async def test_a_staged_match_in_the_compact_form_is_read() -> None:
    """The compact form of no ids (length 0, empty data) reads the same match."""
    match = {key: value for key, value in STAGED.items() if key != "cumulative_token_ids"}
    match["cumulative_tokens"] = {"encoding": "u32le", "length": 0, "data": ""}
    resolution = await _resolve(match)
    assert resolution.match is not None and resolution.match.staging_chain == ("r1/c1", "r1/c2")


async def test_an_entries_match_keeps_an_empty_chain() -> None:
    """A match over token entries still reads its ids, with an empty chain and chain hash."""
    match = {"model_call_id": "c1", "cumulative_token_ids": [1, 2], "digest": "d", "prev_len": 2}
    resolution = await _resolve(match)
    assert resolution.match is not None
    assert (resolution.match.staging_chain, resolution.match.chain_hash) == ((), "")


@pytest.mark.parametrize(
    "change",
    [
        {"cumulative_token_ids": [1, 2, 3, 4, 5, 6, 7, 8]},
        {"prev_len": 0},
        {"chain_hash": "not-a-digest"},
        {"chain_hash": ""},
        {"staging_chain": "r1/c1"},
        {"staging_chain": ["r1/c1", ""]},
        {"staging_chain": []},
        {"staging_chain": ["cl-other/c1", "r1/c2"]},
        {"staging_chain": ["r10/c1", "r1/c2"]},
        {"staging_chain": ["r1/c2", "r1/c1"]},
        {"staging_chain": ["cl-other/c2"]},
    ],
    ids=[
        "ids-present",
        "prev-len-zero",
        "chain-hash-not-hex",
        "chain-without-hash",
        "chain-not-a-list",
        "empty-key",
        "hash-without-chain",
        "another-rollouts-key",
        "a-rollout-id-prefix",
        "last-not-the-match",
        "only-another-rollout",
    ],
)
async def test_an_inconsistent_staged_match_is_a_lookup_error(change: dict[str, Any]) -> None:
    """A staged match breaking any of its rules answers unresolved with reason lookup_error."""
    resolution = await _resolve({**STAGED, **change})
    assert (str(resolution.status), resolution.reason) == ("unresolved", "lookup_error")
