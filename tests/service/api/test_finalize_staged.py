"""POST /finalize and /retire of externally staged rollouts (docs/staging.md#finalize-and-retire).

The rollouts are written through a store's own staging API (stage, then the
committed ledger row), as the store server writes them; the app reads the
same store (memory, file, redis) as its source.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from tests.support.captures import make_entry
from tests.support.staged_service import STAGED_RETIRE, StagedService, staged_service
from tests.support.staging_stores import Conversation
from token_finalizer._logging import JsonFormatter
from token_finalizer.core.errors import CaptureFrozen
from token_finalizer.core.staging import build_staged_call
from token_finalizer.web.access_log import ACCESS_LOGGER


@pytest.fixture
def memory(tmp_path: Path) -> Iterator[StagedService]:
    """The app over a memory store (for what does not depend on the store)."""
    with staged_service("memory", tmp_path, **STAGED_RETIRE) as opened:
        yield opened


def _write(service: StagedService, chat: Conversation, *, skip: tuple[str, ...] = ()) -> None:
    """Stage each call and commit its row, as a worker and a model server do."""

    async def write(store: Any) -> None:
        for record, row in zip(chat.records, chat.rows, strict=True):
            if record.model_call_id not in skip:
                await store.stage(record)
            await store.record_ledger_row(chat.rollout_id, row)

    service.seed(write)


def _chat(rollout_id: str = "st-1", calls: int = 3) -> Conversation:
    return Conversation.of(rollout_id, calls)


def _record(chat: Conversation, call_id: str | None = None, **extra: Any) -> dict[str, Any]:
    """The finished record scored on `call_id`'s response (the last call by default)."""
    call_id = call_id or chat.records[-1].model_call_id
    return {"_ng_rollout_id": chat.rollout_id, "response": {"id": f"resp-{call_id}"}, **extra}


def _tokens(chat: Conversation) -> list[int]:
    return [int(token) for record in chat.records for token in record.token_ids_delta]


def _unpacked(column: dict[str, Any]) -> list[Any]:
    dtype = {"u32le": "<u4", "u64le": "<u8", "u8": "u1", "f64le": "<f8"}[column["encoding"]]
    return list(np.frombuffer(base64.b64decode(column["data"]), dtype=dtype).tolist())


def test_a_staged_rollout_answers_its_verified_row(service: StagedService) -> None:
    """The answer's `staged.row` holds the chain's deltas, root to terminal, as lists."""
    chat = _chat()
    _write(service, chat)
    answer = service.finalize(_record(chat))
    row = answer["staged"]["row"]
    assert (row["model_call_ids"], row["token_ids"]) == (["c1", "c2", "c3"], _tokens(chat))
    assert answer["staged"]["error"] is None


def test_the_build_is_the_staged_builders(service: StagedService) -> None:
    """`build`: builder `staged`, unmasked, its snapshot, no rebuilt response, no error."""
    chat = _chat()
    _write(service, chat)
    build = _record_build(service.finalize(_record(chat)))
    assert (build["builder"], build["mask_sample"], "rebuilt_response" in build) == (
        "staged",
        False,
        False,
    )
    assert set(build["_capture_snapshot"]) == {"snapshot_id", "version"}


def _record_build(answer: dict[str, Any]) -> dict[str, Any]:
    build: dict[str, Any] = answer["build"]
    return build


def test_the_record_carries_the_metrics(service: StagedService) -> None:
    """`_ng_token_capture` is the build's metrics; the response is left as it was sent."""
    chat = _chat()
    _write(service, chat)
    record = _record(chat)
    answer = service.finalize(record)
    assert answer["record"]["_ng_token_capture"] == answer["build"]["metrics"]
    assert answer["record"]["response"] == record["response"]


