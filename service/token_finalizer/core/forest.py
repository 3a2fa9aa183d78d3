"""From linked calls to chains: retries settled, the terminal honoured, one main chain.

Shared by both snapshot kinds once every call has its parent (or none).
Nothing here recurses: agent rollouts can be thousands of calls deep.
See docs/records-and-builds.md#retry-groups.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from token_finalizer.core.call_graph import Call
from token_finalizer.core.token_ids import same_ids

__all__ = ["Forest", "TerminalChain", "arrange"]


class TerminalChain(StrEnum):
    """What became of the attributed terminal call."""

    NONE = ""  # nothing was attributed
    DELIVERED = "delivered"  # its root-to-terminal path is clean: that is the main chain
    BROKEN = "broken"  # the path holds a quarantined or boundary call
    NOT_CAPTURED = "not_captured"  # the attributed call is not among the kept calls


@dataclass(frozen=True, slots=True)
class Forest:
    """What arranging one snapshot's kept calls produced."""

    roots: int
    chains: int
    main_chain: tuple[Call, ...]
    quarantined_calls: int
    unresolved_retries: list[str]
    terminal: TerminalChain


def _path_to(call: Call) -> list[Call]:
    path = [call]
    while (parent := path[-1].parent) is not None:
        path.append(parent)
    path.reverse()
    return path


def _sibling_sets(calls: Sequence[Call]) -> list[list[Call]]:
    """Calls grouped by parent (all roots together), in processing order of first members."""
    sets: dict[int, list[Call]] = {}
    for call in calls:
        key = -1 if call.parent is None else call.parent.order
        sets.setdefault(key, []).append(call)
    return list(sets.values())


def _retry_groups(siblings: list[Call]) -> list[list[Call]]:
    """Siblings with identical prompts, in processing order of their first member."""
    groups: dict[tuple[int, int], list[list[Call]]] = {}
    found: list[list[Call]] = []
    for call in siblings:
        prompt = call.prompt
        key = (len(prompt), int(prompt[-1]) if len(prompt) else -1)
        for group in groups.setdefault(key, []):
            if same_ids(group[0].prompt, prompt):
                group.append(call)
                break
        else:
            group = [call]
            groups[key].append(group)
            found.append(group)
    return [group for group in found if len(group) > 1]


def _settle_retries(calls: Sequence[Call], terminal_path: set[int] | None) -> list[str]:
    """Quarantine the retries the harness did not keep; return the unresolved ones' ids.

    With a terminal, the member on its path is the one kept, and no group
    records an unresolved retry: a group off the path cannot reach the
    delivered chain.
    """
    unresolved: list[str] = []
    for siblings in _sibling_sets(calls):
        for group in _retry_groups(siblings):
            on_path = [c for c in group if terminal_path is not None and c.order in terminal_path]
            if on_path:
                keep = on_path
            else:
                keep = [c for c in group if any(not child.quarantined for child in c.children)]
                if not keep:
                    keep = [min(group, key=lambda c: c.call_id)]
                    if terminal_path is None:
                        unresolved.extend(c.call_id for c in group)
            for call in group:
                if call not in keep:
                    call.quarantined = True
    return unresolved


def arrange(calls: Sequence[Call], *, terminal_id: str | None, attributed: bool) -> Forest | None:
    """Settle retries, list chains and pick the main one; None when no chain is left.

    `calls` are in processing order and linked. `terminal_id` is the
    attributed call (`attributed` tells whether anything was attributed at all).
    """
    terminal = next((c for c in calls if c.call_id == terminal_id), None) if attributed else None
    terminal_path = None if terminal is None else {c.order for c in _path_to(terminal)}
    unresolved = _settle_retries(calls, terminal_path)

    status = TerminalChain.NONE
    truncated: list[Call] | None = None
    if attributed:
        if terminal is None:
            status = TerminalChain.NOT_CAPTURED
        else:
            path = _path_to(terminal)
            if any(c.quarantined or c.boundary for c in path):
                status = TerminalChain.BROKEN
            else:
                status = TerminalChain.DELIVERED
                truncated = path

    chains: list[list[Call]] = []
    for leaf in calls:  # processing order of the leaves
        if leaf.children:
            continue
        path = _path_to(leaf)
        if any(c.quarantined for c in path):
            continue
        if truncated is not None and terminal in path:
            continue
        chains.append(path)
    if truncated is not None:
        chains.insert(0, truncated)
    if not chains:
        return None
    if truncated is not None:
        main = truncated
    else:
        # min() keeps the first of equal keys: among chains of one root, the first listed.
        main = min(chains, key=lambda chain: (chain[0].entry.created_at, chain[0].call_id))
    return Forest(
        roots=sum(1 for c in calls if c.parent is None),
        chains=len(chains),
        main_chain=tuple(main),
        quarantined_calls=sum(1 for c in calls if c.quarantined),
        unresolved_retries=unresolved,
        terminal=status,
    )
