"""HttpLineageResolver against a real store server on loopback, in whichever form it answers.

A store that knows `tokens=compact` answers the match's ids as base64; one
that does not answers the plain list. Either way the resolver hands back the
exact cumulative ids of the call the request continues.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.gym_calls import Conversation
from tests.support.servers import running_app
from token_finalizer import MemoryTokenStore
from token_finalizer.store_server import create_store_app
from token_finalizer_client import HttpLineageResolver

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def store() -> MemoryTokenStore:
    """The memory store behind the module's store server."""
    return MemoryTokenStore()


@pytest.fixture(scope="module")
def store_url(store: MemoryTokenStore) -> Iterator[str]:
    """A store server over `store`, served by uvicorn on loopback."""
    with running_app(create_store_app(store)) as url:
        yield url


@pytest.mark.parametrize("delta", [False, True], ids=["full-prompts", "delta-prompts"])
async def test_a_long_chain_resolves_to_its_exact_ids(
    store: MemoryTokenStore, store_url: str, delta: bool
) -> None:
    """Ten committed calls: the next request resolves to the tenth with its whole cumulative ids."""
    talk = Conversation(f"chain-{'delta' if delta else 'full'}")
    parent = None
    for turn in range(10):
        call_id = f"call-{turn}"
        new_prompt = [1000 * turn + n for n in range(300)]
        generation = [150_000 + 1000 * turn + n for n in range(50)]
        entry = talk.call(
            call_id,
            f"turn {turn}",
            new_prompt=new_prompt,
            generation=generation,
            parent_call_id=parent,
            delta=delta and parent is not None,
        )
        await store.put(entry)
        parent = call_id
    async with HttpLineageResolver(url=store_url) as resolver:
        resolution = await resolver.resolve(talk.rollout_id, talk.items)
    assert resolution.match is not None
    assert resolution.match.model_call_id == "call-9"
    assert resolution.match.cumulative_token_ids == tuple(talk.cumulative["call-9"])


async def test_turn_by_turn_resolves_name_the_last_match_and_stay_exact(
    store: MemoryTokenStore, store_url: str
) -> None:
    """Each resolve names the previous match as known; every answer rebuilds the exact ids."""
    talk = Conversation("turns")
    parent = None
    async with HttpLineageResolver(url=store_url) as resolver:
        for turn in range(6):
            call_id = f"call-{turn}"
            entry = talk.call(
                call_id,
                f"turn {turn}",
                new_prompt=[1000 * turn + n for n in range(40)],
                generation=[150_000 + turn],
                parent_call_id=parent,
                delta=parent is not None,
            )
            await store.put(entry)
            parent = call_id
            resolution = await resolver.resolve(talk.rollout_id, talk.items)
            assert resolution.match is not None
            assert resolution.match.cumulative_token_ids == tuple(talk.cumulative[call_id])
            known = resolver._known_ids().get(talk.rollout_id)
            assert known is not None and known.ids == tuple(talk.cumulative[call_id])
