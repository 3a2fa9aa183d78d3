"""Terminal selection and attribution cases of generate_core.py (run by hand, never in CI)."""

from __future__ import annotations

from typing import Any

from _core_reference import (
    Json,
    Reference,
    Rollout,
    assistant,
    dump,
    tool_call,
    tool_output,
    user,
)
from _core_verify_cases import chain_rollout, manual_call

# --------------------------------------------------------------------------- terminal


def transcript_rollout(ref: Reference) -> Rollout:
    """a -> b -> c with growing transcripts, a retry b2 of b identical to it, a subagent s."""
    rollout = Rollout(ref)
    turn_a = [user("plan the fix")]
    out_a = [assistant("I will read the file"), tool_call("t1", '{"path": "x.py"}')]
    turn_b = [*turn_a, *out_a, tool_output("t1", "print(1)")]
    out_b = [assistant("Found it"), tool_call("t2", '{"path": "x.py", "line": 1}')]
    turn_c = [*turn_b, *out_b, tool_output("t2", "ok")]
    out_c = [assistant("Done: the fix is applied")]
    rollout.call("a", None, [1, 2, 3], [101, 102], request=turn_a, response=out_a)
    rollout.call("b", "a", [11, 12], [103], request=turn_b, response=out_b)
    rollout.call("b2", "a", [11, 12], [103], request=turn_b, response=out_b)
    rollout.call("c", "b", [21], [104, 105], request=turn_c, response=out_c)
    rollout.call("s", None, [7], [8], request=[user("summarize")], response=[assistant("short")])
    return rollout


