"""Digest and wire-type cases of generate_core.py (run by hand, never in CI)."""

from __future__ import annotations

from typing import Any

from _core_reference import ROLLOUT, Json, Reference, Rollout, dump, error_name

# --------------------------------------------------------------------------- digests


def digest_cases(ref: Reference) -> Json:
    digest = ref.digest
    token_inputs = {
        "empty": [],
        "zero": [0],
        "section_3_chain_tokens": [1, 2, 3, 101, 102, 11, 12, 103],
        "uint64_extremes": [2**64 - 1, 0, 2**63, 2**63 - 1],
        "long": list(range(0, 400_000, 331)),
    }
    root_hash = digest.compute_chain_hash(None, [1, 2, 3, 101, 102])
    chain_inputs = [
        ("section_3_root", None, [1, 2, 3, 101, 102]),
        ("section_3_child", root_hash, [11, 12, 103]),
        ("root_single_token", None, [7]),
        ("child_of_all_zero_parent", "0" * 64, [2**64 - 1]),
    ]
    extras_inputs: list[tuple[str, Any]] = [
        ("none", None),
        ("empty_mapping", {}),
        ("golden", {"routed_experts": [[[1, 2]], [[3, 4]]]}),
        ("scalars", {"b": True, "f": -0.5, "i": -(2**63), "n": None, "s": "héllo", "z": 2**63 - 1}),
        ("key_order", {"zeta": 1, "alpha": 2, "Beta": 3, "émoji": 4, "": 5}),
        ("long_int_rows", {"routed_experts": [[list(range(i, i + 20))] for i in range(3)]}),
        ("mixed_list", {"x": [1, 1.0, "1", True, None, [], {}]}),
        ("envelope", {"routed_experts": "nrlre1:int16:2x1x2:AQACAAMABAA=", "media_spans": []}),
        ("int_above_int64", {"x": [2**63, *range(20)]}),
        ("int_below_int64", {"x": -(2**63) - 1}),
    ]
    staged_fields = {
        "schema_version": 2,
        "digest_version": 2,
        "extras_digest_version": 1,
        "rollout_id": "rollout-1",
        "model_call_id": "call-1",
        "parent_call_id": None,
        "mode": "text",
        "prev_len": 0,
        "delta_len": 3,
        "cum_len": 3,
        "weight_version": 0,
        "token_ids_delta": [5, 6, 7],
        "token_mask_delta": [0.0, 1.0, 1.0],
        "generation_log_probs_delta": [0.0, -0.1, -1e-40],
        "extras_digest": digest.EMPTY_EXTRAS_DIGEST,
        "chain_hash": "1" * 64,
        "cumulative_hash": "2" * 64,
    }
    staged_variants: list[tuple[str, dict[str, Any]]] = [
        ("root_with_subnormal_log_prob", {}),
        ("negative_zero_mask", {"token_mask_delta": [-0.0, 1.0, 1.0]}),
        ("unicode_ids", {"rollout_id": "rollout-é", "model_call_id": "调用"}),
        ("weight_version_u64_max", {"weight_version": 2**64 - 1}),
        ("log_prob_near_f32_max", {"generation_log_probs_delta": [0.0, -3.4028235e38, -1.0]}),
        ("log_prob_overflows_f32", {"generation_log_probs_delta": [0.0, -3.5e38, -1.0]}),
        ("carry_log_prob_not_zero", {"generation_log_probs_delta": [-0.5, -0.1, -0.2]}),
        ("mask_not_binary", {"token_mask_delta": [0.0, 0.5, 1.0]}),
        ("delta_len_mismatch", {"delta_len": 2, "cum_len": 2}),
        ("cum_len_mismatch", {"cum_len": 4}),
        ("token_id_too_large", {"token_ids_delta": [5, 2**64, 7]}),
        ("integer_log_prob", {"generation_log_probs_delta": [0.0, -1, -1.0]}),
        ("root_with_prev_len", {"prev_len": 1, "cum_len": 4}),
        ("bad_extras_digest", {"extras_digest": "A" * 64}),
    ]
    return {
        "token_hashes": [
            {"name": name, "ids": ids, "expected": digest.hash_token_ids(ids)}
            for name, ids in token_inputs.items()
        ],
        "chain_hashes": [
            {
                "name": name,
                "parent": parent,
                "delta": delta,
                "expected": digest.compute_chain_hash(parent, delta),
            }
            for name, parent, delta in chain_inputs
        ],
        "extras_digests": [
            {
                "name": name,
                "extras": extras,
                **_named(error_name(lambda e=extras: digest.compute_extras_digest(e))),
            }
            for name, extras in extras_inputs
        ],
        "staging_digests": [
            {
                "name": name,
                "fields": {**staged_fields, **change},
                **_named(
                    error_name(
                        lambda c=change: digest.compute_staging_digest(**{**staged_fields, **c})
                    )
                ),
            }
            for name, change in staged_variants
        ],
    }


