"""resolve_terminal and select_terminal_call over real manifest rows (generator only)."""

from __future__ import annotations

from typing import Any

from _harness import dump
from _reference import Gym
from _scenarios import scored_response
from _trainer import SELECTION_OF_METHOD, attribution_json

__all__ = ["terminal_cases"]

Json = Any


class Rows:
    """One scenario run's manifest rows by call id, and its served responses."""

    def __init__(self, gym: Gym, run: Any) -> None:
        self.by_id = {
            row["model_call_id"]: gym.staged.CallRecord.model_validate(row)
            for row in run.case["expected"]["manifest"]["records"]
        }
        self.served = {
            call["model_call_id"]: call["served_response"]
            for call in run.case["expected"]["calls"]
            if call.get("served_response")
        }

    def pick(self, *names: str, **changes: dict[str, Any]) -> list[Any]:
        """The named rows in order; ``changes[name]`` updates that row (no validation)."""
        return [self.by_id[name].model_copy(update=changes.get(name, {})) for name in names]

    def response(self, name: str) -> Json:
        return scored_response(self.served[name])


def output_of(text: str) -> Json:
    return {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _witness_specs(retry: Rows, branch: Rows, twins: Rows) -> list[tuple[Any, ...]]:
    chain = retry.pick("c1", "c2a", "c2b", "c3")
    branch_rows = branch.pick("main-1", "main-2", "sub-1", "main-3")
    c3 = retry.response("c3")
    c2b_id = retry.served["c2b"]["id"]
    transcript = {
        "id": "resp-agent",
        "object": "response",
        "output": [
            output_of("4"),
            {"type": "message", "role": "user", "content": "And 3+3?"},
            output_of("six"),
            {"type": "message", "role": "user", "content": "Add."},
            output_of("10"),
        ],
    }
    merged = {**transcript, "output": [output_of("four"), transcript["output"][1], output_of("10")]}
    dup_output = retry.by_id["c2a"].output_fingerprint
    return [
        ("explicit_only", "The record names a call; no response.", chain, None, "c2b", None),
        (
            "explicit_not_captured",
            "The named call is absent; the response id attributes.",
            chain,
            c3,
            "c9",
            None,
        ),
        ("explicit_and_response_agree", "Both name c3.", chain, c3, "c3", None),
        ("declared", "The declared id matches c2b.", chain, None, None, c2b_id),
        (
            "declared_not_captured",
            "A declared id that matches nothing stops attribution, even "
            "though the response would attribute.",
            chain,
            c3,
            None,
            "chatcmpl-nope",
        ),
        (
            "declared_ambiguous",
            "Two rows carry the declared id with different tokens.",
            retry.pick("c1", "c2a", "c2b", "c3", c2a={"response_id": c2b_id}),
            None,
            None,
            c2b_id,
        ),
        (
            "declared_identical_collapse",
            "Two identical rows carry the declared id: the smaller call id wins.",
            twins.pick("c1", "c2a", "c2b", "c3", c2b={"response_id": twins.served["c2a"]["id"]}),
            None,
            None,
            twins.served["c2a"]["id"],
        ),
        ("response_id", "The response id and its output both name c3.", chain, c3, None, None),
        ("response_id_without_output", "Only the id.", chain, {"id": c3["id"]}, None, None),
        (
            "response_id_no_match_content_output",
            "An unknown id; the output is c2b's.",
            chain,
            {**retry.response("c2b"), "id": "resp-agent"},
            None,
            None,
        ),
        (
            "content_full_transcript",
            "A full transcript matches c3's continuation fingerprint.",
            chain,
            transcript,
            None,
            None,
        ),
        (
            "content_trailing_block",
            "A merged transcript: only its trailing assistant block (c3's output) matches.",
            chain,
            merged,
            None,
            None,
        ),
        (
            "content_ambiguous",
            "Two rows with the same output fingerprint and different tokens.",
            retry.pick("c1", "c2a", "c2b", "c3", c2b={"output_fingerprint": dup_output}),
            {"id": "resp-agent", "output": [output_of("6")]},
            None,
            None,
        ),
        (
            "content_identical_collapse",
            "The output matches two identical rows: the smaller call id wins.",
            twins.pick("c1", "c2a", "c2b", "c3"),
            {"id": "resp-agent", "output": [output_of("6")]},
            None,
            None,
        ),
        (
            "identical_witnesses_corroborate",
            "The response id names c2b, the content collapses "
            "to c2a; identical tokens corroborate, the first witness names the call.",
            twins.pick("c1", "c2a", "c2b", "c3"),
            {"id": twins.served["c2b"]["id"], "output": [output_of("6")]},
            None,
            None,
        ),
        (
            "witness_disagreement",
            "The id names c3, the output names c2a.",
            chain,
            {"id": c3["id"], "output": [output_of("6")]},
            None,
            None,
        ),
        (
            "fingerprint_version_mismatch",
            "Rows stamped with another fingerprint version never match by content.",
            retry.pick("c1", "c2a", "c2b", "c3", c3={"fingerprint_version": 1}),
            {"id": "resp-agent", "output": [output_of("10")]},
            None,
            None,
        ),
        ("no_response_object", "Nothing to attribute with.", chain, None, None, None),
        (
            "response_without_id_or_assistant_output",
            "No id, only a user item.",
            chain,
            {"output": [{"role": "user", "content": "hi"}]},
            None,
            None,
        ),
        (
            "subagent_by_response_id",
            "The subagent's own response.",
            branch_rows,
            branch.response("sub-1"),
            None,
            None,
        ),
        ("no_rows", "An empty manifest.", [], c3, None, None),
    ]


def _selection_specs(retry: Rows, branch: Rows) -> list[tuple[str, str, list[Any]]]:
    sub_child = branch.by_id["main-2"].model_copy(
        update={"model_call_id": "sub-2", "parent_call_id": "sub-1", "admitted_at": None}
    )
    branch_rows = branch.pick("main-1", "main-2", "sub-1", "main-3")
    c2b = retry.by_id["c2b"]
    return [
        ("selected_linear", "One chain.", retry.pick("c1", "c2b", "c3")),
        (
            "retry_with_child_preferred",
            "c2a is an abandoned leaf; c2b has a child.",
            retry.pick("c1", "c2a", "c2b", "c3"),
        ),
        (
            "abandoned_leaves_are_ambiguous",
            "Two childless siblings.",
            retry.pick("c1", "c2a", "c2b"),
        ),
        (
            "siblings_with_children_are_ambiguous",
            "Two siblings, each with a child.",
            [
                *retry.pick("c1", "c2a", "c2b", "c3"),
                retry.by_id["c3"].model_copy(
                    update={"model_call_id": "c3a", "parent_call_id": "c2a"}
                ),
            ],
        ),
        ("root_with_children_preferred", "A childless subagent root is passed over.", branch_rows),
        (
            "earliest_root_with_children",
            "Both roots have children: the earlier admission wins.",
            [*branch_rows, sub_child],
        ),
        (
            "unstamped_root_sorts_last",
            "main-1 has no admitted_at: the subagent root wins.",
            [
                *branch.pick(
                    "main-1", "main-2", "sub-1", "main-3", **{"main-1": {"admitted_at": None}}
                ),
                sub_child,
            ],
        ),
        (
            "admission_tie_uses_position",
            "Same admitted_at: manifest order decides.",
            [
                *branch.pick(
                    "main-1",
                    "main-2",
                    "sub-1",
                    "main-3",
                    **{"sub-1": {"admitted_at": branch.by_id["main-1"].admitted_at}},
                ),
                sub_child,
            ],
        ),
        ("no_records", "An empty manifest.", []),
        ("duplicate_call_id", "The same call id twice.", retry.pick("c1", "c1", "c2b")),
        ("orphaned_row", "c2b's parent is absent.", [c2b]),
        (
            "no_root",
            "Every row names a present parent.",
            [
                c2b.model_copy(update={"model_call_id": "x", "parent_call_id": "y"}),
                c2b.model_copy(update={"model_call_id": "y", "parent_call_id": "x"}),
            ],
        ),
    ]


def terminal_cases(gym: Gym, runs: dict[str, Any]) -> list[Json]:
    retry = Rows(gym, runs["retry_after_client_timeout"])
    branch = Rows(gym, runs["subagent_branch"])
    twins = Rows(gym, runs["identical_retry_memory_ledger"])
    cases = []
    for name, description, rows, response, explicit, declared in _witness_specs(
        retry, branch, twins
    ):
        result = gym.terminal.resolve_terminal(
            rows, response, explicit, declared_response_id=declared
        )
        expected = attribution_json(result)
        expected["receipt_selection"] = SELECTION_OF_METHOD.get(result.method)
        cases.append(
            {
                "name": f"resolve_terminal_{name}",
                "description": description,
                "inputs": {
                    "function": "resolve_terminal",
                    "rows": [dump(row) for row in rows],
                    "response": response,
                    "explicit_call_id": explicit,
                    "declared_response_id": declared,
                },
                "expected": expected,
            }
        )
    for name, description, rows in _selection_specs(retry, branch):
        chosen = gym.selection.select_terminal_call(rows)
        cases.append(
            {
                "name": f"select_terminal_call_{name}",
                "description": description,
                "inputs": {"function": "select_terminal_call", "rows": [dump(r) for r in rows]},
                "expected": {
                    "terminal_model_call_id": chosen.terminal_model_call_id,
                    "reason": chosen.reason,
                },
            }
        )
    return cases
