"""POST /finalize?tokens=compact: the context once, prompts as prefix lengths into it.

A compact answer loses nothing: expanding each item's `prompt_token_ids`
(an int n) to `context_token_ids[:n]` and dropping `context_token_ids` gives
the plain answer, byte for byte. Its size grows with the context, not with
calls x context.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.support.asgi import in_process
from tests.support.captures import agent_rollout, make_entry, record_for
from token_finalizer import MemoryTokenStore
from token_finalizer.api import create_app
from token_finalizer.settings import settings_from_mapping

SOURCE = "mem"
IDENTITY = {"Accept-Encoding": "identity"}
_ids = itertools.count()


@dataclass
class Service:
    """An in-process finalizer whose source `mem` is a memory store the test writes into."""

    client: httpx.Client
    store: MemoryTokenStore

    def write(self, entries: list[dict[str, Any]]) -> None:
        async def put_all() -> None:
            for entry in entries:
                await self.store.put(entry)

        anyio.run(put_all)

    def finalize(self, record: dict[str, Any], *, compact: bool) -> httpx.Response:
        params = {"source": SOURCE, "tokens": "compact" if compact else "plain"}
        response = self.client.post("/finalize", json=record, params=params, headers=IDENTITY)
        assert response.status_code == 200, response.text
        return response


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """One app for the module (hypothesis examples included); each rollout id is fresh."""
    capture_dir: Path = tmp_path_factory.mktemp("capture")
    config = {"sources": {"local": {"kind": "file", "dir": str(capture_dir)}}}
    store = MemoryTokenStore()
    app = create_app(settings_from_mapping(config, env={}), sources={SOURCE: store})
    with in_process(app) as client:
        yield Service(client, store)


def expand(compact: dict[str, Any]) -> dict[str, Any]:
    """The plain answer a compact one stands for: prompt = context[:n], no context key."""
    answer = dict(compact)
    context = answer.pop("context_token_ids")
    if context is None:
        return answer
    record = answer["record"]
    output = [
        {**item, "prompt_token_ids": context[: item["prompt_token_ids"]]}
        if isinstance(item, dict) and isinstance(item.get("prompt_token_ids"), int)
        else item
        for item in record["response"]["output"]
    ]
    answer["record"] = {**record, "response": {**record["response"], "output": output}}
    return answer


# -- random rollouts ---------------------------------------------------------------------

token = st.integers(0, 2**31 - 1)
log_prob = st.floats(-40.0, 0.0, allow_nan=False, allow_infinity=False)
output_item = st.one_of(
    st.builds(
        lambda text: {"type": "message", "role": "assistant", "content": text},
        st.text(max_size=12),
    ),
    st.builds(
        lambda name, turn: {
            "type": "function_call",
            "name": name,
            "call_id": f"tool-{turn}",
            "arguments": orjson.dumps({"turn": turn}).decode(),
        },
        st.sampled_from(["bash", "edit_file", "search"]),
        st.integers(0, 999),
    ),
    st.just({"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]}),
)


def _routed_experts(draw: st.DrawFn, tokens: int) -> list[list[int]] | None:
    """Per generated token, the experts it was routed to (or none recorded)."""
    if not draw(st.booleans()):
        return None
    per_token = st.lists(st.integers(0, 127), min_size=1, max_size=4)
    return draw(st.lists(per_token, min_size=tokens, max_size=tokens))


@st.composite
def built_chain(draw: st.DrawFn, rollout_id: str) -> list[dict[str, Any]]:
    """A chain of calls with random items, tool-call outputs and optional routed experts."""
    context = draw(st.lists(token, min_size=1, max_size=20))
    entries = []
    for turn in range(draw(st.integers(1, 6))):
        generation = draw(st.lists(token, min_size=1, max_size=8))
        items = draw(st.lists(output_item, min_size=1, max_size=3))
        index = draw(st.none() | st.integers(0, len(items) - 1))
        routed = _routed_experts(draw, len(generation))
        extra = {} if routed is None else {"routed_experts": routed}
        entries.append(
            make_entry(
                rollout_id,
                f"call-{turn:03d}",
                context,
                generation,
                log_probs=draw(
                    st.lists(log_prob, min_size=len(generation), max_size=len(generation))
                ),
                output_items=items,
                token_item_index=index,
                created_at=float(turn),
                **extra,
            )
        )
        interstitial = draw(st.lists(token, max_size=8))
        context = [*context, *generation, *interstitial]
    return entries


@st.composite
def agent_chain(draw: st.DrawFn, rollout_id: str) -> list[dict[str, Any]]:
    """An agent_rollout (function_call outputs) with routed experts on some calls."""
    entries = agent_rollout(
        rollout_id,
        calls=draw(st.integers(1, 8)),
        new_tokens_per_turn=draw(st.integers(2, 40)),
        first_prompt=draw(st.none() | st.integers(1, 30)),
        seed=draw(st.integers(0, 2**16)),
    )
    for entry in entries:
        routed = _routed_experts(draw, len(entry["generation_token_ids"]))
        if routed is not None:
            entry["routed_experts"] = routed
    return entries


@st.composite
def rollouts(draw: st.DrawFn) -> tuple[str, list[dict[str, Any]]]:
    """A fresh rollout id and its capture: a clean chain, or one that builds masked."""
    rollout_id = f"prop-{next(_ids)}"
    entries = draw(st.one_of(built_chain(rollout_id), agent_chain(rollout_id)))
    shape = draw(st.sampled_from(["chain", "chain", "second_root", "retry"]))
    if shape == "second_root":  # masked multiple_roots, still rebuilt
        entries.append(make_entry(rollout_id, "stray", [2**31 - 1, 0], [1], created_at=99.0))
    elif shape == "retry":  # masked unresolved_retries, still rebuilt
        last = entries[-1]
        retry = [*last["generation_token_ids"], 0]
        entries.append(make_entry(rollout_id, "retry", last["prompt_token_ids"], retry))
    return rollout_id, entries


@given(rollout=rollouts())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_expanded_compact_answer_is_the_plain_answer(
    service: Service, rollout: tuple[str, list[dict[str, Any]]]
) -> None:
    """For any rollout, the compact answer expanded is the plain answer, byte for byte."""
    rollout_id, entries = rollout
    service.write(entries)
    plain = service.finalize(record_for(rollout_id), compact=False)
    compact = service.finalize(record_for(rollout_id), compact=True)
    answer = compact.json()
    event(f"mask_reason={answer['build'].get('mask_reason')}")
    event(f"compacted={answer['context_token_ids'] is not None}")
    event(f"routed_experts={any('routed_experts' in e for e in entries)}")
    assert orjson.dumps(expand(answer)) == plain.content


# -- nothing rebuilt: nothing compacted -----------------------------------------------------


def test_record_carrying_its_own_tokens_is_not_compacted(service: Service) -> None:
    """A record with its own tokens: context_token_ids null and the record exactly as posted."""
    rollout_id = f"own-{next(_ids)}"
    service.write([make_entry(rollout_id, "c1", [1, 2], [3])])
    record = record_for(rollout_id)
    record["response"]["output"][0].update(prompt_token_ids=[1, 2], generation_token_ids=[3])
    answer = service.finalize(record, compact=True).json()
    assert (answer["context_token_ids"], answer["record"]) == (None, record)
    assert answer["build"]["_redundant_capture"] is True


def test_masked_build_without_output_has_no_context(service: Service) -> None:
    """A build with no rebuilt output (empty capture) answers context_token_ids null."""
    answer = service.finalize(record_for(f"never-{next(_ids)}"), compact=True).json()
    assert (answer["build"]["mask_reason"], answer["context_token_ids"]) == ("empty_capture", None)
    assert answer["record"]["response"]["output"] == record_for("x")["response"]["output"]


def test_compact_context_is_the_final_cumulative_sequence(service: Service) -> None:
    """context_token_ids is the last call's prompt plus its generation; prompts are lengths."""
    rollout_id = f"ctx-{next(_ids)}"
    entries = agent_rollout(rollout_id, calls=4, new_tokens_per_turn=12)
    service.write(entries)
    answer = service.finalize(record_for(rollout_id), compact=True).json()
    last = entries[-1]
    assert answer["context_token_ids"] == last["prompt_token_ids"] + last["generation_token_ids"]
    prompts = [item["prompt_token_ids"] for item in answer["record"]["response"]["output"]]
    assert prompts == [len(entry["prompt_token_ids"]) for entry in entries]


