"""The compact token form of a finalize answer, expanded back into the standard record.

The client always asks for `?tokens=compact`. Such an answer carries the
chain's whole cumulative token sequence once, as top-level
`context_token_ids`, and every rebuilt item of `record["response"]["output"]`
carries an int as its `prompt_token_ids`: how many leading tokens of the
context form its prompt. Items whose prompt is still a list (a record that
carried its own tokens) are left as they are. When `context_token_ids` is
null or absent, nothing was compacted.

Expanding costs one slice per item, never per-token Python work:

- lists (the default): each prompt is `context[:n]`, a new list whose
  entries are the context's own int objects;
- numpy (`as_numpy=True`): the context becomes ONE array and each prompt is
  the view `context[:n]` of it (no copy). The shared buffer is read-only, so
  changing one prompt in place cannot silently change the others;
  `generation_token_ids` and `generation_log_probs` (float64) become arrays
  too, in every token-bearing item. Token arrays are int64, or uint64 when an
  id of the record is 2**63 or more (valid ids are [0, 2**64)): one dtype
  for the whole record, so concatenating its arrays stays exact. Every id is
  checked first: anything but an integer in range (1.7, "12", true, -1)
  raises MalformedAnswerError instead of being converted.

The input answer is never changed: the record, its response and the
expanded items are shallow copies; everything else is shared.
"""

from __future__ import annotations

from typing import Any

from token_finalizer_client._exceptions import FinalizerError, MalformedAnswerError

__all__ = ["expand_record", "load_numpy", "plain_record"]

PROMPT = "prompt_token_ids"
GENERATION = "generation_token_ids"
LOG_PROBS = "generation_log_probs"
_TOKEN_KEYS = (PROMPT, GENERATION, LOG_PROBS)
_ID_KEYS = (PROMPT, GENERATION)
_ID_END = 2**64
_INTEGERS = frozenset({int})
_NUMBERS = frozenset({int, float})


def load_numpy() -> Any:
    """The numpy module; ImportError saying how to install it when it is missing."""
    try:
        import numpy
    except ImportError as exc:
        raise ImportError(
            "as_numpy=True needs numpy, which is not installed; install the client's extra "
            "token-finalizer-client[fast] (from a checkout: pip install './client[fast]') "
            "or numpy itself"
        ) from exc
    return numpy


def _output(record: dict[str, Any]) -> list[Any] | None:
    response = record.get("response")
    output = response.get("output") if isinstance(response, dict) else None
    return output if isinstance(output, list) else None


def _with_output(record: dict[str, Any], output: list[Any]) -> dict[str, Any]:
    return {**record, "response": {**record["response"], "output": output}}


def _compact_prompt(item: dict[str, Any], context: Any) -> Any:
    """The item's prompt cut from `context` when it is a prefix length; None otherwise."""
    length = item.get(PROMPT)
    if not isinstance(length, int) or isinstance(length, bool):
        return None
    if context is None:
        raise FinalizerError(
            f"the finalize answer gives `prompt_token_ids` as a prefix length ({length}) "
            "but has no `context_token_ids` to take it from"
        )
    if not 0 <= length <= len(context):
        raise FinalizerError(
            f"the finalize answer gives `prompt_token_ids` as a prefix length of {length}, "
            f"outside its {len(context)}-token `context_token_ids`"
        )
    return context[:length]


def _list_output(output: list[Any], context: list[Any] | None) -> list[Any] | None:
    """The output with every compact prompt sliced from `context`; None when none was compact."""
    expanded: list[Any] | None = None
    for index, item in enumerate(output):
        if not isinstance(item, dict):
            continue
        prompt = _compact_prompt(item, context)
        if prompt is not None:
            if expanded is None:
                expanded = list(output)
            expanded[index] = {**item, PROMPT: prompt}
    return expanded


def _refuse_strangers(values: Any, what: str, allowed: frozenset[type], kind: str) -> None:
    """MalformedAnswerError unless `values` is a list of `allowed` types only (one C pass)."""
    if not isinstance(values, list):
        raise MalformedAnswerError(f"the finalize answer's `{what}` is not a list")
    strangers = set(map(type, values)) - allowed  # type(True) is bool, never int
    if strangers:
        names = ", ".join(sorted(stranger.__name__ for stranger in strangers))
        raise MalformedAnswerError(
            f"the finalize answer's `{what}` holds {names} values where {kind}"
        )


