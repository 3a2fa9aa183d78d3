"""Stores seeded with external staging as the NeMo Gym 0.7 vectors describe it.

`replay_scenario` writes a scenarios.json rollout into one of our stores the
way NeMo Gym 0.7.0 would have written it through our clients: every stage
and every ledger write its capture path made, in call order. Where our
store decides otherwise than Gym's test sink, Gym's reaction is written
instead: a stage our custody checks refuse answers `StageResult(ok=False)`,
so Gym records `worker_capture_failed` and the middleware's
`request_finished_without_staged_coordinates` for that call instead of its
committed row (as the `sink_rejects` scenario shows Gym doing).

`seed_rows` and `seed_staged` write ledger rows and staged calls that the
store would refuse (tampered records, rows no `commit_row` makes, a call
stored under another call's id) through each store's raw layer: the
memory store's dicts, the file store's two JSON-lines files, the redis
store's keys. A value the store accepts goes through its API.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson
import redis

from tests.support.redis import redis_url
from tests.support.staging_stores import row_of_commit, wire_attachments
from token_finalizer.core.errors import CaptureConflict
from token_finalizer.core.staging import (
    CustodyRefusal,
    StagedCallRecord,
    StagingRecordError,
    stored_snapshot,
)
from token_finalizer.sources._staging import ledger_line
from token_finalizer.sources.memory_staging import StagedCall
from token_finalizer.sources.redis._client import KEY_PARTS

__all__ = [
    "GYM_ON_REFUSED_STAGE",
    "RawCall",
    "replay_scenario",
    "seed_rows",
    "seed_staged",
]

# What Gym's capture path records for a call whose stage was refused.
GYM_ON_REFUSED_STAGE = ("worker_capture_failed", "request_finished_without_staged_coordinates")


def _kept(case: dict[str, Any], staging_key: str) -> tuple[StagedCallRecord, Any] | None:
    """The record and attachments Gym's store kept under a key (None: its sink refused it)."""
    stored = case["expected"]["staged_records"].get(staging_key)
    if stored is None:
        return None
    return StagedCallRecord.from_json(stored["record"]), wire_attachments(stored["attachments"])


async def replay_scenario(store: Any, case: dict[str, Any]) -> dict[str, str]:
    """Write a scenario's rollout as Gym on our clients would; {call id: refused check}."""
    rollout_id = case["inputs"]["rollout_id"]
    refused: dict[str, str] = {}
    for call in case["expected"]["calls"]:
        call_id = call["model_call_id"]
        for op in call.get("stage_ops", []):
            kept = _kept(case, op["staging_key"])
            if kept is None:
                continue
            try:
                await store.stage(*kept)
            except CustodyRefusal as refusal:
                refused[call_id] = refusal.check
        for op in call.get("ledger_ops", []):
            if op["op"] == "record" and call_id in refused:
                for reason in GYM_ON_REFUSED_STAGE:
                    await store.record_ledger_failure(rollout_id, call_id, reason)
            elif op["op"] == "record":
                commit = op["args"]["commit"]
                await store.record_ledger_row(rollout_id, row_of_commit(commit))
            elif op["op"] == "record_failure":
                args = op["args"]
                await store.record_ledger_failure(rollout_id, call_id, args["reason"])
    return refused


# -- the raw layer ------------------------------------------------------------------------


class RawCall:
    """One staged call to seed: its base snapshot JSON (maybe tampered) under a call id."""

    def __init__(
        self, call_id: str, snapshot: dict[str, Any], extras: dict[str, Any] | None
    ) -> None:
        self.call_id = call_id
        self.snapshot = snapshot
        self.extras = extras

    def record(self) -> StagedCallRecord | None:
        """The record the store's API would take, None when it is not a valid one for its key."""
        if self.snapshot.get("model_call_id") != self.call_id:
            return None
        try:
            return StagedCallRecord.from_json({**self.snapshot, "extras": self.extras})
        except StagingRecordError:
            return None


