"""Staged calls built by hand for the staging core tests: small, with defaults for the rest."""

from __future__ import annotations

from collections.abc import Sequence

from token_finalizer.core.staging import StagedCallBaseSnapshot, StagedCallRecord, build_staged_call

__all__ = ["staged_call"]


def staged_call(
    *,
    rollout_id: str = "r",
    model_call_id: str = "c",
    parent: StagedCallBaseSnapshot | None = None,
    prompt: object = (1,),
    generated: Sequence[int] = (2,),
    log_probs: Sequence[float] | None = None,
    weight_version: int = 0,
) -> StagedCallRecord:
    """`build_staged_call` with every argument defaulted; log probs -0.5 per generated token.

    `prompt` is passed as given (a list, a tuple or an array: the call copies it).
    """
    return build_staged_call(
        rollout_id=rollout_id,
        model_call_id=model_call_id,
        parent=parent,
        prompt_token_ids=prompt,
        generated_token_ids=generated,
        generated_log_probs=[-0.5] * len(generated) if log_probs is None else log_probs,
        weight_version=weight_version,
    )
