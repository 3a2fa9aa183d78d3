"""Captures as a NeMo Gym 0.7 model server writes them: recorded parents, digests, deltas."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from token_finalizer.core.token_digest import token_digest

__all__ = ["stamp_lineage"]


def stamp_lineage(
    entries: list[dict[str, Any]], parents: Mapping[str, str | None], *, delta: bool = False
) -> list[dict[str, Any]]:
    """Copies of full-prompt entries stamped with the parent each call was resolved to.

    `parents` maps each call id to its parent's id (None: a root). With
    `delta`, a resolved call stores only the prompt suffix after its parent's
    cumulative sequence, as a 0.7 writer with `delta_records` does.
    """
    by_id = {entry["model_call_id"]: entry for entry in entries}
    stamped: list[dict[str, Any]] = []
    for entry in entries:
        cumulative = entry["prompt_token_ids"] + entry["generation_token_ids"]
        copy = dict(entry, cum_len=len(cumulative), digest=token_digest(cumulative))
        parent_id = parents.get(entry["model_call_id"])
        if parent_id is None:
            copy.update(parent_resolution="root", parent_call_id=None)
        else:
            copy.update(parent_resolution="resolved", parent_call_id=parent_id)
            if delta:
                parent = by_id[parent_id]
                covered = len(parent["prompt_token_ids"]) + len(parent["generation_token_ids"])
                copy.update(
                    prompt_token_ids=entry["prompt_token_ids"][covered:], prompt_is_delta=True
                )
        stamped.append(copy)
    return stamped
