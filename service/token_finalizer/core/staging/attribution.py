"""Which manifest row the verifier scored: witnesses, then the parent-link walk.

Terminal attribution over token-free manifest rows (docs/staging.md#receipt-policy):
the same four witnesses as for token captures (explicit call id, declared
response id, the response's id, its content), each naming one row or
abstaining with a reason; rows with identical ``(cumulative_hash,
chain_hash, cum_len)`` are one sequence and collapse to the smallest call id.
Content matches the rows' precomputed fingerprints only (rows hold no
items): a row's ``continuation_fingerprint`` against the response's model
output, its ``output_fingerprint`` against that or against the output's
trailing model-authored block; rows stamped with another fingerprint version
never match.

``select_terminal_call`` is NeMo Gym 0.7.0's fallback when no witness names a
row: roots with children first, the earliest admitted, then down the
children, preferring those with children; a tie at any level is ambiguous.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from token_finalizer.core.staging.manifest import CallRecord
from token_finalizer.core.terminal import TERMINAL_CALL_KEY, TERMINAL_RESPONSE_ID_KEY
from token_finalizer_client.protocol import (
    FINGERPRINT_VERSION,
    FingerprintError,
    assistant_fingerprint,
    is_model_authored,
)

__all__ = [
    "SELECTION_AMBIGUOUS",
    "SELECTION_DUPLICATE_CALL_ID",
    "SELECTION_NO_RECORDS",
    "SELECTION_NO_ROOT",
    "SELECTION_ORPHANED_ROW",
    "SELECTION_SELECTED",
    "RowAttribution",
    "TerminalSelection",
    "attribute_rows",
    "select_terminal_call",
]

SELECTION_SELECTED = "selected"
SELECTION_NO_RECORDS = "no_records"
SELECTION_DUPLICATE_CALL_ID = "duplicate_call_id"
SELECTION_ORPHANED_ROW = "orphaned_row"
SELECTION_NO_ROOT = "no_root"
SELECTION_AMBIGUOUS = "ambiguous_terminal"

NO_METHOD = "none"


@dataclass(frozen=True, slots=True)
class RowAttribution:
    """The attributed row (or None), the first witness's method, and the reason trail.

    ``declared`` says the record declared a terminal response id; ``failure``
    is why nothing was attributed (``declared_terminal_not_captured``,
    ``declared_ambiguous``, ``witness_disagreement``, ``no_witness`` or
    ``attribution_error``), "" when a row was.
    """

    method: str
    call_id: str | None
    reason: str
    declared: bool
    failure: str


@dataclass(frozen=True, slots=True)
class TerminalSelection:
    """The parent-link walk's terminal call, or None, with the walk's reason."""

    call_id: str | None
    reason: str


def attribute_rows(records: Sequence[CallRecord], record: Mapping[str, Any]) -> RowAttribution:
    """Attribute the finished record's scored response to one manifest row; never raises."""
    declared_id = _given(record.get(TERMINAL_RESPONSE_ID_KEY))
    try:
        return _attribute(records, record, declared_id)
    except Exception:
        return RowAttribution(
            NO_METHOD, None, "attribution_error", declared_id is not None, "attribution_error"
        )


def _attribute(
    records: Sequence[CallRecord], record: Mapping[str, Any], declared_id: str | None
) -> RowAttribution:
    reasons: list[str] = []
    witnesses: list[tuple[str, CallRecord]] = []
    declared = declared_id is not None

    def unattributed(failure: str) -> RowAttribution:
        return RowAttribution(NO_METHOD, None, ",".join(reasons), declared, failure)

    explicit_id = _given(record.get(TERMINAL_CALL_KEY))
    if explicit_id is not None:
        named = {row.model_call_id: row for row in records}.get(explicit_id)
        if named is None:
            reasons.append("explicit_terminal_not_captured")
        else:
            witnesses.append(("explicit", named))

    if declared_id is not None:
        claimed = [row for row in records if row.response_id == declared_id]
        winner = _collapse(claimed)
        if winner is None:
            # The harness said which response it kept: never substitute another.
            failure = "declared_ambiguous" if claimed else "declared_terminal_not_captured"
            reasons.append(failure)
            return unattributed(failure)
        witnesses.append(("declared", winner))

    response = record.get("response")
    if isinstance(response, dict) and response:
        _response_id_witness(records, response, reasons, witnesses)
        _content_witness(records, response, reasons, witnesses)
    else:
        reasons.append("no_response_object")

    if not witnesses:
        return unattributed("no_witness")
    if _collapse([row for _, row in witnesses]) is None:
        named_by = ";".join(f"{method}={row.model_call_id}" for method, row in witnesses)
        reasons.append(f"witness_disagreement[{named_by}]")
        return unattributed("witness_disagreement")
    method, named = witnesses[0]
    if len(witnesses) > 1:
        reasons.append("corroborated_by=" + "+".join(other for other, _ in witnesses[1:]))
    return RowAttribution(method, named.model_call_id, ",".join(reasons), declared, "")