def test_plain_answer_has_no_context_key(service: Service) -> None:
    """Without tokens=compact the answer has no context_token_ids and full prompt arrays."""
    rollout_id = f"plain-{next(_ids)}"
    service.write(agent_rollout(rollout_id, calls=2, new_tokens_per_turn=10))
    answer = service.finalize(record_for(rollout_id), compact=False).json()
    assert "context_token_ids" not in answer
    assert all(
        isinstance(item["prompt_token_ids"], list)
        for item in answer["record"]["response"]["output"]
    )


# -- size: the context once -------------------------------------------------------------------

BYTES_PER_CONTEXT_TOKEN = 8
# An item's own fields: its generation ids (8 bytes each) and log probs (24 each),
# plus a fixed allowance for its keys, type, name and arguments.
BYTES_PER_GENERATED_TOKEN = 8 + 24
BYTES_PER_ITEM = 256
# The answer around the output: record fields, build metrics, retire ticket.
ENVELOPE_BYTES = 4096


def _hundred_calls(service: Service) -> tuple[str, list[dict[str, Any]]]:
    rollout_id = f"big-{next(_ids)}"
    entries = agent_rollout(rollout_id, calls=100, new_tokens_per_turn=200)
    service.write(entries)
    return rollout_id, entries


def _bound(entries: list[dict[str, Any]]) -> int:
    last = entries[-1]
    context = len(last["prompt_token_ids"]) + len(last["generation_token_ids"])
    items = sum(
        BYTES_PER_GENERATED_TOKEN * len(entry["generation_token_ids"]) + BYTES_PER_ITEM
        for entry in entries
    )
    return BYTES_PER_CONTEXT_TOKEN * context + items + ENVELOPE_BYTES


def test_compact_answer_size_grows_with_the_context(service: Service) -> None:
    """A 100-call compact answer is at most 8 bytes per context token plus per-item overhead."""
    rollout_id, entries = _hundred_calls(service)
    compact = service.finalize(record_for(rollout_id), compact=True)
    assert len(compact.content) <= _bound(entries)


def test_plain_answer_exceeds_the_compact_bound(service: Service) -> None:
    """The same 100-call rollout's plain answer is over ten times that bound (calls x context)."""
    rollout_id, entries = _hundred_calls(service)
    plain = service.finalize(record_for(rollout_id), compact=False)
    assert len(plain.content) > 10 * _bound(entries)
