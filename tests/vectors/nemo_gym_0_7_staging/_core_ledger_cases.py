"""Ledger cases of generate_core.py (run by hand, never in CI)."""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

from _core_reference import ROLLOUT, Json, Reference, dump, tool_output, user
from _core_terminal_cases import transcript_rollout

# --------------------------------------------------------------------------- ledger


def ledger_cases(ref: Reference) -> Json:
    transcript = transcript_rollout(ref)
    commits = {commit.record.model_call_id: commit for commit in transcript.commits}
    later = commits["a"].model_copy(
        update={"record": commits["a"].record.model_copy(update={"admitted_at": 5000.0})}
    )
    scripts: dict[str, tuple[str, list[tuple[str, Any]]]] = {
        "identical_replay": ("the same commit twice is one row", [("record", commits["a"])] * 2),
        "admitted_at_conflict": (
            "a replay with another admission time conflicts",
            [("record", commits["a"]), ("record", later)],
        ),
        "record_after_failure": (
            "a commit after a failure row of the same call conflicts",
            [("failure", ("a", "unresolved_parent")), ("record", commits["a"])],
        ),
        "failure_after_record": (
            "a failure after the commit is a second row",
            [("record", commits["a"]), ("failure", ("a", "worker_capture_failed"))],
        ),
        "failure_idempotent": (
            "identical failures are one row; a new reason appends",
            [
                ("failure", ("a", "unresolved_parent")),
                ("failure", ("a", "unresolved_parent")),
                ("failure", ("a", "worker_capture_failed")),
            ],
        ),
        "whole_rollout": (
            "every commit, then a failure of another call",
            [
                *(("record", commit) for commit in transcript.commits),
                ("failure", ("z", "unresolved_parent")),
            ],
        ),
    }
    writes = []
    for name, (description, operations) in scripts.items():
        writes.append({"name": name, "description": description, **run_ledger(ref, operations)})

    def manifest(rows: list[Json]) -> Json:
        return ref.lineage._manifest_from_rows(ROLLOUT, rows)

    full_rows = run_ledger(ref, [("record", commit) for commit in transcript.commits])["expected"][
        "rows"
    ]
    row_a = full_rows[0]
    hand_rows = {
        "missing_response_id": [{**row_a, "response_id": None}],
        "empty_response_id": [{**row_a, "response_id": ""}],
        "missing_chain_hash": [{**row_a, "chain_hash": None}],
        "missing_cumulative_hash": [{k: v for k, v in row_a.items() if k != "cumulative_hash"}],
        "lineage_only_row_skipped": [{"model_call_id": "old", "fingerprint": "x"}, row_a],
        "failures_and_records_in_order": [
            {"failure_reason": "unresolved_parent", "model_call_id": "u"},
            *full_rows,
            {"failure_reason": "worker_capture_failed", "model_call_id": "v"},
        ],
    }
    manifests = [
        {"name": name, "rows": rows, "expected": manifest(rows)} for name, rows in hand_rows.items()
    ]

    turn_c = transcript.commits[3].request_items
    out_c = transcript.commits[3].response_items
    requests = {
        "root": ([user("fresh start")], None),
        "continues_c": ([*turn_c, *out_c, user("thanks")], None),
        "continues_a": (
            [
                user("plan the fix"),
                *transcript.commits[0].response_items,
                tool_output("t1", "print(1)"),
            ],
            None,
        ),
        "edited_context": ([user("plan another fix"), *transcript.commits[0].response_items], None),
        "identical_retry": (
            [
                *transcript.commits[1].request_items,
                *transcript.commits[1].response_items,
                user("go on"),
            ],
            "the reference's file ledger needs exactly one candidate before the context "
            "check; docs/staging.md#ledger-rows-and-manifest collapses candidates with one "
            "sequence to the smallest call id (as its in-memory ledger does)",
        ),
    }
    resolutions = []
    for name, (items, note) in requests.items():
        status, match = resolve_with(ref, transcript.commits, items)
        case: Json = {"name": name, "rows": full_rows, "request_items": items}
        if note is None:
            case["expected"] = {"status": status, "match": match}
        else:
            ours = {"status": "resolved", "match": _match_of(full_rows[1])}
            case.update(expected=ours, reference={"status": status, "match": match}, note=note)
        resolutions.append(case)
    return {"writes": writes, "manifests": manifests, "resolutions": resolutions}


def _match_of(row: Json) -> Json:
    return {
        "model_call_id": row["model_call_id"],
        "cumulative_token_ids": [],
        "digest": row["digest"],
        "staging_chain": row["staging_chain"],
        "prev_len": row["cum_len"],
        "chain_hash": row["chain_hash"],
    }


def run_ledger(ref: Reference, operations: list[tuple[str, Any]]) -> Json:
    """Apply the operations to a fresh FileLineageStore; its outcomes, rows and manifest."""
    root = Path(tempfile.mkdtemp(dir=ref.workdir))
    store = ref.lineage.FileLineageStore(root)
    outcomes: list[str] = []
    encoded: list[Json] = []
    for kind, payload in operations:
        try:
            if kind == "record":
                encoded.append({"op": "record", "commit": dump(payload)})
                asyncio.run(store.record(payload))
            else:
                call_id, reason = payload
                encoded.append({"op": "failure", "model_call_id": call_id, "reason": reason})
                asyncio.run(store.record_failure(ROLLOUT, call_id, reason))
            outcomes.append("ok")
        except ValueError:
            outcomes.append("conflict")
    path = root / f"{ROLLOUT}.lineage.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return {
        "operations": encoded,
        "expected": {
            "outcomes": outcomes,
            "rows": rows,
            "manifest": asyncio.run(store.manifest(ROLLOUT)),
        },
    }


def resolve_with(ref: Reference, commits: list[Any], items: list[Json]) -> tuple[str, Json]:
    root = Path(tempfile.mkdtemp(dir=ref.workdir))
    store = ref.lineage.FileLineageStore(root)
    for commit in commits:
        asyncio.run(store.record(commit))
    resolution = asyncio.run(store.resolve(ROLLOUT, items))
    match = resolution.match
    return resolution.status.value, None if match is None else {
        "model_call_id": match.model_call_id,
        "cumulative_token_ids": list(match.cumulative_token_ids),
        "digest": match.digest,
        "staging_chain": list(match.staging_chain),
        "prev_len": match.prev_len,
        "chain_hash": match.chain_hash,
    }
