"""Two model-server-shaped writers, then Gym's consumer (`trajectories_from_source`) on our source.

Server A records the first call of a rollout, server B (another sink and
resolver, as another Gym model server process) resolves the continuation
through the store and records the second call. Gym's
`trajectories_from_source` then builds from our `HttpTokenSource`, each step
on an `asyncio.run` of its own (the drop included: once "Event loop is
closed"). What Gym computes is written to
`tests/vectors/nemo_gym_0_7_consumer/consumer.json` with
`GYM_WRITE_VECTORS=1`, else compared with it; `tests/client/test_gym_consumer_vectors.py`
checks our classes against those vectors in CI, without Gym.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from pathlib import Path
from typing import Any

from nemo_gym.token_id_capture.consumer import trajectories_from_source
from nemo_gym.token_id_capture.lineage import stamp_continuation
from nemo_gym.token_id_capture.records import ParentResolutionStatus, TokenEntry, stamp_lineage

from token_finalizer_client import HttpLineageResolver, HttpTokenSink, HttpTokenSource

VECTORS = (
    Path(__file__).resolve().parents[1] / "vectors" / "nemo_gym_0_7_consumer" / "consumer.json"
)
REQUEST = [{"role": "user", "content": "What is the weather in Paris?"}]
FOLLOW_UP = {"role": "user", "content": "And tomorrow?"}


def _message(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text}],
    }


def _entry(
    rollout_id: str, call_id: str, prompt: list[int], generation: list[int], text: str
) -> TokenEntry:
    return TokenEntry(
        rollout_id=rollout_id,
        model_call_id=call_id,
        model="m",
        prompt_token_ids=prompt,
        generation_token_ids=generation,
        generation_log_probs=[-0.25] * len(generation),
        output_items=[_message(text)],
        token_item_index=0,
        response_id=f"resp-{call_id}",
        created_at=1700000000.0,
    )


async def _server_a(url: str, rollout_id: str) -> TokenEntry:
    """The first call: a root, recorded by one model server."""
    entry = _entry(rollout_id, "call-1", [1, 2, 3], [4, 5], "It is sunny.")
    stamp_continuation(entry, REQUEST)
    stamp_lineage(entry, None, parent_resolution=ParentResolutionStatus.ROOT)
    async with HttpTokenSink(url=url) as sink:
        await sink.begin_call(rollout_id, entry.model_call_id)
        await sink.put(entry)
    return entry


async def _server_b(url: str, rollout_id: str, parent: TokenEntry) -> TokenEntry:
    """The continuation: resolved through the store by another server, then recorded there."""
    items = [*REQUEST, *parent.output_items, FOLLOW_UP]
    resolver = HttpLineageResolver(url=url)
    resolution = await resolver.resolve(rollout_id, items)
    await resolver.close()
    assert resolution.status.value == "resolved", resolution
    prompt = [*parent.prompt_token_ids, *parent.generation_token_ids, 6, 7]
    entry = _entry(rollout_id, "call-2", prompt, [8, 9], "Rain tomorrow.")
    stamp_continuation(entry, items)
    stamp_lineage(
        entry, resolution.match.model_call_id, parent_resolution=ParentResolutionStatus.RESOLVED
    )
    async with HttpTokenSink(url=url) as sink:
        await sink.begin_call(rollout_id, entry.model_call_id)
        await sink.put(entry)
    return entry


def _outcome(built: dict[str, Any]) -> dict[str, Any]:
    """What Gym's build says, without the ids that differ between runs."""
    return {
        "mask_sample": bool(built.get("mask_sample")),
        "error": built.get("error"),
        "rebuilt_output": (built.get("rebuilt_response") or {}).get("output"),
        "metrics": built.get("metrics"),
    }


def test_two_servers_then_gyms_consumer_on_our_source(store_url: str) -> None:
    """Gym builds the two-call chain from our source, and the drop on a later loop retires it."""
    rollout_id = f"consumer-{uuid.uuid4().hex[:8]}"
    first = asyncio.run(_server_a(store_url, rollout_id))
    second = asyncio.run(_server_b(store_url, rollout_id, first))
    source = HttpTokenSource(store_url)
    verified = {"id": "resp-call-2", "model": "m", "output": [_message("Rain tomorrow.")]}
    built = asyncio.run(
        trajectories_from_source(rollout_id, source, model="m", verified_response=verified)
    )
    assert built is not None and not built.get("mask_sample"), built
    frozen = built["_capture_snapshot"]
    dropped = asyncio.run(source.drop(rollout_id, **frozen))
    again = asyncio.run(source.drop(rollout_id, **frozen))
    asyncio.run(source.close())
    vector = {
        "entries": [entry.model_dump(mode="json") for entry in (first, second)],
        "verified_response": verified,
        "gym": _outcome(built),
        "drops": [dropped, again],
    }
    if os.environ.get("GYM_WRITE_VECTORS") == "1":
        VECTORS.parent.mkdir(parents=True, exist_ok=True)
        VECTORS.write_text(json.dumps(_portable(vector), indent=1, sort_keys=True) + "\n")
    expected = json.loads(VECTORS.read_text())
    assert _portable(vector) == expected


def _portable(vector: dict[str, Any]) -> Any:
    """The vector with the run's rollout id replaced by a fixed one."""
    text = json.dumps(vector, sort_keys=True)
    rollout_id = vector["entries"][0]["rollout_id"]
    return json.loads(text.replace(rollout_id, "consumer-r"))