def _id_array(np: Any, values: Any, what: str) -> Any:
    """A JSON list of token ids as int64 (uint64 when an id needs it); MalformedAnswerError
    if any element is not an integer in [0, 2**64). No Python step per id."""
    _refuse_strangers(values, what, _INTEGERS, "token ids must be integers")
    try:
        array = np.array(values, dtype=np.int64)
    except OverflowError:  # an id of 2**63 or more (or below -2**63): checked one by one
        low, high = min(values), max(values)
        if low < 0 or high >= _ID_END:
            raise _out_of_range(what, low if low < 0 else high) from None
        return np.array(values, dtype=np.uint64)
    if len(array) and int(array.min()) < 0:
        raise _out_of_range(what, int(array.min()))
    return array


def _out_of_range(what: str, bad: int) -> MalformedAnswerError:
    return MalformedAnswerError(
        f"the finalize answer's `{what}` holds {bad}, outside the token id range [0, 2**64)"
    )


def _numpy_output(output: list[Any], context: list[Any] | None) -> list[Any]:
    """The output with every token list an array and every compact prompt a view of one array.

    Every list is checked and converted first; then, if one of them needed
    uint64, all become uint64 (one dtype per record), and only then are the
    prompts cut from the context.
    """
    np = load_numpy()
    converted: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for item in output:
        arrays: dict[str, Any] = {}
        if isinstance(item, dict):
            for key in _ID_KEYS:
                if isinstance(item.get(key), list):
                    arrays[key] = _id_array(np, item[key], key)
            if isinstance(item.get(LOG_PROBS), list):
                _refuse_strangers(item[LOG_PROBS], LOG_PROBS, _NUMBERS, "log probs are numbers")
                arrays[LOG_PROBS] = np.array(item[LOG_PROBS], dtype=np.float64)
        converted.append((item, arrays))
    base = None if context is None else _id_array(np, context, "context_token_ids")
    id_arrays = [a[key] for _, a in converted for key in _ID_KEYS if key in a]
    if base is not None:
        id_arrays.append(base)
    if any(array.dtype == np.uint64 for array in id_arrays):
        for _, arrays in converted:
            for key in _ID_KEYS:
                if key in arrays:
                    arrays[key] = arrays[key].astype(np.uint64, copy=False)
        base = None if base is None else base.astype(np.uint64, copy=False)
    if base is not None:
        base.flags.writeable = False  # shared by every prompt: no in-place edits
    expanded: list[Any] = []
    for item, arrays in converted:
        if isinstance(item, dict):
            prompt = _compact_prompt(item, base)
            if prompt is not None:
                arrays[PROMPT] = prompt
            if arrays:
                item = {**item, **arrays}
        expanded.append(item)
    return expanded


def expand_record(record: dict[str, Any], context: Any, *, as_numpy: bool) -> dict[str, Any]:
    """The standard record of a finalize answer given its `context_token_ids` (None if absent).

    Returns `record` itself when there is nothing to change.
    """
    if context is not None and not isinstance(context, list):
        raise FinalizerError(
            "the finalize answer's `context_token_ids` is neither a list nor null: "
            f"{type(context).__name__}"
        )
    output = _output(record)
    if output is None:
        return record
    if as_numpy:
        return _with_output(record, _numpy_output(output, context))
    expanded = _list_output(output, context)
    return record if expanded is None else _with_output(record, expanded)


def _is_array(value: Any) -> bool:
    return not isinstance(value, list) and callable(getattr(value, "tolist", None))


def _leading_view_of(value: Any) -> Any:
    """The 1-D array `value` is a leading slice of (a prompt view), else None."""
    base = getattr(value, "base", None)
    if base is None or getattr(base, "ndim", None) != 1 or value.ndim != 1:
        return None
    if value.dtype != base.dtype or value.strides != base.strides or len(value) > len(base):
        return None
    start = value.__array_interface__["data"][0]
    return base if start == base.__array_interface__["data"][0] else None


def plain_record(record: dict[str, Any]) -> dict[str, Any]:
    """The record with the token arrays of its output items as plain lists.

    Returns `record` itself when it holds no arrays. Prompts that are views
    of one shared array become slices of one list made from it, as the
    default (list) expansion would have made them.
    """
    output = _output(record)
    if output is None:
        return record
    lists: dict[int, tuple[Any, list[Any]]] = {}  # id(base) -> (base, base.tolist())

    def to_list(value: Any) -> list[Any]:
        base = _leading_view_of(value)
        if base is None:
            result: list[Any] = value.tolist()
            return result
        if id(base) not in lists:
            lists[id(base)] = (base, base.tolist())
        return lists[id(base)][1][: len(value)]

    plain: list[Any] | None = None
    for index, item in enumerate(output):
        if not isinstance(item, dict):
            continue
        arrays = {key: to_list(item[key]) for key in _TOKEN_KEYS if _is_array(item.get(key))}
        if arrays:
            if plain is None:
                plain = list(output)
            plain[index] = {**item, **arrays}
    return record if plain is None else _with_output(record, plain)
