"""The end-to-end staged rollouts, as scripts (generator only).

A call script is what the harness sends (``request``), when the middleware
admitted it (``admitted_at``), the weight version the worker reports, what the
engine answers (``engine``) and how the staging store treats the write
(``sink``). A finalize script names the scored response by the call that
served it; the generator turns it into the concrete record.
"""

from __future__ import annotations

from typing import Any

__all__ = ["scenario_specs"]

START = 1767225600.0  # 2026-01-01T00:00:00Z; admission times are START + k/4 (exact floats)

SYSTEM = {"role": "system", "content": "You are a careful calculator."}
SUB_SYSTEM = {"role": "system", "content": "Summarize the arithmetic so far."}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


U1, U2, U3 = user("What is 2+2?"), user("And 3+3?"), user("Add both answers.")


def call(
    call_id: str,
    slot: int,
    messages: list[dict[str, Any]],
    *,
    prompt: list[int],
    generation: list[int],
    content: str,
    logprobs: list[float] | None = None,
    weight_version: int = 7,
    sink: str = "ok",
    **engine: Any,
) -> dict[str, Any]:
    """One call script; ``prompt`` is what the engine prompt holds after the parent prefix."""
    return {
        "model_call_id": call_id,
        "admitted_at": START + slot / 4,
        "weight_version": weight_version,
        "request": {"model": "policy", "messages": messages},
        "engine": {
            "completion_id": f"chatcmpl-{call_id}",
            "prompt_after_prefix": prompt,
            "generation": generation,
            "logprobs": logprobs if logprobs is not None else [-0.5] * len(generation),
            "content": content,
            **engine,
        },
        "sink": sink,
    }


def first(call_id: str = "c1", slot: int = 0, **engine: Any) -> dict[str, Any]:
    return call(
        call_id,
        slot,
        [SYSTEM, U1],
        prompt=[1, 2, 3],
        generation=[101, 102],
        content="4",
        logprobs=[-0.25, -0.5],
        **engine,
    )


def second(call_id: str = "c2", slot: int = 1, **engine: Any) -> dict[str, Any]:
    messages = [SYSTEM, U1, assistant("4"), U2]
    return call(
        call_id,
        slot,
        messages,
        prompt=[11, 12],
        generation=[103],
        content="6",
        logprobs=[-0.125],
        **engine,
    )


def third(call_id: str = "c3", slot: int = 2, after: str = "6", **engine: Any) -> dict[str, Any]:
    messages = [SYSTEM, U1, assistant("4"), U2, assistant(after), U3]
    return call(
        call_id,
        slot,
        messages,
        prompt=[21, 22],
        generation=[104, 105],
        content="10",
        logprobs=[-0.1, -2.5],
        **engine,
    )


def scored(call_id: str, name: str = "scored_by_response_id") -> dict[str, Any]:
    return {
        "name": name,
        "description": f"The scored response is the one {call_id} served (its id and output).",
        "response_of": call_id,
    }


