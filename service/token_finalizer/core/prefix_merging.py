"""Prefix merging: arrange a snapshot's model calls into token chains.

A call's parent is the earlier call whose cumulative sequence (prompt followed
by generation) is the longest prefix of this call's prompt. Candidates are
looked up by (length, last token) and verified with numpy comparisons, so a
chain of calls costs one memcmp-speed pass over its prompts instead of a Python
step per token. The result is exact, independent of entry order, and never
recursive: agent rollouts can be thousands of calls deep.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from token_finalizer.core.entries import TokenEntry

__all__ = ["BuildFailed", "CallForest", "build_forest"]


class BuildFailed(Exception):
    """The capture cannot yield a token chain; the message is the mask reason."""


@dataclass(slots=True, eq=False)
class _Call:
    entry: TokenEntry
    index: int
    parent: int | None = None
    ambiguous: bool = False
    quarantined: bool = False
    children: list[int] = field(default_factory=list)


@dataclass(slots=True)
class CallForest:
    """What the builder learned about one snapshot."""

    roots: int
    chains: int
    main_chain: tuple[TokenEntry, ...]
    quarantined_calls: int
    unresolved_retries: list[str]
    empty_generation_calls: int
    generated_tokens_captured: int
    generated_tokens_delivered: int


def _extends(prompt: np.ndarray, parent: TokenEntry, length: int) -> bool:
    """Whether `parent`'s cumulative sequence equals prompt[:length].

    The generation is compared first: it is short, and it is where unrelated
    candidates differ, so a miss rarely pays for the long prompt comparison.
    """
    split = len(parent.prompt_token_ids)
    return bool(
        np.array_equal(prompt[split:length], parent.generation_token_ids)
        and np.array_equal(prompt[:split], parent.prompt_token_ids)
    )


def _last_token(tokens: np.ndarray) -> int:
    return int(tokens[-1]) if len(tokens) else -1


def _link_parents(calls: list[_Call]) -> None:
    """Set parent, ambiguous and children on every call.

    Candidates are indexed by (cumulative length, last token): for a prompt,
    each shorter length costs one dictionary probe, and only candidates whose
    last token matches are compared in full. The first length (longest first)
    with a verified candidate yields the parent(s). Every call that can be a
    parent sorts before its children, so the index can be built up front.
    """
    by_end: dict[tuple[int, int], list[int]] = defaultdict(list)
    for call in calls:
        entry = call.entry
        by_end[(entry.cumulative_length, int(entry.generation_token_ids[-1]))].append(call.index)
    lengths = np.array(sorted({length for length, _ in by_end}), dtype=np.int64)

    for call in calls:
        prompt = call.entry.prompt_token_ids
        usable = lengths[: np.searchsorted(lengths, len(prompt), side="right")][::-1]
        if not len(usable):
            continue
        for length, token in zip(usable.tolist(), prompt[usable - 1].tolist(), strict=True):
            candidates = by_end.get((length, token))
            if not candidates:
                continue
            parents = [i for i in candidates if _extends(prompt, calls[i].entry, length)]
            if parents:
                call.parent = parents[0]
                call.ambiguous = len(parents) > 1
                calls[parents[0]].children.append(call.index)
                break


def _resolve_retries(calls: list[_Call]) -> list[int]:
    """Quarantine redundant retries bottom-up; return the unresolved ones' indices."""
    groups: dict[tuple[int | None, int, int], list[list[int]]] = defaultdict(list)
    for call in calls:
        prompt = call.entry.prompt_token_ids
        for group in groups[(call.parent, len(prompt), _last_token(prompt))]:
            if np.array_equal(calls[group[0]].entry.prompt_token_ids, prompt):
                group.append(call.index)
                break
        else:
            groups[(call.parent, len(prompt), _last_token(prompt))].append([call.index])

    retry_groups = [g for bucket in groups.values() for g in bucket if len(g) > 1]
    # Children sort after their parents, so handling groups from the last first
    # settles every child's fate before its parent's group asks about it.
    retry_groups.sort(key=lambda group: group[0], reverse=True)
    unresolved: list[int] = []
    for group in retry_groups:
        live = [
            i for i in group if any(not calls[child].quarantined for child in calls[i].children)
        ]
        if not live:
            unresolved.extend(group)
            live = [min(group, key=lambda i: calls[i].entry.model_call_id)]
        for i in group:
            if i not in live:
                calls[i].quarantined = True
    return sorted(unresolved)


def _chains(calls: list[_Call], roots: list[int]) -> list[tuple[int, int]]:
    """(root, leaf) of every root-to-leaf path free of quarantined calls, depth first."""
    chains: list[tuple[int, int]] = []
    stack = [(i, i) for i in reversed(roots) if not calls[i].quarantined]
    while stack:
        root, index = stack.pop()
        call = calls[index]
        if not call.children:
            chains.append((root, index))
            continue
        stack.extend((root, c) for c in reversed(call.children) if not calls[c].quarantined)
    return chains


def _path_to(calls: list[_Call], leaf: int) -> list[int]:
    path = [leaf]
    while (parent := calls[path[-1]].parent) is not None:
        path.append(parent)
    path.reverse()
    return path


def build_forest(entries: Iterable[TokenEntry]) -> CallForest:
    """Arrange the calls of one snapshot; raise BuildFailed when nothing is usable."""
    entries = list(entries)
    ids = [entry.model_call_id for entry in entries]
    if len(set(ids)) != len(ids):
        duplicated = sorted({i for i in ids if ids.count(i) > 1})
        raise BuildFailed(f"duplicate model_call_id in capture: {', '.join(duplicated)}")

    generating = [e for e in entries if len(e.generation_token_ids)]
    empty = len(entries) - len(generating)
    if not generating:
        raise BuildFailed("capture contains only empty generations")
    generating.sort(key=lambda e: (len(e.prompt_token_ids), e.model_call_id))
    calls = [_Call(entry=entry, index=i) for i, entry in enumerate(generating)]
    _link_parents(calls)
    for call in calls:  # parents precede children, so one forward pass covers subtrees
        parent_quarantined = call.parent is not None and calls[call.parent].quarantined
        call.quarantined = call.ambiguous or parent_quarantined
    unresolved = _resolve_retries(calls)

    roots = [call.index for call in calls if call.parent is None]
    chains = _chains(calls, roots)
    if not chains:
        raise BuildFailed("no token chain: every root-to-leaf path holds a quarantined call")
    # min() keeps the first of equal keys: branches of one root tie-break depth first.
    _, leaf = min(
        chains,
        key=lambda chain: (calls[chain[0]].entry.created_at, calls[chain[0]].entry.model_call_id),
    )
    main_chain = tuple(calls[i].entry for i in _path_to(calls, leaf))
    return CallForest(
        roots=len(roots),
        chains=len(chains),
        main_chain=main_chain,
        quarantined_calls=sum(call.quarantined for call in calls),
        unresolved_retries=[calls[i].entry.model_call_id for i in unresolved],
        empty_generation_calls=empty,
        generated_tokens_captured=sum(
            len(call.entry.generation_token_ids) for call in calls if not call.quarantined
        ),
        generated_tokens_delivered=sum(len(entry.generation_token_ids) for entry in main_chain),
    )
