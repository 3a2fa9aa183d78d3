"""Verification cases of generate_core.py (run by hand, never in CI)."""

from __future__ import annotations

import dataclasses
from typing import Any

from _core_reference import ROLLOUT, Json, Reference, Rollout, dump

# --------------------------------------------------------------------------- verification

EXTRAS = {"routed_experts": [[[1, 2]], [[3, 4]]]}


def chain_rollout(ref: Reference, rollout_id: str = ROLLOUT) -> Rollout:
    """a -> b -> c, with extras on a."""
    rollout = Rollout(ref, rollout_id)
    rollout.call("a", None, [1, 2, 3], [101, 102], extras=EXTRAS)
    rollout.call("b", "a", [11, 12], [103])
    rollout.call("c", "b", [21], [104, 105])
    return rollout


def manual_call(
    ref: Reference,
    call_id: str,
    parent: str | None,
    prev_len: int,
    mask: list[float],
    *,
    chain_hash: str = "3" * 64,
    cumulative_hash: str = "4" * 64,
) -> tuple[Any, Any]:
    """A staged record and its manifest row built field by field (any graph shape)."""
    digest = ref.digest
    ids = [200 + index for index in range(len(mask))]
    log_probs = [-0.5 if value else 0.0 for value in mask]
    fields = {
        "rollout_id": ROLLOUT,
        "model_call_id": call_id,
        "parent_call_id": parent,
        "mode": "token_in" if parent else "text",
        "prev_len": prev_len,
        "delta_len": len(ids),
        "cum_len": prev_len + len(ids),
        "weight_version": 1,
        "token_ids_delta": ids,
        "token_mask_delta": mask,
        "generation_log_probs_delta": log_probs,
        "extras_digest": digest.EMPTY_EXTRAS_DIGEST,
        "chain_hash": chain_hash,
        "cumulative_hash": cumulative_hash,
    }
    staged_digest = digest.compute_staging_digest(
        schema_version=2, digest_version=2, extras_digest_version=1, **fields
    )
    snapshot = ref.records.StagedCallBaseSnapshot(digest=staged_digest, **fields)
    row = ref.records.CallRecord(
        model_call_id=call_id,
        parent_call_id=parent,
        prev_len=prev_len,
        delta_len=len(ids),
        cum_len=prev_len + len(ids),
        weight_version=1,
        digest=staged_digest,
        extras_digest=digest.EMPTY_EXTRAS_DIGEST,
        staging_key=f"{ROLLOUT}/{call_id}",
        mode=fields["mode"],
        chain_hash=chain_hash,
        cumulative_hash=cumulative_hash,
        response_id=f"resp-{call_id}",
    )
    return snapshot, row


class VerifyCases:
    """Collects verification cases and runs each through the reference verifier."""

    def __init__(self, ref: Reference) -> None:
        self.ref = ref
        self.cases: list[Json] = []
        # Snapshots by digest: cases list digests, so a snapshot shared by many
        # cases is written once.
        self.snapshots: dict[str, Json] = {}

    def add(
        self,
        name: str,
        description: str,
        receipt: Any,
        snapshots: list[Any],
        *,
        receipt_tamper: dict[str, Any] | None = None,
        snapshot_tamper: list[tuple[int, str, Any]] = (),  # type: ignore[assignment]
    ) -> None:
        case: Json = {
            "name": name,
            "description": description,
            "receipt": dump(receipt),
            "snapshots": [snapshot.digest for snapshot in snapshots],
        }
        for snapshot in snapshots:
            self.snapshots.setdefault(snapshot.digest, dump(snapshot))
        snapshots = [snapshot.model_copy(deep=True) for snapshot in snapshots]
        receipt = receipt.model_copy(deep=True)
        if receipt_tamper:
            case["receipt_tamper"] = receipt_tamper
            for field, value in receipt_tamper.items():
                if field == "manifest":
                    value = [self.ref.records.CallRecord.model_validate(row) for row in value]
                object.__setattr__(receipt, field, value)
        if snapshot_tamper:
            case["snapshot_tamper"] = [
                {"index": index, "field": field, "value": value}
                for index, field, value in snapshot_tamper
            ]
            for index, field, value in snapshot_tamper:
                object.__setattr__(snapshots[index], field, value)
        try:
            row = self.ref.rebuild.verify_and_linearize(receipt, snapshots)
            case["expected"] = {"row": _row_json(row)}
        except self.ref.rebuild.ReceiptVerificationError as error:
            case["expected"] = {
                "error_class": type(error).__name__,
                "code": error.code,
                "detail": str(error).removeprefix(f"{error.code}: "),
            }
        self.cases.append(case)