def test_compact_answers_pack_the_token_columns(service: StagedService) -> None:
    """`?tokens=compact`: ids u32le, mask u8, log probs f64le, equal to the plain row."""
    chat = _chat()
    _write(service, chat)
    plain = service.finalize(_record(chat))["staged"]["row"]
    packed = service.finalize(_record(chat), tokens="compact")["staged"]["row"]
    encodings = [packed[k]["encoding"] for k in ("token_ids", "token_mask", "logprobs")]
    assert encodings == ["u32le", "u8", "f64le"]
    unpacked = {k: _unpacked(packed.pop(k)) for k in ("token_ids", "token_mask", "logprobs")}
    assert {**packed, **unpacked} == plain


def test_ids_beyond_32_bits_travel_as_u64le(memory: StagedService) -> None:
    """A row holding an id of 2**32 or more packs every id as u64le, exactly."""
    chat = Conversation("big-ids")
    record = build_staged_call(
        rollout_id="big-ids",
        model_call_id="c1",
        parent=None,
        prompt_token_ids=[1, 2**40],
        generated_token_ids=[2**64 - 1],
        generated_log_probs=[-0.5],
        weight_version=1,
    )
    chat.records.append(record)
    chat.rows.append(_row_of(record))
    _write(memory, chat)
    packed = memory.finalize(_record(chat), tokens="compact")["staged"]["row"]["token_ids"]
    assert (packed["encoding"], _unpacked(packed)) == ("u64le", [1, 2**40, 2**64 - 1])


def _row_of(record: Any) -> dict[str, Any]:
    from tests.support.staging_stores import committed_row

    answer = [{"role": "assistant", "content": "a"}]
    return committed_row(record, [{"role": "user", "content": "q"}], answer, staging_chain=[])


def test_a_verified_row_retires_everything_staged(service: StagedService) -> None:
    """The ticket retires the rollout: nothing of it is fetchable, the ledger is empty."""
    chat = _chat()
    _write(service, chat)
    answer = service.finalize(_record(chat))
    assert service.client.post("/retire", json=answer["retire"]).json() == {"retired": True}

    async def left(store: Any) -> tuple[Any, ...]:
        fetched = await store.fetch_staged(chat.rollout_id, ["c1", "c2", "c3"])
        return (fetched, await store.ledger_has_rows(chat.rollout_id))

    assert service.seed(left) == ((None, None, None), False)


def test_a_failed_rollout_is_masked_and_kept(service: StagedService) -> None:
    """A poisoned rollout: masked with rollout_failed, no ticket, its calls kept as evidence."""
    chat = _chat()
    _write(service, chat)
    service.seed(
        lambda store: store.record_ledger_failure(chat.rollout_id, "c9", "unresolved_parent")
    )
    answer = service.finalize(_record(chat))
    assert (answer["build"]["mask_reason"], answer["retire"]) == ("rollout_failed", None)

    async def kept(store: Any) -> Any:
        return await store.fetch_staged(chat.rollout_id, ["c1"])

    assert service.seed(kept) != (None,)


def test_a_missing_staged_call_is_masked(memory: StagedService) -> None:
    """A committed row whose staged call the store lacks: staged_record_missing."""
    chat = _chat()
    _write(memory, chat, skip=("c3",))
    answer = memory.finalize(_record(chat))
    assert (answer["build"]["mask_reason"], answer["staged"]["error"]["code"]) == (
        "staged_record_missing",
        "staged_record_missing",
    )


def test_each_terminal_gets_its_row_on_one_frozen_version(memory: StagedService) -> None:
    """A main chain and a subagent root: one finalize each, the same snapshot, two rows."""
    main, sub = _chat("branch", 2), Conversation.of("branch", 1, prefix="s")
    _write(memory, main)
    _write(memory, sub)
    answers = [memory.finalize(_record(main)), memory.finalize(_record(sub))]
    assert [a["staged"]["row"]["model_call_ids"] for a in answers] == [["c1", "c2"], ["s1"]]
    assert answers[0]["build"]["_capture_snapshot"] == answers[1]["build"]["_capture_snapshot"]


def test_retiring_one_terminal_retires_the_rollout(memory: StagedService) -> None:
    """The first ticket removes the whole rollout; the second (same version) answers retired."""
    main, sub = _chat("branch", 2), Conversation.of("branch", 1, prefix="s")
    _write(memory, main)
    _write(memory, sub)
    tickets = [memory.finalize(_record(chat))["retire"] for chat in (main, sub)]
    answers = [memory.client.post("/retire", json=ticket).json() for ticket in tickets]
    assert answers == [{"retired": True}, {"retired": True}]