async def seed_rows(store: Any, rollout_id: str, rows: Sequence[dict[str, Any]]) -> list[str]:
    """Append every row in order (raw where the store refuses it or takes it for a replay);
    the call ids of the rows written raw."""
    raw: list[str] = []
    for row in rows:
        try:
            if "failure_reason" in row:
                call_id, reason = row["model_call_id"], row["failure_reason"]
                appended = await store.record_ledger_failure(rollout_id, call_id, reason)
            else:
                appended = await store.record_ledger_row(rollout_id, row)
        except (StagingRecordError, CaptureConflict):
            appended = False
        if not appended:
            _raw_row(store, rollout_id, row)
            raw.append(row["model_call_id"])
    return raw


async def seed_staged(store: Any, rollout_id: str, calls: Sequence[RawCall]) -> list[str]:
    """Store every call in order (raw where the store refuses it or takes it for a replay);
    the call ids of the calls written raw."""
    raw: list[str] = []
    for call in calls:
        record = call.record()
        stored = False
        if record is not None and record.rollout_id == rollout_id:
            try:
                stored = await store.stage(record)
            except (CustodyRefusal, CaptureConflict, StagingRecordError):
                stored = False
        if not stored:
            _raw_call(store, rollout_id, call)
            raw.append(call.call_id)
    return raw


def _raw_row(store: Any, rollout_id: str, row: dict[str, Any]) -> None:
    line = ledger_line(row)
    if store.kind == "memory":
        with store._lock:
            rollout = store._rollout(rollout_id)
            rollout.staging.ledger.add(orjson.loads(line))
            rollout.state.version += 1
    elif store.kind == "file":
        _append(Path(store.directory) / f"{rollout_id}.lineage.jsonl", line)
    else:
        keys = dict(zip(KEY_PARTS, store.keys(rollout_id), strict=True))
        with _redis() as client:
            client.rpush(keys["ledger"], line)
            client.hsetnx(keys["ledger_ids"], row["model_call_id"], line)
            client.hincrby(keys["state"], "version", 1)


def _raw_call(store: Any, rollout_id: str, call: RawCall) -> None:
    base = orjson.dumps(call.snapshot)
    rest = orjson.dumps({"attachments": None, "extras": call.extras}, option=orjson.OPT_SORT_KEYS)
    if store.kind == "memory":
        # Kept as its JSON, the form a memory store reads as is (docs/staging.md#packed-at-rest).
        digest = stored_snapshot(call.snapshot).digest
        staged = StagedCall(base, digest, rest, call.extras, None)
        with store._lock:
            rollout = store._rollout(rollout_id)
            rollout.staging.calls[call.call_id] = staged
            rollout.state.version += 1
    elif store.kind == "file":
        if call.snapshot.get("model_call_id") != call.call_id:
            raise ValueError("the file store keeps a staged call under its own call id")
        line = {"attachments": None, "record": {**call.snapshot, "extras": call.extras}}
        _append(
            Path(store.directory) / f"{rollout_id}.staged.jsonl",
            orjson.dumps(line, option=orjson.OPT_SORT_KEYS),
        )
    else:
        keys = dict(zip(KEY_PARTS, store.keys(rollout_id), strict=True))
        parent = call.snapshot.get("parent_call_id") or ""
        with _redis() as client:
            client.hset(keys["staged"], call.call_id, base)
            client.hset(keys["staged_extras"], call.call_id, rest)
            client.hset(keys["staged_index"], call.call_id, f"{call.snapshot['digest']} {parent}")
            client.hincrby(keys["state"], "version", 1)


def _append(path: Path, line: bytes) -> None:
    with path.open("ab") as file:
        file.write(line + b"\n")


@contextlib.contextmanager
def _redis() -> Iterator[redis.Redis]:
    """A plain client of the test Redis (every redis store of the tests is on it)."""
    client = redis.Redis.from_url(redis_url())
    try:
        yield client
    finally:
        client.close()
