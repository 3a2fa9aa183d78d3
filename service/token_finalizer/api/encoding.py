"""Encoding a finalize answer without re-encoding the same token ids over and over.

A rebuilt agent rollout is mostly prompt token ids, and they are redundant:
each item's `prompt_token_ids` is a prefix of the next item's (the running
context), so a 100-call rollout spells its first tokens 100 times.

`finalize_answer_pieces` therefore encodes the longest prompt once, cuts every
other prompt's JSON out of that text (after checking, element by element, that
it really is a prefix), encodes the rest of the answer with placeholders, and
returns pieces whose concatenation is exactly `orjson.dumps(answer)`. Joining
them costs a memory copy; a zstd stream can consume them without ever joining.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from token_finalizer.core.codec import Piece, encode_json
from token_finalizer.core.token_ids import same_ids

__all__ = ["SPLICE_MARK", "Piece", "finalize_answer_pieces", "output_pieces"]

# Stands in for a value while the rest of the answer is encoded: a NUL-delimited
# string no record plausibly contains. If one does, the split finds too many
# marks and the plain encoding is used instead.
SPLICE_MARK = "\x00token-finalizer:spliced\x00"
_ENCODED_MARK = encode_json(SPLICE_MARK)
_COMMA = ord(",")


def _prompts(output: list[Any]) -> list[np.ndarray] | None:
    """The 1-D integer prompt arrays of the output items, in order (None if any is not)."""
    prompts = []
    for item in output:
        if not isinstance(item, dict) or "prompt_token_ids" not in item:
            continue
        prompt = item["prompt_token_ids"]
        if not (
            isinstance(prompt, np.ndarray)
            and prompt.ndim == 1
            and np.issubdtype(prompt.dtype, np.integer)
        ):
            return None
        prompts.append(prompt)
    return prompts


def _prefix_texts(prompts: list[np.ndarray]) -> list[list[Piece]] | None:
    """Each prompt's JSON as slices of the longest prompt's JSON; None unless all are prefixes."""
    longest = max(prompts, key=len)
    for prompt in prompts:
        # The projection guarantees this; it is checked anyway because a wrong
        # cut would deliver wrong tokens, silently.
        if not same_ids(prompt, longest[: len(prompt)]):
            return None
    text = encode_json(longest)
    commas = np.flatnonzero(np.frombuffer(text, dtype=np.uint8) == _COMMA)
    if len(commas) != max(len(longest) - 1, 0):
        return None
    whole = memoryview(text)
    texts: list[list[Piece]] = []
    for prompt in prompts:
        if len(prompt) == len(longest):
            texts.append([whole])
        elif len(prompt) == 0:
            texts.append([b"[]"])
        else:
            texts.append([whole[: commas[len(prompt) - 1]], b"]"])
    return texts


def output_pieces(output: list[Any]) -> list[Piece] | None:
    """Pieces joining to `encode_json(output)`, prompts cut from one text; None if not possible."""
    prompts = _prompts(output)
    if not prompts or len(prompts) < 2:
        return None
    texts = _prefix_texts(prompts)
    if texts is None:
        return None
    skeleton = [
        {**item, "prompt_token_ids": SPLICE_MARK}
        if isinstance(item, dict) and "prompt_token_ids" in item
        else item
        for item in output
    ]
    parts = encode_json(skeleton).split(_ENCODED_MARK)
    if len(parts) != len(texts) + 1:
        return None
    pieces: list[Piece] = [parts[0]]
    for text, part in zip(texts, parts[1:], strict=True):
        pieces += text
        pieces.append(part)
    return pieces


def _rebuilt_output(payload: Any) -> list[Any] | None:
    """The record's output when it holds rebuilt (numpy) prompts."""
    if not isinstance(payload, dict):
        return None
    record = payload.get("record")
    response = record.get("response") if isinstance(record, dict) else None
    output = response.get("output") if isinstance(response, dict) else None
    return output if isinstance(output, list) else None


def finalize_answer_pieces(payload: Any) -> list[Piece] | None:
    """Pieces joining to `encode_json(payload)` for a plain finalize answer.

    The rebuilt output's prompts nest (each extends the one before), so they
    are cut from one encoding of the longest. None when the answer has no
    output whose prompts can be cut that way (compact answers need no cutting).
    """
    output = _rebuilt_output(payload)
    if output is None:
        return None
    encoded_output = output_pieces(output)
    if encoded_output is None:
        return None
    record = payload["record"]
    skeleton = {
        **payload,
        "record": {**record, "response": {**record["response"], "output": SPLICE_MARK}},
    }
    parts = encode_json(skeleton).split(_ENCODED_MARK)
    if len(parts) != 2:
        return None
    return [parts[0], *encoded_output, parts[1]]