def _basic_specs(routes: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "name": "clean_chain",
            "description": "Three calls, each continuing the previous one; extras carry routed "
            "experts as a nested list (c1) and as an nrlre1 envelope (c2), c3 has none and "
            "stages two attachments.",
            "calls": [
                first(routed_experts=routes["c1"]),
                second(routed_experts=routes["c2"]),
                {
                    **third(),
                    "attachments": {
                        "image_embeddings": {"bytes_hex": "000102ff"},
                        "image_meta": {"json": {"height": 1, "width": 2}},
                    },
                },
            ],
            "finalize": [
                scored("c3"),
                {
                    "name": "heuristic",
                    "description": "No response, no declared id: the parent-link walk picks c3.",
                },
                {
                    "name": "declared_c2",
                    "description": "The harness declares c2's served id: the row ends at c2.",
                    "declared_of": "c2",
                },
                {
                    "name": "explicit_c2",
                    "description": "The record names c2 by call id: the row ends at c2.",
                    "explicit": "c2",
                },
                {
                    "name": "declared_not_captured",
                    "description": "A declared id no row carries: the receipt is poisoned with "
                    "terminal_selection:declared_terminal_not_captured.",
                    "declared_id": "chatcmpl-unknown",
                },
            ],
        },
        {
            "name": "abandoned_retry_without_witness",
            "description": "c2a and c2b answer the same request differently and nothing "
            "continues either: the heuristic cannot choose.",
            "calls": [
                first(),
                second("c2a"),
                call(
                    "c2b",
                    2,
                    [SYSTEM, U1, assistant("4"), U2],
                    prompt=[11, 12],
                    generation=[106, 107],
                    content="six",
                ),
            ],
            "finalize": [
                {
                    "name": "heuristic",
                    "description": "Two childless siblings: poisoned with "
                    "terminal_selection:ambiguous_terminal.",
                },
                scored("c2b"),
            ],
        },
        {
            "name": "retry_after_client_timeout",
            "description": "c2a commits but the client times out and retries; c2b answers "
            "differently and c3 continues c2b.",
            "calls": [
                first(),
                second("c2a"),
                call(
                    "c2b",
                    2,
                    [SYSTEM, U1, assistant("4"), U2],
                    prompt=[11, 12],
                    generation=[106, 107],
                    content="six",
                ),
                third(slot=3, after="six"),
            ],
            "finalize": [
                scored("c3"),
                {"name": "heuristic", "description": "The walk prefers c2b, which has a child."},
            ],
        },
        {
            "name": "engine_500_then_retry",
            "description": "The engine fails c2a after admission (HTTP 500); the retry c2b and "
            "c3 commit, but the failure row poisons the rollout.",
            "calls": [first(), second("c2a", fault="http_500"), second("c2b", 2), third(slot=3)],
            "finalize": [scored("c3")],
        },
        {
            "name": "weight_versions_7_7_8",
            "description": "Weight versions 7, 7, 8 give spans [0,4), [4,6), [6,10); the engine "
            "puts its token fields on the message.",
            "calls": [
                call(
                    "c1",
                    0,
                    [SYSTEM, U1],
                    prompt=[1, 2, 3],
                    generation=[101],
                    content="4",
                    token_fields="message",
                ),
                call(
                    "c2",
                    1,
                    [SYSTEM, U1, assistant("4"), U2],
                    prompt=[11],
                    generation=[102],
                    content="6",
                    token_fields="message",
                ),
                call(
                    "c3",
                    2,
                    [SYSTEM, U1, assistant("4"), U2, assistant("6"), U3],
                    prompt=[21, 22, 23],
                    generation=[103],
                    content="10",
                    weight_version=8,
                    token_fields="message",
                ),
            ],
            "finalize": [scored("c3")],
        },
        {
            "name": "few_shot_first_call_is_a_text_root",
            "description": "The first request already holds an assistant turn (a few-shot "
            "example): it resolves nowhere, the rollout has no rows yet, so it becomes a text "
            "root; the next call resolves to it.",
            "calls": [
                call(
                    "c1",
                    0,
                    [SYSTEM, user("1+1?"), assistant("2"), U1],
                    prompt=[1, 2, 3, 4, 5],
                    generation=[101],
                    content="4",
                ),
                call(
                    "c2",
                    1,
                    [SYSTEM, user("1+1?"), assistant("2"), U1, assistant("4"), U2],
                    prompt=[11],
                    generation=[102],
                    content="6",
                ),
            ],
            "finalize": [scored("c2")],
        },
    ]


def _identical_retry(ledger: str) -> dict[str, Any]:
    outcome = (
        "c3 finds two identical candidates and is refused (unresolved_parent)"
        if ledger == "file"
        else "the identical candidates collapse to c2a and c3 continues it"
    )
    return {
        "name": f"identical_retry_{ledger}_ledger",
        "description": f"c2a and c2b are identical (same request, tokens and output); with the "
        f"{ledger} ledger {outcome}.",
        "ledger": ledger,
        "calls": [first(), second("c2a"), second("c2b", 2), third(slot=3)],
        "finalize": [scored("c3"), {"name": "heuristic", "description": "No witness given."}],
    }


