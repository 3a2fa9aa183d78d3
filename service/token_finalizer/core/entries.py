"""TokenEntry (one model call's training data) and the frozen Snapshot.

Token arrays are held as numpy arrays from the moment they are parsed: a long
agent rollout repeats its whole context in every prompt, and Python int lists
would cost about nine times the memory and make every prefix comparison a
Python loop.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from token_finalizer._constants import (
    TOKEN_ENTRY_MIN_SCHEMA_VERSION,
    TOKEN_ENTRY_SCHEMA_VERSION,
)
from token_finalizer.core.codec import (
    PromptReuse,
    loads_exact_json,
    loads_json,
    loads_with_token_arrays,
)
from token_finalizer.core.errors import InvalidRolloutId, TokenEntryError, TokenIdOutOfRange
from token_finalizer.core.identity import check_model_call_id, check_store_id
from token_finalizer.core.lineage_fields import Lineage, parse_lineage
from token_finalizer.core.token_ids import (
    WIDE,
    check_token_id_list,
    common_dtype,
    narrowest,
    token_id_array,
    widened_together,
)

if TYPE_CHECKING:
    from token_finalizer.core.staging.stored import StagedCapture

__all__ = ["Snapshot", "TokenEntry", "uniform_token_arrays"]

_KNOWN_FIELDS = frozenset(
    {
        "schema_version",
        "rollout_id",
        "model_call_id",
        "model",
        "prompt_token_ids",
        "generation_token_ids",
        "generation_log_probs",
        "routed_experts",
        "output_items",
        "token_item_index",
        "created_at",
    }
)
_EMPTY_LOGPROBS = np.empty(0, dtype=np.float64)
# The keys of the id arrays the codec lifts out of a line (core/codec.py).
_TOKEN_KEYS = (b'"prompt_token_ids":[', b'"generation_token_ids":[')


def _token_ids(name: str, value: object, call_id: str, *, parsed: bool) -> np.ndarray:
    """A token field as an array of the core's dtype (docs/records-and-builds.md#token-ids).

    `parsed`: arrays come from the codec, which makes them from digit text
    only (non-negative, int32 or uint64): nothing to check again, and a
    capture's prompts are views of one buffer, so checking each would cost
    O(calls x context).
    """
    if not isinstance(value, list | np.ndarray):
        raise TokenEntryError(f"{name} must be a list of integers, got {type(value).__name__}")
    try:
        if isinstance(value, np.ndarray):
            return value if parsed else token_id_array(value)
        return check_token_id_list(value)
    except TokenIdOutOfRange as exc:
        raise TokenIdOutOfRange(f"{exc} (in {name} of model call {call_id})") from None
    except (TypeError, ValueError, OverflowError):
        raise TokenEntryError(f"{name} must be a flat list of integers") from None


def _log_probs(value: object, *, parsed: bool = False) -> np.ndarray:
    if parsed and isinstance(value, np.ndarray) and value.dtype == np.float64 and value.ndim == 1:
        return value if len(value) else _EMPTY_LOGPROBS  # a packed record's, read by numpy
    if not isinstance(value, list):
        raise TokenEntryError(
            f"generation_log_probs must be a list of numbers, got {type(value).__name__}"
        )
    if not value:
        return _EMPTY_LOGPROBS
    try:
        array = np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise TokenEntryError(f"generation_log_probs must be a list of numbers: {exc}") from None
    if array.ndim != 1 or array.dtype.kind not in "iuf":
        raise TokenEntryError("generation_log_probs must be a flat list of numbers")
    return array.astype(np.float64, copy=False)


@dataclass(slots=True, eq=False)
class TokenEntry:
    """One model call of one rollout, as captured by the model server."""

    rollout_id: str
    model_call_id: str
    prompt_token_ids: np.ndarray
    generation_token_ids: np.ndarray
    generation_log_probs: np.ndarray
    schema_version: int = TOKEN_ENTRY_SCHEMA_VERSION
    model: str = ""
    routed_experts: Any = None
    output_items: list[dict[str, Any]] = field(default_factory=list)
    token_item_index: int | None = None
    created_at: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    # Parsed from `extra`, which keeps the raw values for a byte-exact round trip.
    lineage: Lineage = field(default_factory=Lineage)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TokenEntry:
        """Validate a parsed TokenEntry; raise TokenEntryError naming the bad field."""
        return cls._validated(data, parsed=False)

    @classmethod
    def _validated(cls, data: Mapping[str, Any], *, parsed: bool) -> TokenEntry:
        """`from_dict`; `parsed` when its token arrays were made by the codec (`from_json`)."""
        if not isinstance(data, Mapping):
            raise TokenEntryError(f"a TokenEntry must be a JSON object, got {type(data).__name__}")
        schema = data.get("schema_version", TOKEN_ENTRY_SCHEMA_VERSION)
        if isinstance(schema, bool) or not isinstance(schema, int):
            raise TokenEntryError(f"schema_version must be an integer, got {schema!r}")
        if schema > TOKEN_ENTRY_SCHEMA_VERSION:
            raise TokenEntryError(
                f"schema_version {schema} is newer than {TOKEN_ENTRY_SCHEMA_VERSION}, "
                "the newest this reader understands"
            )
        if schema < TOKEN_ENTRY_MIN_SCHEMA_VERSION:
            # NeMo Gym 0.7 refuses such a capture at freeze, in these words
            # (docs/records-and-builds.md#validation).
            raise TokenEntryError(
                f"token record is schema_version {schema}, below the supported minimum "
                f"{TOKEN_ENTRY_MIN_SCHEMA_VERSION}. Pre-lineage records were never written in "
                "production; regenerate the rollout with a current writer."
            )
        for key in ("rollout_id", "model_call_id"):
            if key not in data:
                raise TokenEntryError(f"{key} is missing")
        try:
            rollout_id = check_store_id(data["rollout_id"], what="rollout_id")
            model_call_id = check_model_call_id(data["model_call_id"])
        except InvalidRolloutId as exc:
            raise TokenEntryError(str(exc)) from None
        model = data.get("model", "")
        if model is None:
            model = ""
        if not isinstance(model, str):
            raise TokenEntryError(f"model must be a string, got {type(model).__name__}")
        prompt, generation = (
            _token_ids(key, data.get(key, []), model_call_id, parsed=parsed)
            for key in ("prompt_token_ids", "generation_token_ids")
        )
        log_probs = _log_probs(data.get("generation_log_probs", []), parsed=parsed)
        if len(log_probs) != len(generation):
            raise TokenEntryError(
                f"generation_log_probs has {len(log_probs)} values for "
                f"{len(generation)} generated tokens"
            )
        items = data.get("output_items") or []
        if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
            raise TokenEntryError("output_items must be a list of objects")
        index = data.get("token_item_index")
        if index is not None and (
            isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(items)
        ):
            raise TokenEntryError(
                f"token_item_index {index!r} is not an index into {len(items)} output_items"
            )
        created_at = data.get("created_at", 0.0)
        if created_at is None:
            created_at = 0.0
        if isinstance(created_at, bool) or not isinstance(created_at, int | float):
            raise TokenEntryError(f"created_at must be a number, got {created_at!r}")
        if not math.isfinite(created_at):
            raise TokenEntryError("created_at must be finite")
        return cls(
            rollout_id=rollout_id,
            model_call_id=model_call_id,
            prompt_token_ids=prompt,
            generation_token_ids=generation,
            generation_log_probs=log_probs,
            schema_version=schema,
            model=model,
            routed_experts=data.get("routed_experts"),
            output_items=items,
            token_item_index=index,
            created_at=float(created_at),
            extra={k: v for k, v in data.items() if k not in _KNOWN_FIELDS},
            lineage=parse_lineage(data),
        )

    @classmethod
    def from_json(cls, line: bytes | str, *, prompts: PromptReuse | None = None) -> TokenEntry:
        """Parse and validate one JSON-encoded TokenEntry.

        `prompts`, shared across the lines of one capture, parses each prompt
        by what it adds to the previous one (see `codec.PromptReuse`).
        """
        if isinstance(line, str):
            line = line.encode()
        try:
            data = loads_with_token_arrays(line, prompts=prompts)
        except ValueError as exc:
            raise TokenEntryError(f"not valid JSON: {exc}") from None
        return cls._validated(data, parsed=True)

    @classmethod
    def from_stored_parts(
        cls,
        skeleton: bytes,
        prompt: np.ndarray,
        generation: np.ndarray,
        log_probs: np.ndarray,
        *,
        in_snapshot: bool = False,
    ) -> TokenEntry:
        """The entry of a packed record (docs/store-protocol.md#packed-at-rest): its line's
        text with the token arrays empty, and those arrays (ids in the core's dtype, log
        probs float64) as decoded from the record: the same entry as `from_json` of the
        line, without writing or parsing the arrays' text.

        A token key nested deeper in the line (an output item's `prompt_token_ids`)
        is parsed as the line's own parse would: `from_json` lifts what `entries`
        objects hold; `in_snapshot`: as a whole snapshot's parse does (the http
        source's freeze answer), which then reads every array as a list.
        """
        try:
            nested = skeleton.count(_TOKEN_KEYS[0]) + skeleton.count(_TOKEN_KEYS[1]) != 2
            if not nested:
                data = loads_json(skeleton)
            elif in_snapshot:
                data = loads_exact_json(skeleton, allow_non_finite=True)
            else:
                data = loads_with_token_arrays(skeleton)
        except ValueError as exc:
            raise TokenEntryError(f"not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise TokenEntryError(f"a TokenEntry must be a JSON object, got {type(data).__name__}")
        data["prompt_token_ids"] = prompt
        data["generation_token_ids"] = generation
        data["generation_log_probs"] = log_probs
        return cls._validated(data, parsed=True)

    def to_dict(self, *, as_lists: bool = True) -> dict[str, Any]:
        """The entry as JSON-ready fields, extra fields included.

        With `as_lists=False` the token arrays stay numpy arrays, for callers
        that encode with orjson directly and must not build millions of ints.
        """

        def plain(array: np.ndarray) -> Any:
            return array.tolist() if as_lists else array

        data: dict[str, Any] = dict(self.extra)
        data.update(
            schema_version=self.schema_version,
            rollout_id=self.rollout_id,
            model_call_id=self.model_call_id,
            model=self.model,
            prompt_token_ids=plain(self.prompt_token_ids),
            generation_token_ids=plain(self.generation_token_ids),
            generation_log_probs=plain(self.generation_log_probs),
            output_items=self.output_items,
            token_item_index=self.token_item_index,
            created_at=self.created_at,
        )
        if self.routed_experts is not None:
            data["routed_experts"] = self.routed_experts
        return data

    # Flat views of the lineage fields, for code that reads entries of any origin.
    @property
    def response_id(self) -> str | None:
        return self.lineage.response_id

    @property
    def digest(self) -> str | None:
        return self.lineage.digest

    @property
    def cum_len(self) -> int | None:
        return self.lineage.cum_len

    @property
    def continuation_fingerprint(self) -> str:
        return self.lineage.continuation_fingerprint

    @property
    def fingerprint_version(self) -> int | None:
        return self.lineage.fingerprint_version

    @property
    def continuation_context_len(self) -> int:
        return self.lineage.continuation_context_len

    @property
    def continuation_context_digest(self) -> str:
        return self.lineage.continuation_context_digest

    @property
    def parent_resolution(self) -> str | None:
        return self.lineage.parent_resolution

    @property
    def parent_call_id(self) -> str | None:
        return self.lineage.parent_call_id

    @property
    def prompt_is_delta(self) -> bool:
        return self.lineage.prompt_is_delta

    @property
    def cumulative_length(self) -> int:
        return len(self.prompt_token_ids) + len(self.generation_token_ids)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """An immutable view of one rollout's capture at freeze time.

    A rollout captured by external staging has no entries: `staged` holds its
    manifest and staged base snapshots instead (docs/staging.md#storage).
    """

    rollout_id: str
    entries: tuple[TokenEntry, ...]
    incomplete: bool
    snapshot_id: str
    version: int
    staged: StagedCapture | None = None


def uniform_token_arrays(entries: Sequence[TokenEntry]) -> list[TokenEntry]:
    """The entries with every token array in one dtype: uint64 if any entry needs it.

    A capture parsed line by line gives int32 arrays to calls whose ids fit
    and uint64 to the others; the builder combines arrays of different calls
    (prefix checks, shared tapes, the compact context), so it takes them in
    one dtype (docs/records-and-builds.md#token-ids). Entries already uniform
    are returned as they are, without a copy.
    """
    arrays = [a for e in entries for a in (e.prompt_token_ids, e.generation_token_ids)]
    dtype = common_dtype(arrays)
    if all(array.dtype == dtype for array in arrays):
        return list(entries)
    if dtype == WIDE:
        converted = widened_together(arrays)
    else:  # only empty arrays of another dtype (or a hand-built int64 entry)
        converted = [narrowest(array) for array in arrays]
    return [
        dataclasses.replace(
            entry, prompt_token_ids=converted[2 * i], generation_token_ids=converted[2 * i + 1]
        )
        for i, entry in enumerate(entries)
    ]
