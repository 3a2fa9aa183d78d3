"""A put whose prompt names its prefix by its parent call (docs/store-protocol.md#delta-put).

The body is the entry without `prompt_token_ids`, plus
`"prompt_ref": {"parent", "length", "digest"}` and `"prompt_suffix": [ids]`: the
prompt is the parent's first `length` cumulative ids (prompt + generation, as this
store holds them), whose token digest must be `digest`, then the suffix. The
store rebuilds the full entry and stores it exactly as the full put would have;
an unknown parent, a length past the parent's ids or another digest is refused
(422, nothing stored).
"""

from __future__ import annotations

from typing import Any

from token_finalizer.core.delta import materialize
from token_finalizer.core.errors import TokenEntryError, TokenIdOutOfRange
from token_finalizer.core.token_digest import token_digest
from token_finalizer.core.token_ids import Ids, check_token_id_list, join_ids
from token_finalizer.sources.base import CaptureStore

__all__ = ["PROMPT_REF", "PROMPT_SUFFIX", "full_body"]

PROMPT_REF, PROMPT_SUFFIX = "prompt_ref", "prompt_suffix"


async def _parent_ids(store: CaptureStore, rollout_id: str, parent: str) -> Ids | None:
    """The parent's cumulative ids as the store holds them (its cache, else its entries)."""
    cached = getattr(store, "cumulative_ids", None)
    if callable(cached):
        found = await cached(rollout_id, parent)
        if found is not None:
            return found  # type: ignore[no-any-return]
    committed = getattr(store, "committed_entries", None)
    if not callable(committed):
        return None
    for entry in materialize(await committed(rollout_id)).entries:
        if entry.model_call_id == parent:
            return join_ids((entry.prompt_token_ids, entry.generation_token_ids))
    return None


def _reference(body: dict[str, Any]) -> tuple[str, int, str, list[Any]]:
    ref, suffix = body.get(PROMPT_REF), body.get(PROMPT_SUFFIX)
    if not isinstance(ref, dict) or set(ref) != {"parent", "length", "digest"}:
        raise TokenEntryError("prompt_ref must be an object of parent, length and digest")
    parent, length, digest = ref["parent"], ref["length"], ref["digest"]
    if not isinstance(parent, str) or not parent:
        raise TokenEntryError("prompt_ref.parent must be a model call id")
    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
        raise TokenEntryError(f"prompt_ref.length must be an integer >= 0, got {length!r}")
    if not isinstance(digest, str):
        raise TokenEntryError("prompt_ref.digest must be a token digest")
    if not isinstance(suffix, list):
        raise TokenEntryError("prompt_suffix must be a list of token ids")
    if "prompt_token_ids" in body:
        raise TokenEntryError("a put with prompt_ref must not carry prompt_token_ids")
    return parent, length, digest, suffix


async def full_body(store: CaptureStore, body: dict[str, Any], rollout_id: str) -> dict[str, Any]:
    """The full entry a put's body stands for (a body without `prompt_ref`: itself)."""
    if PROMPT_REF not in body and PROMPT_SUFFIX not in body:
        return body
    parent, length, digest, suffix = _reference(body)
    if body.get("parent_call_id") != parent:
        raise TokenEntryError(f"prompt_ref.parent {parent} is not the entry's parent_call_id")
    ids = await _parent_ids(store, rollout_id, parent)
    if ids is None:
        raise TokenEntryError(f"prompt_ref.parent {parent} is not stored in rollout {rollout_id}")
    if length > len(ids):
        raise TokenEntryError(
            f"prompt_ref.length {length} is past the {len(ids)} ids of call {parent}"
        )
    if token_digest(ids[:length]) != digest:
        raise TokenEntryError(
            f"prompt_ref.digest is not the digest of the first {length} ids of call {parent}"
        )
    full = {key: value for key, value in body.items() if key not in (PROMPT_REF, PROMPT_SUFFIX)}
    # An array, not a list: the entry's validation takes the store's own ids as they are
    # and checks the suffix in C (no Python int per id of the context).
    full["prompt_token_ids"] = join_ids((ids[:length], _suffix_ids(suffix)))
    return full


def _suffix_ids(suffix: list[Any]) -> Ids:
    try:
        return check_token_id_list(suffix)
    except TokenIdOutOfRange as exc:
        raise TokenIdOutOfRange(f"{exc} (in prompt_suffix)") from None
    except (TypeError, ValueError, OverflowError):
        raise TokenEntryError("prompt_suffix must be a flat list of integers") from None