def _branch_specs() -> list[dict[str, Any]]:
    sub = call(
        "sub-1",
        2,
        [SUB_SYSTEM, user("Summarize: 4 then 6.")],
        prompt=[50, 51],
        generation=[151, 152],
        content="4, 6",
    )
    return [
        {
            "name": "subagent_branch",
            "description": "A fresh-context subagent call is a second text root next to the "
            "main chain; each terminal has its own row.",
            "calls": [first("main-1"), second("main-2"), sub, third("main-3", 3)],
            "finalize": [
                scored("main-3", "main_by_response_id"),
                {
                    "name": "subagent_by_declared_id",
                    "description": "The harness declares the subagent's served id.",
                    "declared_of": "sub-1",
                },
                scored("sub-1", "subagent_by_response_id"),
                {"name": "heuristic", "description": "The root with children wins: main."},
            ],
        },
        {
            "name": "worked_example",
            "description": "Main A->B->C with B retried after a client timeout (B1, B2) and a "
            "subagent S between B2 and C.",
            "calls": [
                first("A"),
                second("B1"),
                call(
                    "B2",
                    2,
                    [SYSTEM, U1, assistant("4"), U2],
                    prompt=[11, 12],
                    generation=[106, 107],
                    content="six",
                ),
                {
                    **sub,
                    "model_call_id": "S",
                    "admitted_at": START + 3 / 4,
                    "engine": {**sub["engine"], "completion_id": "chatcmpl-S"},
                },
                third("C", 4, after="six"),
            ],
            "finalize": [
                scored("C"),
                scored("S", "subagent_by_response_id"),
                {"name": "heuristic", "description": "Roots with children: A; then B2; then C."},
            ],
        },
    ]


def _fault_specs() -> list[dict[str, Any]]:
    forged = "ab" * 32
    return [
        {
            "name": "forged_parent_chain_hash",
            "description": "The admission reaching the worker for c2 carries a forged "
            "parent_chain_hash; c2 and c3 commit, verification finds the broken chain.",
            "calls": [first(), second(forge_parent_chain_hash=forged), third()],
            "finalize": [scored("c3")],
        },
        {
            "name": "empty_terminal_generation",
            "description": "The engine generates nothing for c2: its delta is carry only.",
            "calls": [
                first(),
                call(
                    "c2",
                    1,
                    [SYSTEM, U1, assistant("4"), U2],
                    prompt=[11, 12],
                    generation=[],
                    content="",
                ),
            ],
            "finalize": [scored("c2")],
        },
        {
            "name": "wrong_prefix_at_terminal",
            "description": "The worker resolves a wrong prefix for c3 (one token replaced) and "
            "the engine prompt starts with it.",
            "calls": [first(), second(), third(prefix_fault={"index": 0, "token": 999})],
            "finalize": [scored("c3")],
        },
        {
            "name": "wrong_prefix_mid_chain",
            "description": "The worker resolves a wrong prefix for c2 only; 0.7.0 accepts the row "
            "because only the terminal's cumulative hash is checked.",
            "calls": [first(), second(prefix_fault={"index": 0, "token": 999}), third()],
            "finalize": [scored("c3")],
        },
        {
            "name": "sink_rejects",
            "description": "The staging store refuses c2: two failure rows for c2, and c3 "
            "cannot resolve its parent.",
            "calls": [first(), second(sink="reject"), third()],
            "finalize": [scored("c3")],
        },
        {
            "name": "lost_acknowledgement",
            "description": "c2 is stored but its acknowledgement is lost: same failure rows as a "
            "refusal, and the stored record is an orphan.",
            "calls": [first(), second(sink="lost_ack"), third()],
            "finalize": [scored("c3")],
        },
        {
            "name": "worker_ignores_admission",
            "description": "The worker answers c2 without commit coordinates.",
            "calls": [first(), second(fault="ignores_ng_capture")],
            "finalize": [scored("c2")],
        },
        {
            "name": "coordinates_diverge",
            "description": "The worker's coordinates for c2 claim another prev_len; the staged "
            "record stays an orphan.",
            "calls": [first(), second(fault="coordinates_diverge")],
            "finalize": [scored("c1")],
        },
        {
            "name": "served_response_without_id",
            "description": "The served response for c1 has an empty id.",
            "calls": [first(served_id="")],
            "finalize": [{"name": "heuristic", "description": "Nothing committed."}],
        },
        {
            "name": "server_synthesized_completion",
            "description": "The model server answers c2 itself (no worker completion): only the "
            "middleware's failure row is written.",
            "calls": [first(), second(fault="server_synthesized")],
            "finalize": [scored("c1")],
        },
    ]


def scenario_specs(routes: dict[str, Any]) -> list[dict[str, Any]]:
    """Every scenario; ``routes`` holds the routed-experts payloads of the clean chain."""
    return [
        *_basic_specs(routes),
        _identical_retry("file"),
        _identical_retry("memory"),
        *_branch_specs(),
        *_fault_specs(),
    ]
