"""What a worker stages for one finished call: the delta and its hashes (docs/staging.md#digests).

A call generated ``generated`` tokens on ``prompt``; its parent (if any)
ended at ``prev_len = parent.cum_len``. The staged delta is the prompt past
``prev_len`` (carry: mask 0.0, log probability 0.0) followed by the
generation (mask 1.0, its log probabilities). ``cumulative_hash`` is the
token hash of the whole ``prompt + generated`` the call was generated on, so
a worker whose prompt does not start with the parent chain's tokens stages a
record whose cumulative hash betrays it (``custody.check_custody``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from token_finalizer.core.staging._arrays import float_view, token_view
from token_finalizer.core.staging.digests import (
    EXTRAS_DIGEST_VERSION,
    STAGING_DIGEST_VERSION,
    STAGING_SCHEMA_VERSION,
    hash_chain,
    hash_extras,
    hash_staged_call,
    hash_token_parts,
)
from token_finalizer.core.staging.records import StagedCallBaseSnapshot, StagedCallRecord

__all__ = ["build_staged_call"]


def build_staged_call(
    *,
    rollout_id: str,
    model_call_id: str,
    parent: StagedCallBaseSnapshot | None,
    prompt_token_ids: object,
    generated_token_ids: object,
    generated_log_probs: object,
    weight_version: int,
    extras: Mapping[str, Any] | None = None,
) -> StagedCallRecord:
    """The staged record of one call, as a NeMo Gym 0.7.0 worker computes it.

    ``parent`` is the staged parent (``None`` for a text root): its
    ``cum_len`` is where the carry starts and its ``chain_hash`` what the
    delta chains onto. Raises ``ValueError`` when the prompt is shorter than
    ``prev_len``, the generation and log probabilities differ in length, or
    the delta would be empty.
    """
    prompt = token_view(prompt_token_ids)
    generated = token_view(generated_token_ids)
    generated_lp = float_view(generated_log_probs)
    prev_len = 0 if parent is None else parent.cum_len
    if prev_len > len(prompt):
        raise ValueError(f"prev_len={prev_len} is outside prompt length {len(prompt)}")
    if len(generated) != len(generated_lp):
        raise ValueError(
            "generated token and log-probability lengths differ: "
            f"{len(generated)} != {len(generated_lp)}"
        )
    carry = prompt[prev_len:]
    token_ids = np.concatenate([carry, generated])
    if not len(token_ids):
        raise ValueError("staging delta must contain at least one token")
    mask = np.concatenate([np.zeros(len(carry)), np.ones(len(generated))])
    log_probs = np.concatenate([np.zeros(len(carry)), generated_lp])
    extras_dict = None if extras is None else dict(extras)
    fields: dict[str, Any] = {
        "rollout_id": rollout_id,
        "model_call_id": model_call_id,
        "parent_call_id": None if parent is None else parent.model_call_id,
        "mode": "text" if parent is None else "token_in",
        "prev_len": prev_len,
        "delta_len": len(token_ids),
        "cum_len": prev_len + len(token_ids),
        "weight_version": weight_version,
        "token_ids_delta": token_ids,
        "token_mask_delta": mask,
        "generation_log_probs_delta": log_probs,
        "extras_digest": hash_extras(extras_dict),
        "chain_hash": hash_chain(None if parent is None else parent.chain_hash, token_ids),
        "cumulative_hash": hash_token_parts((prompt, generated)),
    }
    digest = hash_staged_call(
        schema_version=STAGING_SCHEMA_VERSION,
        digest_version=STAGING_DIGEST_VERSION,
        extras_digest_version=EXTRAS_DIGEST_VERSION,
        **fields,
    )
    return StagedCallRecord(digest=digest, extras=extras_dict, **fields)