def test_writes_after_the_finalize_are_refused(memory: StagedService) -> None:
    """The fence: once finalized (frozen), a new stage of the rollout is refused."""
    chat = _chat(calls=2)
    _write(memory, chat)
    memory.finalize(_record(chat))
    late = chat.add("c3")
    with pytest.raises(CaptureFrozen):
        memory.seed(lambda store: store.stage(late))


def test_mask_reasons_are_counted_by_code(memory: StagedService) -> None:
    """/metrics counts a staged mask under its code, like any mask reason."""
    chat = _chat()
    _write(memory, chat)
    memory.seed(lambda store: store.record_ledger_failure(chat.rollout_id, "c9", "x"))
    memory.finalize(_record(chat))
    metrics = memory.client.get("/metrics").text
    assert 'token_finalizer_mask_reasons_total{reason="rollout_failed",source="local"} 1.0' in (
        metrics
    )


def test_the_guard_counts_staged_masks(tmp_path: Path) -> None:
    """The mask-fraction guard trips on staged masks and reports their codes."""
    guard = {"token_id_capture": {"max_mask_fraction": 0.5, "mask_fraction_min_samples": 2}}
    with staged_service("memory", tmp_path, **STAGED_RETIRE, **guard) as service:
        statuses, body = [], {}
        for index in range(2):
            chat = _chat(f"g-{index}")
            _write(service, chat)
            service.seed(
                lambda store, rid=chat.rollout_id: store.record_ledger_failure(rid, "x", "y")
            )
            reply = service.client.post("/finalize", json=_record(chat), headers={"X-Run-Id": "r"})
            statuses.append(reply.status_code)
            body = reply.json()
    assert (statuses, body["reasons"]) == ([200, 409], {"rollout_failed": 2})


def test_the_access_log_says_masked(
    memory: StagedService, caplog: pytest.LogCaptureFixture
) -> None:
    """A masked staged finalize is logged with outcome `masked`."""
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    chat = _chat()
    _write(memory, chat, skip=("c3",))
    memory.finalize(_record(chat))
    lines = [
        orjson.loads(JsonFormatter().format(r)) for r in caplog.records if r.name == ACCESS_LOGGER
    ]
    assert [line["outcome"] for line in lines if line["path"] == "/finalize"] == ["masked"]


def test_a_lone_surrogate_at_rest_still_masks_with_a_200(service: StagedService) -> None:
    """A ledger failure holding `\\ud800` (written before 422s refused it) masks, never a 500."""
    chat = _chat("st-surrogate")
    _write(service, chat)
    service.seed(lambda store: store.record_ledger_failure(chat.rollout_id, "c9", "x\ud800"))
    answer = service.finalize(_record(chat))
    assert (answer["build"]["mask_sample"], answer["retire"]) == (True, None)


def test_token_files_beside_a_staged_rollout_mask_it_and_keep_both(tmp_path: Path) -> None:
    """A staged rollout plus another writer's `R.tokens.jsonl`: freeze_failed naming both, kept."""
    chat = _chat("st-both")
    with staged_service("file", tmp_path, **STAGED_RETIRE) as service:
        _write(service, chat)
        stray = tmp_path / f"{chat.rollout_id}.tokens.jsonl"
        stray.write_bytes(orjson.dumps(make_entry(chat.rollout_id, "g1", [1], [2])) + b"\n")
        answer = service.finalize(_record(chat))
        staged = sorted(path.name for path in tmp_path.glob(f"{chat.rollout_id}.*.jsonl"))
    build = answer["build"]
    assert (build["mask_reason"], answer["retire"]) == ("freeze_failed", None)
    assert (".tokens.jsonl" in build["error"], ".staged.jsonl" in build["error"]) == (True, True)
    assert f"{chat.rollout_id}.tokens.jsonl" in staged and len(staged) >= 3
