"""The NeMo Gym 0.7 lineage fields of a TokenEntry, typed and validated.

A 0.7 model server decides each call's parent when the request arrives and
stamps the decision on the entry; it may store the prompt as a delta after
that parent. Every field is optional (absent means a pre-lineage writer).
The raw values also stay in the entry's `extra`, so a capture passes through
every store byte for byte. See docs/records-and-builds.md#lineage-fields.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from token_finalizer.core.errors import TokenEntryError

__all__ = [
    "LINEAGE_FIELDS",
    "PARENT_RESOLUTIONS",
    "CallView",
    "Lineage",
    "lineage_field",
    "parse_lineage",
]

ROOT = "root"
RESOLVED = "resolved"
UNRESOLVED = "unresolved"
PARENT_RESOLUTIONS = frozenset({ROOT, RESOLVED, UNRESOLVED})

LINEAGE_FIELDS = frozenset(
    {
        "parent_resolution",
        "parent_call_id",
        "parent_resolution_reason",
        "cum_len",
        "digest",
        "prompt_is_delta",
        "response_id",
        "continuation_fingerprint",
        "continuation_context_len",
        "continuation_context_digest",
        "fingerprint_version",
        "prefix_requested",
        "prefix_supplied",
    }
)


@dataclass(frozen=True, slots=True)
class Lineage:
    """What a 0.7 writer recorded about a call's place in the rollout."""

    parent_resolution: str | None = None
    parent_call_id: str | None = None
    parent_resolution_reason: str = ""
    cum_len: int | None = None
    digest: str | None = None
    prompt_is_delta: bool = False
    response_id: str | None = None
    continuation_fingerprint: str = ""
    continuation_context_len: int = 0
    continuation_context_digest: str = ""
    fingerprint_version: int | None = None
    prefix_requested: bool = False
    prefix_supplied: bool = False

    @property
    def stamped(self) -> bool:
        """Whether a lineage-aware writer decided this call's parent (a lineage snapshot)."""
        return self.parent_resolution is not None or self.parent_call_id is not None


_DEFAULT = Lineage()


def _optional(data: Mapping[str, Any], key: str, kind: type, default: Any) -> Any:
    value = data.get(key)
    if value is None:
        return default
    # bool is an int subclass: a JSON `true` must not pass for a length.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TokenEntryError(f"{key} must be {kind.__name__} or null, got {value!r}")
    return value


def parse_lineage(data: Mapping[str, Any]) -> Lineage:
    """The lineage fields of a parsed entry, checked by the 0.7 writer's rules."""
    if not LINEAGE_FIELDS.intersection(data):
        return _DEFAULT
    resolution = _optional(data, "parent_resolution", str, None)
    if resolution is not None and resolution not in PARENT_RESOLUTIONS:
        raise TokenEntryError(
            f"parent_resolution must be one of root, resolved, unresolved, got {resolution!r}"
        )
    parent = _optional(data, "parent_call_id", str, None)
    cum_len = _optional(data, "cum_len", int, None)
    if cum_len is not None and cum_len < 0:
        raise TokenEntryError(f"cum_len must not be negative, got {cum_len}")
    lineage = Lineage(
        parent_resolution=resolution,
        parent_call_id=parent,
        parent_resolution_reason=_optional(data, "parent_resolution_reason", str, ""),
        cum_len=cum_len,
        digest=_optional(data, "digest", str, None),
        prompt_is_delta=_optional(data, "prompt_is_delta", bool, False),
        response_id=_optional(data, "response_id", str, None),
        continuation_fingerprint=_optional(data, "continuation_fingerprint", str, ""),
        continuation_context_len=_optional(data, "continuation_context_len", int, 0),
        continuation_context_digest=_optional(data, "continuation_context_digest", str, ""),
        fingerprint_version=_optional(data, "fingerprint_version", int, None),
        prefix_requested=_optional(data, "prefix_requested", bool, False),
        prefix_supplied=_optional(data, "prefix_supplied", bool, False),
    )
    if resolution == RESOLVED and not parent:
        raise TokenEntryError("parent_resolution 'resolved' needs a parent_call_id")
    if resolution in (ROOT, UNRESOLVED) and parent is not None:
        raise TokenEntryError(f"parent_resolution {resolution!r} must not carry a parent_call_id")
    if lineage.prompt_is_delta and (resolution != RESOLVED or not parent):
        raise TokenEntryError("a delta prompt (prompt_is_delta) needs a resolved parent_call_id")
    return lineage


class CallView(Protocol):
    """What attribution and resolution read from a captured call (a TokenEntry, or any
    object with these attributes; lineage fields are read with `lineage_field`)."""

    @property
    def model_call_id(self) -> str: ...

    @property
    def prompt_token_ids(self) -> npt.NDArray[np.integer[Any]]: ...

    @property
    def generation_token_ids(self) -> npt.NDArray[np.integer[Any]]: ...

    @property
    def output_items(self) -> Sequence[Any]: ...


_ABSENT = object()


def lineage_field(entry: object, name: str) -> Any:
    """A lineage field: the entry's own attribute, else its ``lineage`` record's, else None."""
    value = getattr(entry, name, _ABSENT)
    if value is _ABSENT:
        value = getattr(getattr(entry, "lineage", None), name, None)
    return value