def _row_json(row: Any) -> Json:
    data = dataclasses.asdict(row)
    data["link_spans"] = [list(span) for span in data["link_spans"]]
    return data


def verify_cases(ref: Reference) -> Json:
    cases = VerifyCases(ref)
    records = ref.records
    clean = chain_rollout(ref)
    fetched = clean.sink.fetch([row.staging_key for row in clean.rows])
    receipt = clean.receipt("c", reward=0.5)
    row_a, row_b, row_c = (dump(row) for row in clean.rows)

    cases.add("clean_chain", "a -> b -> c, terminal c", receipt, fetched)
    cases.add("terminal_mid_chain", "the row stops at the terminal b", clean.receipt("b"), fetched)
    branch = chain_rollout(ref)
    branch.call("b2", "a", [13], [106, 107], weight_version=4)
    branch.call("d", "b2", [], [108])
    branch.call("s", None, [9, 9], [110], weight_version=5)
    branch_fetched = branch.sink.fetch([row.staging_key for row in branch.rows])
    cases.add(
        "retry_branch",
        "sibling b2 of b, child d with no carry",
        branch.receipt("d"),
        branch_fetched,
    )
    cases.add(
        "second_root", "a fresh-context root s is its own row", branch.receipt("s"), branch_fetched
    )
    versions = Rollout(ref)
    versions.call("a", None, [1, 2], [3, 4], weight_version=7)
    versions.call("b", "a", [5], [6], weight_version=7)
    versions.call("c", "b", [7, 8], [9, 10], weight_version=8)
    cases.add(
        "weight_versions_7_7_8",
        "spans cover each call's whole delta",
        versions.receipt("c"),
        versions.sink.fetch([row.staging_key for row in versions.rows]),
    )
    faults = chain_rollout(ref)
    faults.call("e", "a", [14], [], weight_version=3)
    faults.call("w", "b", [22], [111], wrong_prefix=[1, 2, 3, 101, 102, 11, 99, 103])
    faults.call("w2", "w", [23], [112])
    faults.call("f", "a", [15], [113], forged_parent_chain_hash="5" * 64)
    faults_fetched = faults.sink.fetch([row.staging_key for row in faults.rows])
    short = chain_rollout(ref)
    short.call("p", "a", [16], [114], prev_len=4)
    short_fetched = short.sink.fetch([row.staging_key for row in short.rows])
    cases.add(
        "empty_terminal_generation", "e generated nothing", faults.receipt("e"), faults_fetched
    )
    cases.add(
        "wrong_prefix_at_terminal",
        "w's worker had a wrong prefix",
        faults.receipt("w"),
        faults_fetched,
    )
    cases.add(
        "wrong_prefix_mid_chain_accepted",
        "w's wrong prefix goes unnoticed when w2 is the terminal (the reference accepts it)",
        faults.receipt("w2"),
        faults_fetched,
    )
    cases.add(
        "forged_parent_chain_hash",
        "f chains onto a forged hash",
        faults.receipt("f"),
        faults_fetched,
    )
    cases.add("parent_length_mismatch", "p starts before a ends", short.receipt("c"), short_fetched)

    poisoned = {"capture_poisoned": True, "failure_reason": "unresolved_parent"}
    cases.add(
        "rollout_failed",
        "a failure reason fails the rollout",
        clean.receipt("c", **poisoned),
        fetched,
    )
    cases.add(
        "capture_poisoned",
        "poisoned without a reason",
        clean.receipt("c", capture_poisoned=True),
        fetched,
    )
    cases.add("empty_manifest", "no rows", receipt, [], receipt_tamper={"manifest": []})
    cases.add(
        "duplicate_manifest_row",
        "a twice",
        receipt,
        fetched,
        receipt_tamper={"manifest": [row_a, row_a, row_b, row_c]},
    )
    shared_key = records.RolloutReceipt.model_validate(
        {
            **dump(receipt),
            "manifest": [row_a, {**row_b, "staging_key": row_a["staging_key"]}, row_c],
        }
    )
    cases.add("duplicate_staging_key", "b reuses a's key", shared_key, fetched)
    cases.add("row_count_mismatch", "c not fetched", receipt, fetched[:2])
    cases.add(
        "duplicate_snapshot", "a fetched twice", receipt, [fetched[0], fetched[0], fetched[2]]
    )
    stranger = Rollout(ref)
    stranger.call("zz", None, [1], [2])
    cases.add(
        "snapshot_identity_mismatch",
        "an unknown call fetched",
        receipt,
        [fetched[0], stranger.sink.fetch([f"{ROLLOUT}/zz"])[0], fetched[2]],
    )
    cases.add(
        "snapshot_order_mismatch", "a and b swapped", receipt, [fetched[1], fetched[0], fetched[2]]
    )
    other = chain_rollout(ref, "rollout-other")
    cases.add(
        "wrong_rollout",
        "a of another rollout",
        receipt,
        [other.sink.fetch(["rollout-other/a"])[0], *fetched[1:]],
    )
    row_changes = {
        "wrong_parent_call_id": {"parent_call_id": "a"},
        "wrong_prev_len": {"prev_len": row_c["prev_len"] + 1, "cum_len": row_c["cum_len"] + 1},
        "wrong_delta_len": {"delta_len": row_c["delta_len"] + 1, "cum_len": row_c["cum_len"] + 1},
        "wrong_weight_version": {"weight_version": 99},
        "wrong_digest": {"digest": "0" * 64},
        "wrong_extras_digest": {"extras_digest": ref.digest.EMPTY_EXTRAS_DIGEST},
        "wrong_chain_hash": {"chain_hash": "0" * 64},
        "wrong_cumulative_hash": {"cumulative_hash": "0" * 64},
    }
    for code, change in row_changes.items():
        target = row_a if code == "wrong_extras_digest" else row_c
        manifest = [row_a, row_b, row_c]
        manifest[manifest.index(target)] = {**target, **change}
        changed = records.RolloutReceipt.model_validate({**dump(receipt), "manifest": manifest})
        cases.add(code, f"the manifest row differs: {sorted(change)}", changed, fetched)
    snapshot_changes: list[tuple[str, str, Any]] = [
        ("wrong_mode", "mode", "text"),
        ("wrong_cum_len", "cum_len", 99),
        ("wrong_schema_version", "schema_version", 3),
        ("wrong_digest_version", "digest_version", 3),
        ("wrong_extras_digest_version", "extras_digest_version", 2),
        ("invalid_snapshot", "token_ids_delta", [21, 104]),
        ("corrupt_digest", "token_ids_delta", [21, 104, 999]),
        ("corrupt_digest_log_prob", "generation_log_probs_delta", [0.0, -0.125, -0.3]),
    ]
    for name, field, value in snapshot_changes:
        cases.add(
            name,
            f"snapshot c's {field} altered after validation",
            receipt,
            fetched,
            snapshot_tamper=[(2, field, value)],
        )
    for name, field, value in [
        ("unsupported_schema", "schema_version", 3),
        ("unsupported_digest", "digest_version", 1),
        ("unsupported_extras_digest", "extras_digest_version", 2),
        ("missing_terminal_none", "terminal_model_call_id", None),
        ("missing_terminal_absent", "terminal_model_call_id", "zz"),
    ]:
        cases.add(
            name,
            f"receipt {field} altered after validation",
            receipt,
            fetched,
            receipt_tamper={field: value},
        )
    orphan = records.RolloutReceipt.model_validate({**dump(receipt), "manifest": [row_b, row_c]})
    cases.add("missing_parent", "a is not in the manifest", orphan, fetched[1:])

    x_snapshot, x_row = manual_call(ref, "x", "y", 5, [0.0, 1.0])
    y_snapshot, y_row = manual_call(ref, "y", "x", 1, [0.0, 0.0, 0.0, 1.0])
    cycle = records.RolloutReceipt(
        rollout_id=ROLLOUT,
        manifest=[x_row, y_row],
        terminal_model_call_id="x",
        terminal_selection="heuristic",
    )
    cases.add("lineage_cycle", "x and y name each other", cycle, [x_snapshot, y_snapshot])
    m_chain = ref.digest.compute_chain_hash(None, [200, 201, 202])
    m_snapshot, m_row = manual_call(ref, "m", None, 0, [1.0, 0.0, 1.0], chain_hash=m_chain)
    mixed = records.RolloutReceipt(
        rollout_id=ROLLOUT,
        manifest=[m_row],
        terminal_model_call_id="m",
        terminal_selection="content",
    )
    cases.add("invalid_mask_order", "generation before carry", mixed, [m_snapshot])
    return {"snapshots": cases.snapshots, "cases": cases.cases}