def _named(result: Json) -> Json:
    return {"expected": result["value"]} if "value" in result else {"error": result["error"]}


# --------------------------------------------------------------------------- records

# Where docs/staging.md refuses what the reference's lax pydantic fields coerce.
_LAX_NOTE = (
    "the reference's lax pydantic field coerces this; docs/staging.md#types takes only "
    "the JSON type its own dumps produce"
)


def record_cases(ref: Reference) -> Json:
    records = ref.records
    rollout = Rollout(ref)
    rollout.call("a", None, [1, 2, 3], [101, 102], extras={"routed_experts": [[[1, 2]]]})
    child = rollout.call("b", "a", [11, 12], [103])
    staged = dump(rollout.sink.staged[f"{ROLLOUT}/b"])
    snapshot = {key: value for key, value in staged.items() if key != "extras"}
    root_staged = dump(rollout.sink.staged[f"{ROLLOUT}/a"])
    row = dump(child)
    receipt = dump(rollout.receipt("b", reward=1.0))
    cases: list[Json] = []

    def case(name: str, type_name: str, data: Json, *, lax: bool = False) -> None:
        model = getattr(records, type_name)
        try:
            expected: Json = {"valid": True, "json": dump(model.model_validate(data))}
        except Exception:
            expected = {"valid": False}
        entry: Json = {"name": name, "type": type_name, "input": data}
        if lax:
            assert expected["valid"], name
            entry.update(expected={"valid": False}, reference=expected, note=_LAX_NOTE)
        else:
            entry["expected"] = expected
        cases.append(entry)

    base = "StagedCallBaseSnapshot"
    case("snapshot_valid", base, snapshot)
    case("snapshot_integer_mask_becomes_float", base, {**snapshot, "token_mask_delta": [0, 0, 1]})
    case("snapshot_with_extras_key", base, staged)
    case("snapshot_float_prev_len", base, {**snapshot, "prev_len": 5.0})
    case("snapshot_bool_weight_version", base, {**snapshot, "weight_version": False})
    case("snapshot_bool_token_id", base, {**snapshot, "token_ids_delta": [True, 12, 103]})
    case("snapshot_float_token_id", base, {**snapshot, "token_ids_delta": [11.0, 12, 103]})
    case(
        "snapshot_bool_log_prob", base, {**snapshot, "generation_log_probs_delta": [0.0, 0.0, True]}
    )
    case("snapshot_wrong_digest", base, {**snapshot, "digest": "f" * 64})
    case(
        "snapshot_uppercase_digest",
        base,
        {**snapshot, "chain_hash": snapshot["chain_hash"].upper()},
    )
    case("snapshot_unknown_field", base, {**snapshot, "comment": "x"})
    case("snapshot_missing_field", base, {k: v for k, v in snapshot.items() if k != "cum_len"})
    case("snapshot_extras_digest_defaults_to_empty", base, _without_extras_digest(ref, snapshot))
    case("snapshot_schema_version_float", base, {**snapshot, "schema_version": 2.0})
    case("snapshot_schema_version_3", base, {**snapshot, "schema_version": 3})
    case("snapshot_mode_unknown", base, {**snapshot, "mode": "audio"})
    case("snapshot_empty_parent", base, {**snapshot, "parent_call_id": ""})
    case("record_valid", "StagedCallRecord", root_staged)
    case("record_empty_extras_mapping", "StagedCallRecord", {**root_staged, "extras": {}})
    case("record_extras_not_object", "StagedCallRecord", {**root_staged, "extras": [1]})
    case("call_record_valid", "CallRecord", row)
    case("call_record_integer_admitted_at", "CallRecord", {**row, "admitted_at": 5})
    case("call_record_string_admitted_at", "CallRecord", {**row, "admitted_at": "5"})
    case("call_record_bool_admitted_at", "CallRecord", {**row, "admitted_at": True})
    case("call_record_empty_response_id", "CallRecord", {**row, "response_id": ""})
    case("call_record_empty_fingerprint", "CallRecord", {**row, "output_fingerprint": ""})
    case("call_record_null_fingerprint_version", "CallRecord", {**row, "fingerprint_version": None})
    case(
        "call_record_zero_delta", "CallRecord", {**row, "delta_len": 0, "cum_len": row["prev_len"]}
    )
    case("call_record_child_text_mode", "CallRecord", {**row, "mode": "text"})
    case("call_record_root_defaults_to_token_in", "CallRecord", _root_row_without_mode(row))
    case("call_record_huge_weight_version", "CallRecord", {**row, "weight_version": 2**70})
    case("failure_valid", "ManifestFailure", {"model_call_id": "c", "reason": "unresolved_parent"})
    case("failure_empty_reason", "ManifestFailure", {"model_call_id": "c", "reason": ""})
    case(
        "manifest_valid",
        "RolloutManifest",
        {"rollout_id": ROLLOUT, "records": [row], "failures": []},
    )
    case("manifest_defaults", "RolloutManifest", {"rollout_id": ROLLOUT})
    case("receipt_valid", "RolloutReceipt", receipt)
    case("receipt_integer_reward", "RolloutReceipt", {**receipt, "reward": 2})
    case("receipt_string_reward", "RolloutReceipt", {**receipt, "reward": "0.5"}, lax=True)
    case("receipt_bool_reward", "RolloutReceipt", {**receipt, "reward": True}, lax=True)
    case("receipt_infinite_reward", "RolloutReceipt", {**receipt, "reward": 1e400})
    case(
        "receipt_string_poisoned", "RolloutReceipt", {**receipt, "capture_poisoned": "no"}, lax=True
    )
    case("receipt_unknown_terminal", "RolloutReceipt", {**receipt, "terminal_model_call_id": "zz"})
    case("receipt_duplicate_rows", "RolloutReceipt", {**receipt, "manifest": [row, row]})
    case("receipt_unpoisoned_with_reason", "RolloutReceipt", {**receipt, "failure_reason": "x"})
    case(
        "receipt_poisoned_empty_reason",
        "RolloutReceipt",
        {**receipt, "capture_poisoned": True, "failure_reason": ""},
    )
    case(
        "receipt_unattributed_unpoisoned",
        "RolloutReceipt",
        {**receipt, "terminal_model_call_id": None, "terminal_selection": None},
    )
    case(
        "receipt_poisoned_without_selection",
        "RolloutReceipt",
        {
            **receipt,
            "terminal_model_call_id": None,
            "terminal_selection": None,
            "capture_poisoned": True,
            "failure_reason": "unresolved_parent",
        },
    )
    case(
        "receipt_unknown_selection", "RolloutReceipt", {**receipt, "terminal_selection": "explicit"}
    )
    case("stage_result_ok", "StageResult", {"ok": True, "staging_key": "r/c"})
    case("stage_result_ok_without_key", "StageResult", {"ok": True})
    case("stage_result_failed_empty_error", "StageResult", {"ok": False, "error": ""})
    case("stage_result_failed", "StageResult", {"ok": False, "error": "disk full"})
    case("stage_result_integer_ok", "StageResult", {"ok": 1, "staging_key": "r/c"}, lax=True)
    return {"cases": cases}


def _without_extras_digest(ref: Reference, snapshot: Json) -> Json:
    """A snapshot whose extras_digest is left out (valid when it equals the empty digest)."""
    data = {k: v for k, v in snapshot.items() if k not in ("extras_digest", "digest")}
    fields = {k: v for k, v in data.items()}
    fields["extras_digest"] = ref.digest.EMPTY_EXTRAS_DIGEST
    data["digest"] = ref.digest.compute_staging_digest(**fields)
    return data


def _root_row_without_mode(row: Json) -> Json:
    """A root row that leaves mode out: it defaults to token_in and is refused."""
    data = {k: v for k, v in row.items() if k != "mode"}
    return {**data, "parent_call_id": None, "prev_len": 0, "cum_len": row["delta_len"]}
