"""The compact token form of a rebuilt output: one context, prompts as prefix lengths.

Every token-bearing item of a rebuilt chain carries the whole context so far
as `prompt_token_ids`, so a plain answer grows with calls x context. Since
each prompt of a delivered chain is a prefix of the chain's final cumulative
sequence (the projection checks this), sending that sequence once as
`context_token_ids` and each prompt as its length loses nothing and grows with
the context alone. See docs/finalizer-api.md#compact-token-form.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from token_finalizer.core.token_ids import join_ids

__all__ = ["compact_output"]


def _rebuilt(item: Any) -> bool:
    return isinstance(item, dict) and isinstance(item.get("prompt_token_ids"), np.ndarray)


def compact_output(
    output: list[Any],
) -> tuple[npt.NDArray[np.integer[Any]], list[Any]] | None:
    """(context, output with prompts as lengths) of a rebuilt output; None if not rebuilt.

    Items are shallow-copied; the input stays as it is.
    """
    bearing = [item for item in output if _rebuilt(item)]
    if not bearing:
        return None
    last = bearing[-1]
    context = join_ids([last["prompt_token_ids"], last["generation_token_ids"]])
    compacted = [
        {**item, "prompt_token_ids": len(item["prompt_token_ids"])} if _rebuilt(item) else item
        for item in output
    ]
    return context, compacted