def terminal_cases(ref: Reference) -> Json:
    selection_cases: list[Json] = []

    def select(name: str, description: str, rows: list[Any]) -> None:
        result = ref.selection.select_terminal_call(rows)
        selection_cases.append(
            {
                "name": name,
                "description": description,
                "records": [dump(row) for row in rows],
                "expected": {"call_id": result.terminal_model_call_id, "reason": result.reason},
            }
        )

    records = ref.records
    chain = chain_rollout(ref)
    a, b, c = chain.rows
    select("no_records", "an empty manifest", [])
    select("duplicate_call_id", "a twice", [a, a])
    select("orphaned_row", "b without a", [b, c])
    _, x_row = manual_call(ref, "x", "y", 4, [0.0, 1.0])
    _, y_row = manual_call(ref, "y", "x", 1, [0.0, 0.0, 0.0, 1.0])
    select("no_root", "x and y name each other", [x_row, y_row])
    select("single_chain", "a -> b -> c", [a, b, c])
    retry = chain_rollout(ref)
    retry.call("b2", "a", [13], [106])
    retry.call("d", "b2", [14], [107])
    select(
        "retry_prefers_extended_child", "b2 has a child, b has c", retry.rows[:2] + retry.rows[3:]
    )
    select("ambiguous_siblings", "b and b2 both childless", retry.rows[:2] + retry.rows[3:4])
    select("ambiguous_extended_siblings", "b -> c and b2 -> d", retry.rows)
    roots = Rollout(ref)
    roots.call("r1", None, [1], [2], admitted_at=50.0)
    roots.call("r2", None, [3], [4], admitted_at=20.0)
    roots.call("k1", "r1", [5], [6])
    roots.call("k2", "r2", [7], [8])
    roots.call("lonely", None, [9], [10], admitted_at=1.0)
    select("earliest_extended_root", "r2 admitted before r1; lonely has no child", roots.rows)
    unstamped = [
        records.CallRecord.model_validate({**dump(row), "admitted_at": None})
        if row.model_call_id == "r2"
        else row
        for row in roots.rows
    ]
    select("unstamped_root_last", "r2 lost its admission time", unstamped)
    all_unstamped = [
        records.CallRecord.model_validate({**dump(row), "admitted_at": None}) for row in roots.rows
    ]
    select("manifest_order_breaks_ties", "no admission times at all", all_unstamped)

    attribution_cases: list[Json] = []
    transcript = transcript_rollout(ref)
    rows = transcript.rows

    def attribute(name: str, description: str, record: Json, entries: list[Any] = rows) -> None:
        response = record.get("response")
        result = ref.terminal.resolve_terminal(
            entries,
            response,
            record.get("_ng_terminal_model_call_id") or None,
            declared_response_id=record.get("terminal_response_id") or None,
        )
        attribution_cases.append(
            {
                "name": name,
                "description": description,
                "records": [dump(row) for row in entries],
                "record": record,
                "expected": {
                    "call_id": result.model_call_id,
                    "method": result.method,
                    "reason": result.reason,
                },
            }
        )

    full = [
        assistant("I will read the file"),
        tool_call("t1", '{"path": "x.py"}'),
        tool_output("t1", "print(1)"),
        assistant("Found it"),
        tool_call("t2", '{"path": "x.py", "line": 1}'),
        tool_output("t2", "ok"),
        assistant("Done: the fix is applied"),
    ]
    final = [assistant("Done: the fix is applied")]
    attribute(
        "response_id_and_content",
        "id and final turn agree",
        {"response": {"id": "resp-c", "output": final}},
    )
    attribute(
        "full_transcript", "continuation fingerprint of c", {"response": {"id": "", "output": full}}
    )
    attribute(
        "trailing_block",
        "a merged transcript ends with c's own output",
        {"response": {"output": [user("x"), assistant("Something else"), user("y"), *final]}},
    )
    attribute(
        "explicit",
        "explicit call id",
        {"_ng_terminal_model_call_id": "c", "response": {"id": "resp-c", "output": final}},
    )
    attribute(
        "explicit_missing",
        "explicit id not captured",
        {"_ng_terminal_model_call_id": "zz", "response": {"id": "resp-c"}},
    )
    attribute("declared", "declared response id", {"terminal_response_id": "resp-s"})
    attribute(
        "declared_missing",
        "declared id not captured",
        {"terminal_response_id": "resp-zz", "response": {"id": "resp-c"}},
    )
    attribute(
        "identical_retries_collapse",
        "b and b2 carry one sequence",
        {
            "response": {
                "output": [assistant("Found it"), tool_call("t2", '{"path": "x.py", "line": 1}')]
            }
        },
    )
    attribute(
        "disagreement",
        "id names b, content names c",
        {"response": {"id": "resp-b", "output": final}},
    )
    attribute("no_response", "nothing to attribute by", {"reward": 1.0})
    attribute("response_without_id", "content alone", {"response": {"output": final}})
    attribute(
        "response_id_no_match",
        "an unknown id",
        {"response": {"id": "resp-zz", "output": [user("hi")]}},
    )
    attribute(
        "unfingerprintable_output",
        "an assistant message with numeric content",
        {"response": {"id": "resp-zz", "output": [{"role": "assistant", "content": 5}]}},
    )
    attribute("no_output", "an empty output list", {"response": {"id": "resp-zz", "output": []}})
    old_version = [
        records.CallRecord.model_validate({**dump(row), "fingerprint_version": 0}) for row in rows
    ]
    attribute(
        "other_fingerprint_version_ignored",
        "rows stamped without fingerprints",
        {"response": {"output": final}},
        old_version,
    )
    twins = Rollout(ref)
    twins.call("p", None, [1], [2])
    twins.call("q", None, [1], [3])
    shared_id = [
        records.CallRecord.model_validate({**dump(row), "response_id": "resp-shared"})
        for row in twins.rows
    ]
    attribute(
        "declared_ambiguous",
        "two different calls served one id",
        {"terminal_response_id": "resp-shared"},
        shared_id,
    )
    attribute(
        "response_id_ambiguous",
        "two different calls served one id",
        {"response": {"id": "resp-shared"}},
        shared_id,
    )
    return {"selection": selection_cases, "attribution": attribution_cases}
