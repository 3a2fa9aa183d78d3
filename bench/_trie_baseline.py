"""The reference approach, kept only as a benchmark baseline.

Same rules as the seed builder (`token_finalizer.core.rebuild`), written the plain way:
token lists of Python ints and a per-token trie (one dict per token) to find
each call's parent. It shares no code with the service so that identical
output from both is evidence, not tautology.
"""

from __future__ import annotations

from typing import Any

_END = object()  # trie key under which the calls whose cumulative sequence ends here are listed


def _insert(trie: dict, tokens: list[int], call: int) -> None:
    node = trie
    for token in tokens:
        node = node.setdefault(token, {})
    node.setdefault(_END, []).append(call)


def _parents(trie: dict, prompt: list[int]) -> list[int]:
    node, best = trie, []
    for token in prompt:
        node = node.get(token)
        if node is None:
            break
        if _END in node:
            best = node[_END]
    return best


def build_response(entries: list[dict[str, Any]], rollout_id: str, model: str) -> dict[str, Any]:
    """Rebuild the response of plain-dict entries; raise ValueError when nothing is usable."""
    calls = [e for e in entries if e["generation_token_ids"]]
    if not calls:
        raise ValueError("only empty generations")
    calls.sort(key=lambda e: (len(e["prompt_token_ids"]), e["model_call_id"]))
    trie: dict = {}
    for i, e in enumerate(calls):
        _insert(trie, e["prompt_token_ids"] + e["generation_token_ids"], i)
    parent: list[int | None] = []
    quarantined: list[bool] = []
    children: list[list[int]] = [[] for _ in calls]
    for i, e in enumerate(calls):
        found = [p for p in _parents(trie, e["prompt_token_ids"]) if p != i]
        parent.append(found[0] if found else None)
        if found:
            children[found[0]].append(i)
        quarantined.append(len(found) > 1)  # only the ambiguous call itself
    # Retry groups in the processing order of their first member: a dict keeps
    # insertion order, and sibling sets come first to last by their first call.
    groups: dict[tuple, list[int]] = {}
    for i, e in enumerate(calls):
        groups.setdefault((parent[i], tuple(e["prompt_token_ids"])), []).append(i)
    first_of_set: dict[int | None, int] = {}
    for i in range(len(calls)):
        first_of_set.setdefault(parent[i], i)
    ordered = sorted(groups.items(), key=lambda kv: (first_of_set[kv[0][0]], kv[1][0]))
    unresolved: list[int] = []
    for _, members in ordered:
        if len(members) < 2:
            continue
        live = [m for m in members if any(not quarantined[c] for c in children[m])]
        if not live:
            unresolved += members
            live = [min(members, key=lambda m: calls[m]["model_call_id"])]
        for m in members:
            quarantined[m] = quarantined[m] or m not in live
    chains: list[list[int]] = []
    for leaf in range(len(calls)):  # leaves in processing order
        if children[leaf]:
            continue
        path = [leaf]
        while (up := parent[path[-1]]) is not None:
            path.append(up)
        if not any(quarantined[i] for i in path):
            chains.append(path[::-1])
    if not chains:
        raise ValueError("no chain")
    main = min(chains, key=lambda p: (calls[p[0]]["created_at"], calls[p[0]]["model_call_id"]))
    output: list[dict[str, Any]] = []
    running: list[int] = list(calls[main[0]]["prompt_token_ids"])
    for position, i in enumerate(main):
        e = calls[i]
        if position:
            running = running + e["prompt_token_ids"][len(running) :]
        items = [dict(item) for item in e["output_items"]] or [{"type": "message"}]
        index = e["token_item_index"] if e["token_item_index"] is not None else len(items) - 1
        items[index].update(
            prompt_token_ids=list(running),
            generation_token_ids=e["generation_token_ids"],
            generation_log_probs=e["generation_log_probs"],
        )
        output.extend(items)
        running = running + e["generation_token_ids"]
    generated = sum(len(calls[i]["generation_token_ids"]) for i in main)
    return {
        "id": f"proj-{rollout_id}",
        "model": model,
        "object": "response",
        "output": output,
        "usage": {
            "input_tokens": len(calls[main[0]]["prompt_token_ids"]),
            "output_tokens": generated,
        },
    }
