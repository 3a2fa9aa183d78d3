"""Ledger write, read and resolve rules on the file and in-memory ledgers (generator only)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from _harness import error_text, resolution_json
from _reference import Gym

__all__ = ["ledger_cases", "run_ops"]

Json = Any
RID = "rollout-ledger"


def commits_of(run: Any) -> dict[str, Json]:
    """The CaptureLedgerCommit wire JSON Gym recorded per call of a scenario run."""
    found = {}
    for call in run.case["expected"]["calls"]:
        for operation in call["ledger_ops"]:
            if operation["op"] == "record":
                found[call["model_call_id"]] = operation["args"]["commit"]
    return found


def moved(commit: Json, rollout_id: str = RID, **record_changes: Any) -> Json:
    """A commit re-homed to ``rollout_id`` with some CallRecord fields changed."""
    changed = copy.deepcopy(commit)
    old_prefix = f"{changed['rollout_id']}/"
    changed["rollout_id"] = rollout_id
    changed["staging_chain"] = [
        key.replace(old_prefix, f"{rollout_id}/", 1) for key in changed["staging_chain"]
    ]
    record = changed["record"]
    record["staging_key"] = record["staging_key"].replace(old_prefix, f"{rollout_id}/", 1)
    record.update(record_changes)
    return changed


async def run_ops(gym: Gym, kind: str, root: Path, ops: list[Json]) -> Json:
    store = (
        gym.lineage.FileLineageStore(root) if kind == "file" else gym.lineage.InMemoryLineageStore()
    )
    results = []
    for operation in ops:
        try:
            value = await _apply(gym, store, kind, root, operation)
        except Exception as error:
            results.append({"error": error_text(error)})
        else:
            results.append({"result": value})
    if kind == "file":
        rows = {
            path.name.removesuffix(".lineage.jsonl"): [
                json.loads(line) for line in path.read_text().splitlines()
            ]
            for path in sorted(root.glob("*.lineage.jsonl"))
        }
        lines = {
            path.name.removesuffix(".lineage.jsonl"): path.read_text().splitlines()
            for path in sorted(root.glob("*.lineage.jsonl"))
        }
        return {"results": results, "rows": rows, "lines": lines}
    return {"results": results, "rows": copy.deepcopy(store._ledgers), "lines": None}


async def _apply(gym: Gym, store: Any, kind: str, root: Path, operation: Json) -> Json:
    op = operation["op"]
    if op == "record":
        commit = gym.staged.CaptureLedgerCommit.model_validate(operation["commit"])
        return await store.record(commit)
    if op == "record_failure":
        return await store.record_failure(
            operation["rollout_id"], operation["model_call_id"], operation["reason"]
        )
    if op == "manifest":
        return await store.manifest(operation["rollout_id"])
    if op == "has_rows":
        return await store.has_rows(operation["rollout_id"])
    if op == "resolve":
        resolution = await store.resolve(operation["rollout_id"], operation["request_items"])
        return resolution_json(resolution)
    if op == "append_raw_row":
        # A row written by something other than record(): a legacy or buggy writer.
        if kind == "file":
            path = root / f"{operation['rollout_id']}.lineage.jsonl"
            line = json.dumps(operation["row"], sort_keys=True, separators=(",", ":"))
            with path.open("a") as handle:
                handle.write(line + "\n")
        else:
            store._ledgers.setdefault(operation["rollout_id"], []).append(operation["row"])
        return None
    raise ValueError(f"unknown op {op}")


def _ops(
    clean: dict[str, Json], twins: dict[str, Json], c1_row: Json, twin_c3_items: list[Json]
) -> list[tuple[str, str, list[Json]]]:
    c1, c2, c3 = (moved(clean[name]) for name in ("c1", "c2", "c3"))
    manifest = {"op": "manifest", "rollout_id": RID}
    has_rows = {"op": "has_rows", "rollout_id": RID}

    def record(commit: Json) -> Json:
        return {"op": "record", "commit": commit}

    def fail(call_id: str, reason: str, rollout_id: str = RID) -> Json:
        return {
            "op": "record_failure",
            "rollout_id": rollout_id,
            "model_call_id": call_id,
            "reason": reason,
        }

    def resolve(items: list[Json]) -> Json:
        return {"op": "resolve", "rollout_id": RID, "request_items": items}

    def raw(row: Json) -> Json:
        return {"op": "append_raw_row", "rollout_id": RID, "row": row}

    items_c2, items_c3 = c2["request_items"], c3["request_items"]
    other_context = copy.deepcopy(items_c2)
    other_context[1]["content"] = "What is 2+3?"
    twin_a, twin_b = moved(twins["c2a"]), moved(twins["c2b"])
    unknown = "rollout-never-seen"
    return [
        (
            "record_chain",
            "Three commits, then manifest and has_rows.",
            [record(c1), record(c2), record(c3), manifest, has_rows],
        ),
        (
            "identical_replay_is_a_no_op",
            "The same commit twice writes one row.",
            [record(c1), record(c1), manifest],
        ),
        (
            "admitted_at_change_conflicts",
            "A replay with another admitted_at is refused.",
            [record(c1), record(moved(clean["c1"], admitted_at=c1["record"]["admitted_at"] + 1.0))],
        ),
        (
            "response_id_change_conflicts",
            "A replay with another response_id is refused.",
            [record(c1), record(moved(clean["c1"], response_id="chatcmpl-other"))],
        ),
        (
            "request_items_change",
            "A replay whose request items differ: the file ledger's row "
            "holds their fingerprint and refuses; the in-memory row does not and accepts.",
            [record(c1), record({**c1, "request_items": [c1["request_items"][0]]}), manifest],
        ),
        (
            "record_after_failure_conflicts",
            "A commit for a call that already has a failure row.",
            [fail("c1", "worker_capture_failed"), record(c1), manifest],
        ),
        (
            "failure_after_record_is_appended",
            "A failure for a committed call is a new row.",
            [record(c1), fail("c1", "request_finished_without_staged_coordinates"), manifest],
        ),
        (
            "record_failure_is_idempotent",
            "The same (call, reason) twice writes one row.",
            [fail("c2", "worker_capture_failed"), fail("c2", "worker_capture_failed"), manifest],
        ),
        (
            "record_failure_new_reason_is_appended",
            "Another reason for the same call is a row.",
            [
                fail("c2", "worker_capture_failed"),
                fail("c2", "request_finished_without_staged_coordinates"),
                manifest,
            ],
        ),
        (
            "manifest_keeps_commit_order",
            "Records and failures each keep their own order.",
            [
                record(c1),
                fail("x2", "unresolved_parent"),
                record(c2),
                fail("x1", "unresolved_parent"),
                record(c3),
                manifest,
            ],
        ),
        (
            "has_rows_after_failure_only",
            "A failure row alone counts as a row.",
            [has_rows, fail("c1", "unresolved_parent"), has_rows],
        ),
        (
            "unknown_rollout",
            "A rollout without rows: empty manifest, no rows.",
            [{"op": "manifest", "rollout_id": unknown}, {"op": "has_rows", "rollout_id": unknown}],
        ),
        (
            "invalid_rollout_id",
            "Ids outside [A-Za-z0-9._-]: the file ledger refuses them, the "
            "in-memory ledger does not check.",
            [
                {"op": "manifest", "rollout_id": "bad id"},
                {"op": "has_rows", "rollout_id": "bad id"},
                fail("c1", "unresolved_parent", rollout_id="bad/id"),
                {"op": "manifest", "rollout_id": "rollout-é"},
            ],
        ),
        (
            "row_missing_response_id",
            "A custody row without response_id becomes a failure.",
            [raw({**c1_row, "response_id": None}), record(c2), manifest],
        ),
        (
            "row_missing_chain_hash",
            "A custody row without chain_hash becomes a failure.",
            [raw({**c1_row, "chain_hash": None}), manifest],
        ),
        (
            "row_missing_cumulative_hash",
            "Without cumulative_hash: the same failure reason.",
            [raw({**c1_row, "cumulative_hash": ""}), manifest],
        ),
        (
            "row_without_staging_key_ignored",
            "A row with neither staging_key nor failure_reason is not part of the manifest.",
            [raw({"model_call_id": "legacy", "digest": "0" * 64}), record(c1), manifest],
        ),
        ("resolve_root", "No assistant item: a root.", [record(c1), resolve(c1["request_items"])]),
        ("resolve_continuation", "c2's items continue c1.", [record(c1), resolve(items_c2)]),
        (
            "resolve_chain_tail",
            "c3's items continue c2, whose chain names c1 and c2.",
            [record(c1), record(c2), resolve(items_c3)],
        ),
        (
            "resolve_context_changed",
            "Same assistant turns, another user turn before them.",
            [record(c1), resolve(other_context)],
        ),
        (
            "resolve_context_too_short",
            "The items end before the recorded context does.",
            [record(c1), resolve([items_c2[2]])],
        ),
        (
            "resolve_nothing_recorded",
            "An empty ledger cannot resolve a continuation.",
            [resolve(items_c2), has_rows],
        ),
        (
            "resolve_after_failure_only",
            "Failure rows are never parents.",
            [fail("c1", "worker_capture_failed"), resolve(items_c2)],
        ),
        (
            "resolve_identical_candidates",
            "Two identical commits: the file ledger cannot choose, "
            "the in-memory ledger collapses them to the smallest call id.",
            [record(moved(twins["c1"])), record(twin_a), record(twin_b), resolve(twin_c3_items)],
        ),
    ]


async def ledger_cases(gym: Gym, clean_run: Any, twins_run: Any, workdir: Path) -> list[Json]:
    clean, twins = commits_of(clean_run), commits_of(twins_run)
    # The twins scenario's c3 was refused, so its items come from the call script.
    c3_script = next(c for c in twins_run.case["inputs"]["calls"] if c["model_call_id"] == "c3")
    # The row the file ledger writes for c1, as a template for hand-written rows.
    probe = await run_ops(
        gym, "file", workdir / "ledger-probe", [{"op": "record", "commit": moved(clean["c1"])}]
    )
    c1_row = probe["rows"][RID][0]
    specs = _ops(clean, twins, c1_row, c3_script["request"]["messages"])
    cases = []
    for index, (name, description, ops) in enumerate(specs):
        expected = {
            kind: await run_ops(gym, kind, workdir / f"ledger-{index}-{kind}", ops)
            for kind in ("file", "memory")
        }
        cases.append(
            {"name": name, "description": description, "inputs": {"ops": ops}, "expected": expected}
        )
    return cases