def _response_id_witness(
    records: Sequence[CallRecord],
    response: dict[str, Any],
    reasons: list[str],
    witnesses: list[tuple[str, CallRecord]],
) -> None:
    response_id = str(response.get("id") or "")
    if not response_id:
        reasons.append("response_has_no_id")
        return
    served = [row for row in records if row.response_id == response_id]
    if not served:
        reasons.append("response_id_no_match")
        return
    winner = _collapse(served)
    if winner is None:
        reasons.append("response_id_ambiguous")
    else:
        witnesses.append(("response_id", winner))


def _content_witness(
    records: Sequence[CallRecord],
    response: dict[str, Any],
    reasons: list[str],
    witnesses: list[tuple[str, CallRecord]],
) -> None:
    output = response.get("output")
    items = [item for item in output if isinstance(item, dict)] if isinstance(output, list) else []
    if not items:
        reasons.append("response_has_no_output")
        return
    try:
        target = assistant_fingerprint(items)
    except FingerprintError:
        reasons.append("response_output_unfingerprintable")
        return
    if not target:
        reasons.append("no_model_authored_output")
        return
    tail = _trailing_fingerprint(items)
    matches: dict[str, CallRecord] = {}
    for row in records:
        if row.fingerprint_version != FINGERPRINT_VERSION:
            continue
        own = row.output_fingerprint
        if row.continuation_fingerprint == target or (own and own in (target, tail)):
            matches[row.model_call_id] = row
    winner = _collapse(list(matches.values()))
    if winner is None:
        reasons.append("content_ambiguous" if matches else "no_content_match")
    else:
        witnesses.append(("content", winner))


def _trailing_fingerprint(items: list[dict[str, Any]]) -> str:
    """Fingerprint of the trailing model-authored run when it is a proper suffix; else ""."""
    start = len(items)
    while start > 0 and is_model_authored(items[start - 1]):
        start -= 1
    if start in (0, len(items)):
        return ""
    try:
        return assistant_fingerprint(items[start:])
    except FingerprintError:
        return ""


def _collapse(candidates: Sequence[CallRecord]) -> CallRecord | None:
    """One row standing for rows that all name one token sequence (smallest id), else None."""
    if not candidates:
        return None
    identities = {(row.cumulative_hash, row.chain_hash, row.cum_len) for row in candidates}
    if len(identities) != 1:
        return None
    return min(candidates, key=lambda row: row.model_call_id)


def _given(value: Any) -> str | None:
    """A record claim: a falsy value (null, "", 0, false) means not given."""
    return str(value) if value else None


def select_terminal_call(records: Sequence[CallRecord]) -> TerminalSelection:
    """The terminal by parent links alone, when no witness named one.

    Roots that have children are preferred; among them the earliest
    ``admitted_at`` wins (rows without one last, then manifest order). From
    there, descend while a call has children, preferring children that have
    children themselves; more than one candidate left at a level is
    ``ambiguous_terminal``.
    """
    if not records:
        return TerminalSelection(None, SELECTION_NO_RECORDS)
    by_id = {row.model_call_id: row for row in records}
    if len(by_id) != len(records):
        return TerminalSelection(None, SELECTION_DUPLICATE_CALL_ID)
    if any(row.parent_call_id is not None and row.parent_call_id not in by_id for row in records):
        return TerminalSelection(None, SELECTION_ORPHANED_ROW)
    children: dict[str, list[CallRecord]] = {}
    roots: list[CallRecord] = []
    for row in records:
        if row.parent_call_id is None:
            roots.append(row)
        else:
            children.setdefault(row.parent_call_id, []).append(row)
    if not roots:
        # Every row names a present parent: the parent links form a cycle.
        return TerminalSelection(None, SELECTION_NO_ROOT)

    position = {row.model_call_id: index for index, row in enumerate(records)}

    def admission_order(row: CallRecord) -> tuple[bool, float, int]:
        stamped = row.admitted_at is not None
        return (not stamped, row.admitted_at or 0.0, position[row.model_call_id])

    def prefer_extended(candidates: list[CallRecord]) -> list[CallRecord]:
        extended = [row for row in candidates if children.get(row.model_call_id)]
        return extended or candidates

    node = min(prefer_extended(roots), key=admission_order)
    while True:
        below = children.get(node.model_call_id)
        if not below:
            return TerminalSelection(node.model_call_id, SELECTION_SELECTED)
        pool = prefer_extended(below)
        if len(pool) > 1:
            return TerminalSelection(None, SELECTION_AMBIGUOUS)
        node = pool[0]
