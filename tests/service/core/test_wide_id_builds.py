"""Ids anywhere in [0, 2**64) survive parsing, building, projecting and encoding exactly."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.captures import make_entry, record_for
from tests.support.lineage import stamp_lineage
from tests.support.wide_ids import expected_items, token_items, wide_rollout
from token_finalizer.api.encoding import finalize_answer_pieces
from token_finalizer.core.codec import dumps_entry_line, encode_json
from token_finalizer.core.compact_tokens import compact_output
from token_finalizer.core.digest_batch import DigestBatch
from token_finalizer.core.entries import Snapshot, TokenEntry, uniform_token_arrays
from token_finalizer.core.errors import TokenEntryError, TokenIdOutOfRange
from token_finalizer.core.rebuild import rebuild_snapshot
from token_finalizer.core.tape import Tape
from token_finalizer.core.token_digest import token_digest
from token_finalizer.sources._entries import parse_capture

IDS = st.one_of(st.integers(0, 1000), st.integers(0, 2**64 - 1), st.just(2**64 - 1))
RUNS = st.lists(IDS, min_size=1, max_size=6)


def _snapshot(entries: list[dict[str, Any]]) -> Snapshot:
    """The snapshot a file or Redis store hands over for these entries (lines parsed as stored)."""
    lines = [dumps_entry_line(entry) for entry in entries]
    parsed = parse_capture(lines, entries[0]["rollout_id"], "test capture")
    return Snapshot(entries[0]["rollout_id"], parsed, False, "snap", 1)


def _unmasked_build(entries: list[dict[str, Any]]) -> dict[str, Any]:
    build = rebuild_snapshot(_snapshot(entries), record=record_for(entries[0]["rollout_id"]))
    assert not build.mask_sample, build.to_dict(with_response=False)
    assert build.rebuilt_response is not None
    return build.rebuilt_response


@pytest.mark.parametrize(
    ("lineage", "delta"),
    [(False, False), (True, False), (True, True)],
    ids=["seed", "lineage", "delta"],
)
def test_wide_ids_build_unmasked_and_exact(lineage: bool, delta: bool) -> None:
    """Seed, lineage and delta captures mixing ids near 2**64 with small ones build exactly."""
    response = _unmasked_build(wide_rollout("r", lineage=lineage, delta=delta))
    assert token_items({"response": response}) == expected_items("r")


def test_entry_with_wide_ids_holds_uint64() -> None:
    """An entry with an id of 2**63 or more holds uint64 arrays with every id exact."""
    entry = TokenEntry.from_json(dumps_entry_line(make_entry("r", "c", [1, 2**63 + 5], [2])))
    assert entry.prompt_token_ids.dtype == np.uint64
    assert entry.prompt_token_ids.tolist() == [1, 2**63 + 5]


@pytest.mark.parametrize("bad", [-7, 2**64])
def test_entry_with_an_id_out_of_range_names_it(bad: int) -> None:
    """An id below 0 or of 2**64 raises TokenIdOutOfRange naming the id, the field and the call."""
    with pytest.raises(TokenIdOutOfRange, match=rf"got {bad} \(in generation_token_ids of .* c7\)"):
        TokenEntry.from_dict(make_entry("r", "c7", [1], [bad]))


@pytest.mark.parametrize("stranger", [1.5, "12", True])
def test_entry_with_a_non_integer_id_is_refused(stranger: object) -> None:
    """A float, string or boolean id is a TokenEntryError, never converted into an id."""
    with pytest.raises(TokenEntryError, match="prompt_token_ids must be a flat list") as caught:
        TokenEntry.from_dict(make_entry("r", "c", [1, stranger], [2]))  # type: ignore[list-item]
    assert not isinstance(caught.value, TokenIdOutOfRange)


def test_tape_widens_without_changing_earlier_views() -> None:
    """A wide id appended to an int32 tape moves it to uint64; earlier views stay as they were."""
    tape = Tape(np.array([1, 2], dtype=np.int32))
    before = tape.view(2)
    tape.append(np.array([2**64 - 1], dtype=np.uint64))
    tape.append(np.array([3], dtype=np.int32))
    assert before.tolist() == [1, 2]
    assert tape.view(4).tolist() == [1, 2, 2**64 - 1, 3]
    batch = DigestBatch()
    batch.add(tape.view(4))
    assert batch.run() == [token_digest([1, 2, 2**64 - 1, 3])]


@st.composite
def chains(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A chain of 1-5 calls whose ids are drawn from all of [0, 2**64), full prompts."""
    context: list[int] = draw(RUNS)
    entries = []
    for index in range(draw(st.integers(1, 5))):
        generation = draw(RUNS)
        entries.append(make_entry("r", f"c{index}", context, generation, created_at=index))
        context = [*context, *generation, *draw(st.lists(IDS, max_size=3))]
    return entries


def _lineage(entries: list[dict[str, Any]], delta: bool) -> list[dict[str, Any]]:
    ids = [entry["model_call_id"] for entry in entries]
    parents = {call: ids[i - 1] if i else None for i, call in enumerate(ids)}
    return stamp_lineage(entries, parents, delta=delta)


@settings(max_examples=150, deadline=None)
@given(chains(), st.sampled_from(["seed", "lineage", "delta"]))
def test_any_ids_round_trip_through_build_and_both_answer_forms(
    entries: list[dict[str, Any]], shape: str
) -> None:
    """For random ids in [0, 2**64): the build, the plain encoding and the compact form agree."""
    written = entries if shape == "seed" else _lineage(entries, delta=shape == "delta")
    response = _unmasked_build(written)
    expected = [(e["prompt_token_ids"], e["generation_token_ids"]) for e in entries]
    assert token_items({"response": response}) == expected
    answer = {"record": {"response": response}}
    pieces = finalize_answer_pieces(answer)
    encoded = encode_json(answer) if pieces is None else b"".join(pieces)
    assert token_items(orjson.loads(encoded)["record"]) == expected
    compacted = compact_output(response["output"])
    assert compacted is not None
    context, _ = compacted
    last_prompt, last_generation = expected[-1]
    assert context.tolist() == [*last_prompt, *last_generation]


def test_widening_keeps_shared_prompts_shared() -> None:
    """One wide id widens the snapshot; prompts parsed into one buffer stay views of one array."""
    entries = wide_rollout("r")
    entries[0] = make_entry("r", "c0", [1, 2, 3], [4, 5])
    small = [1, 2, 3, 4, 5]
    entries[1] = make_entry("r", "c1", [*small, 6], [7])
    entries[2] = make_entry("r", "c2", [*small, 6, 7, 8], [2**64 - 1])
    parsed = _snapshot(entries).entries
    assert parsed[0].prompt_token_ids.dtype == np.int32  # as parsed, before the build
    uniform = uniform_token_arrays(parsed)
    prompts = [entry.prompt_token_ids for entry in uniform]
    assert {str(prompt.dtype) for prompt in prompts} == {"uint64"}
    assert np.shares_memory(prompts[0], prompts[1])
    assert [p.tolist() for p in prompts] == [e["prompt_token_ids"] for e in entries]
